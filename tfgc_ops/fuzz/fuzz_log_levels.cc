// libFuzzer target: LogQuant's decoder (log_levels.h) on arbitrary bytes.
//
// Input: byte 0 picks the block split (1 + low 2 bits blocks) and the bits (2 + bits
// 2..4, capped at 8); bytes 1..4 are the scale as a float; the rest is packed codes.
//
// Checks: Decode by blocks (8-aligned, last first) writes exactly the n values the bytes
// hold (ASan) and each equals a naive decoding of the unpacked code: 0 for level 0,
// +-scale * 2^(1 - m) (ldexp) otherwise, +-scale everywhere for a scale that is not
// finite.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "bit_packing.h"
#include "fuzz_check.h"
#include "log_levels.h"

using tfgc_fuzz::Check;
namespace bp = ::tfgc::bit_packing;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  const int parts = 1 + (data[0] & 3);
  const int bits = std::min(8, 2 + ((data[0] >> 2) & 7));
  float scale;
  std::memcpy(&scale, data + 1, 4);
  const uint8_t* packed = data + 5;
  const int64_t bytes = static_cast<int64_t>(size) - 5;
  // The most codes the bytes hold exactly (n with PackedSize(n) == bytes).
  const int64_t n = bp::MaxCodes(bytes, bits);
  if (bp::PackedSize(n, bits) != bytes) return 0;
  std::unique_ptr<float[]> out(new float[n > 0 ? n : 1]);
  std::vector<int64_t> cuts = {0};
  for (int p = 1; p < parts; ++p) cuts.push_back(n * p / parts / 8 * 8);
  cuts.push_back(n);
  for (int p = parts - 1; p >= 0; --p) {
    if (cuts[p] < cuts[p + 1]) ::tfgc::log_levels::Decode(packed, n, bits, scale, cuts[p], cuts[p + 1], out.get());
  }
  std::vector<int32_t> codes(n);
  bp::Unpack(packed, n, bits, codes.data());
  const int32_t sign_bit = 1 << (bits - 1);
  for (int64_t j = 0; j < n; ++j) {
    const int32_t level = codes[j] & (sign_bit - 1);
    float magnitude = level > 0 ? scale * std::ldexp(1.0f, 1 - level) : 0.0f;
    if (!std::isfinite(scale)) magnitude = scale;
    const float expected = (codes[j] & sign_bit) ? -magnitude : magnitude;
    Check(std::memcmp(&expected, &out[j], 4) == 0 || (std::isnan(expected) && std::isnan(out[j])),
          "decoded value");
  }
  return 0;
}
