// libFuzzer target: the largest-magnitude selection of Sparsify and TopK
// (magnitude_select.h) on arbitrary floats.
//
// Input: bytes 0..3 are `wanted` (int32, may be negative or beyond n), bit 0 of byte 4
// is non_finite_in_wanted; the rest is float32 values (bytes 5.. cut to whole floats).
//
// Checks, against a stable sort of the nonzero finite magnitudes (descending, position
// ascending):
//   * the selection is exactly every non-finite value plus the first
//     min(max(wanted', 0), nonzero finite) of that order;
//   * the bitmap (exactly sized heap buffer, zero padding), positions, values and
//     reconstruction agree with it, with all four outputs and with each one alone
//     (ASan catches writes past the exact sizes); Expand of the bitmap and values gives
//     the reconstruction back;
//   * Expand of the input bytes as a bitmap of any bits takes exactly CountSelected
//     values, in position order, and ignores the padding bits.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_check.h"
#include "magnitude_select.h"

using tfgc_fuzz::Check;
namespace ms = ::tfgc::magnitude_select;

namespace {

uint32_t Pattern(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits & 0x7FFFFFFF;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  int32_t wanted;
  std::memcpy(&wanted, data, 4);
  const bool non_finite_in_wanted = data[4] & 1;
  const int64_t n = static_cast<int64_t>(size - 5) / 4;
  std::vector<float> x(n);
  if (n > 0) std::memcpy(x.data(), data + 5, 4 * n);

  // The expected selection.
  std::vector<int64_t> order;
  std::vector<char> expected(n, 0);
  int64_t non_finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t p = Pattern(x[i]);
    if (p >= 0x7F800000) {
      expected[i] = 1;
      ++non_finite;
    } else if (p != 0) {
      order.push_back(i);
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return Pattern(x[a]) > Pattern(x[b]); });
  int64_t take = non_finite_in_wanted ? wanted - non_finite : wanted;
  take = std::max<int64_t>(0, std::min<int64_t>(take, static_cast<int64_t>(order.size())));
  for (int64_t j = 0; j < take; ++j) expected[order[j]] = 1;
  const int64_t count = take + non_finite;

  std::vector<uint32_t> scratch;
  const ms::Selection selection = ms::Select(x.data(), n, wanted, non_finite_in_wanted, &scratch);
  Check(selection.count == count, "selected count");

  const int64_t bitmap_size = (n + 7) / 8;
  for (int which = 1; which < 16; which = which == 15 ? 16 : (which == 8 ? 15 : which * 2)) {
    // Exactly sized buffers: 1, 2, 4 and 8 alone, then all four.
    std::unique_ptr<uint8_t[]> bitmap(new uint8_t[bitmap_size > 0 ? bitmap_size : 1]);
    std::unique_ptr<int32_t[]> positions(new int32_t[count > 0 ? count : 1]);
    std::unique_ptr<float[]> values(new float[count > 0 ? count : 1]);
    std::unique_ptr<float[]> reconstruction(new float[n > 0 ? n : 1]);
    ms::Outputs outputs;
    if (which & 1) outputs.bitmap = bitmap_size > 0 ? bitmap.get() : nullptr;
    if (which & 2) outputs.positions = count > 0 ? positions.get() : nullptr;
    if (which & 4) outputs.values = count > 0 ? values.get() : nullptr;
    if (which & 8) outputs.reconstruction = n > 0 ? reconstruction.get() : nullptr;
    ms::Write(x.data(), n, selection, outputs);
    int64_t k = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (outputs.bitmap) {
        Check(((bitmap[i >> 3] >> (7 - (i & 7))) & 1) == expected[i], "bitmap bit");
      }
      if (outputs.reconstruction) {
        const float want = expected[i] ? x[i] : 0.0f;
        Check(std::memcmp(&want, &reconstruction[i], 4) == 0, "reconstruction");
      }
      if (expected[i]) {
        if (outputs.positions) Check(positions[k] == i, "position");
        if (outputs.values) Check(std::memcmp(&values[k], &x[i], 4) == 0, "value");
        ++k;
      }
    }
    if (outputs.bitmap && (n & 7) != 0) {
      Check((bitmap[n >> 3] & ((1 << (8 - (n & 7))) - 1)) == 0, "bitmap padding");
    }
    if (which == 15 && n > 0) {  // Expand inverts the bitmap and values
      Check(ms::CountSelected(bitmap.get(), n) == count, "count of the bitmap");
      std::unique_ptr<float[]> dense(new float[n]);
      ms::Expand(bitmap.get(), n, count > 0 ? values.get() : nullptr, dense.get());
      Check(std::memcmp(dense.get(), reconstruction.get(), 4 * n) == 0, "expand");
    }
  }

  // The input bytes themselves as a bitmap of any bits (padding set too): Expand takes
  // exactly CountSelected values, in order.
  const int64_t bits = 8 * static_cast<int64_t>(size) - (data[0] & 7);
  const int64_t selected = ms::CountSelected(data, bits);
  std::unique_ptr<float[]> given(new float[selected > 0 ? selected : 1]);
  for (int64_t j = 0; j < selected; ++j) given[j] = static_cast<float>(j + 1);
  std::unique_ptr<float[]> dense(new float[bits]);
  ms::Expand(data, bits, given.get(), dense.get());
  int64_t next = 0;
  for (int64_t i = 0; i < bits; ++i) {
    const bool set = (data[i >> 3] >> (7 - (i & 7))) & 1;
    Check(dense[i] == (set ? static_cast<float>(++next) : 0.0f), "expand of any bitmap");
  }
  Check(next == selected, "selected bits");
  return 0;
}
