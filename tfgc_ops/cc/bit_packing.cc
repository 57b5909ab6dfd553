#include "bit_packing.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu_isa.h"

namespace tfgc {
namespace bit_packing {
namespace {

#if defined(__x86_64__)

// Packs the whole groups of 32 codes of codes[0, n) with AVX2 (B = 4 or 8), ORs every
// code into *seen (out-of-range codes are saturated in the output and found later from
// *seen); returns how many codes it packed.
template <int B>
__attribute__((target("avx2"))) int64_t PackPrefixAvx2(const int32_t* codes, int64_t n,
                                                       uint8_t* out, uint32_t* seen) {
  static_assert(B == 4 || B == 8, "AVX2 packing is for 4- and 8-bit codes");
  // packus leaves the dwords of a, b, c, d lane by lane: this puts them back in order.
  const __m256i in_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256i any = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i* c = reinterpret_cast<const __m256i*>(codes + i);
    const __m256i a = _mm256_loadu_si256(c), b = _mm256_loadu_si256(c + 1);
    const __m256i d2 = _mm256_loadu_si256(c + 2), d3 = _mm256_loadu_si256(c + 3);
    any = _mm256_or_si256(any, _mm256_or_si256(_mm256_or_si256(a, b), _mm256_or_si256(d2, d3)));
    const __m256i bytes = _mm256_permutevar8x32_epi32(
        _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(d2, d3)), in_order);
    if (B == 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bytes);
    } else {
      // Each pair of bytes (first, second) -> first * 16 + second, most significant first.
      const __m256i pairs = _mm256_maddubs_epi16(bytes, _mm256_set1_epi16(0x0110));
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(pairs, pairs), 0x08);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i / 2), _mm256_castsi256_si128(packed));
    }
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), any);
  for (const uint32_t lane : lanes) *seen |= lane;
  return i;
}

#endif  // __x86_64__

// One group: eight codes <-> `B` bytes through a 64-bit word (8 * B <= 64 bits).
// Templated on B so that the compiler unrolls both loops.
template <int B>
int64_t PackFixed(const int32_t* codes, int64_t n, uint8_t* out) {
  uint32_t out_of_range = 0;  // any bit at or above B in any code (negatives included)
  int64_t g = 0;
#if defined(__x86_64__)
  if ((B == 4 || B == 8) && UseAvx2()) {
    uint32_t seen = 0;
    g = PackPrefixAvx2<B == 4 ? 4 : 8>(codes, n, out, &seen) / 8;
    out_of_range = seen >> B;
  }
#endif
  const int64_t groups = n / 8;
  for (; g < groups; ++g) {
    const int32_t* c = codes + 8 * g;
    uint64_t word = 0;
    for (int j = 0; j < 8; ++j) {
      const uint32_t v = static_cast<uint32_t>(c[j]);
      out_of_range |= v >> B;
      word = (word << B) | (v & ((1u << B) - 1));
    }
    // Most significant byte first: byte-swap the word's top B bytes into place and
    // store them at once (one or two stores instead of B).
    const uint64_t bytes = __builtin_bswap64(word << (64 - 8 * B));
    std::memcpy(out + B * g, &bytes, B);
  }
  const int64_t rest = n - 8 * groups;
  if (rest > 0) {
    const int32_t* c = codes + 8 * groups;
    uint64_t word = 0;
    for (int j = 0; j < 8; ++j) {
      const uint32_t v = j < rest ? static_cast<uint32_t>(c[j]) : 0;
      out_of_range |= v >> B;
      word = (word << B) | (v & ((1u << B) - 1));
    }
    uint8_t* o = out + B * groups;
    const int64_t bytes = PackedSize(rest, B);
    for (int k = 0; k < bytes; ++k) o[k] = static_cast<uint8_t>(word >> (8 * (B - 1 - k)));
  }
  if (out_of_range == 0) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if ((static_cast<uint32_t>(codes[i]) >> B) != 0) return i;
  }
  return -1;  // unreachable
}

template <int B>
void UnpackFixed(const uint8_t* packed, int64_t n, int32_t* out) {
  constexpr uint64_t kMask = (1u << B) - 1;
  const int64_t groups = n / 8;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* p = packed + B * g;
    uint64_t word = 0;
    for (int k = 0; k < B; ++k) word = (word << 8) | p[k];
    int32_t* o = out + 8 * g;
    for (int j = 0; j < 8; ++j) o[j] = static_cast<int32_t>((word >> (B * (7 - j))) & kMask);
  }
  const int64_t rest = n - 8 * groups;
  if (rest > 0) {
    const uint8_t* p = packed + B * groups;
    const int64_t bytes = PackedSize(rest, B);  // only these exist: the rest is padding
    uint64_t word = 0;
    for (int k = 0; k < B; ++k) word = (word << 8) | (k < bytes ? p[k] : 0);
    int32_t* o = out + 8 * groups;
    for (int j = 0; j < rest; ++j) o[j] = static_cast<int32_t>((word >> (B * (7 - j))) & kMask);
  }
}

}  // namespace

int64_t Pack(const int32_t* codes, int64_t n, int bits, uint8_t* out) {
  switch (bits) {
    case 1: return PackFixed<1>(codes, n, out);
    case 2: return PackFixed<2>(codes, n, out);
    case 3: return PackFixed<3>(codes, n, out);
    case 4: return PackFixed<4>(codes, n, out);
    case 5: return PackFixed<5>(codes, n, out);
    case 6: return PackFixed<6>(codes, n, out);
    case 7: return PackFixed<7>(codes, n, out);
    default: return PackFixed<8>(codes, n, out);
  }
}

void Unpack(const uint8_t* packed, int64_t n, int bits, int32_t* out) {
  switch (bits) {
    case 1: return UnpackFixed<1>(packed, n, out);
    case 2: return UnpackFixed<2>(packed, n, out);
    case 3: return UnpackFixed<3>(packed, n, out);
    case 4: return UnpackFixed<4>(packed, n, out);
    case 5: return UnpackFixed<5>(packed, n, out);
    case 6: return UnpackFixed<6>(packed, n, out);
    case 7: return UnpackFixed<7>(packed, n, out);
    default: return UnpackFixed<8>(packed, n, out);
  }
}

}  // namespace bit_packing
}  // namespace tfgc
