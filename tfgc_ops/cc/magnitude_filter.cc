#include "magnitude_filter.h"

#include <emmintrin.h>  // SSE2, part of every x86-64 CPU: no run-time dispatch needed

#include <cfloat>
#include <cmath>
#include <limits>

namespace tfgc {
namespace magnitude_filter {
namespace {

// False for Inf and NaN (a comparison, which stays branch-free in the summing loop).
inline bool IsFinite(double magnitude) {
  return magnitude <= std::numeric_limits<double>::max();
}

// Adds |v_i| to partial[i mod 4] (four partial sums break the chain of dependent adds;
// the caller combines them in a fixed order), 0 for a value that is not finite.
template <typename T>
inline void AddMagnitude(const T* v, int64_t i, double partial[4], bool& finite) {
  const double magnitude = std::fabs(static_cast<double>(v[i]));
  const bool is_finite = IsFinite(magnitude);
  finite &= is_finite;
  partial[i & 3] += is_finite ? magnitude : 0.0;
}

MagnitudeSum Combine(const double partial[4], bool finite) {
  MagnitudeSum result;
  result.sum = (partial[0] + partial[1]) + (partial[2] + partial[3]);
  result.finite = finite;
  return result;
}

template <typename T>
void AppendCandidatesScalar(const T* v, int64_t begin, int64_t end, double floor,
                            std::vector<int64_t>* positions) {
  for (int64_t i = begin; i < end; ++i) {
    const double magnitude = std::fabs(static_cast<double>(v[i]));
    // Rare (the filter keeps few values), so a branch predicts well.
    if ((magnitude > 0.0 && magnitude >= floor) || !IsFinite(magnitude)) {
      positions->push_back(i);
    }
  }
}

}  // namespace

template <typename T>
MagnitudeSum SumMagnitudes(const T* v, int64_t begin, int64_t end) {
  double partial[4] = {0, 0, 0, 0};
  bool finite = true;
  for (int64_t i = begin; i < end; ++i) AddMagnitude(v, i, partial, finite);
  return Combine(partial, finite);
}

template <typename T>
void AppendCandidates(const T* v, int64_t begin, int64_t end, double floor,
                      std::vector<int64_t>* positions) {
  AppendCandidatesScalar(v, begin, end, floor, positions);
}

template <>
MagnitudeSum SumMagnitudes<float>(const float* v, int64_t begin, int64_t end) {
  // partial[k] adds the values with i = k (mod 4) in increasing i, as the scalar loop
  // does: lanes 0-1 of `low` and `high` hold partials 0-1 and 2-3 between the scalar
  // head and tail, so every sum is bit for bit the scalar one.
  double partial[4] = {0, 0, 0, 0};
  bool finite = true;
  int64_t i = begin;
  for (; i < end && (i & 3) != 0; ++i) AddMagnitude(v, i, partial, finite);
  __m128d low = _mm_loadu_pd(partial), high = _mm_loadu_pd(partial + 2);
  __m128d not_finite = _mm_setzero_pd();
  const __m128d largest = _mm_set1_pd(DBL_MAX);
  const __m128 magnitude_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
  for (; i + 4 <= end; i += 4) {
    const __m128 magnitude = _mm_and_ps(_mm_loadu_ps(v + i), magnitude_mask);
    const __m128d first = _mm_cvtps_pd(magnitude);
    const __m128d second = _mm_cvtps_pd(_mm_movehl_ps(magnitude, magnitude));
    const __m128d first_ok = _mm_cmple_pd(first, largest);  // false for Inf and NaN
    const __m128d second_ok = _mm_cmple_pd(second, largest);
    not_finite = _mm_or_pd(not_finite, _mm_andnot_pd(_mm_and_pd(first_ok, second_ok),
                                                     _mm_castsi128_pd(_mm_set1_epi32(-1))));
    low = _mm_add_pd(low, _mm_and_pd(first_ok, first));
    high = _mm_add_pd(high, _mm_and_pd(second_ok, second));
  }
  _mm_storeu_pd(partial, low);
  _mm_storeu_pd(partial + 2, high);
  finite &= _mm_movemask_pd(not_finite) == 0;
  for (; i < end; ++i) AddMagnitude(v, i, partial, finite);
  return Combine(partial, finite);
}

template <>
void AppendCandidates<float>(const float* v, int64_t begin, int64_t end, double floor,
                             std::vector<int64_t>* positions) {
  // Eight values at a time are screened in float against the float nearest the floor,
  // which is at most the least float at or above it, so no candidate is missed (a NaN
  // floor lets every nonzero value through); groups with a possible candidate take the
  // exact test of the scalar loop.
  const __m128 bound4 = _mm_set1_ps(static_cast<float>(floor));
  const __m128 magnitude_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
  const __m128 zero = _mm_setzero_ps();
  // Not below the bound (or NaN) and not zero (or NaN): Inf and NaN always pass.
  auto screen = [&](const float* at) {
    const __m128 magnitude = _mm_and_ps(_mm_loadu_ps(at), magnitude_mask);
    return _mm_and_ps(_mm_cmpnlt_ps(magnitude, bound4), _mm_cmpnle_ps(magnitude, zero));
  };
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    if (_mm_movemask_ps(_mm_or_ps(screen(v + i), screen(v + i + 4))) != 0) {
      AppendCandidatesScalar(v, i, i + 8, floor, positions);
    }
  }
  AppendCandidatesScalar(v, i, end, floor, positions);
}

template MagnitudeSum SumMagnitudes<double>(const double*, int64_t, int64_t);
template void AppendCandidates<double>(const double*, int64_t, int64_t, double,
                                       std::vector<int64_t>*);

}  // namespace magnitude_filter
}  // namespace tfgc
