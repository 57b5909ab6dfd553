#include "zero_run.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "zero_run_paths.h"

namespace tfgc {
namespace zero_run {
namespace {

constexpr uint8_t kLongestRunByte = kFirstRunByte + (kMaxRun - 2);  // 255

// The byte that stands for a run of k 121s, 1 <= k <= 14. A table beats a branch here.
constexpr uint8_t kRunByte[kMaxRun + 1] = {0,   121, 243, 244, 245, 246, 247, 248,
                                           249, 250, 251, 252, 253, 254, 255};

constexpr uint64_t kEightZeroGroups = 0x7979797979797979ULL;

// Decoded length of each byte: 1 for a literal, 2..14 for a run byte.
constexpr struct DecodedLengths {
  uint8_t of[256];
  constexpr DecodedLengths() : of() {
    for (int b = 0; b < 256; ++b) of[b] = b < kFirstRunByte ? 1 : b - (kFirstRunByte - 2);
  }
} kDecodedLength;

// True when some byte of v is zero (the classic SWAR test).
inline bool HasZeroByte(uint64_t v) {
  return ((v - 0x0101010101010101ULL) & ~v & 0x8080808080808080ULL) != 0;
}

// Number of leading bytes equal to 121 in in[0, n).
int64_t CountLeadingZeroGroups(const uint8_t* in, int64_t n) {
  int64_t i = 0;
  while (i + 8 <= n) {
    uint64_t word;
    std::memcpy(&word, in + i, 8);
    const uint64_t diff = word ^ kEightZeroGroups;
    if (diff != 0) return i + __builtin_ctzll(diff) / 8;  // little-endian byte order
    i += 8;
  }
  while (i < n && in[i] == kZeroGroup) ++i;
  return i;
}

// Number of trailing bytes equal to 121 in in[0, n).
int64_t CountTrailingZeroGroups(const uint8_t* in, int64_t n) {
  int64_t i = n;
  while (i > 0 && in[i - 1] == kZeroGroup) --i;
  return n - i;
}

int64_t RunEncodedSize(int64_t k) { return k / kMaxRun + (k % kMaxRun != 0); }

// Writes the greedy encoding of a run of k 121s; returns bytes written.
int64_t WriteRun(int64_t k, uint8_t* out) {
  const int64_t full = k / kMaxRun;
  std::memset(out, kLongestRunByte, full);
  const int64_t rest = k % kMaxRun;
  if (rest == 0) return full;
  out[full] = kRunByte[rest];
  return full + 1;
}

}  // namespace

namespace internal {

int64_t EncodeScalar(const uint8_t* in, int64_t n, uint8_t* out, EncodeState state) {
  // Invariant: o plus one byte for a pending run never exceeds i, so writes at out[o]
  // and out[o + 1] stay inside out while i <= n - 2.
  int64_t i = state.i, o = state.o;
  uint64_t run = state.run;
  while (i + 9 <= n) {
    uint64_t word;
    std::memcpy(&word, in + i, 8);
    const uint64_t diff = word ^ kEightZeroGroups;
    if (diff == 0) {  // eight 121s: extend the run
      run += 8;
      if (run >= kMaxRun) {
        out[o++] = kLongestRunByte;
        run -= kMaxRun;
      }
    } else if (!HasZeroByte(diff)) {  // no 121: eight literals
      if (run > 0) {
        out[o++] = kRunByte[run];
        run = 0;
      }
      std::memcpy(out + o, in + i, 8);
      o += 8;
    } else {
      // Mixed: runs are short and unpredictable, so go branch-free per byte, written as
      // arithmetic because compilers turn conditionals back into branches here.
      for (int k = 0; k < 8; ++k) {
        const uint8_t b = in[i + k];
        const uint64_t zero = b == kZeroGroup;  // 0 or 1
        const uint64_t if_zero = 0 - zero;      // all ones when b is 121
        // A run is written when it reaches 14 or when a literal ends it.
        out[o] = kRunByte[run + ((kMaxRun - run) & if_zero)];  // zero ? 255 : byte of run
        const uint64_t full = run == kMaxRun - 1, pending = run != 0;
        o += pending ^ ((pending ^ full) & if_zero);
        out[o] = b;
        o += 1 - zero;
        const uint64_t next = run + 1;
        run = next & (0 - static_cast<uint64_t>(next != kMaxRun)) & if_zero;
      }
    }
    i += 8;
  }
  for (; i < n; ++i) {
    if (in[i] == kZeroGroup) {
      if (++run == kMaxRun) {
        out[o++] = kLongestRunByte;
        run = 0;
      }
      continue;
    }
    if (run > 0) out[o++] = kRunByte[run];
    run = 0;
    out[o++] = in[i];
  }
  if (run > 0) out[o++] = kRunByte[run];
  return o;
}

}  // namespace internal

int64_t FindInvalidByte(const uint8_t* in, int64_t n) {
  constexpr int64_t kChunk = 4096;
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t end = std::min(n, start + kChunk);
    uint8_t largest = 0;
    for (int64_t i = start; i < end; ++i) largest = std::max(largest, in[i]);  // vectorizes
    if (largest > kMaxLiteral) {
      for (int64_t i = start; i < end; ++i) {
        if (in[i] > kMaxLiteral) return i;
      }
    }
  }
  return -1;
}

int64_t DecodedSizeWith(Isa isa, const uint8_t* in, int64_t n) {
  if (isa != Isa::kScalar) return internal::DecodedSizeSsse3(in, n);
  int64_t size = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t b = in[i];
    size += b >= kFirstRunByte ? b - (kFirstRunByte - 2) : 1;  // vectorizes
  }
  return size;
}

namespace internal {

void DecodeScalar(const uint8_t* in, int64_t n, uint8_t* out, int64_t out_size,
                  DecodeState state) {
  static constexpr uint8_t kSixteenZeroGroups[16] = {121, 121, 121, 121, 121, 121, 121, 121,
                                                     121, 121, 121, 121, 121, 121, 121, 121};
  int64_t i = state.i, o = state.o;
  // Branch-free while 16 bytes of room are left: store a whole run of 121s, put the byte
  // itself first if it is a literal, advance by its decoded length.
  for (; i < n && o + 16 <= out_size; ++i) {
    const uint8_t b = in[i];
    std::memcpy(out + o, kSixteenZeroGroups, 16);
    out[o] = b <= kMaxLiteral ? b : kZeroGroup;
    o += kDecodedLength.of[b];
  }
  for (; i < n; ++i) {
    const uint8_t b = in[i];
    const int64_t length = kDecodedLength.of[b];
    std::memset(out + o, kZeroGroup, length);
    out[o] = b <= kMaxLiteral ? b : kZeroGroup;
    o += length;
  }
}

}  // namespace internal

bool IsaSupported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kSsse3:
      return internal::CpuHasSsse3();
    case Isa::kAvx512Vbmi2:
      return internal::CpuHasSsse3() && internal::CpuHasAvx512Vbmi2();
  }
  return false;
}

Isa SelectedIsa() {
  static const Isa selected = [] {
    const char* named = std::getenv("TFGC_ZERO_RUN_ISA");
    Isa cap = Isa::kAvx512Vbmi2;
    if (named != nullptr && std::strcmp(named, "scalar") == 0) cap = Isa::kScalar;
    if (named != nullptr && std::strcmp(named, "ssse3") == 0) cap = Isa::kSsse3;
    // The fastest supported path at or below the cap (Isa is ordered slowest first).
    for (Isa isa : {Isa::kAvx512Vbmi2, Isa::kSsse3}) {
      if (isa <= cap && IsaSupported(isa)) return isa;
    }
    return Isa::kScalar;
  }();
  return selected;
}

int64_t EncodeSerialWith(Isa isa, const uint8_t* in, int64_t n, uint8_t* out) {
  internal::EncodeState state;
  if (isa != Isa::kScalar) state = internal::EncodePrefixSsse3(in, n, out);
  return internal::EncodeScalar(in, n, out, state);
}

int64_t EncodeSerial(const uint8_t* in, int64_t n, uint8_t* out) {
  return EncodeSerialWith(SelectedIsa(), in, n, out);
}

void DecodeWith(Isa isa, const uint8_t* in, int64_t n, uint8_t* out, int64_t out_size) {
  internal::DecodeState state;
  if (isa == Isa::kSsse3) state = internal::DecodePrefixSsse3(in, n, out, out_size);
  if (isa == Isa::kAvx512Vbmi2) {
    state = internal::DecodePrefixAvx512Vbmi2(in, n, out, out_size);
  }
  internal::DecodeScalar(in, n, out, out_size, state);
}

void Decode(const uint8_t* in, int64_t n, uint8_t* out, int64_t out_size) {
  DecodeWith(SelectedIsa(), in, n, out, out_size);
}

int64_t DecodedSize(const uint8_t* in, int64_t n) { return DecodedSizeWith(SelectedIsa(), in, n); }

ParallelEncoder::ParallelEncoder(const uint8_t* in, int64_t n, int64_t block_size,
                                 uint8_t* scratch)
    : in_(in), n_(n), scratch_(scratch) {
  block_size = std::max<int64_t>(block_size, 1);
  for (int64_t begin = 0; begin < n; begin += block_size) {
    Block block;
    block.begin = begin;
    block.end = std::min(n, begin + block_size);
    blocks_.push_back(block);
  }
}

void ParallelEncoder::Summarize(int64_t index) {
  Block& b = blocks_[index];
  const uint8_t* in = in_ + b.begin;
  const int64_t len = b.end - b.begin;
  const int64_t invalid = FindInvalidByte(in, len);
  if (invalid >= 0) {
    b.first_invalid = b.begin + invalid;
    return;
  }
  b.lead = CountLeadingZeroGroups(in, len);
  b.all_zero_groups = b.lead == len;
  if (b.all_zero_groups) return;
  b.trail = CountTrailingZeroGroups(in, len);
  // The interior starts and ends with a literal, so every run inside it is complete.
  b.interior_size =
      EncodeSerial(in + b.lead, len - b.lead - b.trail, scratch_ + b.begin);
}

int64_t ParallelEncoder::FirstInvalidByte() const {
  for (const Block& b : blocks_) {
    if (b.first_invalid >= 0) return b.first_invalid;
  }
  return -1;
}

int64_t ParallelEncoder::Plan() {
  int64_t pending_run = 0;  // 121s not yet assigned to an output position
  int64_t offset = 0;
  for (Block& b : blocks_) {
    if (b.all_zero_groups) {
      pending_run += b.end - b.begin;
      continue;
    }
    b.run_before = pending_run + b.lead;
    b.out_offset = offset;
    offset += RunEncodedSize(b.run_before) + b.interior_size;
    pending_run = b.trail;
  }
  tail_run_ = pending_run;
  tail_offset_ = offset;
  return offset + RunEncodedSize(tail_run_);
}

void ParallelEncoder::Write(int64_t index, uint8_t* out) const {
  const Block& b = blocks_[index];
  if (!b.all_zero_groups) {
    const int64_t run_bytes = WriteRun(b.run_before, out + b.out_offset);
    std::memcpy(out + b.out_offset + run_bytes, scratch_ + b.begin, b.interior_size);
  }
  if (index + 1 == num_blocks()) WriteRun(tail_run_, out + tail_offset_);
}

}  // namespace zero_run
}  // namespace tfgc
