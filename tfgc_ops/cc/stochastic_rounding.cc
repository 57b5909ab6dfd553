#include "stochastic_rounding.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "bit_packing.h"
#include "quartic_fold.h"

namespace tfgc {
namespace stochastic_rounding {
namespace {

// Codes are computed and packed through a small buffer of this many values (a multiple
// of 8, so each chunk packs into whole bytes).
constexpr int64_t kChunk = 1024;

}  // namespace

void BucketNorms(const float* x, int64_t n, int64_t bucket, int64_t begin, int64_t end,
                 float* norms) {
  for (int64_t b = begin; b < end; ++b) {
    const int64_t first = b * bucket, last = std::min(n, first + bucket);
    // Four sums in turn: one would wait on each addition's latency.
    double sum[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t j = first;
    for (; j + 4 <= last; j += 4) {
      for (int k = 0; k < 4; ++k) sum[k] += static_cast<double>(x[j + k]) * x[j + k];
    }
    for (; j < last; ++j) sum[0] += static_cast<double>(x[j]) * x[j];
    norms[b] = static_cast<float>(std::sqrt((sum[0] + sum[1]) + (sum[2] + sum[3])));
  }
}

void QsgdEncode(const float* x, int64_t n, const float* norms, int64_t bucket, int bits,
                uint64_t seed0, uint64_t seed1, int64_t begin, int64_t end, uint8_t* out) {
  const float levels = static_cast<float>((1 << (bits - 1)) - 1);
  const int32_t sign_bit = 1 << (bits - 1);
  const uint64_t key = SeedKey(seed0, seed1);
  int32_t codes[kChunk];
  for (int64_t start = begin; start < end; start += kChunk) {
    const int64_t stop = std::min(start + kChunk, end);
    // Bucket by bucket: one norm per stretch, no division per value.
    for (int64_t j = start; j < stop;) {
      const int64_t b = j / bucket;
      const int64_t stretch_end = std::min(stop, (b + 1) * bucket);
      const float norm = norms[b];
      if (!(norm > 0 && std::isfinite(norm))) {  // level 0 (its values may be NaN)
        for (; j < stretch_end; ++j) codes[j - start] = x[j] < 0 ? sign_bit : 0;
        continue;
      }
      // t = |x| * (s / N); a value beyond its norm (possible once the norm is rounded to
      // float16) gets the top level. Where s / N overflows (a subnormal N) the division
      // comes first: |x| / N * s.
      const bool subnormal = levels / static_cast<double>(norm) > FLT_MAX;
      const float factor = subnormal ? 0.0f : levels / norm;
      for (; j < stretch_end; ++j) {
        const float magnitude = std::fabs(x[j]);
        const float t = std::min(subnormal ? magnitude / norm * levels : magnitude * factor, levels);
        const int32_t lower = static_cast<int32_t>(t);  // t >= 0: truncation is floor
        const int32_t up = Uniform(key, j) < t - static_cast<float>(lower);
        // Branch-free: signs are coin flips.
        codes[j - start] = static_cast<int32_t>(x[j] < 0) * sign_bit |
                           std::min(lower + up, sign_bit - 1);
      }
    }
    bit_packing::Pack(codes, stop - start, bits, out + start * bits / 8);
  }
}

void QsgdDecode(const uint8_t* packed, int64_t n, const float* norms, int64_t bucket, int bits,
                int64_t begin, int64_t end, float* out) {
  const float levels = static_cast<float>((1 << (bits - 1)) - 1);
  const int32_t sign_bit = 1 << (bits - 1);
  int32_t codes[kChunk];
  for (int64_t start = begin; start < end; start += kChunk) {
    const int64_t stop = std::min(start + kChunk, end);
    bit_packing::Unpack(packed + start * bits / 8, stop - start, bits, codes);
    for (int64_t j = start; j < stop;) {
      const int64_t b = j / bucket;
      const int64_t stretch_end = std::min(stop, (b + 1) * bucket);
      const float norm = norms[b];
      for (; j < stretch_end; ++j) {
        const int32_t code = codes[j - start];
        const float level = static_cast<float>(code & (sign_bit - 1));
        out[j] = ((code & sign_bit) ? -level : level) * norm / levels;
      }
    }
  }
}

void TernaryFold(const float* x, int64_t n, float scale, uint64_t seed0, uint64_t seed1,
                 int64_t begin, int64_t end, uint8_t* out) {
  const int64_t groups = quartic_fold::GroupsFor(n);
  static constexpr int kPowers[5] = {81, 27, 9, 3, 1};
  const float inverse = 1.0f / scale;
  const uint64_t key = SeedKey(seed0, seed1);
  int bytes[kChunk];
  for (int64_t start = begin; start < end; start += kChunk) {
    const int64_t stop = std::min(start + kChunk, end);
    // 121 is five 3-values of 0; each kept value adds its sign times its power.
    std::fill(bytes, bytes + (stop - start), 121);
    for (int k = 0; k < 5; ++k) {
      const int64_t offset = k * groups;  // byte i holds value k * groups + i
      const int64_t last = std::min(stop, n - offset);
      for (int64_t i = start; i < last; ++i) {
        const float v = x[offset + i];
        const int kept = Uniform(key, offset + i) < std::fabs(v) * inverse;
        const int sign = 1 - 2 * (v < 0);
        bytes[i - start] += kept * sign * kPowers[k];  // branch-free: kept is a coin flip
      }
    }
    for (int64_t i = start; i < stop; ++i) out[i] = static_cast<uint8_t>(bytes[i - start]);
  }
}

}  // namespace stochastic_rounding
}  // namespace tfgc
