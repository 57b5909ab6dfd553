// libFuzzer target: OneBit's sign bits and side sums (sign_bits.h) on arbitrary floats.
//
// Input: byte 0 picks the block split (1 + low 2 bits blocks); the rest, read 4 bytes at
// a time, are the float32 values (any bit pattern: NaN, Inf, -0.0, subnormals).
//
// Checks: Encode by blocks (8-aligned, last first) writes exactly ceil(n / 8) bytes
// (ASan: the buffer has exactly that size) equal to a naive packing of x >= 0, most
// significant bit first and the pad zero; the counts are exact; each side's sum is
// non-finite exactly when a naive double sum is, and otherwise equals it to 1e-9 of the
// sum of magnitudes (the adds run in another order).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_check.h"
#include "sign_bits.h"

using tfgc_fuzz::Check;
namespace sb = ::tfgc::sign_bits;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int parts = 1 + (data[0] & 3);
  const int64_t n = static_cast<int64_t>((size - 1) / 4);
  std::vector<float> x(n);
  if (n > 0) std::memcpy(x.data(), data + 1, n * 4);
  const int64_t bytes = (n + 7) / 8;
  std::unique_ptr<uint8_t[]> out(new uint8_t[bytes > 0 ? bytes : 1]);
  std::vector<int64_t> cuts = {0};
  for (int p = 1; p < parts; ++p) cuts.push_back(n * p / parts / 8 * 8);
  cuts.push_back(n);
  sb::SideSums total;
  for (int p = parts - 1; p >= 0; --p) {
    if (cuts[p] >= cuts[p + 1]) continue;
    const sb::SideSums part = sb::Encode(x.data(), cuts[p], cuts[p + 1], out.get());
    for (int side = 0; side < 2; ++side) {
      total.sum[side] += part.sum[side];
      total.count[side] += part.count[side];
    }
  }
  double sum[2] = {0, 0}, magnitude[2] = {0, 0};
  int64_t count[2] = {0, 0};
  for (int64_t i = 0; i < n; ++i) {
    const int side = x[i] >= 0.0f ? 0 : 1;
    sum[side] += x[i];
    magnitude[side] += std::fabs(static_cast<double>(x[i]));
    ++count[side];
    const bool bit = (out[i / 8] >> (7 - i % 8)) & 1;
    Check(bit == (side == 0), "sign bit");
  }
  if (n % 8 != 0) Check((out[bytes - 1] & ((1u << (8 - n % 8)) - 1)) == 0, "pad bits");
  for (int side = 0; side < 2; ++side) {
    Check(total.count[side] == count[side], "count");
    Check(std::isfinite(total.sum[side]) == std::isfinite(sum[side]), "finiteness of a sum");
    if (std::isfinite(sum[side])) {
      Check(std::fabs(total.sum[side] - sum[side]) <= 1e-9 * magnitude[side], "sum");
    }
  }
  return 0;
}
