#include "quartic_rans.h"

#include <algorithm>
#include <cstring>

namespace tfgc {
namespace quartic_rans {
namespace {

constexpr uint8_t kZeroGroup = 121;   // five zero 3-values: the only byte of class 0
constexpr int kSymbols = 243;
constexpr uint32_t kLowerBound = 1u << 23;  // the state stays in [2^23, 2^31)
constexpr uint32_t kUpperBound = 1u << 31;

// Per byte: its class (nonzero 3-values) and its rank among the bytes of that class; and
// the inverse, the bytes of each class in increasing order.
struct SymbolTables {
  uint8_t class_of[kSymbols];
  uint8_t rank_of[kSymbols];
  uint8_t first_of_class[kClasses];  // where class k begins in by_class
  uint8_t by_class[kSymbols];
  constexpr SymbolTables() : class_of(), rank_of(), first_of_class(), by_class() {
    int count[kClasses] = {};
    for (int b = 0; b < kSymbols; ++b) {
      int nonzero = 0;  // digits d of b in base 3 with d != 1 (3-value d - 1 != 0)
      for (int i = 0, v = b; i < 5; ++i, v /= 3) nonzero += v % 3 != 1;
      class_of[b] = static_cast<uint8_t>(nonzero);
      rank_of[b] = static_cast<uint8_t>(count[nonzero]++);
    }
    int first = 0;
    for (int k = 0; k < kClasses; ++k) {
      first_of_class[k] = static_cast<uint8_t>(first);
      first += count[k];
    }
    for (int b = 0; b < kSymbols; ++b) {
      by_class[first_of_class[class_of[b]] + rank_of[b]] = static_cast<uint8_t>(b);
    }
  }
};
constexpr SymbolTables kTables;

// A symbol's frequency and cumulative start under a model.
inline uint32_t Start(const Model& m, uint8_t b) {
  const int k = kTables.class_of[b];
  return m.start[k] + kTables.rank_of[b] * m.freq[k];
}

// How the encoder codes one byte under a model: x -> (x / f) * 2^16 + x % f + start
// = x + start + q * (2^16 - f) with q = x / f, where q comes from a multiply by a
// reciprocal instead of a division (which took most of the encoder's time): with
// s = ceil(log2 f) and r = ceil(2^(31 + s) / f) < 2^32, q = (x * r) >> (31 + s) exactly
// for every x < 2^31, which the renormalisation guarantees (x < 2^15 f). f = 1 has no
// such r: r = 2^32 - 1 and shift 0 give q = x - 1, and the bias adds the missing
// 2^16 - 1.
struct EncodeSymbol {
  uint32_t x_max;       // renormalise while x >= x_max = 2^15 f
  uint32_t reciprocal;  // r
  uint32_t bias;        // start (+ 2^16 - 1 for f = 1)
  uint32_t complement;  // 2^16 - f
  uint32_t shift;       // s - 1 (applied after the high 32 bits of x * r)
};

// The entry for a symbol of frequency `freq` and start 0 (the caller adds its start).
EncodeSymbol EncodeSymbolFor(uint32_t freq) {
  EncodeSymbol e;
  e.x_max = ((kLowerBound >> kProbBits) << 8) * freq;
  e.complement = kProbScale - freq;
  if (freq == 1) {
    e.reciprocal = ~0u;
    e.shift = 0;
    e.bias = kProbScale - 1;
  } else {
    uint32_t s = 0;
    while ((1u << s) < freq) ++s;
    e.reciprocal = static_cast<uint32_t>(((uint64_t{1} << (31 + s)) + freq - 1) / freq);
    e.shift = s - 1;
    e.bias = 0;
  }
  return e;
}

}  // namespace

int NonzeroCount(uint8_t b) { return kTables.class_of[b]; }

Model ModelFor(uint32_t q) {
  // f_k = round(65536 * a^(5-k) * q^k / 65536^5 / 2^k) with a = 65536 - q; the numerator
  // is below 2^80, so 128-bit integers make this exact and the same on every machine.
  using u128 = unsigned __int128;
  const u128 a = kProbScale - q;
  Model m;
  int64_t others = 0;
  for (int k = 1; k < kClasses; ++k) {
    u128 num = 1;
    for (int i = 0; i < 5 - k; ++i) num *= a;
    for (int i = 0; i < k; ++i) num *= q;
    const int shift = 64 + k;
    const u128 rounded = (num + (u128(1) << (shift - 1))) >> shift;
    m.freq[k] = static_cast<uint32_t>(std::max<u128>(rounded, 1));
    others += kClassSize[k] * m.freq[k];
  }
  int64_t zero = static_cast<int64_t>(kProbScale) - others;
  while (zero < 1) {
    // Take the deficit from the class with the largest total among those above 1.
    int widest = 0;
    for (int k = 1; k < kClasses; ++k) {
      if (m.freq[k] > 1 && (widest == 0 || kClassSize[k] * m.freq[k] >
                                               kClassSize[widest] * m.freq[widest])) {
        widest = k;
      }
    }
    const int64_t cut = std::min<int64_t>(m.freq[widest] - 1,
                                          (1 - zero + kClassSize[widest] - 1) / kClassSize[widest]);
    m.freq[widest] -= static_cast<uint32_t>(cut);
    zero += cut * kClassSize[widest];
  }
  m.freq[0] = static_cast<uint32_t>(zero);
  uint32_t start = 0;
  for (int k = 0; k < kClasses; ++k) {
    m.start[k] = start;
    start += static_cast<uint32_t>(kClassSize[k]) * m.freq[k];
  }
  return m;
}

uint32_t QFor(const uint8_t* quartic, int64_t n) {
  int64_t nonzero = 0;
  for (int64_t i = 0; i < n; ++i) nonzero += kTables.class_of[quartic[i]];
  if (nonzero == 0) return 0;
  using u128 = unsigned __int128;
  const u128 values = u128(5) * static_cast<uint64_t>(n);
  const u128 q = (u128(nonzero) * kProbScale * 2 + values) / (2 * values);  // rounded
  return static_cast<uint32_t>(std::clamp<u128>(q, 1, kProbScale - 1));
}

int64_t MaxEncodedSize(int64_t n, int64_t groups) {
  // A symbol's renormalisation writes at most two bytes: from below 2^31 to below 2^15.
  return kHeaderBytesPerGroup * groups + kStateBytes + 2 * n;
}

int64_t Encode(const uint8_t* in, const int64_t* group_sizes, int64_t num_groups, uint8_t* out) {
  int64_t total = 0;
  std::vector<uint32_t> qs(num_groups);
  for (int64_t g = 0; g < num_groups; ++g) {
    qs[g] = QFor(in + total, group_sizes[g]);
    out[kHeaderBytesPerGroup * g] = static_cast<uint8_t>(qs[g]);
    out[kHeaderBytesPerGroup * g + 1] = static_cast<uint8_t>(qs[g] >> 8);
    total += group_sizes[g];
  }
  // rANS codes last-in first-out: walk backwards, writing backwards from the end of out.
  uint8_t* const end = out + MaxEncodedSize(total, num_groups);
  uint8_t* p = end;
  uint32_t x = kLowerBound;
  int64_t offset = total;
  for (int64_t g = num_groups - 1; g >= 0; --g) {
    offset -= group_sizes[g];
    if (qs[g] == 0) continue;
    const Model m = ModelFor(qs[g]);
    // The reciprocal depends on the frequency alone: one division per class, not per
    // byte value (a fused message codes many groups per step).
    EncodeSymbol of_class[kClasses];
    for (int k = 0; k < kClasses; ++k) of_class[k] = EncodeSymbolFor(m.freq[k]);
    EncodeSymbol symbols[kSymbols];
    for (int b = 0; b < kSymbols; ++b) {
      symbols[b] = of_class[kTables.class_of[b]];
      symbols[b].bias += Start(m, static_cast<uint8_t>(b));
    }
    for (int64_t i = offset + group_sizes[g] - 1; i >= offset; --i) {
      const EncodeSymbol& e = symbols[in[i]];
      while (x >= e.x_max) {
        *--p = static_cast<uint8_t>(x);
        x >>= 8;
      }
      const uint32_t q =
          static_cast<uint32_t>((static_cast<uint64_t>(x) * e.reciprocal) >> 32) >> e.shift;
      x += e.bias + q * e.complement;
    }
  }
  p -= kStateBytes;
  for (int i = 0; i < kStateBytes; ++i) p[i] = static_cast<uint8_t>(x >> (8 * i));
  uint8_t* const body = out + kHeaderBytesPerGroup * num_groups;
  const int64_t body_size = end - p;
  std::memmove(body, p, body_size);
  return kHeaderBytesPerGroup * num_groups + body_size;
}

const char* Decode(const uint8_t* in, int64_t n, const int64_t* group_sizes, int64_t num_groups,
                   uint8_t* out) {
  if (n < kHeaderBytesPerGroup * num_groups + kStateBytes) {
    return "shorter than the header and state its groups need";
  }
  const uint8_t* p = in + kHeaderBytesPerGroup * num_groups;
  const uint8_t* const end = in + n;
  uint32_t x = 0;
  for (int i = 0; i < kStateBytes; ++i) x |= static_cast<uint32_t>(p[i]) << (8 * i);
  p += kStateBytes;
  if (x < kLowerBound || x >= kUpperBound) return "initial rANS state out of range";
  for (int64_t g = 0; g < num_groups; ++g) {
    const int64_t size = group_sizes[g];
    const uint32_t q = in[kHeaderBytesPerGroup * g] | (in[kHeaderBytesPerGroup * g + 1] << 8);
    if (q == 0) {
      std::memset(out, kZeroGroup, size);
      out += size;
      continue;
    }
    const Model m = ModelFor(q);
    const uint32_t zero_freq = m.freq[0];
    for (int64_t i = 0; i < size; ++i) {
      const uint32_t slot = x & (kProbScale - 1);
      if (slot < zero_freq) {  // the common case: five zero 3-values
        out[i] = kZeroGroup;
        x = zero_freq * (x >> kProbBits) + slot;
      } else {
        int k = 1;
        while (k + 1 < kClasses && slot >= m.start[k + 1]) ++k;
        const uint32_t rank = (slot - m.start[k]) / m.freq[k];
        out[i] = kTables.by_class[kTables.first_of_class[k] + rank];
        x = m.freq[k] * (x >> kProbBits) + (slot - m.start[k] - rank * m.freq[k]);
      }
      while (x < kLowerBound) {
        if (p == end) return "the stream ends before its symbols do";
        x = (x << 8) | *p++;
      }
    }
    out += size;
  }
  if (p != end) return "bytes left over after the last symbol";
  if (x != kLowerBound) return "final rANS state is not the initial one (corrupt stream)";
  return nullptr;
}

}  // namespace quartic_rans
}  // namespace tfgc
