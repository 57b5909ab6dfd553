// Stochastic rounding for QSGD and 3LC's stochastic 3-values, free of TensorFlow: one
// pass over float32 values each way, with uniform draws that depend only on a seed and
// the value's index (so blocks run in any order and give the same bytes).
//
// Draw j under seed (s0, s1): u_j = `Uniform(SeedKey(s0, s1), j)`, a counter-based
// draw: a 32-bit mixing function of a Weyl sequence whose step and offset come from the
// seed (four draws per SSE2 instruction sequence, eight per AVX2 one).
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

// The draws' 32-bit mixing function: a bijection with full avalanche ("lowbias32").
inline uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  return x ^ (x >> 16);
}

// The counter state of draw j: a Weyl sequence lo32(j) * g + c with the key's odd step
// g = hi32(key) | 1 and offset c = lo32(key) + hi32(j) * 0x9E3779B9. All 32-bit, so
// four draws fit one SSE2 register and eight one AVX2 register (QsgdEncode).
inline uint32_t Step(uint64_t key) { return static_cast<uint32_t>(key >> 32) | 1u; }
inline uint32_t Offset(uint64_t key, int64_t j) {
  return static_cast<uint32_t>(key) +
         static_cast<uint32_t>(static_cast<uint64_t>(j) >> 32) * 0x9E3779B9u;
}

// u_j in [0, 1), a multiple of 2^-24: the top 24 bits of Mix32 of draw j's state.
inline float Uniform(uint64_t key, int64_t j) {
  const uint32_t state = static_cast<uint32_t>(j) * Step(key) + Offset(key, j);
  return static_cast<float>(Mix32(state) >> 8) * (1.0f / 16777216.0f);
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
