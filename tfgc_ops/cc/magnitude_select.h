// Exact selection of the largest magnitudes of float32 values (Sparsify and TopK), free
// of TensorFlow.
//
// A finite float32's magnitude orders like its bit pattern p = bits & 0x7FFFFFFF, so the
// value of rank k is found by radix selection on p: a histogram of p's top 11 bits over
// all values (8 KiB of counts per copy, four interleaved copies: 32 KiB, L1-sized, where
// a 2^16-bin histogram takes 256 KiB), then the values of the chosen bin only, on the
// next 10 bits and the last 10. Zeros are never selected; values that are not finite
// always are. From 2^20 values on a CPU with AVX2, a sample of 2^15 patterns (one at a
// hashed offset in each of 2^15 equal strides) first predicts a narrow range that holds
// the threshold: one pass then counts the values above it and keeps those inside, and
// the histograms run on those only; where the sample puts too many values in the range
// (ties), the histograms of every value run from the start, and where the prediction
// misses, the selection falls back to them, so the result never depends on the sample.
//
// The selection is "every finite value with p > threshold, and the first `ties` values
// (in position order) with p == threshold", plus the non-finite ones. `Write` applies it
// in one pass: the bitmap or the positions, the selected values, and the dense tensor of
// the selected values (zeros elsewhere). `Expand` turns a bitmap and values back into
// the dense tensor (Sparsify's decode), `ExpandPositions` positions and values (TopK's).
#ifndef TFGC_OPS_CC_MAGNITUDE_SELECT_H_
#define TFGC_OPS_CC_MAGNITUDE_SELECT_H_

#include <cstdint>
#include <vector>

namespace tfgc {
namespace magnitude_select {

struct Selection {
  uint32_t threshold = 0;  // magnitude bit pattern; a finite value above it is selected
  int64_t ties = 0;        // how many values equal to it are selected, first ones first
  int64_t count = 0;       // values selected, non-finite ones included
};

// Selects the `wanted` largest nonzero finite magnitudes of x[0, n) (fewer when fewer are
// nonzero; none when wanted <= 0), after subtracting the non-finite values from `wanted`
// when non_finite_in_wanted. `scratch` holds the candidates (values near the threshold).
Selection Select(const float* x, int64_t n, int64_t wanted, bool non_finite_in_wanted,
                 std::vector<uint32_t>* scratch);

// Outputs of a selection; any pointer may be null (that output is not written).
struct Outputs {
  uint8_t* bitmap = nullptr;        // ceil(n / 8) bytes: bit i (most significant first)
  int32_t* positions = nullptr;     // `count` ascending positions (n must be < 2^31)
  float* values = nullptr;          // `count` selected values, in position order
  float* reconstruction = nullptr;  // n values: x where selected, else 0
};

// Writes the outputs of `selection` over x[0, n) in one pass.
void Write(const float* x, int64_t n, const Selection& selection, const Outputs& outputs);

// Bits set among the first n bits of a bitmap (ceil(n / 8) bytes, most significant bit
// first); padding bits are not counted.
int64_t CountSelected(const uint8_t* bitmap, int64_t n);

// The inverse of a bitmap and values: out[i] = the next of `values` where bit i is set,
// else 0, for i in [0, n). `values` must hold CountSelected(bitmap, n) floats. With
// AVX2, each bitmap byte's eight outputs are one permutation of the next values and one
// store (no separate pass of zeros).
void Expand(const uint8_t* bitmap, int64_t n, const float* values, float* out);

// True when `positions` [0, count) are strictly ascending and lie in [0, n): what
// `ExpandPositions` needs.
bool PositionsAscendWithin(const int32_t* positions, int64_t count, int64_t n);

// The inverse of positions and values (TopK's decode): out[positions[j]] = values[j],
// 0 elsewhere, for positions that `PositionsAscendWithin(positions, count, n)`.
void ExpandPositions(const int32_t* positions, int64_t count, const float* values, int64_t n,
                     float* out);

}  // namespace magnitude_select
}  // namespace tfgc

#endif  // TFGC_OPS_CC_MAGNITUDE_SELECT_H_
