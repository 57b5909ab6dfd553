#include "log_levels.h"

#include <emmintrin.h>  // SSE2, part of every x86-64 CPU: no run-time dispatch needed

#include <algorithm>
#include <cmath>
#include <cstring>

#include "bit_packing.h"
#include "pack_eight.h"

namespace tfgc {
namespace log_levels {
namespace {

constexpr int64_t kChunk = 1024;  // codes unpacked at a time (a multiple of 8)

constexpr uint32_t kMagnitudeBits = 0x7FFFFFFF;
constexpr uint32_t kInfinityBits = 0x7F800000;
constexpr uint32_t kSmallestNormalBits = 0x00800000;  // 2^-126
constexpr int kExponentBias = 127;
constexpr int kSignificandBits = 23;
// A subnormal is m * 2^-149 for an integer m < 2^23, which converts to float exactly.
constexpr int kSubnormalExponent = -149;
// Added to a normal magnitude's bits, this carries into the exponent exactly when the
// significand is at least sqrt(2), i.e. when log2 |x| rounds up: 0x3504F4 is the least
// 23-bit fraction f with 1 + f / 2^23 > sqrt(2) (no float equals sqrt(2)).
constexpr uint32_t kRoundUpAtSqrt2 = (1u << kSignificandBits) - 0x3504F4;

// The encoder works on the floats' bits, and does float arithmetic only on integers
// converted exactly and on normal powers of two: TensorFlow runs kernels with
// denormals-are-zero, under which a float comparison would read a subnormal as 0.

// Four values' levels (log_levels.h; 0 when not sent) from their magnitudes' bits.
// kGeneral handles every input; without it, the caller guarantees that the window lies
// above 2^-126 and below 2^128 (full_scale - levels + 1 > -126 and full_scale < 128):
// then 0, subnormals, Inf and NaN, read as normal floats, fall outside the window anyway.
template <bool kGeneral>
inline __m128i Levels(__m128i magnitude, __m128i level_offset, __m128i levels_plus_one) {
  __m128i normalized = magnitude, exponent_shift = _mm_setzero_si128();
  if (kGeneral) {
    // A subnormal's bits are its integer m; m as a float has the exponent of log2 m.
    const __m128i subnormal =
        _mm_cmplt_epi32(magnitude, _mm_set1_epi32(static_cast<int>(kSmallestNormalBits)));
    const __m128i as_integer = _mm_castps_si128(_mm_cvtepi32_ps(magnitude));
    normalized = _mm_or_si128(_mm_and_si128(subnormal, as_integer),
                              _mm_andnot_si128(subnormal, magnitude));
    exponent_shift = _mm_and_si128(subnormal, _mm_set1_epi32(kSubnormalExponent));
  }
  const __m128i biased = _mm_add_epi32(
      _mm_srli_epi32(_mm_add_epi32(normalized, _mm_set1_epi32(static_cast<int>(kRoundUpAtSqrt2))),
                     kSignificandBits),
      exponent_shift);  // round(log2 |x|) + 127
  const __m128i level = _mm_sub_epi32(level_offset, biased);  // fsr - round(log2 |x|) + 1
  __m128i kept = _mm_and_si128(_mm_cmpgt_epi32(level, _mm_setzero_si128()),
                               _mm_cmplt_epi32(level, levels_plus_one));
  if (kGeneral) {
    const __m128i finite_nonzero = _mm_and_si128(
        _mm_cmpgt_epi32(magnitude, _mm_setzero_si128()),
        _mm_cmplt_epi32(magnitude, _mm_set1_epi32(static_cast<int>(kInfinityBits))));
    kept = _mm_and_si128(kept, finite_nonzero);
  }
  return _mm_and_si128(kept, level);
}

// Decode's values for four levels and sign bits (bit 31): +-scale * 2^(1 - level), +-0
// for level 0 (scale is 2^fsr > 0); for a scale that is not finite, +-scale.
template <bool kFiniteScale>
inline void StoreDecoded(__m128i level, __m128i sign, __m128 scale, float* out) {
  __m128i magnitude = _mm_castps_si128(scale);
  if (kFiniteScale) {
    const __m128i power = _mm_and_si128(
        _mm_cmpgt_epi32(level, _mm_setzero_si128()),
        _mm_slli_epi32(_mm_sub_epi32(_mm_set1_epi32(kExponentBias + 1), level),
                       kSignificandBits));
    magnitude = _mm_castps_si128(_mm_mul_ps(scale, _mm_castsi128_ps(power)));
  }
  _mm_storeu_ps(out, _mm_castsi128_ps(_mm_xor_si128(magnitude, sign)));
}

// Encode (log_levels.h) with the checks that the window and the scale need.
template <bool kGeneral, bool kFiniteScale>
void EncodeWith(const float* x, int64_t begin, int64_t end, int bits, int full_scale,
                float scale, uint8_t* packed, float* decoded) {
  const int32_t levels = (1 << (bits - 1)) - 1;
  const __m128i level_offset = _mm_set1_epi32(full_scale + kExponentBias + 1);
  const __m128i levels_plus_one = _mm_set1_epi32(levels + 1);
  const __m128i magnitude_bits = _mm_set1_epi32(static_cast<int>(kMagnitudeBits));
  const __m128 scale4 = _mm_set1_ps(scale);
  // Eight values from `in`: their codes packed at `out` (spilling past its `bytes` when
  // `spill`), their decoded values to `values` unless it is null.
  auto encode_eight = [=](const float* in, int bytes, bool spill, uint8_t* out, float* values) {
    __m128i code[2];
    for (int h = 0; h < 2; ++h) {
      const __m128i x_bits = _mm_castps_si128(_mm_loadu_ps(in + 4 * h));
      const __m128i sign = _mm_andnot_si128(magnitude_bits, x_bits);
      const __m128i level =
          Levels<kGeneral>(_mm_and_si128(x_bits, magnitude_bits), level_offset, levels_plus_one);
      code[h] = _mm_or_si128(level, _mm_srli_epi32(sign, 32 - bits));
      if (values != nullptr) StoreDecoded<kFiniteScale>(level, sign, scale4, values + 4 * h);
    }
    bit_packing::PackEight(code[0], code[1], bits, bytes, spill, out);
  };
  // Every byte up to here is written in order by this call, so a group may spill into
  // the bytes of the groups after it.
  const int64_t bytes_end = (end * bits + 7) / 8;
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const int64_t offset = i / 8 * bits;
    encode_eight(x + i, bits, offset + 8 <= bytes_end, packed + offset,
                 decoded != nullptr ? decoded + i : nullptr);
  }
  if (i == end) return;
  // The last, short group, padded with zeros, whose code is 0 (the stream's padding).
  const int width = static_cast<int>(end - i);
  alignas(16) float last[8] = {};
  alignas(16) float last_decoded[8];
  std::copy(x + i, x + end, last);
  encode_eight(last, (width * bits + 7) / 8, false, packed + i / 8 * bits,
               decoded != nullptr ? last_decoded : nullptr);
  if (decoded != nullptr) std::copy(last_decoded, last_decoded + width, decoded + i);
}

// 2^(1 - level) for level in 1..127, built from its exponent bits (a normal float), and 0
// for level 0: an integer select, no branch.
float PowerOfTwo(int32_t level) {
  const uint32_t bits = level > 0 ? static_cast<uint32_t>(128 - level) << 23 : 0u;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// `value` with its sign bit cleared when `clear`, branch-free.
float ClearSignIf(float value, bool clear) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  bits &= ~(static_cast<uint32_t>(clear) << 31);
  std::memcpy(&value, &bits, sizeof(bits));
  return value;
}

// `magnitude` with its sign bit flipped when `negative` (so -0.0 for a negative zero),
// branch-free: signs are coin flips.
float Signed(float magnitude, bool negative) {
  uint32_t bits;
  std::memcpy(&bits, &magnitude, sizeof(bits));
  bits ^= static_cast<uint32_t>(negative) << 31;
  std::memcpy(&magnitude, &bits, sizeof(bits));
  return magnitude;
}

}  // namespace

int FullScale(float largest) {
  uint32_t bits;
  std::memcpy(&bits, &largest, sizeof(bits));
  if (bits == 0 || bits >= kInfinityBits) return 0;  // 0, negative (sign bit), Inf or NaN
  if (bits < kSmallestNormalBits) {  // m * 2^-149: ceil(log2 m) - 149
    const int floor_log2 = 31 - __builtin_clz(bits);
    return floor_log2 + ((bits & (bits - 1)) != 0) + kSubnormalExponent;
  }
  const int exponent = static_cast<int>(bits >> kSignificandBits) - kExponentBias;
  return exponent + ((bits & ((1u << kSignificandBits) - 1)) != 0);
}

float Scale(int full_scale) {
  // Built from its bits: ldexp would flush a subnormal result under TensorFlow's
  // flush-to-zero.
  uint32_t bits = kInfinityBits;  // 2^128 and above
  if (full_scale < kSubnormalExponent) {
    bits = 0;
  } else if (full_scale < 1 - kExponentBias) {
    bits = 1u << (full_scale - kSubnormalExponent);
  } else if (full_scale <= kExponentBias) {
    bits = static_cast<uint32_t>(full_scale + kExponentBias) << kSignificandBits;
  }
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return scale;
}

void Encode(const float* x, int64_t begin, int64_t end, int bits, int full_scale, float scale,
            uint8_t* packed, float* decoded) {
  const int levels = (1 << (bits - 1)) - 1;
  const bool general = full_scale - levels + 1 <= 1 - kExponentBias || full_scale > kExponentBias;
  const bool finite_scale = std::isfinite(scale);
  if (general) {
    (finite_scale ? EncodeWith<true, true> : EncodeWith<true, false>)(
        x, begin, end, bits, full_scale, scale, packed, decoded);
  } else {
    (finite_scale ? EncodeWith<false, true> : EncodeWith<false, false>)(
        x, begin, end, bits, full_scale, scale, packed, decoded);
  }
}

void Decode(const uint8_t* packed, int64_t n, int bits, float scale, int64_t begin,
            int64_t end, float* out) {
  const int32_t sign_bit = 1 << (bits - 1);
  const bool finite = std::isfinite(scale);
  int32_t codes[kChunk];
  for (int64_t start = begin; start < end; start += kChunk) {
    const int64_t stop = std::min(start + kChunk, end);
    bit_packing::Unpack(packed + start * bits / 8, stop - start, bits, codes);
    for (int64_t j = start; j < stop; ++j) {
      const int32_t code = codes[j - start];
      const int32_t level = code & (sign_bit - 1);
      // Level 0 is +0 before the sign, also for a (malformed) negative scale: the sign
      // bit of the product scale * 0 is cleared with integer operations (a select here
      // keeps the loop from vectorizing, 3-4x slower).
      const float product = ClearSignIf(scale * PowerOfTwo(level), level == 0);
      out[j] = Signed(finite ? product : scale, (code & sign_bit) != 0);
    }
  }
}

}  // namespace log_levels
}  // namespace tfgc
