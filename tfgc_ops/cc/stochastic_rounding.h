// Stochastic rounding for QSGD and 3LC's stochastic 3-values, free of TensorFlow: one
// pass over float32 values each way, with uniform draws that depend only on a seed and
// the value's index (so blocks run in any order and give the same bytes).
//
// Draw j under seed (s0, s1): u_j = `Uniform(SeedKey(s0, s1), j)`, a counter-based
// wyrand draw.
//
// QSGD (bits K, levels s = 2^(K-1) - 1, buckets of B values with norms N_b): value j of
// bucket b has level l = min(floor(t) + [u_j < t - floor(t)], s) with
// t = min(|x_j| * (s / N_b), s) in float32 (min(|x_j| / N_b * s, s) where s / N_b
// overflows), and code (x_j < 0) << (K - 1) | l, packed K bits per
// value as bit_packing.h packs them. A bucket whose norm is not > 0 and finite sends
// level 0. Decoding gives (+-l * N_b) / s.
//
// Stochastic 3-values (scale M): q_j = sign(x_j) if u_j < |x_j| * (1 / M), else 0,
// folded five per byte as quartic_fold.h folds 3LC's.
#ifndef TFGC_OPS_CC_STOCHASTIC_ROUNDING_H_
#define TFGC_OPS_CC_STOCHASTIC_ROUNDING_H_

#include <cstdint>

namespace tfgc {
namespace stochastic_rounding {

// The key of a seed: a SplitMix64 finalizer of seed0 ^ finalizer(seed1).
inline uint64_t Finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline uint64_t SeedKey(uint64_t seed0, uint64_t seed1) { return Finalize(seed0 ^ Finalize(seed1)); }

// u_j in [0, 1), a multiple of 2^-24: the top 24 bits of wyrand's output for the
// counter key + (j + 1) * 0xA0761D6478BD642F (one 64x64 -> 128-bit multiply per draw).
inline float Uniform(uint64_t key, int64_t j) {
  const uint64_t state = key + (static_cast<uint64_t>(j) + 1) * 0xA0761D6478BD642Full;
  const unsigned __int128 product =
      static_cast<unsigned __int128>(state) * (state ^ 0xE7037ED1A0B428DBull);
  const uint64_t z = static_cast<uint64_t>(product >> 64) ^ static_cast<uint64_t>(product);
  return static_cast<float>(static_cast<int32_t>(z >> 40)) * (1.0f / 16777216.0f);
}

// L2 norm of each bucket of `bucket` values of x[0, n) (the last one short), summed in
// double, for buckets [begin, end); NaN or Inf where a value is not finite.
void BucketNorms(const float* x, int64_t n, int64_t bucket, int64_t begin, int64_t end,
                 float* norms);

// Packed QSGD codes of values [begin, end) of x[0, n), begin a multiple of 8, written to
// out + begin * bits / 8. bits in 2..8.
void QsgdEncode(const float* x, int64_t n, const float* norms, int64_t bucket, int bits,
                uint64_t seed0, uint64_t seed1, int64_t begin, int64_t end, uint8_t* out);

// Values [begin, end) (begin a multiple of 8) of the n codes packed in `packed`, with
// bucket norms `norms`, written to out[begin, end).
void QsgdDecode(const uint8_t* packed, int64_t n, const float* norms, int64_t bucket, int bits,
                int64_t begin, int64_t end, float* out);

// Bytes [begin, end) of the folding of the stochastic 3-values of x[0, n) with scale M
// (> 0; the caller sends all zeros otherwise).
void TernaryFold(const float* x, int64_t n, float scale, uint64_t seed0, uint64_t seed1,
                 int64_t begin, int64_t end, uint8_t* out);

}  // namespace stochastic_rounding
}  // namespace tfgc

#endif  // TFGC_OPS_CC_STOCHASTIC_ROUNDING_H_
