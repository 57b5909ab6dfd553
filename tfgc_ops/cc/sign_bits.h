// One-bit sign quantization (1-bit SGD, 3LC's "MQE 1-bit"), free of TensorFlow: one pass
// that packs whether each value is >= 0 and sums each side, so that each side can be
// sent as its mean.
//
// Bit i of the stream (most significant bit first, as bit_packing.h packs 1-bit codes;
// the last byte zero-padded) is 1 when x_i >= 0. NaN counts with the other side.
// Sums are in double, so no float32 input overflows them; a non-finite value makes its
// side's sum non-finite.
#ifndef TFGC_OPS_CC_SIGN_BITS_H_
#define TFGC_OPS_CC_SIGN_BITS_H_

#include <cstdint>

namespace tfgc {
namespace sign_bits {

// Sums and counts of the values >= 0 ([0]) and of the others ([1]).
struct SideSums {
  double sum[2] = {0.0, 0.0};
  int64_t count[2] = {0, 0};
};

// Packs the sign bits of x[begin, end) (begin a multiple of 8, end <= n) into
// out[begin / 8, ceil(end / 8)) and returns those values' sums, added in index order.
SideSums Encode(const float* x, int64_t begin, int64_t end, uint8_t* out);

}  // namespace sign_bits
}  // namespace tfgc

#endif  // TFGC_OPS_CC_SIGN_BITS_H_
