// libFuzzer target: the quartic entropy coder (quartic_rans.h) on arbitrary streams and on
// arbitrary quartic bytes.
//
// Input: byte 0 picks how many groups there are (1 + low 2 bits) and how the rest is used
// (bit 2: as an encoded stream or as quartic bytes; bit 3: bytes biased towards 121, as
// sparse gradients give); the next one byte per group is that group's size (0..255).
//
// Checks:
//   * Decode of an arbitrary stream into a heap buffer of exactly the groups' total size
//     (ASan catches any access past it, or past the stream) either fails with a message or
//     yields bytes <= 242 that Encode codes into a stream that decodes back to them.
//   * Encode of any quartic bytes stays within MaxEncodedSize and decodes back exactly; the
//     stream cut by one byte, or extended by one, is rejected.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "fuzz_check.h"
#include "quartic_rans.h"

using tfgc_fuzz::Check;
namespace qr = ::tfgc::quartic_rans;

namespace {

std::vector<uint8_t> EncodeAll(const uint8_t* quartic, const std::vector<int64_t>& sizes,
                               int64_t total) {
  std::vector<uint8_t> out(qr::MaxEncodedSize(total, sizes.size()));
  const int64_t size = qr::Encode(quartic, sizes.data(), sizes.size(), out.data());
  Check(size > 0 && size <= static_cast<int64_t>(out.size()), "Encode size within its bound");
  out.resize(size);
  return out;
}

// Decodes `stream` into an exactly-sized heap buffer; nullptr when it is rejected.
std::unique_ptr<uint8_t[]> DecodeAll(const std::vector<uint8_t>& stream,
                                     const std::vector<int64_t>& sizes, int64_t total) {
  std::unique_ptr<uint8_t[]> in(new uint8_t[stream.size()]);  // exact, for ASan
  std::copy(stream.begin(), stream.end(), in.get());
  std::unique_ptr<uint8_t[]> out(new uint8_t[total > 0 ? total : 1]);
  const char* error = qr::Decode(in.get(), stream.size(), sizes.data(), sizes.size(), out.get());
  if (error != nullptr) return nullptr;
  return out;
}

void CheckRoundTrip(const uint8_t* quartic, const std::vector<int64_t>& sizes, int64_t total) {
  std::vector<uint8_t> stream = EncodeAll(quartic, sizes, total);
  const auto decoded = DecodeAll(stream, sizes, total);
  Check(decoded != nullptr, "an encoding decodes");
  Check(std::equal(quartic, quartic + total, decoded.get()), "round trip");
  std::vector<uint8_t> cut(stream.begin(), stream.end() - 1);
  Check(DecodeAll(cut, sizes, total) == nullptr, "a stream cut by one byte is rejected");
  stream.push_back(0);
  Check(DecodeAll(stream, sizes, total) == nullptr, "a stream with one byte more is rejected");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int num_groups = 1 + (data[0] & 3);
  const bool as_stream = (data[0] & 4) == 0, sparse = (data[0] & 8) != 0;
  if (size < 1 + static_cast<size_t>(num_groups)) return 0;
  std::vector<int64_t> sizes(data + 1, data + 1 + num_groups);
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  const uint8_t* rest = data + 1 + num_groups;
  const size_t rest_size = size - 1 - num_groups;

  if (as_stream) {
    const std::vector<uint8_t> stream(rest, rest + rest_size);
    const auto decoded = DecodeAll(stream, sizes, total);
    if (decoded == nullptr) return 0;
    Check(std::all_of(decoded.get(), decoded.get() + total, [](uint8_t b) { return b <= 242; }),
          "decoded bytes are quartic");
    CheckRoundTrip(decoded.get(), sizes, total);
    return 0;
  }
  // Quartic bytes from the rest, repeated as needed to fill the groups.
  std::vector<uint8_t> quartic(total);
  for (int64_t i = 0; i < total; ++i) {
    const uint8_t b = rest_size ? rest[i % rest_size] : 121;
    quartic[i] = sparse ? (b < 200 ? 121 : b % 243) : b % 243;
  }
  CheckRoundTrip(quartic.data(), sizes, total);
  return 0;
}
