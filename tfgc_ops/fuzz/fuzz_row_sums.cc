// libFuzzer target: a sparse gradient's rows summed by distinct index (row_sums.h).
//
// Input: byte 0 picks int32 or int64 indices and the row size (0..3); bytes 1..8 are
// num_rows as an int64 (any value; reduced to [0, 2^40] in magnitude so that wide ranges
// reach the sorting path); the rest, read 4 or 8 bytes at a time, are the indices (any
// value, out of range too), and row i's values are i * row_size + j.
//
// Checks: CheckRange finds exactly the first index outside [0, num_rows) and whether the
// indices before it ascend strictly; when all are in range, the distinct indices are
// those of a std::map, ascending, and the sums equal the map's sums added in position
// order, bit for bit.
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "fuzz_check.h"
#include "row_sums.h"

using tfgc_fuzz::Check;
namespace rs = ::tfgc::row_sums;

namespace {

template <typename Index>
void CheckRowSums(const uint8_t* data, size_t size, int64_t num_rows, int64_t row_size) {
  const int64_t n = static_cast<int64_t>(size / sizeof(Index));
  std::vector<Index> indices(n);
  if (n > 0) std::memcpy(indices.data(), data, n * sizeof(Index));
  const rs::RangeCheck check = rs::CheckRange(indices.data(), n, num_rows);
  int64_t first_out = -1;
  bool ascending = true;
  for (int64_t i = 0; i < n && first_out < 0; ++i) {
    if (indices[i] < 0 || static_cast<int64_t>(indices[i]) >= num_rows) {
      first_out = i;
    } else if (i > 0 && indices[i] <= indices[i - 1]) {
      ascending = false;
    }
  }
  Check(check.first_out_of_range == first_out, "first out of range");
  if (first_out >= 0) return;
  Check(check.ascending == ascending, "ascending");

  std::vector<float> rows(n * row_size);
  for (int64_t k = 0; k < n * row_size; ++k) rows[k] = static_cast<float>(k) * 0.37f - 5.0f;
  std::map<int64_t, std::vector<float>> expected;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float>& sum = expected[indices[i]];
    sum.resize(row_size, 0.0f);
    for (int64_t j = 0; j < row_size; ++j) sum[j] += rows[i * row_size + j];
  }
  const rs::DistinctIndices<Index> distinct(indices.data(), n, num_rows, check);
  Check(distinct.size() == static_cast<int64_t>(expected.size()), "distinct count");
  std::vector<int64_t> ascending_out(distinct.size());
  distinct.CopyAscending(ascending_out.data());
  std::vector<float> sums(distinct.size() * row_size, 0.0f);
  distinct.AddRows(rows.data(), row_size, sums.data());
  int64_t k = 0;
  for (const auto& [index, sum] : expected) {
    Check(ascending_out[k] == index, "distinct indices");
    Check(row_size == 0 ||
              std::memcmp(sums.data() + k * row_size, sum.data(), row_size * sizeof(float)) == 0,
          "sums");
    ++k;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 9) return 0;
  const int64_t row_size = (data[0] >> 1) & 3;
  int64_t num_rows;
  std::memcpy(&num_rows, data + 1, 8);
  num_rows %= (int64_t{1} << 40) + 1;  // sign kept: a negative num_rows rejects every index
  if (data[0] & 1) {
    CheckRowSums<int64_t>(data + 9, size - 9, num_rows, row_size);
  } else {
    CheckRowSums<int32_t>(data + 9, size - 9, num_rows, row_size);
  }
  return 0;
}
