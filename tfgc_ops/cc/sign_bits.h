// One-bit sign quantization (1-bit SGD, 3LC's "MQE 1-bit"), free of TensorFlow: one pass
// that packs whether each value is >= 0 and sums each side, so that each side can be
// sent as its mean.
//
// Bit i of the stream (most significant bit first, as bit_packing.h packs 1-bit codes;
// the last byte zero-padded) is 1 when x_i >= 0. NaN counts with the other side.
// Sums are in double, so no float32 input overflows them; a non-finite value makes its
// side's sum non-finite.
//
// Each side's sum is eight partial sums (one per bit position of a byte), each added in
// index order, then combined in a fixed order: the result depends only on the values
// and [begin, end), and the SSE2 loop (every x86-64 CPU) and the AVX2 loop (where the CPU
// has it and TFGC_CODEC_ISA does not cap it, cpu_isa.h) add exactly what the scalar loop
// adds.
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

// Signum's sender step on [begin, end) in one pass: updated_i = beta * old_i + x_i in
// float32, rounded after the product and after the sum (as TensorFlow's Mul then Add
// round it; no fused multiply-add), written to updated[begin, end); then the sign bits
// and sums of the updated values, exactly as Encode(updated, begin, end, out) gives them.
SideSums EncodeMomentum(const float* old, const float* x, float beta, int64_t begin,
                        int64_t end, float* updated, uint8_t* out);

}  // namespace sign_bits
}  // namespace tfgc

#endif  // TFGC_OPS_CC_SIGN_BITS_H_
