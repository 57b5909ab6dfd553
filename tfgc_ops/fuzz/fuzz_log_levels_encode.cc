// libFuzzer target: LogQuant's encoder (log_levels.h) on arbitrary float32 values.
//
// Input: byte 0 picks the block split (1 + low 2 bits blocks), the bits (2 + bits 2..4,
// capped at 8) and, with bit 5, a largest magnitude taken from bytes 1..4 instead of the
// values' own (any float: NaN, Inf, subnormal, smaller than some values), and with bit 6
// puts every value's significand within 128 units of sqrt(2)'s; the rest is the values.
//
// Checks: FullScale is the least k with 2^k >= largest (ilogb, no frexp); Scale(k) is
// ldexp(1, k), for it and for twice byte 4 as a signed byte; Encode by blocks (8-aligned,
// last first) writes exactly the packed bytes and decoded values of the n inputs (ASan);
// every code equals a naive definition (frexp, the significand against sqrt(1/2) in
// double); the decoded values are Decode's for those codes.
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
namespace ll = ::tfgc::log_levels;

namespace {

int NaiveFullScale(float largest) {
  if (!(largest > 0.0f) || !std::isfinite(largest)) return 0;
  const int floor_log2 = std::ilogb(largest);
  return std::ldexp(1.0f, floor_log2) == largest ? floor_log2 : floor_log2 + 1;
}

int32_t NaiveCode(float x, int full_scale, int bits) {
  const int32_t levels = (1 << (bits - 1)) - 1;
  int32_t level = 0;
  if (x != 0.0f && std::isfinite(x)) {
    int exponent;
    const double significand = std::frexp(static_cast<double>(std::fabs(x)), &exponent);
    // |x| = significand * 2^exponent; log2 |x| rounds to exponent - 1 or exponent.
    const int rounded = significand >= std::sqrt(0.5) ? exponent : exponent - 1;
    const int candidate = full_scale - rounded + 1;
    if (candidate >= 1 && candidate <= levels) level = candidate;
  }
  return level | static_cast<int32_t>(std::signbit(x)) << (bits - 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  const int parts = 1 + (data[0] & 3);
  const int bits = std::min(8, 2 + ((data[0] >> 2) & 7));
  const bool given_largest = (data[0] >> 5) & 1;
  const int64_t n = static_cast<int64_t>(size - 5) / 4;
  std::vector<float> x(n);
  if (n > 0) std::memcpy(x.data(), data + 5, n * 4);
  if ((data[0] >> 6) & 1) {
    // Significands within +-128 units of the last place of sqrt(2), where log2 rounds
    // the other way: each value keeps its sign and exponent, its low byte picks the unit.
    for (float& v : x) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const int32_t unit = static_cast<int8_t>(bits & 0xFF);
      bits = (bits & 0xFF800000u) | static_cast<uint32_t>(0x3504F4 + unit);
      std::memcpy(&v, &bits, 4);
    }
  }
  float largest = 0.0f;
  if (given_largest) {
    std::memcpy(&largest, data + 1, 4);
  } else {
    bool finite = true;  // as largest_magnitude: NaN when some value is not finite
    for (float v : x) {
      finite = finite && std::isfinite(v);
      if (std::isfinite(v)) largest = std::max(largest, std::fabs(v));
    }
    if (!finite) largest = NAN;
  }
  const int full_scale = ll::FullScale(largest);
  Check(full_scale == NaiveFullScale(largest), "full-scale exponent");
  for (const int k : {full_scale, static_cast<int8_t>(data[4]) * 2}) {
    const float scale = ll::Scale(k), naive = std::ldexp(1.0f, k);
    Check(std::memcmp(&scale, &naive, 4) == 0, "power of two");
  }
  const float scale = std::isfinite(largest) ? ll::Scale(full_scale) : NAN;

  const int64_t bytes = bp::PackedSize(n, bits);
  std::unique_ptr<uint8_t[]> packed(new uint8_t[bytes > 0 ? bytes : 1]);
  std::unique_ptr<float[]> decoded(new float[n > 0 ? n : 1]);
  std::vector<int64_t> cuts = {0};
  for (int p = 1; p < parts; ++p) cuts.push_back(n * p / parts / 8 * 8);
  cuts.push_back(n);
  for (int p = parts - 1; p >= 0; --p) {
    if (cuts[p] < cuts[p + 1]) {
      ll::Encode(x.data(), cuts[p], cuts[p + 1], bits, full_scale, scale, packed.get(),
                 decoded.get());
    }
  }
  std::vector<int32_t> codes(n);
  bp::Unpack(packed.get(), n, bits, codes.data());
  for (int64_t j = 0; j < n; ++j) {
    Check(codes[j] == NaiveCode(x[j], full_scale, bits), "code");
  }
  if (n * bits % 8 != 0) {
    Check((packed[bytes - 1] & ((1 << (8 - n * bits % 8)) - 1)) == 0, "zero padding");
  }
  std::unique_ptr<float[]> expected(new float[n > 0 ? n : 1]);
  if (n > 0) ll::Decode(packed.get(), n, bits, scale, 0, n, expected.get());
  for (int64_t j = 0; j < n; ++j) {
    Check(std::memcmp(&expected[j], &decoded[j], 4) == 0 ||
              (std::isnan(expected[j]) && std::isnan(decoded[j])),
          "decoded value");
  }
  return 0;
}
