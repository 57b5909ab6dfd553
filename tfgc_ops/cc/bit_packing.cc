#include "bit_packing.h"

#include <cstring>

namespace tfgc {
namespace bit_packing {
namespace {

// One group: eight codes <-> `B` bytes through a 64-bit word (8 * B <= 64 bits).
// Templated on B so that the compiler unrolls both loops.
template <int B>
int64_t PackFixed(const int32_t* codes, int64_t n, uint8_t* out) {
  uint32_t out_of_range = 0;  // any bit at or above B in any code (negatives included)
  const int64_t groups = n / 8;
  for (int64_t g = 0; g < groups; ++g) {
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
