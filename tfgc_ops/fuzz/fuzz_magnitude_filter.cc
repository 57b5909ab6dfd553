// libFuzzer target: FastSGD's threshold filter (magnitude_filter.h) on arbitrary values.
//
// Input: byte 0 picks float32 or float64 values and 1..4 blocks; bytes 1..8 are the
// factor as a double; the rest, read 4 or 8 bytes at a time, are the values (any bit
// pattern: NaN, Inf, -0.0, subnormals).
//
// Checks: each block's sum is exactly that of four partial sums by position mod 4; by
// blocks (the sums added in block order, as the op adds them), the sum is finite exactly
// when every value is, and then equals a naive double sum of |v| to 1e-9 of itself (both
// infinite where float64 magnitudes overflow the double sum); the candidates, appended
// block after block, are exactly the ascending positions a naive scan finds for the
// floor that sum * factor gives.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_check.h"
#include "magnitude_filter.h"

using tfgc_fuzz::Check;
namespace mf = ::tfgc::magnitude_filter;

namespace {

template <typename T>
void CheckFilter(const uint8_t* data, size_t size, int parts, double factor) {
  const int64_t n = static_cast<int64_t>(size / sizeof(T));
  std::vector<T> v(n);
  if (n > 0) std::memcpy(v.data(), data, n * sizeof(T));
  std::vector<int64_t> cuts = {0};
  for (int p = 1; p < parts; ++p) cuts.push_back(n * p / parts);
  cuts.push_back(n);
  double sum = 0.0;
  bool finite = true;
  for (int p = 0; p < parts; ++p) {
    const mf::MagnitudeSum part = mf::SumMagnitudes(v.data(), cuts[p], cuts[p + 1]);
    sum += part.sum;
    finite &= part.finite;
    // Bit for bit: partial sums by position mod 4, each in increasing position, then
    // (0 + 1) + (2 + 3), whatever the loops that compute them.
    double partial[4] = {0, 0, 0, 0};
    for (int64_t i = cuts[p]; i < cuts[p + 1]; ++i) {
      const double magnitude = std::fabs(static_cast<double>(v[i]));
      if (std::isfinite(magnitude)) partial[i & 3] += magnitude;
    }
    Check(part.sum == (partial[0] + partial[1]) + (partial[2] + partial[3]), "sum order");
  }
  double naive = 0.0;
  bool naive_finite = true;
  for (const T value : v) {
    if (std::isfinite(static_cast<double>(value))) {
      naive += std::fabs(static_cast<double>(value));
    } else {
      naive_finite = false;
    }
  }
  Check(finite == naive_finite, "finiteness");
  if (naive_finite && std::isinf(naive)) {
    Check(sum == naive, "sum overflow");  // float64 magnitudes near the largest double
  } else if (naive_finite) {
    Check(std::fabs(sum - naive) <= 1e-9 * naive, "sum");
  }
  const double floor = (finite ? sum : std::nan("")) * factor;
  std::vector<int64_t> positions;
  for (int p = 0; p < parts; ++p) {
    mf::AppendCandidates(v.data(), cuts[p], cuts[p + 1], floor, &positions);
  }
  std::vector<int64_t> expected;
  for (int64_t i = 0; i < n; ++i) {
    const double magnitude = std::fabs(static_cast<double>(v[i]));
    if (!std::isfinite(magnitude) || (magnitude > 0 && magnitude >= floor)) expected.push_back(i);
  }
  Check(positions == expected, "candidates");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 9) return 0;
  const int parts = 1 + (data[0] & 3);
  double factor;
  std::memcpy(&factor, data + 1, 8);
  if (data[0] & 4) {
    CheckFilter<double>(data + 9, size - 9, parts, factor);
  } else {
    CheckFilter<float>(data + 9, size - 9, parts, factor);
  }
  return 0;
}
