// LogQuant's signed power-of-two levels (Miyashita et al. 2016), free of TensorFlow: the
// encoding of float32 values into packed codes (with the values the receiver decodes),
// and the decoding, each one pass.
//
// A code of `bits` bits holds a sign (its top bit) and a level m below it: m = 0 is zero,
// m >= 1 is scale * 2^(1 - m). A scale that is not finite (the encoder's NaN for a
// non-finite input) gives every value that scale, signed.
//
// Encoding, exactly, with no logarithm computed: scale = 2^fsr, fsr = ceil(log2 L) for the
// largest magnitude L (0 when L is not > 0). Value x gets e = round(log2 |x|), which is
// |x|'s binary exponent plus one when its significand is at least sqrt(2), and level
// m = fsr - e + 1 when 1 <= m <= 2^(bits - 1) - 1; otherwise (and for 0, Inf, NaN) m = 0.
// The sign bit is x's own, so -0.0 decodes to -0.0.
#ifndef TFGC_OPS_CC_LOG_LEVELS_H_
#define TFGC_OPS_CC_LOG_LEVELS_H_

#include <cstdint>

namespace tfgc {
namespace log_levels {

// fsr for the largest magnitude `largest` (any float; 0 unless it is positive and finite).
int FullScale(float largest);

// 2^full_scale as a float (Inf from 2^128 on, 0 below 2^-149).
float Scale(int full_scale);

// Encodes x[begin, end) (begin a multiple of 8) with full-scale exponent `full_scale`,
// packing the codes into packed[begin * bits / 8, ceil(end * bits / 8)) as bit_packing.h
// does; when `decoded` is not null, writes to decoded[begin, end) what Decode gives for
// those codes and `scale`, which is Scale(full_scale) or NaN. bits in 2..8.
void Encode(const float* x, int64_t begin, int64_t end, int bits, int full_scale, float scale,
            uint8_t* packed, float* decoded);

// Values [begin, end) (begin a multiple of 8) of the n codes packed in `packed` (exactly
// bit_packing::PackedSize(n, bits) bytes), written to out[begin, end). bits in 2..8.
void Decode(const uint8_t* packed, int64_t n, int bits, float scale, int64_t begin,
            int64_t end, float* out);

}  // namespace log_levels
}  // namespace tfgc

#endif  // TFGC_OPS_CC_LOG_LEVELS_H_
