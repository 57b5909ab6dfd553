// libFuzzer target: bit packing, both ways.
//
// Byte 0 picks `bits` (1..8) and byte 1 how many trailing bytes the unpacker is given
// (n is the most codes they hold). Checks:
//   * Unpack of the bytes (a heap buffer of exactly PackedSize(n, bits) bytes, output of
//     exactly n codes, so ASan sees any access beyond) equals a naive bit-by-bit reader,
//     every code in [0, 2^bits);
//   * Pack of those codes equals the input bytes with the padding bits of the last byte
//     cleared, and Pack into an exactly-sized buffer writes nothing beyond it;
//   * codes with one value made out of range (from byte 1) are refused at that index.
#include <cstdint>
#include <cstring>
#include <vector>

#include "bit_packing.h"
#include "fuzz_check.h"

using tfgc::bit_packing::Pack;
using tfgc::bit_packing::PackedSize;
using tfgc::bit_packing::MaxCodes;
using tfgc::bit_packing::Unpack;
using tfgc_fuzz::Check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int bits = data[0] % 8 + 1;
  const uint8_t control = data[1];
  const std::vector<uint8_t> stream(data + 2, data + size);
  const int64_t n = MaxCodes(static_cast<int64_t>(stream.size()), bits);
  Check(PackedSize(n, bits) == static_cast<int64_t>(stream.size()), "MaxCodes fills the bytes");

  std::vector<uint8_t> packed(stream);  // exactly sized copy for ASan
  std::vector<int32_t> codes(n);
  Unpack(packed.data(), n, bits, codes.data());
  for (int64_t i = 0; i < n; ++i) {
    int32_t naive = 0;
    for (int b = 0; b < bits; ++b) {
      const int64_t bit = i * bits + b;
      naive = (naive << 1) | ((stream[bit / 8] >> (7 - bit % 8)) & 1);
    }
    Check(codes[i] == naive, "Unpack equals a bit-by-bit reader");
  }

  std::vector<uint8_t> repacked(PackedSize(n, bits));
  Check(Pack(codes.data(), n, bits, repacked.data()) == -1, "unpacked codes pack");
  std::vector<uint8_t> expected(stream);
  const int padding = static_cast<int>(8 * expected.size() - n * bits);
  if (!expected.empty()) expected.back() &= static_cast<uint8_t>(0xFF << padding);
  Check(repacked == expected, "Pack(Unpack(bytes)) is the bytes without their padding");

  if (n > 0) {
    const int64_t at = control % n;
    codes[at] = (control & 1) ? -1 - control : (1 << bits) + control;
    Check(Pack(codes.data(), n, bits, repacked.data()) == at, "an out-of-range code is found");
  }
  return 0;
}
