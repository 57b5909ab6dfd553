// 3LC's quantization and quartic folding (sections 3.1-3.2) and their inverse, free of
// TensorFlow: one pass over float32 values each way.
//
// n values x_j fold into g = ceil(n / 5) bytes: byte i = sum over k of
// (q_{k g + i} + 1) 3^(4 - k), with q_j = round-half-even(x_j / M) for j < n and 0 for the
// pad. Unfolding gives back q_j * M for j < n.
#ifndef TFGC_OPS_CC_QUARTIC_FOLD_H_
#define TFGC_OPS_CC_QUARTIC_FOLD_H_

#include <cstdint>

namespace tfgc {
namespace quartic_fold {

inline constexpr uint8_t kMaxQuartic = 242;

inline int64_t GroupsFor(int64_t n) { return (n + 4) / 5; }

// Largest |x_j| over x[0, n), NaN if some x_j is not finite, 0 for n = 0.
float LargestMagnitude(const float* x, int64_t n);

// Bytes [begin, end) of the folding of x[0, n) with scale M. M must be > 0 and every
// |x_j| / M at most 1.5 (M is at least max|x| rounded to x's dtype); the caller sends all
// zeros (byte 121) when M is 0 or NaN.
void Fold(const float* x, int64_t n, float scale, int64_t begin, int64_t end, uint8_t* out);

// Values of bytes [begin, end) of in (g = GroupsFor(n) bytes, each <= 242) times scale,
// written to their places in out[0, n).
void Unfold(const uint8_t* in, int64_t n, float scale, int64_t begin, int64_t end, float* out);

}  // namespace quartic_fold
}  // namespace tfgc

#endif  // TFGC_OPS_CC_QUARTIC_FOLD_H_
