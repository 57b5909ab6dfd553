#include "uniform_quantize.h"

#include <emmintrin.h>  // SSE2, part of every x86-64 CPU: no run-time dispatch needed

#include <cmath>
#include <cstring>
#include <limits>

#include "pack_eight.h"

namespace tfgc {
namespace uniform_quantize {
namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();

// Adding and subtracting 1.5 * 2^23 rounds a float of magnitude below 2^22 to an integer,
// ties to even (the default rounding mode), as tf.round does: no library call per value.
constexpr float kRoundingMagic = 12582912.0f;

float LowestLane(__m128 v) { return _mm_cvtss_f32(v); }

float Smallest(__m128 v) {
  v = _mm_min_ps(v, _mm_movehl_ps(v, v));
  return LowestLane(_mm_min_ss(v, _mm_shuffle_ps(v, v, 1)));
}

float Largest(__m128 v) {
  v = _mm_max_ps(v, _mm_movehl_ps(v, v));
  return LowestLane(_mm_max_ss(v, _mm_shuffle_ps(v, v, 1)));
}

double Total(__m128d v) {
  double lanes[2];
  _mm_storeu_pd(lanes, v);
  return lanes[0] + lanes[1];
}

// Four values' codes as int32. max_ps returns its second operand when the first is NaN,
// so a NaN quotient becomes 0 before the upper clamp.
inline __m128i Codes(__m128 x, __m128 low, __m128 divisor, __m128 levels) {
  __m128 q = _mm_div_ps(_mm_sub_ps(x, low), divisor);
  q = _mm_min_ps(_mm_max_ps(q, _mm_setzero_ps()), levels);
  const __m128 magic = _mm_set1_ps(kRoundingMagic);
  return _mm_cvttps_epi32(_mm_sub_ps(_mm_add_ps(q, magic), magic));
}

inline void Reconstruct(__m128i codes, __m128 low, __m128 step, float* out) {
  _mm_storeu_ps(out, _mm_add_ps(low, _mm_mul_ps(_mm_cvtepi32_ps(codes), step)));
}

}  // namespace

Range Measure(const float* x, int64_t begin, int64_t end) {
  __m128 low = _mm_set1_ps(kInfinity), high = _mm_set1_ps(-kInfinity);
  __m128 not_finite = _mm_setzero_ps();  // lanes where some x - x was NaN (x was inf/NaN)
  __m128d sums[4] = {_mm_setzero_pd(), _mm_setzero_pd(), _mm_setzero_pd(), _mm_setzero_pd()};
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m128 a = _mm_loadu_ps(x + i), b = _mm_loadu_ps(x + i + 4);
    not_finite = _mm_or_ps(not_finite, _mm_cmpunord_ps(_mm_sub_ps(a, a), _mm_sub_ps(b, b)));
    low = _mm_min_ps(low, _mm_min_ps(a, b));
    high = _mm_max_ps(high, _mm_max_ps(a, b));
    const __m128d parts[4] = {_mm_cvtps_pd(a), _mm_cvtps_pd(_mm_movehl_ps(a, a)),
                              _mm_cvtps_pd(b), _mm_cvtps_pd(_mm_movehl_ps(b, b))};
    for (int k = 0; k < 4; ++k) sums[k] = _mm_add_pd(sums[k], _mm_mul_pd(parts[k], parts[k]));
  }
  Range range;
  range.low = Smallest(low);
  range.high = Largest(high);
  range.finite = _mm_movemask_ps(not_finite) == 0;
  range.sum_squares = (Total(sums[0]) + Total(sums[1])) + (Total(sums[2]) + Total(sums[3]));
  for (; i < end; ++i) {
    const float v = x[i];
    range.finite = range.finite && std::isfinite(v);
    range.low = v < range.low ? v : range.low;
    range.high = v > range.high ? v : range.high;
    range.sum_squares += static_cast<double>(v) * v;
  }
  return range;
}

Range Combine(const Range& a, const Range& b) {
  Range range;
  range.low = b.low < a.low ? b.low : a.low;
  range.high = b.high > a.high ? b.high : a.high;
  range.finite = a.finite && b.finite;
  range.sum_squares = a.sum_squares + b.sum_squares;
  return range;
}

void Quantize(const float* x, int64_t begin, int64_t end, float low, float step, int bits,
              uint8_t* packed, float* reconstructed) {
  const __m128 low4 = _mm_set1_ps(low), step4 = _mm_set1_ps(step);
  const __m128 divisor = _mm_set1_ps(step > 0.0f ? step : 1.0f);
  const __m128 levels = _mm_set1_ps(static_cast<float>((1 << bits) - 1));
  // Every byte up to here is written in order by this call, so a group may spill into
  // the bytes of the groups after it.
  const int64_t bytes_end = (end * bits + 7) / 8;
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m128i first = Codes(_mm_loadu_ps(x + i), low4, divisor, levels);
    const __m128i second = Codes(_mm_loadu_ps(x + i + 4), low4, divisor, levels);
    const int64_t offset = i / 8 * bits;
    bit_packing::PackEight(first, second, bits, bits, offset + 8 <= bytes_end, packed + offset);
    if (reconstructed != nullptr) {
      Reconstruct(first, low4, step4, reconstructed + i);
      Reconstruct(second, low4, step4, reconstructed + i + 4);
    }
  }
  if (i == end) return;
  // The last, short group: padded with NaN, whose code is 0 (the stream's zero padding).
  const int width = static_cast<int>(end - i);
  alignas(16) float last[8];
  for (int k = 0; k < 8; ++k) last[k] = k < width ? x[i + k] : std::nanf("");
  const __m128i first = Codes(_mm_load_ps(last), low4, divisor, levels);
  const __m128i second = Codes(_mm_load_ps(last + 4), low4, divisor, levels);
  bit_packing::PackEight(first, second, bits, (width * bits + 7) / 8, false, packed + i / 8 * bits);
  if (reconstructed != nullptr) {
    alignas(16) float values[8];
    Reconstruct(first, low4, step4, values);
    Reconstruct(second, low4, step4, values + 4);
    for (int k = 0; k < width; ++k) reconstructed[i + k] = values[k];
  }
}

}  // namespace uniform_quantize
}  // namespace tfgc
