#include "quartic_fold.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tfgc {
namespace quartic_fold {
namespace {

// x + 1.5 * 2^23 - 1.5 * 2^23 rounds |x| < 2^22 to the nearest integer, ties to even,
// under the default rounding mode; unlike rintf it vectorizes without SSE4.1.
constexpr float kRoundingMagic = 12582912.0f;
inline float RoundHalfEven(float v) { return (v + kRoundingMagic) - kRoundingMagic; }

// q + 1 in {0, 1, 2} for the 3-value of x / scale (clamped, so that no input can make a
// byte above 242).
inline float Digit(float x, float scale) {
  return std::min(std::max(RoundHalfEven(x / scale), -1.0f), 1.0f) + 1.0f;
}

// The five 3-values of each quartic byte, as floats.
struct DigitTable {
  float of[kMaxQuartic + 1][5];
  constexpr DigitTable() : of() {
    for (int b = 0; b <= kMaxQuartic; ++b) {
      for (int k = 0, v = b, power = 81; k < 5; ++k, power /= 3) {
        of[b][k] = static_cast<float>(v / power - 1);
        v %= power;
      }
    }
  }
};
constexpr DigitTable kDigits;

}  // namespace

float LargestMagnitude(const float* x, int64_t n) {
  float largest = 0.0f;
  bool finite = true;
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
  const __m128 max_finite = _mm_set1_ps(FLT_MAX);
  __m128 top0 = _mm_setzero_ps(), top1 = _mm_setzero_ps();
  __m128i bad = _mm_setzero_si128();
  for (; i + 8 <= n; i += 8) {
    const __m128 a = _mm_and_ps(_mm_loadu_ps(x + i), abs_mask);
    const __m128 b = _mm_and_ps(_mm_loadu_ps(x + i + 4), abs_mask);
    top0 = _mm_max_ps(top0, a);
    top1 = _mm_max_ps(top1, b);
    // |v| <= FLT_MAX is false for Inf and NaN.
    bad = _mm_or_si128(bad, _mm_castps_si128(_mm_cmpnle_ps(a, max_finite)));
    bad = _mm_or_si128(bad, _mm_castps_si128(_mm_cmpnle_ps(b, max_finite)));
  }
  float lanes[4];
  _mm_storeu_ps(lanes, _mm_max_ps(top0, top1));
  for (float v : lanes) largest = std::max(largest, v);
  finite = _mm_movemask_epi8(bad) == 0;
#endif
  for (; i < n; ++i) {
    const float a = std::fabs(x[i]);
    finite = finite && a <= FLT_MAX;
    largest = std::max(largest, a);
  }
  return finite ? largest : __builtin_nanf("");
}

void Fold(const float* x, int64_t n, float scale, int64_t begin, int64_t end, uint8_t* out) {
  const int64_t g = GroupsFor(n);
  const float *x0 = x, *x1 = x + g, *x2 = x + 2 * g, *x3 = x + 3 * g, *x4 = x + 4 * g;
  // Bytes below `full` have all five values; the others take the pad's 3-value 0.
  const int64_t full = std::clamp<int64_t>(n - 4 * g, begin, end);
  int64_t i = begin;
#if defined(__SSE2__)
  // Sixteen bytes at a time, with the same float operations as Digit (gcc does not
  // vectorize the scalar loop: the clamps are branches for it).
  const __m128 scale4 = _mm_set1_ps(scale), magic = _mm_set1_ps(kRoundingMagic);
  const __m128 one = _mm_set1_ps(1.0f), minus_one = _mm_set1_ps(-1.0f);
  auto digits = [=](const float* from) {
    const __m128 q = _mm_sub_ps(_mm_add_ps(_mm_div_ps(_mm_loadu_ps(from), scale4), magic), magic);
    return _mm_add_ps(_mm_min_ps(_mm_max_ps(q, minus_one), one), one);
  };
  auto four_bytes = [&](int64_t at) {
    __m128 byte = _mm_mul_ps(digits(x0 + at), _mm_set1_ps(81.0f));
    byte = _mm_add_ps(byte, _mm_mul_ps(digits(x1 + at), _mm_set1_ps(27.0f)));
    byte = _mm_add_ps(byte, _mm_mul_ps(digits(x2 + at), _mm_set1_ps(9.0f)));
    byte = _mm_add_ps(byte, _mm_mul_ps(digits(x3 + at), _mm_set1_ps(3.0f)));
    return _mm_cvttps_epi32(_mm_add_ps(byte, digits(x4 + at)));  // 0..242
  };
  for (; i + 16 <= full; i += 16) {
    const __m128i low = _mm_packs_epi32(four_bytes(i), four_bytes(i + 4));
    const __m128i high = _mm_packs_epi32(four_bytes(i + 8), four_bytes(i + 12));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_packus_epi16(low, high));
  }
#endif
  for (; i < full; ++i) {
    const float byte = Digit(x0[i], scale) * 81 + Digit(x1[i], scale) * 27 +
                       Digit(x2[i], scale) * 9 + Digit(x3[i], scale) * 3 + Digit(x4[i], scale);
    out[i] = static_cast<uint8_t>(static_cast<int>(byte));
  }
  for (int64_t i = full; i < end; ++i) {
    int byte = 0;
    for (int k = 0; k < 5; ++k) {
      const int64_t j = k * g + i;
      byte = byte * 3 + (j < n ? static_cast<int>(Digit(x[j], scale)) : 1);
    }
    out[i] = static_cast<uint8_t>(byte);
  }
}

void Unfold(const uint8_t* in, int64_t n, float scale, int64_t begin, int64_t end, float* out) {
  const int64_t g = GroupsFor(n);
  float *out0 = out, *out1 = out + g, *out2 = out + 2 * g, *out3 = out + 3 * g,
        *out4 = out + 4 * g;
  const int64_t full = std::clamp<int64_t>(n - 4 * g, begin, end);
  for (int64_t i = begin; i < full; ++i) {
    const float* d = kDigits.of[in[i]];
    out0[i] = d[0] * scale;
    out1[i] = d[1] * scale;
    out2[i] = d[2] * scale;
    out3[i] = d[3] * scale;
    out4[i] = d[4] * scale;
  }
  for (int64_t i = full; i < end; ++i) {
    for (int k = 0; k < 5; ++k) {
      const int64_t j = k * g + i;
      if (j < n) out[j] = kDigits.of[in[i]][k] * scale;
    }
  }
}

}  // namespace quartic_fold
}  // namespace tfgc
