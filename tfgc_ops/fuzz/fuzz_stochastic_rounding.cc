// libFuzzer target: QSGD's stochastic rounding and 3LC's stochastic 3-values
// (stochastic_rounding.h) on arbitrary floats, and QSGD decoding of arbitrary bytes.
//
// Input: byte 0 picks the block split (1 + low 2 bits blocks), the QSGD bits (2 + bits
// 2..4, capped at 8) and the bucket size (1 + byte 1); bytes 2..9 are the seed; the rest
// is float32 values.
//
// Checks:
//   * BucketNorms by blocks equals one pass and a naive double sum (to float rounding).
//   * QsgdEncode by blocks (8-aligned, last first, into an exactly-sized heap buffer)
//     equals one pass; each code's sign is x < 0 and its level is 0 in an unusable
//     bucket, else floor(t) + [Uniform(key, j) < t - floor(t)] as the scalar definition
//     computes it (the SSE2 loop must agree), and floor(t) or floor(t) + 1 in double,
//     capped at s; QsgdDecode gives back
//     +-level * norm / s into exactly n floats (ASan).
//   * QsgdDecode of the input bytes as a payload writes exactly the n values they hold.
//   * TernaryFold by blocks equals one pass, every byte <= 242, a zero value stays 0,
//     and each 3-value is sign(x) where Uniform(key, j) < |x| / M, else 0.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "bit_packing.h"
#include "fuzz_check.h"
#include "quartic_fold.h"
#include "stochastic_rounding.h"

using tfgc_fuzz::Check;
namespace sr = ::tfgc::stochastic_rounding;
namespace bp = ::tfgc::bit_packing;

namespace {

// Splits [0, n) into `parts` blocks whose starts are multiples of `align` and runs
// work(begin, end) on each, last first.
template <typename Work>
void InBlocks(int64_t n, int parts, int64_t align, Work work) {
  std::vector<int64_t> cuts = {0};
  for (int p = 1; p < parts; ++p) cuts.push_back(std::min(n, n * p / parts / align * align));
  cuts.push_back(n);
  for (int p = parts - 1; p >= 0; --p) {
    if (cuts[p] < cuts[p + 1]) work(cuts[p], cuts[p + 1]);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 10) return 0;
  const int parts = 1 + (data[0] & 3);
  const int bits = std::min(8, 2 + ((data[0] >> 2) & 7));
  const int64_t bucket = 1 + data[1];
  uint64_t seed0, seed1 = data[0];
  std::memcpy(&seed0, data + 2, 8);
  const int64_t n = (size - 10) / 4;
  std::vector<float> x(n);
  if (n > 0) std::memcpy(x.data(), data + 10, 4 * n);
  const float levels = static_cast<float>((1 << (bits - 1)) - 1);

  // Norms.
  const int64_t buckets = (n + bucket - 1) / bucket;
  std::vector<float> norms(buckets), whole(buckets);
  sr::BucketNorms(x.data(), n, bucket, 0, buckets, whole.data());
  InBlocks(buckets, parts, 1, [&](int64_t b, int64_t e) {
    sr::BucketNorms(x.data(), n, bucket, b, e, norms.data());
  });
  for (int64_t b = 0; b < buckets; ++b) {
    Check(std::memcmp(&norms[b], &whole[b], 4) == 0, "norms depend on the blocks");
    double naive = 0.0;
    for (int64_t j = b * bucket; j < std::min(n, (b + 1) * bucket); ++j) naive += double(x[j]) * x[j];
    const float expected = static_cast<float>(std::sqrt(naive));
    Check(std::isfinite(expected) == std::isfinite(norms[b]), "norm finiteness");
    if (std::isfinite(expected)) {
      Check(std::fabs(norms[b] - expected) <= 1e-5f * expected + 1e-30f, "norm value");
    }
  }

  // QSGD codes.
  const int64_t packed_size = bp::PackedSize(n, bits);
  std::unique_ptr<uint8_t[]> packed(new uint8_t[packed_size + 1]);
  std::unique_ptr<uint8_t[]> one_pass(new uint8_t[packed_size + 1]);
  sr::QsgdEncode(x.data(), n, norms.data(), bucket, bits, seed0, seed1, 0, n, one_pass.get());
  InBlocks(n, parts, 8, [&](int64_t b, int64_t e) {
    sr::QsgdEncode(x.data(), n, norms.data(), bucket, bits, seed0, seed1, b, e, packed.get());
  });
  Check(std::memcmp(packed.get(), one_pass.get(), packed_size) == 0, "codes depend on the blocks");
  std::vector<int32_t> codes(n);
  bp::Unpack(packed.get(), n, bits, codes.data());
  std::unique_ptr<float[]> values(new float[n > 0 ? n : 1]);
  InBlocks(n, parts, 8, [&](int64_t b, int64_t e) {
    sr::QsgdDecode(packed.get(), n, norms.data(), bucket, bits, b, e, values.get());
  });
  const int32_t sign_bit = 1 << (bits - 1);
  const uint64_t key = sr::SeedKey(seed0, seed1);
  for (int64_t j = 0; j < n; ++j) {
    const float norm = norms[j / bucket];
    const int32_t level = codes[j] & (sign_bit - 1);
    Check(((codes[j] & sign_bit) != 0) == (x[j] < 0), "code sign");
    if (!(norm > 0 && std::isfinite(norm))) {
      Check(level == 0, "level in an unusable bucket");
    } else {
      const double t = std::min(double(std::fabs(x[j])) * (levels / double(norm)), double(levels));
      Check(level >= std::floor(t) - 1 && level <= std::floor(t) + 1, "level near t");
      const bool subnormal = levels / double(norm) > FLT_MAX;
      const float t32 = std::min(subnormal ? std::fabs(x[j]) / norm * levels
                                           : std::fabs(x[j]) * (levels / norm), levels);
      const int32_t lower = static_cast<int32_t>(t32);
      const int32_t up = sr::Uniform(key, j) < t32 - static_cast<float>(lower);
      Check(level == std::min(lower + up, sign_bit - 1), "level is the scalar definition's");
    }
    const float magnitude = static_cast<float>(level);
    const float expected = ((codes[j] & sign_bit) ? -magnitude : magnitude) * norm / levels;
    Check(std::memcmp(&expected, &values[j], 4) == 0 ||
              (std::isnan(expected) && std::isnan(values[j])), "decoded value");
  }

  // QSGD decoding of the input bytes themselves.
  const int64_t held = bp::MaxCodes(static_cast<int64_t>(size), bits);
  const int64_t held_buckets = (held + bucket - 1) / bucket;
  std::vector<float> unit_norms(held_buckets, 1.0f);
  std::unique_ptr<float[]> decoded(new float[held > 0 ? held : 1]);
  InBlocks(held, parts, 8, [&](int64_t b, int64_t e) {
    sr::QsgdDecode(data, held, unit_norms.data(), bucket, bits, b, e, decoded.get());
  });
  for (int64_t j = 0; j < held; ++j) Check(std::fabs(decoded[j]) <= 1.0f, "decoded magnitude");

  // Stochastic 3-values.
  float scale = 0.0f;
  for (float v : x) scale = std::max(scale, std::isfinite(v) ? std::fabs(v) : 0.0f);
  if (scale > 0) {
    const int64_t groups = ::tfgc::quartic_fold::GroupsFor(n);
    std::unique_ptr<uint8_t[]> fold(new uint8_t[groups + 1]);
    std::unique_ptr<uint8_t[]> fold_once(new uint8_t[groups + 1]);
    sr::TernaryFold(x.data(), n, scale, seed0, seed1, 0, groups, fold_once.get());
    InBlocks(groups, parts, 1, [&](int64_t b, int64_t e) {
      sr::TernaryFold(x.data(), n, scale, seed0, seed1, b, e, fold.get());
    });
    Check(std::memcmp(fold.get(), fold_once.get(), groups) == 0, "3-values depend on the blocks");
    static constexpr int kPowers[5] = {81, 27, 9, 3, 1};
    for (int64_t i = 0; i < groups; ++i) {
      Check(fold[i] <= 242, "quartic byte above 242");
      for (int k = 0; k < 5; ++k) {
        const int64_t j = k * groups + i;
        const int digit = fold[i] / kPowers[k] % 3;
        if (j >= n || x[j] == 0.0f) Check(digit == 1, "a zero (or pad) value sent nonzero");
        if (j < n) {  // the scalar definition (the SSE2 loop must agree)
          const bool kept = sr::Uniform(key, j) < std::fabs(x[j]) * (1.0f / scale);
          Check(digit == 1 + (kept ? (x[j] < 0 ? -1 : 1) : 0), "3-value is the definition's");
        }
      }
    }
  }
  return 0;
}
