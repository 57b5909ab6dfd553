#include "sign_bits.h"

#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>  // part of every x86-64 CPU: no run-time dispatch needed
#endif
#if defined(__x86_64__)
#include <immintrin.h>  // AVX2, used only where UseAvx2()
#endif

#include "cpu_isa.h"

// Signum's update rounds the product and the sum, as TensorFlow's Mul and Add do.
#pragma GCC optimize("fp-contract=off")

namespace tfgc {
namespace sign_bits {
namespace {

// v if `keep` is all ones, +0.0 if it is zero: a mask on the bits rather than a branch
// (random signs would mispredict half the time) or a product (NaN * 0 is NaN).
inline double Masked(double v, uint64_t keep) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits &= keep;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// Adds eight values (the pad of a short last byte is given as -0.0 and masked out) to the
// partial sums; returns their sign bits, the first value in the most significant bit.
inline unsigned AddEight(const float v[8], int width, double upper[8], double lower[8]) {
  unsigned byte = 0;
  for (int k = 0; k < 8; ++k) {
    const uint64_t is_upper = v[k] >= 0.0f && k < width;
    const uint64_t keep = 0 - is_upper;
    byte |= static_cast<unsigned>(is_upper) << (7 - k);
    const double wide = static_cast<double>(v[k]);
    upper[k] += Masked(wide, keep);
    lower[k] += Masked(wide, ~keep);
  }
  return byte;
}

// Signum's update of one value: the product rounded, then the sum (this file is
// compiled with fp-contract off, so that no fused multiply-add merges the roundings
// where the target has one).
inline float Updated(float old, float x, float beta) {
  const float product = beta * old;
  return product + x;
}

#if defined(__SSE2__) || defined(__x86_64__)

// Bit i of a byte moved to bit 7 - i: movemask's lane order to the stream's.
constexpr struct ReversedBytes {
  uint8_t of[256];
  constexpr ReversedBytes() : of() {
    for (int b = 0; b < 256; ++b) {
      for (int i = 0; i < 8; ++i) of[b] |= static_cast<uint8_t>(((b >> i) & 1) << (7 - i));
    }
  }
} kReversed;

#endif

#if defined(__SSE2__)

// One half of a byte's partial sums in SSE2: values 2j and 2j + 1 of the eight, widened,
// added to upper[2j, 2j + 2) or lower[2j, 2j + 2) as AddEight adds them.
inline void AddTwo(__m128d wide, __m128d* upper, __m128d* lower) {
  const __m128d keep = _mm_cmpge_pd(wide, _mm_setzero_pd());  // NaN: not kept
  *upper = _mm_add_pd(*upper, _mm_and_pd(keep, wide));
  *lower = _mm_add_pd(*lower, _mm_andnot_pd(keep, wide));
}

// WholeBytesAvx2 in SSE2 (the loop every x86-64 CPU can run): the same values, bits and
// partial sums, four values per register.
template <bool kMomentum>
int64_t WholeBytesSse2(const float* x, const float* old, float beta, float* updated,
                       int64_t begin, int64_t end, uint8_t* out, double upper[8],
                       double lower[8], int64_t* upper_count) {
  __m128d up[4], low[4];
  for (int j = 0; j < 4; ++j) {
    up[j] = _mm_loadu_pd(upper + 2 * j);
    low[j] = _mm_loadu_pd(lower + 2 * j);
  }
  const __m128 betas = _mm_set1_ps(beta);
  const __m128 zero = _mm_setzero_ps();
  int64_t count = 0;
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m128 a = _mm_loadu_ps(x + i), b = _mm_loadu_ps(x + i + 4);
    if (kMomentum) {
      a = _mm_add_ps(_mm_mul_ps(betas, _mm_loadu_ps(old + i)), a);
      b = _mm_add_ps(_mm_mul_ps(betas, _mm_loadu_ps(old + i + 4)), b);
      _mm_storeu_ps(updated + i, a);
      _mm_storeu_ps(updated + i + 4, b);
    }
    const unsigned mask = static_cast<unsigned>(_mm_movemask_ps(_mm_cmpge_ps(a, zero)) |
                                                _mm_movemask_ps(_mm_cmpge_ps(b, zero)) << 4);
    out[i / 8] = kReversed.of[mask];
    count += __builtin_popcount(mask);
    AddTwo(_mm_cvtps_pd(a), &up[0], &low[0]);
    AddTwo(_mm_cvtps_pd(_mm_movehl_ps(a, a)), &up[1], &low[1]);
    AddTwo(_mm_cvtps_pd(b), &up[2], &low[2]);
    AddTwo(_mm_cvtps_pd(_mm_movehl_ps(b, b)), &up[3], &low[3]);
  }
  for (int j = 0; j < 4; ++j) {
    _mm_storeu_pd(upper + 2 * j, up[j]);
    _mm_storeu_pd(lower + 2 * j, low[j]);
  }
  *upper_count += count;
  return i;
}

#endif  // __SSE2__

#if defined(__x86_64__)

// The whole bytes of [begin, end) with AVX2: lane k of the accumulators is upper[k] and
// lower[k] of AddEight, each added in the same order, so the sums are bit for bit the
// scalar loop's. With kMomentum, the values are Signum's updated ones (beta * old + x,
// a product then a sum: the function's target has no FMA to contract them into), stored
// to `updated` as they are encoded. Returns the end of the bytes done and adds the
// count of values >= 0 to *upper_count.
template <bool kMomentum>
__attribute__((target("avx2"))) int64_t WholeBytesAvx2(const float* x, const float* old,
                                                       float beta, float* updated,
                                                       int64_t begin, int64_t end,
                                                       uint8_t* out, double upper[8],
                                                       double lower[8], int64_t* upper_count) {
  __m256d upper_low = _mm256_loadu_pd(upper), upper_high = _mm256_loadu_pd(upper + 4);
  __m256d lower_low = _mm256_loadu_pd(lower), lower_high = _mm256_loadu_pd(lower + 4);
  const __m256 betas = _mm256_set1_ps(beta);
  const __m256 zero = _mm256_setzero_ps();
  const __m256d zero_wide = _mm256_setzero_pd();
  int64_t count = 0;
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if (kMomentum) {
      v = _mm256_add_ps(_mm256_mul_ps(betas, _mm256_loadu_ps(old + i)), v);
      _mm256_storeu_ps(updated + i, v);
    }
    // Ordered compares: NaN is not >= 0, as in AddEight.
    const unsigned mask =
        static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(v, zero, _CMP_GE_OQ)));
    out[i / 8] = kReversed.of[mask];
    count += __builtin_popcount(mask);
    const __m256d low = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d high = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    const __m256d keep_low = _mm256_cmp_pd(low, zero_wide, _CMP_GE_OQ);
    const __m256d keep_high = _mm256_cmp_pd(high, zero_wide, _CMP_GE_OQ);
    upper_low = _mm256_add_pd(upper_low, _mm256_and_pd(keep_low, low));
    upper_high = _mm256_add_pd(upper_high, _mm256_and_pd(keep_high, high));
    lower_low = _mm256_add_pd(lower_low, _mm256_andnot_pd(keep_low, low));
    lower_high = _mm256_add_pd(lower_high, _mm256_andnot_pd(keep_high, high));
  }
  _mm256_storeu_pd(upper, upper_low);
  _mm256_storeu_pd(upper + 4, upper_high);
  _mm256_storeu_pd(lower, lower_low);
  _mm256_storeu_pd(lower + 4, lower_high);
  *upper_count += count;
  return i;
}

#endif  // __x86_64__

// Encode's loop on values already final (old == nullptr) or Signum's updated values.
SideSums EncodeSome(const float* x, const float* old, float beta, float* updated,
                    int64_t begin, int64_t end, uint8_t* out) {
  // Eight partial sums per side (one per bit position) break the chain of dependent
  // adds; they are combined in a fixed order, so the result depends only on [begin, end).
  double upper[8] = {}, lower[8] = {};
  int64_t upper_count = 0;
  int64_t i = begin;
#if defined(__x86_64__)
  if (UseAvx2()) {
    i = old == nullptr
            ? WholeBytesAvx2<false>(x, old, beta, updated, i, end, out, upper, lower,
                                    &upper_count)
            : WholeBytesAvx2<true>(x, old, beta, updated, i, end, out, upper, lower,
                                   &upper_count);
  }
#endif
#if defined(__SSE2__)
  i = old == nullptr
          ? WholeBytesSse2<false>(x, old, beta, updated, i, end, out, upper, lower,
                                  &upper_count)
          : WholeBytesSse2<true>(x, old, beta, updated, i, end, out, upper, lower,
                                 &upper_count);
#endif
  const float* values = old == nullptr ? x : updated;
  for (; i + 8 <= end; i += 8) {
    if (old != nullptr) {
      for (int k = 0; k < 8; ++k) updated[i + k] = Updated(old[i + k], x[i + k], beta);
    }
    const unsigned byte = AddEight(values + i, 8, upper, lower);
    upper_count += __builtin_popcount(byte);
    out[i / 8] = static_cast<uint8_t>(byte);
  }
  if (i < end) {
    float last[8] = {-0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f};
    const int width = static_cast<int>(end - i);
    for (int k = 0; k < width; ++k) {
      if (old != nullptr) updated[i + k] = Updated(old[i + k], x[i + k], beta);
      last[k] = values[i + k];
    }
    const unsigned byte = AddEight(last, width, upper, lower);
    upper_count += __builtin_popcount(byte);
    out[i / 8] = static_cast<uint8_t>(byte);
  }
  SideSums sums;
  for (int k = 0; k < 8; ++k) {
    sums.sum[0] += upper[k];
    sums.sum[1] += lower[k];
  }
  sums.count[0] = upper_count;
  sums.count[1] = (end - begin) - upper_count;
  return sums;
}

}  // namespace

SideSums Encode(const float* x, int64_t begin, int64_t end, uint8_t* out) {
  return EncodeSome(x, nullptr, 0.0f, nullptr, begin, end, out);
}

SideSums EncodeMomentum(const float* old, const float* x, float beta, int64_t begin,
                        int64_t end, float* updated, uint8_t* out) {
  return EncodeSome(x, old, beta, updated, begin, end, out);
}

}  // namespace sign_bits
}  // namespace tfgc
