#include "magnitude_select.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>  // part of every x86-64 CPU: no run-time dispatch needed
#endif

namespace tfgc {
namespace magnitude_select {
namespace {

constexpr uint32_t kLargestFinite = 0x7F7FFFFF;  // FLT_MAX's pattern
constexpr uint32_t kFirstNonFinite = 0x7F800000;  // +inf's pattern; NaNs lie above
constexpr int kTopShift = 20;                     // top level: bits 20..30 (2048 bins)
constexpr int kTopBins = 1 << (31 - kTopShift);
constexpr int kFiniteTopBins = kFirstNonFinite >> kTopShift;  // 2040; the rest are non-finite
constexpr int kLowShift = 10;                                 // then bits 10..19, then 0..9
constexpr int kLowBins = 1 << kLowShift;
constexpr uint32_t kLowMask = kLowBins - 1;
constexpr uint32_t kBelowTopMask = (1u << kTopShift) - 1;

inline uint32_t Pattern(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits & 0x7FFFFFFF;
}

// The bin of counts[0, bins) that holds the entry of rank `rank` (>= 1) counted from the
// top, and how many entries lie in the bins above it.
int BinOfRank(const uint32_t* counts, int bins, int64_t rank, int64_t* above) {
  int64_t seen = 0;
  for (int b = bins - 1; b > 0; --b) {
    if (seen + counts[b] >= rank) {
      *above = seen;
      return b;
    }
    seen += counts[b];
  }
  *above = seen;
  return 0;
}

}  // namespace

Selection Select(const float* x, int64_t n, int64_t wanted, bool non_finite_in_wanted,
                 std::vector<uint32_t>* scratch) {
  // Interleaved histograms: values of one exponent fall in few bins, and increments of
  // one bin would otherwise wait on each other.
  constexpr int kWays = 4;
  std::vector<uint32_t> ways(kWays * kTopBins);
  int64_t zeros = 0;
  int64_t i = 0;
#if defined(__SSE2__)
  // Bins and zeros of eight values per step in SSE2; only the increments stay scalar.
  {
    const __m128i magnitude = _mm_set1_epi32(0x7FFFFFFF);
    const __m128i zero = _mm_setzero_si128();
    __m128i minus_zeros = zero;  // -1 per zero, per lane
    alignas(16) uint32_t bins[8];
    for (; i + 8 <= n; i += 8) {
      const __m128i a = _mm_and_si128(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)), magnitude);
      const __m128i b = _mm_and_si128(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i + 4)), magnitude);
      minus_zeros = _mm_add_epi32(minus_zeros, _mm_cmpeq_epi32(a, zero));
      minus_zeros = _mm_add_epi32(minus_zeros, _mm_cmpeq_epi32(b, zero));
      _mm_store_si128(reinterpret_cast<__m128i*>(bins), _mm_srli_epi32(a, kTopShift));
      _mm_store_si128(reinterpret_cast<__m128i*>(bins + 4), _mm_srli_epi32(b, kTopShift));
      for (int k = 0; k < 8; ++k) ++ways[(k % kWays) * kTopBins + bins[k]];
    }
    alignas(16) int32_t lanes[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes), minus_zeros);
    for (const int32_t lane : lanes) zeros -= lane;  // each lane counts at most n / 4
  }
#endif
  for (; i + kWays <= n; i += kWays) {
    for (int w = 0; w < kWays; ++w) {
      const uint32_t p = Pattern(x[i + w]);
      ++ways[w * kTopBins + (p >> kTopShift)];
      zeros += p == 0;
    }
  }
  for (; i < n; ++i) {
    const uint32_t p = Pattern(x[i]);
    ++ways[p >> kTopShift];
    zeros += p == 0;
  }
  std::array<uint32_t, kTopBins> top{};
  for (int w = 0; w < kWays; ++w) {
    for (int b = 0; b < kTopBins; ++b) top[b] += ways[w * kTopBins + b];
  }
  top[0] -= static_cast<uint32_t>(zeros);  // zeros are never selected
  int64_t non_finite = 0;
  for (int b = kFiniteTopBins; b < kTopBins; ++b) non_finite += top[b];
  const int64_t nonzero_finite = n - zeros - non_finite;
  if (non_finite_in_wanted) wanted -= non_finite;
  wanted = std::min(std::max<int64_t>(wanted, 0), nonzero_finite);

  Selection selection;
  selection.count = wanted + non_finite;
  if (wanted == 0) {  // only the non-finite values, which lie above every finite one
    selection.threshold = kLargestFinite;
    return selection;
  }
  int64_t above_top = 0, above_middle = 0, above_low = 0;
  const int top_bin = BinOfRank(top.data(), kFiniteTopBins, wanted, &above_top);

  // The nonzero values of that bin, their low 20 bits (in any order: only histograms
  // read them); every value looked at is written and only those in the bin are kept (no
  // branch on the data), hence the one spare slot.
  scratch->resize(static_cast<size_t>(top[top_bin]) + 1);
  uint32_t* candidates = scratch->data();
  int64_t found = 0;
  const auto keep_if_in_bin = [&](int64_t j) {
    const uint32_t p = Pattern(x[j]);
    candidates[found] = p & kBelowTopMask;
    found += ((p >> kTopShift) == static_cast<uint32_t>(top_bin)) & (p != 0);
  };
  int64_t next = 0;
#if defined(__SSE2__)
  // One bin holds a few percent of the values: test eight at once and look closer only
  // at groups with one in the bin (the scalar step also drops zeros, which bin 0 holds).
  const __m128i magnitude = _mm_set1_epi32(0x7FFFFFFF);
  const __m128i bin = _mm_set1_epi32(top_bin);
  for (; next + 8 <= n; next += 8) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + next));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + next + 4));
    const __m128i a_in =
        _mm_cmpeq_epi32(_mm_srli_epi32(_mm_and_si128(a, magnitude), kTopShift), bin);
    const __m128i b_in =
        _mm_cmpeq_epi32(_mm_srli_epi32(_mm_and_si128(b, magnitude), kTopShift), bin);
    if (_mm_movemask_epi8(_mm_or_si128(a_in, b_in)) == 0) continue;
    for (int k = 0; k < 8; ++k) keep_if_in_bin(next + k);
  }
#endif
  for (; next < n; ++next) keep_if_in_bin(next);
  std::array<uint32_t, kLowBins> middle{}, low{};
  for (int64_t j = 0; j < found; ++j) ++middle[candidates[j] >> kLowShift];
  const int64_t middle_rank = wanted - above_top;
  const int middle_bin = BinOfRank(middle.data(), kLowBins, middle_rank, &above_middle);
  const uint32_t middle_bits = static_cast<uint32_t>(middle_bin);
  for (int64_t j = 0; j < found; ++j) {
    low[candidates[j] & kLowMask] += (candidates[j] >> kLowShift) == middle_bits;
  }
  const int64_t low_rank = middle_rank - above_middle;
  const int low_bin = BinOfRank(low.data(), kLowBins, low_rank, &above_low);
  selection.threshold = static_cast<uint32_t>(top_bin) << kTopShift |
                        static_cast<uint32_t>(middle_bin) << kLowShift |
                        static_cast<uint32_t>(low_bin);
  selection.ties = low_rank - above_low;
  return selection;
}

namespace {

// Bit i of a byte moved to bit 7 - i: movemask's lane order to the bitmap's.
constexpr struct ReversedBytes {
  uint8_t of[256];
  constexpr ReversedBytes() : of() {
    for (int b = 0; b < 256; ++b) {
      for (int i = 0; i < 8; ++i) of[b] |= static_cast<uint8_t>(((b >> i) & 1) << (7 - i));
    }
  }
} kReversed;

// Write with the outputs chosen at compile time (bit 0: bitmap, 1: positions, 2: values,
// 3: reconstruction), so that the loop tests none of them.
template <int kOutputs>
void WriteSome(const float* x, int64_t n, const Selection& selection, const Outputs& out) {
  constexpr bool kBitmap = kOutputs & 1, kPositions = kOutputs & 2, kValues = kOutputs & 4,
                 kReconstruction = kOutputs & 8, kList = kPositions || kValues;
  // Selected positions and values collect in a small buffer with a spare slot (each value
  // is written and kept only if selected), flushed when full.
  constexpr int kStage = 256;
  int32_t staged_positions[kStage + 1];
  float staged_values[kStage + 1];
  int staged = 0;
  int64_t written = 0;
  auto flush = [&]() {
    if (kPositions) std::copy(staged_positions, staged_positions + staged, out.positions + written);
    if (kValues) std::copy(staged_values, staged_values + staged, out.values + written);
    written += staged;
    staged = 0;
  };
  auto stage = [&](int64_t i, bool keep) {
    if (kPositions) staged_positions[staged] = static_cast<int32_t>(i);
    if (kValues) staged_values[staged] = x[i];
    staged += keep;
    if (staged == kStage) flush();
  };
  const uint32_t threshold = selection.threshold;
  const int64_t ties = selection.ties;
  int64_t ties_seen = 0;
  uint32_t byte = 0;
  // One value, in order: the only place that counts ties.
  auto one = [&](int64_t i) {
    const float v = x[i];
    const uint32_t p = Pattern(v);
    const bool tie = p == threshold;
    ties_seen += tie;
    const bool keep = (p > threshold) | (tie & (ties_seen <= ties));
    if (kReconstruction) out.reconstruction[i] = keep ? v : 0.0f;
    if (kBitmap) {
      byte = byte << 1 | static_cast<uint32_t>(keep);
      if ((i & 7) == 7) out.bitmap[i >> 3] = static_cast<uint8_t>(byte);
    }
    if (kList) stage(i, keep);
  };
  int64_t i = 0;
#if defined(__SSE2__)
  // Eight values at a time; a group holding a value equal to the threshold goes through
  // `one`, which keeps the ties in position order.
  const __m128i thresholds = _mm_set1_epi32(static_cast<int>(threshold));
  const __m128i magnitude = _mm_set1_epi32(0x7FFFFFFF);
  for (; i + 8 <= n; i += 8) {
    const __m128 v0 = _mm_loadu_ps(x + i), v1 = _mm_loadu_ps(x + i + 4);
    const __m128i p0 = _mm_and_si128(_mm_castps_si128(v0), magnitude);
    const __m128i p1 = _mm_and_si128(_mm_castps_si128(v1), magnitude);
    const __m128i tied = _mm_or_si128(_mm_cmpeq_epi32(p0, thresholds),
                                      _mm_cmpeq_epi32(p1, thresholds));
    if (_mm_movemask_epi8(tied) != 0) {
      for (int k = 0; k < 8; ++k) one(i + k);
      continue;
    }
    // Patterns are below 2^31, so the signed comparison orders them.
    const __m128 keep0 = _mm_castsi128_ps(_mm_cmpgt_epi32(p0, thresholds));
    const __m128 keep1 = _mm_castsi128_ps(_mm_cmpgt_epi32(p1, thresholds));
    if (kReconstruction) {
      _mm_storeu_ps(out.reconstruction + i, _mm_and_ps(v0, keep0));
      _mm_storeu_ps(out.reconstruction + i + 4, _mm_and_ps(v1, keep1));
    }
    unsigned mask = static_cast<unsigned>(_mm_movemask_ps(keep0) | _mm_movemask_ps(keep1) << 4);
    if (kBitmap) out.bitmap[i >> 3] = kReversed.of[mask];
    if (kList) {
      for (; mask != 0; mask &= mask - 1) stage(i + __builtin_ctz(mask), true);
    }
  }
#endif
  for (; i < n; ++i) one(i);
  if (kBitmap && (n & 7) != 0) out.bitmap[n >> 3] = static_cast<uint8_t>(byte << (8 - (n & 7)));
  if (kList) flush();
}

using Writer = void (*)(const float*, int64_t, const Selection&, const Outputs&);

template <int... kOutputs>
constexpr std::array<Writer, sizeof...(kOutputs)> Writers(std::integer_sequence<int, kOutputs...>) {
  return {&WriteSome<kOutputs>...};
}

constexpr auto kWriters = Writers(std::make_integer_sequence<int, 16>());

}  // namespace

int64_t CountSelected(const uint8_t* bitmap, int64_t n) {
  const int64_t whole = n / 8;
  int64_t count = 0, i = 0;
  for (; i + 8 <= whole; i += 8) {
    uint64_t word;
    std::memcpy(&word, bitmap + i, sizeof(word));
    count += __builtin_popcountll(word);
  }
  for (; i < whole; ++i) count += __builtin_popcount(bitmap[i]);
  if (n & 7) count += __builtin_popcount(bitmap[whole] >> (8 - (n & 7)));
  return count;
}

void Expand(const uint8_t* bitmap, int64_t n, const float* values, float* out) {
  std::fill(out, out + n, 0.0f);
  int64_t next = 0;
  for (int64_t byte = 0; byte * 8 < n; ++byte) {
    // Bit j of the reversed byte is position 8 * byte + j; padding bits past n drop.
    unsigned bits = kReversed.of[bitmap[byte]];
    if (byte * 8 + 8 > n) bits &= (1u << (n - byte * 8)) - 1;
    for (; bits != 0; bits &= bits - 1) out[byte * 8 + __builtin_ctz(bits)] = values[next++];
  }
}

bool PositionsAscendWithin(const int32_t* positions, int64_t count, int64_t n) {
  int64_t previous = -1;
  for (int64_t j = 0; j < count; ++j) {
    if (positions[j] <= previous) return false;
    previous = positions[j];
  }
  return previous < n;
}

void ExpandPositions(const int32_t* positions, int64_t count, const float* values, int64_t n,
                     float* out) {
  // Zeros between the positions, written in order: one sequential pass over `out`,
  // where a zero fill then a scatter would write it twice.
  int64_t start = 0;
  for (int64_t j = 0; j < count; ++j) {
    std::fill(out + start, out + positions[j], 0.0f);
    out[positions[j]] = values[j];
    start = positions[j] + 1;
  }
  std::fill(out + start, out + n, 0.0f);
}

void Write(const float* x, int64_t n, const Selection& selection, const Outputs& outputs) {
  const int which = (outputs.bitmap != nullptr) | (outputs.positions != nullptr) << 1 |
                    (outputs.values != nullptr) << 2 | (outputs.reconstruction != nullptr) << 3;
  kWriters[which](x, n, selection, outputs);
}

}  // namespace magnitude_select
}  // namespace tfgc
