#include "log_levels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "bit_packing.h"

namespace tfgc {
namespace log_levels {
namespace {

constexpr int64_t kChunk = 1024;  // codes unpacked at a time (a multiple of 8)

// 2^(1 - level) for level in 1..127, built from its exponent bits (a normal float), and 0
// for level 0: an integer select, no branch.
float PowerOfTwo(int32_t level) {
  const uint32_t bits = level > 0 ? static_cast<uint32_t>(128 - level) << 23 : 0u;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// `magnitude` with its sign bit flipped when `negative` (so -0.0 for a negative zero),
// branch-free: signs are coin flips.
float Signed(float magnitude, bool negative) {
  uint32_t bits;
  std::memcpy(&bits, &magnitude, sizeof(bits));
  bits ^= static_cast<uint32_t>(negative) << 31;
  std::memcpy(&magnitude, &bits, sizeof(bits));
  return magnitude;
}

}  // namespace

void Decode(const uint8_t* packed, int64_t n, int bits, float scale, int64_t begin,
            int64_t end, float* out) {
  const int32_t sign_bit = 1 << (bits - 1);
  const bool finite = std::isfinite(scale);
  int32_t codes[kChunk];
  for (int64_t start = begin; start < end; start += kChunk) {
    const int64_t stop = std::min(start + kChunk, end);
    bit_packing::Unpack(packed + start * bits / 8, stop - start, bits, codes);
    for (int64_t j = start; j < stop; ++j) {
      const int32_t code = codes[j - start];
      const float magnitude = finite ? scale * PowerOfTwo(code & (sign_bit - 1)) : scale;
      out[j] = Signed(magnitude, (code & sign_bit) != 0);
    }
  }
}

}  // namespace log_levels
}  // namespace tfgc
