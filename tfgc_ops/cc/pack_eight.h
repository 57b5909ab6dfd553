// Packing of eight int32 codes held in two SSE2 vectors, shared by the SSE2 quantizers
// (uniform_quantize.cc, log_levels.cc). The bytes are those of bit_packing::Pack.
#ifndef TFGC_OPS_CC_PACK_EIGHT_H_
#define TFGC_OPS_CC_PACK_EIGHT_H_

#include <emmintrin.h>

#include <cstdint>
#include <cstring>

namespace tfgc {
namespace bit_packing {

// Packs eight codes of `bits` bits into out[0, bytes) (bytes <= bits), the first code in
// the most significant bits. With `spill`, out[bytes, 8) may be overwritten too (the
// caller writes them next): one 8-byte store instead of one per byte.
inline void PackEight(__m128i first, __m128i second, int bits, int bytes, bool spill,
                      uint8_t* out) {
  if (bits == 8 && bytes == 8) {
    const __m128i words = _mm_packs_epi32(first, second);  // codes <= 255: no saturation
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packus_epi16(words, words));
    return;
  }
  alignas(16) int32_t codes[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(codes), first);
  _mm_store_si128(reinterpret_cast<__m128i*>(codes + 4), second);
  uint64_t group = 0;  // the 8 * bits bits, right-aligned; independent shifts, no chain
  for (int k = 0; k < 8; ++k) group |= static_cast<uint64_t>(codes[k]) << (bits * (7 - k));
  if (spill) {
    const uint64_t big_endian = __builtin_bswap64(group << (64 - 8 * bits));
    std::memcpy(out, &big_endian, sizeof big_endian);
    return;
  }
  for (int m = 0; m < bytes; ++m) out[m] = static_cast<uint8_t>(group >> (8 * (bits - 1 - m)));
}

}  // namespace bit_packing
}  // namespace tfgc

#endif  // TFGC_OPS_CC_PACK_EIGHT_H_
