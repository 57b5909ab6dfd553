#include "sign_bits.h"

#include <cstring>

namespace tfgc {
namespace sign_bits {
namespace {

// v if `keep` is all ones, +0.0 if it is zero: a mask on the bits rather than a branch
// (random signs would mispredict half the time) or a product (NaN * 0 is NaN).
inline double Masked(double v, uint64_t keep) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits &= keep;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// Adds eight values (the pad of a short last byte is given as -0.0 and masked out) to the
// partial sums; returns their sign bits, the first value in the most significant bit.
inline unsigned AddEight(const float v[8], int width, double upper[8], double lower[8]) {
  unsigned byte = 0;
  for (int k = 0; k < 8; ++k) {
    const uint64_t is_upper = v[k] >= 0.0f && k < width;
    const uint64_t keep = 0 - is_upper;
    byte |= static_cast<unsigned>(is_upper) << (7 - k);
    const double wide = static_cast<double>(v[k]);
    upper[k] += Masked(wide, keep);
    lower[k] += Masked(wide, ~keep);
  }
  return byte;
}

}  // namespace

SideSums Encode(const float* x, int64_t begin, int64_t end, uint8_t* out) {
  // Eight partial sums per side (one per bit position) break the chain of dependent
  // adds; they are combined in a fixed order, so the result depends only on [begin, end).
  double upper[8] = {}, lower[8] = {};
  int64_t upper_count = 0;
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const unsigned byte = AddEight(x + i, 8, upper, lower);
    upper_count += __builtin_popcount(byte);
    out[i / 8] = static_cast<uint8_t>(byte);
  }
  if (i < end) {
    float last[8] = {-0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f};
    const int width = static_cast<int>(end - i);
    for (int k = 0; k < width; ++k) last[k] = x[i + k];
    const unsigned byte = AddEight(last, width, upper, lower);
    upper_count += __builtin_popcount(byte);
    out[i / 8] = static_cast<uint8_t>(byte);
  }
  SideSums sums;
  for (int k = 0; k < 8; ++k) {
    sums.sum[0] += upper[k];
    sums.sum[1] += lower[k];
  }
  sums.count[0] = upper_count;
  sums.count[1] = (end - begin) - upper_count;
  return sums;
}

}  // namespace sign_bits
}  // namespace tfgc
