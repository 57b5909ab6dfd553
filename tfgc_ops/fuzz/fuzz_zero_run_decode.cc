// libFuzzer target: arbitrary bytes through the zero-run decoder, then back through both
// encoders.
//
// Input: byte 0 picks the ParallelEncoder block size (1 + low 6 bits: 1..64) and the
// block visiting order (top 2 bits); the remaining bytes are the encoded stream.
//
// Checks:
//   * DecodedSize (and DecodedSizeWith on every instruction set) equals a naive count;
//     Decode, and DecodeWith on every instruction set
//     the CPU runs, into a heap buffer of exactly that size (ASan catches any write past
//     it) give what a naive byte-by-byte decoder gives.
//   * The decoded bytes are all <= 242: FindInvalidByte finds nothing.
//   * EncodeSerial and ParallelEncoder (Summarize/FirstInvalidByte/Plan/Write, blocks in
//     a scrambled order, output buffer of exactly Plan() bytes) agree byte for byte with
//     each other and with a naive greedy encoder; the greedy encoding is no longer than
//     the input stream.
//   * Decoding that encoding gives back the decoded bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "zero_run.h"
#include "zero_run_reference.h"

using tfgc_fuzz::Check;
namespace zr = ::tfgc::zero_run;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int64_t block_size = 1 + (data[0] & 63);
  const int mode = data[0] >> 6;
  const uint8_t* in = data + 1;
  const int64_t n = static_cast<int64_t>(size - 1);

  const std::vector<uint8_t> expected = tfgc_fuzz::NaiveDecode(in, n);
  const int64_t decoded_size = zr::DecodedSize(in, n);
  Check(decoded_size == static_cast<int64_t>(expected.size()), "DecodedSize");
  std::unique_ptr<uint8_t[]> decoded(new uint8_t[decoded_size]);
  zr::Decode(in, n, decoded.get(), decoded_size);
  Check(std::equal(expected.begin(), expected.end(), decoded.get()), "Decode content");
  for (zr::Isa isa : tfgc_fuzz::SupportedIsas()) {
    Check(zr::DecodedSizeWith(isa, in, n) == decoded_size, "DecodedSizeWith");
    std::unique_ptr<uint8_t[]> other(new uint8_t[decoded_size]);
    zr::DecodeWith(isa, in, n, other.get(), decoded_size);
    Check(std::equal(expected.begin(), expected.end(), other.get()), "DecodeWith content");
  }

  const std::vector<uint8_t> encoded =
      tfgc_fuzz::CheckEncodings(decoded.get(), decoded_size, block_size, mode);
  Check(static_cast<int64_t>(encoded.size()) <= n,
        "greedy encoding longer than the stream it was decoded from");
  return 0;
}
