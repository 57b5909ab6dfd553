// FastSGD's threshold filter (its Algorithm 1, with the early stop), free of TensorFlow:
// the sum of |v| and the positions of the values that can pass, in two passes over v
// instead of a chain of elementwise TensorFlow ops over float64 copies.
//
// sum = sum of |v_i| over the finite v_i, in double. A value is a candidate when
// 0 < |v_i| and |v_i| >= floor (floor = sum as received * b^-tau), or when it is not
// finite (so that the caller sees it).
#ifndef TFGC_OPS_CC_MAGNITUDE_FILTER_H_
#define TFGC_OPS_CC_MAGNITUDE_FILTER_H_

#include <cstdint>
#include <vector>

namespace tfgc {
namespace magnitude_filter {

struct MagnitudeSum {
  double sum = 0.0;  // of |v| over the finite values
  bool finite = true;
};

// Sum of |v| over the finite values of v[begin, end), added in index order.
template <typename T>
MagnitudeSum SumMagnitudes(const T* v, int64_t begin, int64_t end);

// Appends the candidates' positions in [begin, end), ascending, to `positions`.
template <typename T>
void AppendCandidates(const T* v, int64_t begin, int64_t end, double floor,
                      std::vector<int64_t>* positions);

// float input runs SSE2 loops with the same sums and candidates.
template <>
MagnitudeSum SumMagnitudes<float>(const float* v, int64_t begin, int64_t end);
template <>
void AppendCandidates<float>(const float* v, int64_t begin, int64_t end, double floor,
                             std::vector<int64_t>* positions);

}  // namespace magnitude_filter
}  // namespace tfgc

#endif  // TFGC_OPS_CC_MAGNITUDE_FILTER_H_
