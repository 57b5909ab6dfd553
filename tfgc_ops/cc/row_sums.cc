#include "row_sums.h"

#include <algorithm>
#include <utility>

namespace tfgc {
namespace row_sums {
namespace {

// The bitmap is used while it has at most this many 64-bit words per index (plus a
// fixed allowance): scanning its words then costs less than sorting the indices.
constexpr int64_t kWordsPerIndex = 4;
constexpr int64_t kFreeWords = 1 << 14;

}  // namespace

template <typename Index>
RangeCheck CheckRange(const Index* indices, int64_t n, int64_t num_rows) {
  RangeCheck check;
  for (int64_t i = 0; i < n; ++i) {
    if (indices[i] < 0 || static_cast<int64_t>(indices[i]) >= num_rows) {
      check.first_out_of_range = i;
      return check;
    }
    if (i > 0 && indices[i] <= indices[i - 1]) check.ascending = false;
  }
  return check;
}

template <typename Index>
DistinctIndices<Index>::DistinctIndices(const Index* indices, int64_t n, int64_t num_rows,
                                        const RangeCheck& check)
    : indices_(indices), n_(n), given_ascending_(check.ascending) {
  if (given_ascending_) return;
  const int64_t words = num_rows / 64 + 1;
  if (words <= kFreeWords + kWordsPerIndex * n) {
    words_.assign(words, Word{0, 0});
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t index = static_cast<uint64_t>(indices[i]);
      words_[index >> 6].bits |= uint64_t{1} << (index & 63);
    }
    for (int64_t w = 0; w < words; ++w) {
      words_[w].before = static_cast<int64_t>(ascending_.size());
      for (uint64_t word = words_[w].bits; word != 0; word &= word - 1) {
        ascending_.push_back(w * 64 + __builtin_ctzll(word));
      }
    }
    return;
  }
  std::vector<std::pair<int64_t, int64_t>> order(n);  // (index, position)
  for (int64_t i = 0; i < n; ++i) order[i] = {static_cast<int64_t>(indices[i]), i};
  std::sort(order.begin(), order.end());
  places_.resize(n);
  for (const auto& [index, position] : order) {
    if (ascending_.empty() || ascending_.back() != index) ascending_.push_back(index);
    places_[position] = static_cast<int64_t>(ascending_.size()) - 1;
  }
}

template <typename Index>
void DistinctIndices<Index>::CopyAscending(int64_t* out) const {
  if (given_ascending_) {
    std::copy(indices_, indices_ + n_, out);
  } else {
    std::copy(ascending_.begin(), ascending_.end(), out);
  }
}

namespace {

template <typename T>
__attribute__((always_inline)) inline void AddRow(const T* rows, int64_t i, int64_t place,
                                                  int64_t row_size, T* sums) {
  T* sum = sums + place * row_size;
  const T* row = rows + i * row_size;
  for (int64_t j = 0; j < row_size; ++j) sum[j] += row[j];
}

// An index's place is the set bits before it: its word's count and a popcount.
template <typename Index, typename Word, typename T>
__attribute__((always_inline)) inline void AddByBitmap(const Index* indices, int64_t n,
                                                       const Word* words, const T* rows,
                                                       int64_t row_size, T* sums) {
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t index = static_cast<uint64_t>(indices[i]);
    const Word& word = words[index >> 6];
    const uint64_t lower = word.bits & ((uint64_t{1} << (index & 63)) - 1);
    AddRow(rows, i, word.before + __builtin_popcountll(lower), row_size, sums);
  }
}

#if defined(__x86_64__)
// The same loop with the POPCNT instruction (twice as fast as the portable count here),
// run only where the CPU has it.
template <typename Index, typename Word, typename T>
__attribute__((target("popcnt"))) void AddByBitmapPopcnt(const Index* indices, int64_t n,
                                                         const Word* words, const T* rows,
                                                         int64_t row_size, T* sums) {
  AddByBitmap(indices, n, words, rows, row_size, sums);
}
#endif

}  // namespace

template <typename Index>
template <typename T>
void DistinctIndices<Index>::AddRows(const T* rows, int64_t row_size, T* sums) const {
  if (given_ascending_) {  // one row per place, in order
    std::copy(rows, rows + n_ * row_size, sums);
  } else if (!places_.empty()) {
    for (int64_t i = 0; i < n_; ++i) AddRow(rows, i, places_[i], row_size, sums);
  } else {
#if defined(__x86_64__)
    static const bool has_popcnt = __builtin_cpu_supports("popcnt");
    if (has_popcnt) {
      AddByBitmapPopcnt(indices_, n_, words_.data(), rows, row_size, sums);
      return;
    }
#endif
    AddByBitmap(indices_, n_, words_.data(), rows, row_size, sums);
  }
}

template RangeCheck CheckRange<int32_t>(const int32_t*, int64_t, int64_t);
template RangeCheck CheckRange<int64_t>(const int64_t*, int64_t, int64_t);
template class DistinctIndices<int32_t>;
template class DistinctIndices<int64_t>;
template void DistinctIndices<int32_t>::AddRows<float>(const float*, int64_t, float*) const;
template void DistinctIndices<int32_t>::AddRows<double>(const double*, int64_t, double*) const;
template void DistinctIndices<int64_t>::AddRows<float>(const float*, int64_t, float*) const;
template void DistinctIndices<int64_t>::AddRows<double>(const double*, int64_t, double*) const;

}  // namespace row_sums
}  // namespace tfgc
