// The zero-run codec's SIMD paths against its scalar fallback, in one process on the same
// buffers (no TensorFlow: the cores of tfgc_ops/cc only).
//
//   g++ -O3 -fno-wrapv -DNDEBUG -std=c++17 -I tfgc_ops/cc -o /tmp/bench_zero_run_paths
//       benchmarks/bench_zero_run_paths.cc tfgc_ops/cc/zero_run.cc tfgc_ops/cc/zero_run_x86.cc
//   /tmp/bench_zero_run_paths [MiB=16] [repeats=9]
//
// Data: quartic bytes of i.i.d. 3-values, each nonzero with probability p (half +1, half
// -1), from 1% (long runs of 121, sparse) to 60% (hardly any run). This is the shape of
// ThreeLC's bytes, not real gradients; benchmarks/bench_throughput.py measures the ops on
// ThreeLC's own bytes. Each row: best of `repeats` single-threaded passes per path, GB/s of
// input bytes (quartic bytes for encode, encoded bytes for decode), and SSSE3 / scalar;
// where the CPU has AVX-512 VBMI2, that decoder too (its encoder is SSSE3's). A row also
// checks that all paths write identical bytes and decode back to the input.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "zero_run.h"

namespace zr = tfgc::zero_run;

namespace {

std::vector<uint8_t> QuarticBytes(int64_t n, double nonzero, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<uint8_t> bytes(n);
  for (uint8_t& byte : bytes) {
    int code = 0;
    for (int k = 0; k < 5; ++k) {
      const double u = uniform(gen);
      code = code * 3 + (u < nonzero / 2 ? 0 : u < nonzero ? 2 : 1);
    }
    byte = static_cast<uint8_t>(code);
  }
  return bytes;
}

template <class F>
double BestSeconds(F f, int repeats) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    f();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = (argc > 1 ? std::atoll(argv[1]) : 16) << 20;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 9;
  if (!zr::IsaSupported(zr::Isa::kSsse3)) {
    std::printf("this CPU has no SSSE3 path (or this is not an x86-64 build)\n");
    return 1;
  }
  std::printf("%lld MiB per buffer, best of %d, one thread, GB/s of input bytes\n",
              static_cast<long long>(n >> 20), repeats);
  const bool avx512 = zr::IsaSupported(zr::Isa::kAvx512Vbmi2);
  std::printf("%-8s %7s | %-24s | %-24s | %-22s | %s\n", "nonzero", "ratio",
              "encode ssse3 / scalar", "decode ssse3 / scalar",
              avx512 ? "decode avx512 (/ssse3)" : "decode avx512: no CPU", "identical");
  bool all_identical = true;
  for (double nonzero : {0.01, 0.05, 0.15, 0.3, 0.6}) {
    const std::vector<uint8_t> quartic = QuarticBytes(n, nonzero, 1);
    std::vector<uint8_t> encoded[2] = {std::vector<uint8_t>(n), std::vector<uint8_t>(n)};
    std::vector<uint8_t> decoded[2] = {std::vector<uint8_t>(n), std::vector<uint8_t>(n)};
    int64_t size[2] = {0, 0};
    double encode_s[2], decode_s[2];
    const zr::Isa isas[2] = {zr::Isa::kSsse3, zr::Isa::kScalar};
    for (int p = 0; p < 2; ++p) {
      encode_s[p] = BestSeconds(
          [&] { size[p] = zr::EncodeSerialWith(isas[p], quartic.data(), n, encoded[p].data()); },
          repeats);
    }
    for (int p = 0; p < 2; ++p) {
      decode_s[p] = BestSeconds(
          [&] { zr::DecodeWith(isas[p], encoded[0].data(), size[0], decoded[p].data(), n); },
          repeats);
    }
    double avx512_s = 0;
    bool avx512_identical = true;
    if (avx512) {
      std::vector<uint8_t> decoded_avx512(n);
      avx512_s = BestSeconds(
          [&] {
            zr::DecodeWith(zr::Isa::kAvx512Vbmi2, encoded[0].data(), size[0],
                           decoded_avx512.data(), n);
          },
          repeats);
      avx512_identical = decoded_avx512 == quartic;
    }
    const bool identical = size[0] == size[1] &&
                           std::memcmp(encoded[0].data(), encoded[1].data(), size[0]) == 0 &&
                           decoded[0] == quartic && decoded[1] == quartic && avx512_identical;
    all_identical = all_identical && identical;
    char encode[64], decode[64], decode_avx512[64] = "-";
    std::snprintf(encode, sizeof(encode), "%5.2f / %5.2f = %5.2fx", n / encode_s[0] / 1e9,
                  n / encode_s[1] / 1e9, encode_s[1] / encode_s[0]);
    std::snprintf(decode, sizeof(decode), "%5.2f / %5.2f = %5.2fx", size[0] / decode_s[0] / 1e9,
                  size[0] / decode_s[1] / 1e9, decode_s[1] / decode_s[0]);
    if (avx512) {
      std::snprintf(decode_avx512, sizeof(decode_avx512), "%5.2f (%5.2fx)",
                    size[0] / avx512_s / 1e9, decode_s[0] / avx512_s);
    }
    std::printf("%-8.2f %6.2fx | %-24s | %-24s | %-22s | %s\n", nonzero,
                static_cast<double>(n) / size[0], encode, decode, decode_avx512,
                identical ? "yes" : "NO");
  }
  return all_identical ? 0 : 2;
}
