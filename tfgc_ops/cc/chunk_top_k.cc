#include "chunk_top_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "magnitude_select.h"

namespace tfgc {
namespace chunk_top_k {
namespace {

namespace ms = ::tfgc::magnitude_select;

// Writes codes of up to 32 bits, most significant bit first, from a byte-aligned start;
// Finish zero-pads the last byte.
class BitWriter {
 public:
  explicit BitWriter(uint8_t* out) : out_(out) {}

  void Put(uint32_t code, int bits) {
    buffer_ = buffer_ << bits | code;
    filled_ += bits;
    while (filled_ >= 8) {
      filled_ -= 8;
      *out_++ = static_cast<uint8_t>(buffer_ >> filled_);
    }
  }

  void Finish() {
    if (filled_ > 0) *out_++ = static_cast<uint8_t>(buffer_ << (8 - filled_));
    filled_ = 0;
  }

 private:
  uint8_t* out_;
  uint64_t buffer_ = 0;
  int filled_ = 0;
};

// Reads codes of up to 32 bits, most significant bit first, from a byte-aligned start;
// never reads a byte past the last one a code it returns touches.
class BitReader {
 public:
  explicit BitReader(const uint8_t* in) : in_(in) {}

  uint32_t Get(int bits) {
    while (filled_ < bits) {
      buffer_ = buffer_ << 8 | *in_++;
      filled_ += 8;
    }
    filled_ -= bits;
    return static_cast<uint32_t>(buffer_ >> filled_) & ((uint32_t{1} << bits) - 1);
  }

 private:
  const uint8_t* in_;
  uint64_t buffer_ = 0;
  int filled_ = 0;
};

int64_t LengthOf(const Layout& layout, int64_t n, int64_t c) {
  return std::min(layout.chunk, n - c * layout.chunk);
}

bool AllFinite(const float* x, int64_t n) {
  uint32_t any = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, 4);
    any |= ((bits & 0x7F800000u) == 0x7F800000u);
  }
  return any == 0;
}

// The two levels of the kept values val[0, count) and each one's code; `padded` when the
// chunk has fewer nonzero values than it keeps (its zeros then take level low = 0).
void Quantize(const float* val, int64_t count, bool padded, uint32_t* codes, float* low,
              float* high) {
  if (padded) {
    double sum = 0;
    int64_t nonzero = 0;
    for (int64_t j = 0; j < count; ++j) {
      sum += std::fabs(val[j]);
      nonzero += val[j] != 0;
    }
    *low = 0.0f;
    *high = nonzero ? static_cast<float>(sum / nonzero) : 0.0f;
    for (int64_t j = 0; j < count; ++j) {
      codes[j] = val[j] != 0 ? (std::signbit(val[j]) ? 3u : 1u) : 0u;
    }
    return;
  }
  // Lloyd-Max with two levels over the (nonzero) magnitudes: each level the mean of the
  // magnitudes it stands for, split at the midpoint of the levels; from the mean, a few
  // rounds settle (fewer when the split moves no value).
  double total = 0;
  for (int64_t j = 0; j < count; ++j) total += std::fabs(val[j]);
  double threshold = total / count;
  double sum_low = 0, sum_high = 0;
  int64_t n_low = 0, n_high = 0, last_high = -1;
  for (int round = 0;; ++round) {
    sum_low = sum_high = 0;
    n_low = n_high = 0;
    for (int64_t j = 0; j < count; ++j) {
      const double m = std::fabs(val[j]);
      if (m >= threshold) {
        sum_high += m, ++n_high;
      } else {
        sum_low += m, ++n_low;
      }
    }
    if (round == 3 || n_low == 0 || n_high == last_high) break;
    last_high = n_high;
    const double next = 0.5 * (sum_low / n_low + sum_high / n_high);
    if (next == threshold) break;
    threshold = next;
  }
  // n_high >= 1: the largest magnitude is at least any mean or midpoint of them.
  *high = static_cast<float>(sum_high / n_high);
  *low = n_low ? static_cast<float>(sum_low / n_low) : *high;
  for (int64_t j = 0; j < count; ++j) {
    codes[j] = (std::signbit(val[j]) ? 2u : 0u) | (std::fabs(val[j]) >= threshold ? 1u : 0u);
  }
}

}  // namespace

bool Valid(const Layout& layout) {
  return layout.chunk >= kMinChunk && layout.chunk <= kMaxChunk && layout.kept >= 1 &&
         layout.kept <= layout.chunk;
}

int IndexBits(const Layout& layout) {
  int bits = 1;
  while ((int64_t{1} << bits) < layout.chunk) ++bits;
  return bits;
}

int64_t NumChunks(const Layout& layout, int64_t n) {
  return (n + layout.chunk - 1) / layout.chunk;
}

int64_t KeptIn(const Layout& layout, int64_t length) {
  return (length * layout.kept + layout.chunk - 1) / layout.chunk;
}

int64_t TotalKept(const Layout& layout, int64_t n) {
  if (n <= 0) return 0;
  const int64_t chunks = NumChunks(layout, n);
  return (chunks - 1) * layout.kept + KeptIn(layout, LengthOf(layout, n, chunks - 1));
}

void Encode(const float* x, int64_t n, const Layout& layout, int64_t first, int64_t end,
            uint8_t* positions, uint8_t* codes, float* levels,
            std::vector<uint32_t>* scratch) {
  const int bits = IndexBits(layout);
  BitWriter position_writer(positions + PackedBytes(first * layout.kept, bits));
  BitWriter code_writer(codes + PackedBytes(first * layout.kept, kCodeBits));
  std::vector<int32_t> pos(layout.kept);
  std::vector<float> val(layout.kept);
  std::vector<uint32_t> code(layout.kept);
  for (int64_t c = first; c < end; ++c) {
    const float* xc = x + c * layout.chunk;
    const int64_t length = LengthOf(layout, n, c);
    const int64_t kept = KeptIn(layout, length);
    float* level = levels + 2 * c;
    if (!AllFinite(xc, length)) {
      for (int64_t j = 0; j < kept; ++j) pos[j] = static_cast<int32_t>(j), code[j] = 0;
      level[0] = level[1] = std::numeric_limits<float>::quiet_NaN();
    } else {
      const ms::Selection selection = ms::Select(xc, length, kept, false, scratch);
      const bool padded = selection.count < kept;
      if (!padded) {
        ms::Outputs outputs;
        outputs.positions = pos.data();
        outputs.values = val.data();
        ms::Write(xc, length, selection, outputs);
      } else {  // every nonzero value, then the first zeros
        int64_t pads = kept - selection.count, j = 0;
        for (int64_t i = 0; i < length && j < kept; ++i) {
          if (xc[i] != 0) {
            pos[j] = static_cast<int32_t>(i), val[j++] = xc[i];
          } else if (pads > 0) {
            pos[j] = static_cast<int32_t>(i), val[j++] = 0.0f, --pads;
          }
        }
      }
      Quantize(val.data(), kept, padded, code.data(), &level[0], &level[1]);
    }
    for (int64_t j = 0; j < kept; ++j) {
      position_writer.Put(static_cast<uint32_t>(pos[j]), bits);
      code_writer.Put(code[j], kCodeBits);
    }
  }
  position_writer.Finish();
  code_writer.Finish();
}

int64_t FindInvalidChunk(const uint8_t* positions, int64_t n, const Layout& layout) {
  const int bits = IndexBits(layout);
  BitReader reader(positions);
  const int64_t chunks = NumChunks(layout, n);
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t length = LengthOf(layout, n, c);
    const int64_t kept = KeptIn(layout, length);
    int64_t previous = -1;
    for (int64_t j = 0; j < kept; ++j) {
      const int64_t p = reader.Get(bits);
      if (p <= previous || p >= length) return c;
      previous = p;
    }
  }
  return -1;
}

void Decode(const uint8_t* positions, const uint8_t* codes, const float* levels, int64_t n,
            const Layout& layout, int64_t first, int64_t end, float* out) {
  const int bits = IndexBits(layout);
  BitReader position_reader(positions + PackedBytes(first * layout.kept, bits));
  BitReader code_reader(codes + PackedBytes(first * layout.kept, kCodeBits));
  for (int64_t c = first; c < end; ++c) {
    const int64_t length = LengthOf(layout, n, c);
    const int64_t kept = KeptIn(layout, length);
    float* oc = out + c * layout.chunk;
    std::fill(oc, oc + length, 0.0f);
    const float low = levels[2 * c], high = levels[2 * c + 1];
    for (int64_t j = 0; j < kept; ++j) {
      const uint32_t p = position_reader.Get(bits);
      const uint32_t code = code_reader.Get(kCodeBits);
      const float magnitude = (code & 1) ? high : low;
      oc[p] = (code & 2) ? -magnitude : magnitude;
    }
  }
}

}  // namespace chunk_top_k
}  // namespace tfgc
