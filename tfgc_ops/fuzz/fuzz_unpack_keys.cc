// libFuzzer target: arbitrary bytes through the key unpacker.
//
// Checks:
//   * Unpack, ParseHeader and UnpackInto return true or false without crashing or reading
//     out of bounds (UnpackInto writes into a heap buffer of exactly `count` keys, so ASan
//     sees any write past it), and agree with each other.
//   * When the bytes are accepted: the keys are non-negative and strictly increasing
//     (CheckKeys agrees), there are as many as the header says, and Pack(keys, flag bits
//     from the header) gives a packing with M = BitLength(largest delta) that Unpack
//     accepts, that decodes to the same keys and that packs to itself again. Unpack
//     accepts non-canonical M, classes and LEB128 counts, so the input need not equal the
//     canonical packing byte for byte, and it may even be shorter: class lengths
//     ceil((c + 1) M / 2^l) are not monotone in what they offer a given delta, e.g. l = 2,
//     M = 10 has a class of 8 bits while M = 9 only has 7 and 9.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "key_packing.h"

namespace kp = ::tfgc::key_packing;

using tfgc_fuzz::Check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int64_t n = static_cast<int64_t>(size);
  std::vector<int64_t> keys;
  std::string error;
  const bool ok = kp::Unpack(data, n, &keys, &error);
  Check(ok == error.empty(), "Unpack's result and error message disagree");

  int flag_bits = -1, max_bits = -1;
  int64_t count = -1, header_size = -1;
  std::string header_error;
  const bool header_ok =
      kp::ParseHeader(data, n, &flag_bits, &max_bits, &count, &header_size, &header_error);
  Check(header_ok == header_error.empty(), "ParseHeader's result and error disagree");
  if (!header_ok) {
    Check(!ok, "Unpack accepted what ParseHeader rejected");
    return 0;
  }
  Check(flag_bits >= kp::kMinFlagBits && flag_bits <= kp::kMaxFlagBits, "flag bits range");
  Check(max_bits >= 0 && max_bits <= kp::kMaxDeltaBits, "max bits range");
  Check(header_size >= 3 && header_size <= n && header_size <= 11, "header size range");
  Check(count >= 0 && count <= 8 * (n - header_size) / flag_bits, "count range");

  std::unique_ptr<int64_t[]> exact(new int64_t[count]);
  std::string into_error;
  const bool into_ok = kp::UnpackInto(data, n, exact.get(), &into_error);
  Check(into_ok == ok, "UnpackInto and Unpack disagree");
  if (!ok) return 0;

  Check(static_cast<int64_t>(keys.size()) == count, "key count differs from the header");
  for (int64_t j = 0; j < count; ++j) {
    Check(exact[j] == keys[j], "UnpackInto and Unpack give different keys");
    Check(keys[j] >= 0, "negative key");
    Check(j == 0 || keys[j] > keys[j - 1], "keys not strictly increasing");
  }
  Check(kp::CheckKeys(keys.data(), count, -1, 0).empty(), "CheckKeys rejects unpacked keys");
  const int bits_needed = kp::BitLength(kp::MaxDelta(keys.data(), count, -1));
  Check(bits_needed <= max_bits, "a delta is longer than the header's M");

  const std::vector<uint8_t> packed = kp::Pack(keys.data(), count, flag_bits);
  Check(packed[0] == flag_bits && packed[1] == bits_needed, "canonical header");
  std::vector<int64_t> again;
  std::string again_error;
  Check(kp::Unpack(packed.data(), static_cast<int64_t>(packed.size()), &again, &again_error),
        "Unpack rejects Pack's output");
  Check(again == keys, "Pack/Unpack roundtrip changes the keys");
  Check(kp::Pack(again.data(), count, flag_bits) == packed, "Pack is not idempotent");
  return 0;
}
