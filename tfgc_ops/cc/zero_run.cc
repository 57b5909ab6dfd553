#include "zero_run.h"

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tfgc {
namespace zero_run {
namespace {

constexpr uint8_t kLongestRunByte = kFirstRunByte + (kMaxRun - 2);  // 255

// The byte that stands for a run of k 121s, 1 <= k <= 14. A table beats a branch here.
constexpr uint8_t kRunByte[kMaxRun + 1] = {0,   121, 243, 244, 245, 246, 247, 248,
                                           249, 250, 251, 252, 253, 254, 255};

// Number of leading bytes equal to 121 in in[0, n).
int64_t CountLeadingZeroGroups(const uint8_t* in, int64_t n) {
  constexpr uint64_t kPattern = 0x7979797979797979ULL;  // eight 121s
  int64_t i = 0;
  while (i + 8 <= n) {
    uint64_t word;
    std::memcpy(&word, in + i, 8);
    const uint64_t diff = word ^ kPattern;
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

int64_t EncodeSerial(const uint8_t* in, int64_t n, uint8_t* out) {
  int64_t i = 0, o = 0;
  while (i < n) {
    const void* hit = std::memchr(in + i, kZeroGroup, n - i);
    const int64_t literal_end = hit ? static_cast<const uint8_t*>(hit) - in : n;
    std::memcpy(out + o, in + i, literal_end - i);
    o += literal_end - i;
    i = literal_end;
    if (i == n) break;
    const int64_t k = CountLeadingZeroGroups(in + i, n - i);
    o += WriteRun(k, out + o);
    i += k;
  }
  return o;
}

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

int64_t DecodedSize(const uint8_t* in, int64_t n) {
  int64_t size = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t b = in[i];
    size += b >= kFirstRunByte ? b - (kFirstRunByte - 2) : 1;  // vectorizes
  }
  return size;
}

void Decode(const uint8_t* in, int64_t n, uint8_t* out, int64_t out_size) {
  int64_t i = 0, o = 0;
#if defined(__SSE2__)
  const __m128i largest_literal = _mm_set1_epi8(static_cast<char>(kMaxLiteral));
  const __m128i zero_groups = _mm_set1_epi8(static_cast<char>(kZeroGroup));
  while (i + 16 <= n) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m128i is_literal = _mm_cmpeq_epi8(_mm_max_epu8(v, largest_literal), largest_literal);
    if (_mm_movemask_epi8(is_literal) == 0xFFFF && o + 16 <= out_size) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + o), v);
      i += 16;
      o += 16;
      continue;
    }
    for (const int64_t stop = i + 16; i < stop; ++i) {
      const uint8_t b = in[i];
      if (b <= kMaxLiteral) {
        out[o++] = b;
      } else if (o + 16 <= out_size) {
        // A run is at most 14 bytes: one unaligned 16-byte store, the excess is overwritten.
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + o), zero_groups);
        o += b - (kFirstRunByte - 2);
      } else {
        const int64_t k = b - (kFirstRunByte - 2);
        std::memset(out + o, kZeroGroup, k);
        o += k;
      }
    }
  }
#endif
  for (; i < n; ++i) {
    const uint8_t b = in[i];
    if (b <= kMaxLiteral) {
      out[o++] = b;
    } else {
      const int64_t k = b - (kFirstRunByte - 2);
      std::memset(out + o, kZeroGroup, k);
      o += k;
    }
  }
}

ParallelEncoder::ParallelEncoder(const uint8_t* in, int64_t n, int64_t block_size)
    : in_(in), n_(n) {
  block_size = std::max<int64_t>(block_size, 1);
  for (int64_t begin = 0; begin < n; begin += block_size) {
    Block block;
    block.begin = begin;
    block.end = std::min(n, begin + block_size);
    blocks_.push_back(block);
  }
  scratch_.resize(n);
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
      EncodeSerial(in + b.lead, len - b.lead - b.trail, scratch_.data() + b.begin);
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
    std::memcpy(out + b.out_offset + run_bytes, scratch_.data() + b.begin, b.interior_size);
  }
  if (index + 1 == num_blocks()) WriteRun(tail_run_, out + tail_offset_);
}

}  // namespace zero_run
}  // namespace tfgc
