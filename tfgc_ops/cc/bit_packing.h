// Packing of small unsigned codes (1..8 bits each) into bytes, free of TensorFlow.
//
// Code i occupies bits [i * bits, (i + 1) * bits) of a stream written most significant
// bit first; the last byte is zero-padded. Eight codes fill exactly `bits` bytes, so
// blocks of a multiple of eight codes pack and unpack independently.
#ifndef TFGC_OPS_CC_BIT_PACKING_H_
#define TFGC_OPS_CC_BIT_PACKING_H_

#include <cstdint>

namespace tfgc {
namespace bit_packing {

inline constexpr int kMinBits = 1;
inline constexpr int kMaxBits = 8;

// Bytes that n codes of `bits` bits take: ceil(n * bits / 8). n must be below 2^60.
inline int64_t PackedSize(int64_t n, int bits) { return (n * bits + 7) / 8; }

// The most codes of `bits` bits that `size` bytes hold.
inline int64_t MaxCodes(int64_t size, int bits) { return size / bits * 8 + size % bits * 8 / bits; }

// Packs codes[0, n) into out[0, PackedSize(n, bits)). Returns -1, or the index of the
// first code outside [0, 2^bits) (out is then unspecified). bits must be in 1..8.
int64_t Pack(const int32_t* codes, int64_t n, int bits, uint8_t* out);

// Unpacks n codes from packed[0, PackedSize(n, bits)) into out[0, n). Reads and writes
// nothing beyond those ranges. bits must be in 1..8.
void Unpack(const uint8_t* packed, int64_t n, int bits, int32_t* out);

}  // namespace bit_packing
}  // namespace tfgc

#endif  // TFGC_OPS_CC_BIT_PACKING_H_
