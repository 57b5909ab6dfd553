// Decoding of LogQuant's signed power-of-two levels (Miyashita et al. 2016), free of
// TensorFlow: one pass from packed codes to float32 values.
//
// A code of `bits` bits holds a sign (its top bit) and a level m below it: m = 0 is zero,
// m >= 1 is scale * 2^(1 - m). A scale that is not finite (the encoder's NaN for a
// non-finite input) gives every value that scale, signed.
#ifndef TFGC_OPS_CC_LOG_LEVELS_H_
#define TFGC_OPS_CC_LOG_LEVELS_H_

#include <cstdint>

namespace tfgc {
namespace log_levels {

// Values [begin, end) (begin a multiple of 8) of the n codes packed in `packed` (exactly
// bit_packing::PackedSize(n, bits) bytes), written to out[begin, end). bits in 2..8.
void Decode(const uint8_t* packed, int64_t n, int bits, float scale, int64_t begin,
            int64_t end, float* out);

}  // namespace log_levels
}  // namespace tfgc

#endif  // TFGC_OPS_CC_LOG_LEVELS_H_
