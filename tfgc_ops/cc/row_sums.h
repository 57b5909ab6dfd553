// The rows of a sparse gradient (tf.IndexedSlices) summed by distinct index, in
// ascending index order, free of TensorFlow. FastSGD's encode needs that form; an
// embedding lookup's gradient has its indices in lookup order, repeated. Summing into
// the dense tensor costs a pass over every dense element, and hashing each index
// (tf.unique) costs several times that per index.
//
// Indices already strictly ascending are their own distinct indices (one check while
// their range is checked). Otherwise the distinct indices are found with a bitmap of
// the index range when the range is small next to the number of indices (one bit per
// possible index; an index's place is the count of set bits before it), else by
// sorting the indices. Either way each distinct index's rows are added in the order
// of their positions.
#ifndef TFGC_OPS_CC_ROW_SUMS_H_
#define TFGC_OPS_CC_ROW_SUMS_H_

#include <cstdint>
#include <vector>

namespace tfgc {
namespace row_sums {

struct RangeCheck {
  int64_t first_out_of_range = -1;  // position of the first index outside [0, num_rows)
  bool ascending = true;            // strictly, i.e. already distinct
};

template <typename Index>
RangeCheck CheckRange(const Index* indices, int64_t n, int64_t num_rows);

// The distinct values of indices[0, n), each in [0, num_rows), and where each index
// falls among them; `check` is CheckRange's result for them.
template <typename Index>
class DistinctIndices {
 public:
  DistinctIndices(const Index* indices, int64_t n, int64_t num_rows, const RangeCheck& check);

  // How many distinct indices there are.
  int64_t size() const { return given_ascending_ ? n_ : static_cast<int64_t>(ascending_.size()); }

  // Writes the distinct indices, ascending, to out[0, size()).
  void CopyAscending(int64_t* out) const;

  // sums[k] += rows[i] for each i in 0, 1, ..., n - 1, where indices[i] is the k-th
  // distinct index and a row is row_size values; `sums` must hold size() * row_size
  // zeros.
  template <typename T>
  void AddRows(const T* rows, int64_t row_size, T* sums) const;

 private:
  const Index* indices_;
  int64_t n_;
  bool given_ascending_;
  std::vector<int64_t> ascending_;  // empty when given ascending
  // Bitmap: one bit per index in [0, num_rows), beside the count of set bits before it
  // (one cache line holds both).
  struct Word {
    uint64_t bits;
    int64_t before;
  };
  std::vector<Word> words_;
  // Otherwise (a wide range): each index's place, found by sorting.
  std::vector<int64_t> places_;
};

}  // namespace row_sums
}  // namespace tfgc

#endif  // TFGC_OPS_CC_ROW_SUMS_H_
