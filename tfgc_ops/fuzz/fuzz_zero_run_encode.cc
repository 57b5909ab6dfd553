// libFuzzer target: the zero-run encoders on arbitrary quartic bytes, and invalid-byte
// detection on arbitrary raw bytes.
//
// Input: byte 0 picks the ParallelEncoder block size (1 + low 6 bits: 1..64) and the
// block visiting order (top 2 bits); byte 1 picks how the rest is mapped into 0..242 and
// whether it is placed after a 4096-byte valid prefix (so FindInvalidByte's second
// 4096-byte chunk is reached); the remaining bytes are the payload.
//
// Checks:
//   * Mapped bytes (all <= 242): EncodeSerial == EncodeSerialWith on every instruction
//     set the CPU runs == ParallelEncoder (any block size and order) == naive greedy
//     encoder, and decoding on every instruction set gives the bytes back exactly.
//   * Raw bytes: FindInvalidByte and ParallelEncoder::FirstInvalidByte both equal a naive
//     scan for the first byte > 242; when there is none, the encodings are checked too.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "zero_run.h"
#include "zero_run_reference.h"

using tfgc_fuzz::Check;
namespace zr = ::tfgc::zero_run;

namespace {

// Maps raw bytes into 0..242. Mode 0 keeps each byte modulo 243; modes 1-3 make 121 (a
// zero group) far more likely so that long runs and runs across block seams are common.
std::vector<uint8_t> MapAll(const uint8_t* in, size_t n, int mode) {
  constexpr size_t kMaxMapped = 16384;  // keeps mode 3's expansion (up to 127x) cheap
  std::vector<uint8_t> out;
  for (size_t i = 0; i < n && out.size() < kMaxMapped; ++i) {
    const uint8_t b = in[i];
    switch (mode) {
      case 0:
        out.push_back(b % 243);
        break;
      case 1:  // half of all bytes are 121
        out.push_back((b & 1) ? zr::kZeroGroup : static_cast<uint8_t>((b >> 1) % 243));
        break;
      case 2:  // seven in eight bytes are 121; the rest are 120 or 122
        out.push_back((b & 7) ? zr::kZeroGroup
                              : static_cast<uint8_t>(120 + 2 * ((b >> 3) & 1)));
        break;
      default:  // each byte is a run of b >> 1 121s, then a literal 0..120 if b is odd
        out.insert(out.end(), b >> 1, zr::kZeroGroup);
        if (b & 1) out.push_back(static_cast<uint8_t>(b % 121));
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int64_t block_size = 1 + (data[0] & 63);
  const int order = data[0] >> 6;
  const int map_mode = data[1] & 3;
  const bool long_prefix = (data[1] & 4) != 0;
  const uint8_t* payload = data + 2;
  const size_t n = size - 2;

  // Valid bytes: encoders agree and roundtrip.
  std::vector<uint8_t> valid = MapAll(payload, n, map_mode);
  if (long_prefix) {
    std::vector<uint8_t> prefixed(4096, zr::kZeroGroup);
    for (size_t i = 0; i < valid.size() && i < 4096; ++i) prefixed[4095 - i] = valid[i];
    prefixed.insert(prefixed.end(), valid.begin(), valid.end());
    valid.swap(prefixed);
  }
  tfgc_fuzz::CheckEncodings(valid.data(), static_cast<int64_t>(valid.size()), block_size,
                            order);

  // Raw bytes: the first invalid byte.
  std::vector<uint8_t> raw(payload, payload + n);
  if (long_prefix) raw.insert(raw.begin(), valid.begin(), valid.begin() + 4096);
  const int64_t raw_n = static_cast<int64_t>(raw.size());
  const int64_t first_invalid = tfgc_fuzz::NaiveFindInvalid(raw.data(), raw_n);
  Check(zr::FindInvalidByte(raw.data(), raw_n) == first_invalid, "FindInvalidByte");
  std::vector<uint8_t> scratch(raw.size());
  zr::ParallelEncoder enc(raw.data(), raw_n, block_size, scratch.data());
  for (int64_t b : tfgc_fuzz::Order(enc.num_blocks(), order)) enc.Summarize(b);
  Check(enc.FirstInvalidByte() == first_invalid, "ParallelEncoder::FirstInvalidByte");
  if (first_invalid < 0) tfgc_fuzz::CheckEncodings(raw.data(), raw_n, block_size, order);
  return 0;
}
