// Uniform K-bit quantization over [low, low + (2^K - 1) * step] (MQGrad's quantizer, the
// "Adaptive" baseline), free of TensorFlow: one pass that measures a tensor's range and
// one that quantizes, packs and reconstructs it.
//
// Code q_i = x_i's nearest level, round((x_i - low) / d) with ties to even, where d is step
// if step > 0 and 1 otherwise, clamped to [0, 2^K - 1]; a quotient that is not a number
// (x_i or low NaN) gives 0. Codes are packed as bit_packing.h packs them (most significant
// bit first); the reconstruction is low + q_i * step in float32, which is what the
// receiver computes from the payload.
#ifndef TFGC_OPS_CC_UNIFORM_QUANTIZE_H_
#define TFGC_OPS_CC_UNIFORM_QUANTIZE_H_

#include <cstdint>

namespace tfgc {
namespace uniform_quantize {

// What one pass over values learns: the extremes of the finite values, whether all were
// finite, and the sum of their squares in double (no float32 input overflows it).
struct Range {
  float low;   // +inf when no value was seen
  float high;  // -inf when no value was seen
  bool finite = true;
  double sum_squares = 0.0;
};

// The range of x[begin, end); the sum is added in a fixed order, so it depends only on
// [begin, end).
Range Measure(const float* x, int64_t begin, int64_t end);

// `a` and then `b` as one range (the sums added in that order).
Range Combine(const Range& a, const Range& b);

// Quantizes x[begin, end) (begin a multiple of 8) with `bits` in 1..8, packs the codes into
// packed[begin * bits / 8, ceil(end * bits / 8)), and, when `reconstructed` is not null,
// writes low + q_i * step to reconstructed[begin, end).
void Quantize(const float* x, int64_t begin, int64_t end, float low, float step, int bits,
              uint8_t* packed, float* reconstructed);

}  // namespace uniform_quantize
}  // namespace tfgc

#endif  // TFGC_OPS_CC_UNIFORM_QUANTIZE_H_
