// libFuzzer target: uniform quantization (uniform_quantize.h) on arbitrary floats.
//
// Input: byte 0 picks the bits (1 + low 3 bits) and the block split (1 + next 2 bits
// blocks); bytes 1-4 and 5-8 are low and step; the rest, read 4 bytes at a time, are the
// float32 values (any bit pattern: NaN, Inf, -0.0, subnormals, for low and step too).
//
// Checks: Quantize by blocks (8-aligned, last first, as the op's threads may run them)
// writes exactly ceil(n * bits / 8) bytes (ASan: the buffer has exactly that size), each
// code equal to a naive scalar computation (quotient, NaN -> 0, clamp, round half to
// even) and the pad zero; the reconstruction is low + code * step, bit for bit. Measure
// by blocks, combined, finds the naive extremes and finiteness, and a sum of squares
// within 1e-9 of the naive one.
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_check.h"
#include "uniform_quantize.h"

using tfgc_fuzz::Check;
namespace uq = ::tfgc::uniform_quantize;

namespace {

float ReadFloat(const uint8_t* data) {
  float v;
  std::memcpy(&v, data, sizeof v);
  return v;
}

bool SameBits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 9) return 0;
  const int bits = 1 + (data[0] & 7);
  const int parts = 1 + ((data[0] >> 3) & 3);
  const float low = ReadFloat(data + 1), step = ReadFloat(data + 5);
  const int64_t n = static_cast<int64_t>((size - 9) / 4);
  std::vector<float> x(n);
  if (n > 0) std::memcpy(x.data(), data + 9, n * 4);
  const int64_t bytes = (n * bits + 7) / 8;
  std::unique_ptr<uint8_t[]> packed(new uint8_t[bytes > 0 ? bytes : 1]);
  std::vector<float> reconstructed(n);
  std::vector<int64_t> cuts = {0};
  for (int p = 1; p < parts; ++p) cuts.push_back(n * p / parts / 8 * 8);
  cuts.push_back(n);
  uq::Range range = uq::Measure(x.data(), 0, 0);
  for (int p = parts - 1; p >= 0; --p) {
    if (cuts[p] >= cuts[p + 1]) continue;
    uq::Quantize(x.data(), cuts[p], cuts[p + 1], low, step, bits, packed.get(),
                 reconstructed.data());
  }
  for (int p = 0; p < parts; ++p) {
    if (cuts[p] < cuts[p + 1]) range = uq::Combine(range, uq::Measure(x.data(), cuts[p], cuts[p + 1]));
  }
  const float levels = static_cast<float>((1 << bits) - 1);
  const float divisor = step > 0.0f ? step : 1.0f;
  bool finite = true;
  float smallest = INFINITY, largest = -INFINITY;
  double sum_squares = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    float q = (x[i] - low) / divisor;
    q = std::isnan(q) ? 0.0f : std::fmin(std::fmax(q, 0.0f), levels);
    const int32_t code = static_cast<int32_t>(std::nearbyint(q));  // default mode: ties to even
    int32_t got = 0;
    for (int b = 0; b < bits; ++b) {
      const int64_t bit = i * bits + b;
      got = (got << 1) | ((packed[bit / 8] >> (7 - bit % 8)) & 1);
    }
    Check(got == code, "code");
    Check(SameBits(reconstructed[i], low + static_cast<float>(code) * step), "reconstruction");
    finite = finite && std::isfinite(x[i]);
    if (x[i] < smallest) smallest = x[i];
    if (x[i] > largest) largest = x[i];
    sum_squares += static_cast<double>(x[i]) * x[i];
  }
  const int64_t used = n * bits % 8;
  if (used != 0) Check((packed[bytes - 1] & ((1u << (8 - used)) - 1)) == 0, "pad bits");
  Check(range.finite == finite, "finiteness");
  if (finite) {
    Check(range.low == smallest && range.high == largest, "extremes");
    Check(std::fabs(range.sum_squares - sum_squares) <= 1e-9 * sum_squares, "sum of squares");
  }
  return 0;
}
