// libFuzzer target: 3LC's quantize-and-fold and unfold (quartic_fold.h) on arbitrary floats
// and arbitrary bytes.
//
// Input: byte 0 picks the block split (1 + low 3 bits blocks of bytes) and whether the
// rest is floats to fold (bit 3 clear) or bytes to unfold (bit 3 set); bytes 1..4 are
// the scale as a float.
//
// Checks:
//   * LargestMagnitude equals a naive scan (NaN exactly when some value is not finite).
//   * Fold (block by block, into an exactly-sized heap buffer) gives bytes <= 242 equal to
//     a naive fold of clamp(nearbyint(x / M), -1, 1); Unfold of them gives q * M.
//   * Unfold of arbitrary bytes <= 242 writes exactly n values (ASan) equal to a naive one.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_check.h"
#include "quartic_fold.h"

using tfgc_fuzz::Check;
namespace qf = ::tfgc::quartic_fold;

namespace {

int NaiveDigit(float x, float scale) {  // q + 1
  return static_cast<int>(std::min(std::max(std::nearbyint(x / scale), -1.0f), 1.0f)) + 1;
}

// Splits [0, groups) into `parts` blocks and runs work(begin, end) on each, last first.
template <typename Work>
void InBlocks(int64_t groups, int parts, Work work) {
  for (int p = parts - 1; p >= 0; --p) work(groups * p / parts, groups * (p + 1) / parts);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  const int parts = 1 + (data[0] & 7);
  const bool unfold_bytes = (data[0] & 8) != 0;
  float scale;
  std::memcpy(&scale, data + 1, 4);
  const uint8_t* rest = data + 5;
  const size_t rest_size = size - 5;

  if (unfold_bytes) {
    if (!std::isfinite(scale)) return 0;
    const int64_t groups = rest_size;
    const int64_t n = std::max<int64_t>(0, 5 * groups - (data[0] >> 4) % 5);
    if (qf::GroupsFor(n) != groups) return 0;
    std::vector<uint8_t> bytes(rest, rest + rest_size);
    for (uint8_t& b : bytes) b %= 243;
    std::unique_ptr<float[]> out(new float[n > 0 ? n : 1]);
    InBlocks(groups, parts, [&](int64_t b, int64_t e) {
      qf::Unfold(bytes.data(), n, scale, b, e, out.get());
    });
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = j % groups, k = j / groups;
      int digit = bytes[i];
      for (int d = 4; d > k; --d) digit /= 3;
      Check(out[j] == static_cast<float>(digit % 3 - 1) * scale, "Unfold value");
    }
    return 0;
  }

  const int64_t n = rest_size / 4;
  std::unique_ptr<float[]> x(new float[n > 0 ? n : 1]);
  std::memcpy(x.get(), rest, 4 * n);
  float naive_largest = 0.0f;
  bool finite = true;
  for (int64_t j = 0; j < n; ++j) {
    finite = finite && std::isfinite(x[j]);
    naive_largest = std::max(naive_largest, std::fabs(x[j]));
  }
  const float largest = qf::LargestMagnitude(x.get(), n);
  Check(finite ? largest == naive_largest : std::isnan(largest), "LargestMagnitude");
  // The op's contract: M > 0 and |x| / M <= 1.5, i.e. M at least max|x| / 1.5.
  if (!finite || !(scale > 0) || !std::isfinite(scale) || naive_largest / scale > 1.5f) return 0;
  const int64_t groups = qf::GroupsFor(n);
  std::unique_ptr<uint8_t[]> folded(new uint8_t[groups > 0 ? groups : 1]);
  InBlocks(groups, parts, [&](int64_t b, int64_t e) {
    qf::Fold(x.get(), n, scale, b, e, folded.get());
  });
  Check(std::all_of(folded.get(), folded.get() + groups, [](uint8_t b) { return b <= 242; }),
        "Fold bytes <= 242");
  for (int64_t i = 0; i < groups; ++i) {
    int byte = 0;
    for (int k = 0; k < 5; ++k) {
      const int64_t j = k * groups + i;
      byte = byte * 3 + (j < n ? NaiveDigit(x[j], scale) : 1);
    }
    Check(folded[i] == byte, "Fold byte");
  }
  std::unique_ptr<float[]> back(new float[n > 0 ? n : 1]);
  qf::Unfold(folded.get(), n, scale, 0, groups, back.get());
  for (int64_t j = 0; j < n; ++j) {
    Check(back[j] == static_cast<float>(NaiveDigit(x[j], scale) - 1) * scale, "round trip");
  }
  return 0;
}
