#include "magnitude_filter.h"

#include <cmath>
#include <limits>

namespace tfgc {
namespace magnitude_filter {
namespace {

// False for Inf and NaN (a comparison, which stays branch-free in the summing loop).
inline bool IsFinite(double magnitude) {
  return magnitude <= std::numeric_limits<double>::max();
}

}  // namespace

template <typename T>
MagnitudeSum SumMagnitudes(const T* v, int64_t begin, int64_t end) {
  // Four partial sums break the chain of dependent adds; combined in a fixed order.
  double partial[4] = {0, 0, 0, 0};
  bool finite = true;
  for (int64_t i = begin; i < end; ++i) {
    const double magnitude = std::fabs(static_cast<double>(v[i]));
    const bool is_finite = IsFinite(magnitude);
    finite &= is_finite;
    partial[i & 3] += is_finite ? magnitude : 0.0;
  }
  MagnitudeSum result;
  result.sum = (partial[0] + partial[1]) + (partial[2] + partial[3]);
  result.finite = finite;
  return result;
}

template <typename T>
void AppendCandidates(const T* v, int64_t begin, int64_t end, double floor,
                      std::vector<int64_t>* positions) {
  for (int64_t i = begin; i < end; ++i) {
    const double magnitude = std::fabs(static_cast<double>(v[i]));
    // Rare (the filter keeps few values), so a branch predicts well.
    if ((magnitude > 0.0 && magnitude >= floor) || !IsFinite(magnitude)) {
      positions->push_back(i);
    }
  }
}

template MagnitudeSum SumMagnitudes<float>(const float*, int64_t, int64_t);
template MagnitudeSum SumMagnitudes<double>(const double*, int64_t, int64_t);
template void AppendCandidates<float>(const float*, int64_t, int64_t, double,
                                      std::vector<int64_t>*);
template void AppendCandidates<double>(const double*, int64_t, int64_t, double,
                                       std::vector<int64_t>*);

}  // namespace magnitude_filter
}  // namespace tfgc
