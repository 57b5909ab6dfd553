#include "stochastic_rounding.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#if defined(__SSE2__)
#include <emmintrin.h>  // part of every x86-64 CPU: no run-time dispatch needed
#endif
#if defined(__x86_64__)
#include <immintrin.h>  // AVX2, used only where UseAvx2()
#endif

#include "bit_packing.h"
#include "cpu_isa.h"
#include "quartic_fold.h"

namespace tfgc {
namespace stochastic_rounding {
namespace {

// Codes are computed and packed through a small buffer of this many values (a multiple
// of 8, so each chunk packs into whole bytes).
constexpr int64_t kChunk = 1024;

#if defined(__SSE2__)

// a * b in each 32-bit lane (SSE2 multiplies only the even lanes, 32x32 -> 64 bits).
inline __m128i MultiplyLow32(__m128i a, __m128i b) {
  const __m128i even = _mm_mul_epu32(a, b);
  const __m128i odd = _mm_mul_epu32(_mm_srli_epi64(a, 32), _mm_srli_epi64(b, 32));
  return _mm_unpacklo_epi32(_mm_shuffle_epi32(even, _MM_SHUFFLE(0, 0, 2, 0)),
                            _mm_shuffle_epi32(odd, _MM_SHUFFLE(0, 0, 2, 0)));
}

// Uniform() of four draws, given their counter states.
inline __m128 UniformOfStates(__m128i x) {
  x = _mm_xor_si128(x, _mm_srli_epi32(x, 16));
  x = MultiplyLow32(x, _mm_set1_epi32(0x7FEB352D));
  x = _mm_xor_si128(x, _mm_srli_epi32(x, 15));
  x = MultiplyLow32(x, _mm_set1_epi32(static_cast<int>(0x846CA68Bu)));
  x = _mm_xor_si128(x, _mm_srli_epi32(x, 16));
  // The top 24 bits are below 2^24, so the signed conversion is exact.
  return _mm_mul_ps(_mm_cvtepi32_ps(_mm_srli_epi32(x, 8)), _mm_set1_ps(1.0f / 16777216.0f));
}

// The counter states of draws j .. j + 3 (which share the high word of their index).
inline __m128i StatesFrom(uint64_t key, int64_t j) {
  const uint32_t step = Step(key);
  const uint32_t first = static_cast<uint32_t>(j) * step + Offset(key, j);
  return _mm_add_epi32(_mm_set1_epi32(static_cast<int>(first)),
                       _mm_setr_epi32(0, static_cast<int>(step), static_cast<int>(2 * step),
                                      static_cast<int>(3 * step)));
}

// How many of `count` draws from index j a loop of `lanes` (a power of two) lanes takes:
// a multiple of `lanes`, ending before the high word of the index changes (a draw's
// offset depends on it).
inline int64_t VectorCount(int64_t j, int64_t count, int64_t lanes = 4) {
  const int64_t same_high = ((j >> 32) + 1) << 32;
  return std::min(count, same_high - j) & ~(lanes - 1);
}

// QsgdEncode's codes (norm usable, factor = s / N finite) of x[j, j + count), four at a
// time; returns how many it wrote to codes[0, ...) (`VectorCount`).
int64_t QsgdCodesSse2(const float* x, int64_t j, int64_t count, float factor, float levels,
                      int32_t sign_bit, uint64_t key, int32_t* codes) {
  count = VectorCount(j, count);
  __m128i state = StatesFrom(key, j);
  const __m128i state_step = _mm_set1_epi32(static_cast<int>(4 * Step(key)));
  const __m128 magnitude_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
  const __m128 factors = _mm_set1_ps(factor), top = _mm_set1_ps(levels);
  const __m128i signs = _mm_set1_epi32(sign_bit);
  for (int64_t k = 0; k < count; k += 4) {
    const __m128 v = _mm_loadu_ps(x + j + k);
    // As the scalar loop: t = min(|x| * factor, s), level floor(t) + [u < t - floor(t)]
    // (never above s: at t = s the fraction is 0).
    const __m128 t = _mm_min_ps(_mm_mul_ps(_mm_and_ps(v, magnitude_mask), factors), top);
    const __m128i lower = _mm_cvttps_epi32(t);
    const __m128 fraction = _mm_sub_ps(t, _mm_cvtepi32_ps(lower));
    const __m128i up = _mm_castps_si128(_mm_cmplt_ps(UniformOfStates(state), fraction));
    const __m128i negative = _mm_castps_si128(_mm_cmplt_ps(v, _mm_setzero_ps()));
    const __m128i code = _mm_or_si128(_mm_sub_epi32(lower, up), _mm_and_si128(negative, signs));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + k), code);
    state = _mm_add_epi32(state, state_step);
  }
  return count;
}

// One TernaryFold digit for values x[j, j + count) with draws j ...: adds sign(x[j + i])
// * power to bytes[i] where draw j + i keeps the value, four at a time; returns how many
// it did (`VectorCount`).
int64_t TernaryDigitSse2(const float* x, int64_t j, int64_t count, float inverse, int power,
                         uint64_t key, int* bytes) {
  count = VectorCount(j, count);
  __m128i state = StatesFrom(key, j);
  const __m128i state_step = _mm_set1_epi32(static_cast<int>(4 * Step(key)));
  const __m128 magnitude_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
  const __m128 inverses = _mm_set1_ps(inverse);
  const __m128i powers = _mm_set1_epi32(power), twice = _mm_set1_epi32(2 * power);
  for (int64_t k = 0; k < count; k += 4) {
    const __m128 v = _mm_loadu_ps(x + j + k);
    const __m128 threshold = _mm_mul_ps(_mm_and_ps(v, magnitude_mask), inverses);
    const __m128i kept = _mm_castps_si128(_mm_cmplt_ps(UniformOfStates(state), threshold));
    const __m128i negative = _mm_castps_si128(_mm_cmplt_ps(v, _mm_setzero_ps()));
    // +power, or -power for a negative value, where kept.
    const __m128i signed_power = _mm_sub_epi32(powers, _mm_and_si128(negative, twice));
    __m128i* at = reinterpret_cast<__m128i*>(bytes + k);
    _mm_storeu_si128(at, _mm_add_epi32(_mm_loadu_si128(at), _mm_and_si128(kept, signed_power)));
    state = _mm_add_epi32(state, state_step);
  }
  return count;
}

#endif  // __SSE2__

#if defined(__x86_64__)

// QsgdCodesSse2 eight at a time with AVX2 (which multiplies 32-bit lanes in one
// instruction); the same codes.
__attribute__((target("avx2"))) int64_t QsgdCodesAvx2(const float* x, int64_t j, int64_t count,
                                                      float factor, float levels,
                                                      int32_t sign_bit, uint64_t key,
                                                      int32_t* codes) {
  count = VectorCount(j, count, 8);
  const uint32_t step = Step(key);
  __m256i state = _mm256_add_epi32(
      _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(j) * step + Offset(key, j))),
      _mm256_mullo_epi32(_mm256_set1_epi32(static_cast<int>(step)),
                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
  const __m256i state_step = _mm256_set1_epi32(static_cast<int>(8 * step));
  const __m256 magnitude_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 factors = _mm256_set1_ps(factor), top = _mm256_set1_ps(levels);
  const __m256i signs = _mm256_set1_epi32(sign_bit);
  const __m256i mix1 = _mm256_set1_epi32(0x7FEB352D);
  const __m256i mix2 = _mm256_set1_epi32(static_cast<int>(0x846CA68Bu));
  const __m256 to_unit = _mm256_set1_ps(1.0f / 16777216.0f);
  for (int64_t k = 0; k < count; k += 8) {
    const __m256 v = _mm256_loadu_ps(x + j + k);
    __m256i u = _mm256_xor_si256(state, _mm256_srli_epi32(state, 16));  // Mix32
    u = _mm256_mullo_epi32(u, mix1);
    u = _mm256_xor_si256(u, _mm256_srli_epi32(u, 15));
    u = _mm256_mullo_epi32(u, mix2);
    u = _mm256_xor_si256(u, _mm256_srli_epi32(u, 16));
    const __m256 uniform = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(u, 8)), to_unit);
    const __m256 t = _mm256_min_ps(_mm256_mul_ps(_mm256_and_ps(v, magnitude_mask), factors), top);
    const __m256i lower = _mm256_cvttps_epi32(t);
    const __m256 fraction = _mm256_sub_ps(t, _mm256_cvtepi32_ps(lower));
    const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(uniform, fraction, _CMP_LT_OQ));
    const __m256i negative =
        _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
    const __m256i code =
        _mm256_or_si256(_mm256_sub_epi32(lower, up), _mm256_and_si256(negative, signs));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + k), code);
    state = _mm256_add_epi32(state, state_step);
  }
  return count;
}

#endif  // __x86_64__

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
#if defined(__x86_64__)
      if (!subnormal && UseAvx2()) {
        j += QsgdCodesAvx2(x, j, stretch_end - j, factor, levels, sign_bit, key,
                           codes + (j - start));
      }
#endif
#if defined(__SSE2__)
      if (!subnormal) {
        j += QsgdCodesSse2(x, j, stretch_end - j, factor, levels, sign_bit, key,
                           codes + (j - start));
      }
#endif
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
  // Each level's fraction of the norm, at most 1: a finite norm decodes finite (norm *
  // level / levels overflows for a norm within a factor `levels` of float's largest).
  float fractions[128];
  for (int32_t level = 0; level < sign_bit; ++level) {
    fractions[level] = static_cast<float>(level) / levels;
  }
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
        const float fraction = fractions[code & (sign_bit - 1)];
        out[j] = ((code & sign_bit) ? -fraction : fraction) * norm;
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
      int64_t i = start;
#if defined(__SSE2__)
      if (i < last) {
        i += TernaryDigitSse2(x, offset + i, last - i, inverse, kPowers[k], key,
                              bytes + (i - start));
      }
#endif
      for (; i < last; ++i) {
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
