// Naive reference implementations and helpers shared by the zero-run fuzz targets.
#ifndef TFGC_OPS_FUZZ_ZERO_RUN_REFERENCE_H_
#define TFGC_OPS_FUZZ_ZERO_RUN_REFERENCE_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_check.h"
#include "zero_run.h"

namespace tfgc_fuzz {

namespace zr = ::tfgc::zero_run;

// Every instruction set this CPU runs (the scalar path always).
inline std::vector<zr::Isa> SupportedIsas() {
  std::vector<zr::Isa> isas;
  for (zr::Isa isa : {zr::Isa::kScalar, zr::Isa::kSsse3, zr::Isa::kAvx512Vbmi2}) {
    if (zr::IsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

inline int64_t NaiveFindInvalid(const uint8_t* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (in[i] > zr::kMaxLiteral) return i;
  }
  return -1;
}

inline std::vector<uint8_t> NaiveDecode(const uint8_t* in, int64_t n) {
  std::vector<uint8_t> out;
  for (int64_t i = 0; i < n; ++i) {
    if (in[i] <= zr::kMaxLiteral) {
      out.push_back(in[i]);
    } else {
      out.insert(out.end(), in[i] - zr::kFirstRunByte + 2, zr::kZeroGroup);
    }
  }
  return out;
}

// Greedy: runs of 121 become as many 255s (14 each) as fit, then one byte for the rest
// (a literal 121 for a rest of one).
inline std::vector<uint8_t> NaiveEncode(const uint8_t* in, int64_t n) {
  std::vector<uint8_t> out;
  int64_t i = 0;
  while (i < n) {
    if (in[i] != zr::kZeroGroup) {
      out.push_back(in[i++]);
      continue;
    }
    int64_t k = 0;
    while (i + k < n && in[i + k] == zr::kZeroGroup) ++k;
    i += k;
    while (k >= zr::kMaxRun) {
      out.push_back(255);
      k -= zr::kMaxRun;
    }
    if (k == 1) out.push_back(zr::kZeroGroup);
    if (k >= 2) out.push_back(static_cast<uint8_t>(zr::kFirstRunByte + k - 2));
  }
  return out;
}

// Visiting order for blocks: 0 forward, 1 backward, 2 odd blocks then even, 3 rotated.
inline std::vector<int64_t> Order(int64_t num_blocks, int mode) {
  std::vector<int64_t> order;
  switch (mode & 3) {
    case 0:
      for (int64_t b = 0; b < num_blocks; ++b) order.push_back(b);
      break;
    case 1:
      for (int64_t b = num_blocks - 1; b >= 0; --b) order.push_back(b);
      break;
    case 2:
      for (int64_t b = 1; b < num_blocks; b += 2) order.push_back(b);
      for (int64_t b = 0; b < num_blocks; b += 2) order.push_back(b);
      break;
    default:
      for (int64_t b = 0; b < num_blocks; ++b) order.push_back((b + num_blocks / 2) % num_blocks);
  }
  return order;
}

// Runs the ParallelEncoder protocol on valid input. Blocks are summarized in order `mode`
// and written in order `mode + 1`; the output buffer holds exactly Plan() bytes (so ASan
// sees any write past it) and starts filled with `fill` (so a byte that Write() forgets
// shows up as a mismatch for at least one of two different fills).
inline std::vector<uint8_t> ParallelEncode(const uint8_t* in, int64_t n, int64_t block_size,
                                           int mode, uint8_t fill) {
  std::vector<uint8_t> scratch(n, fill);
  zr::ParallelEncoder enc(in, n, block_size, scratch.data());
  Check(enc.num_blocks() == (n + block_size - 1) / block_size, "ParallelEncoder num_blocks");
  for (int64_t b : Order(enc.num_blocks(), mode)) enc.Summarize(b);
  Check(enc.FirstInvalidByte() == -1, "ParallelEncoder reports an invalid byte in valid input");
  const int64_t size = enc.Plan();
  Check(size >= 0 && size <= n, "ParallelEncoder::Plan size out of range");
  std::unique_ptr<uint8_t[]> out(new uint8_t[size]);
  std::memset(out.get(), fill, size);
  for (int64_t b : Order(enc.num_blocks(), mode + 1)) enc.Write(b, out.get());
  return std::vector<uint8_t>(out.get(), out.get() + size);
}

// Encodes valid bytes in[0, n) with EncodeSerial and ParallelEncoder and checks that both
// equal the naive greedy encoding and decode back to the input. Returns the encoding.
inline std::vector<uint8_t> CheckEncodings(const uint8_t* in, int64_t n, int64_t block_size,
                                           int mode) {
  Check(zr::FindInvalidByte(in, n) == -1, "FindInvalidByte on valid bytes");
  std::unique_ptr<uint8_t[]> buf(new uint8_t[n]);  // EncodeSerial's contract: n bytes
  const int64_t size = zr::EncodeSerial(in, n, buf.get());
  Check(size >= 0 && size <= n, "EncodeSerial size out of range");
  const std::vector<uint8_t> serial(buf.get(), buf.get() + size);
  Check(serial == NaiveEncode(in, n), "EncodeSerial differs from the naive greedy encoder");
  for (zr::Isa isa : SupportedIsas()) {
    std::unique_ptr<uint8_t[]> other(new uint8_t[n]);
    const int64_t other_size = zr::EncodeSerialWith(isa, in, n, other.get());
    Check(other_size == size && std::equal(serial.begin(), serial.end(), other.get()),
          "EncodeSerialWith differs between instruction sets");
  }
  for (uint8_t fill : {uint8_t{0x00}, uint8_t{0xFF}}) {
    Check(ParallelEncode(in, n, block_size, mode, fill) == serial,
          "ParallelEncoder differs from EncodeSerial");
  }
  Check(ParallelEncode(in, n, n + 1, mode, 0x5A) == serial,
        "ParallelEncoder (single block) differs from EncodeSerial");

  const int64_t decoded_size = zr::DecodedSize(serial.data(), size);
  Check(decoded_size == n, "DecodedSize of the encoding");
  for (zr::Isa isa : SupportedIsas()) {
    std::unique_ptr<uint8_t[]> decoded(new uint8_t[decoded_size]);
    zr::DecodeWith(isa, serial.data(), size, decoded.get(), decoded_size);
    Check(std::equal(in, in + n, decoded.get()), "roundtrip");
  }
  return serial;
}

}  // namespace tfgc_fuzz

#endif  // TFGC_OPS_FUZZ_ZERO_RUN_REFERENCE_H_
