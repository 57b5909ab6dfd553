// SIMD loops of the zero-run codec for x86-64 with SSSE3 or AVX-512 VBMI2, chosen at run
// time (zero_run.cc). Compiled for the baseline CPU; only the functions marked with a
// target attribute use those instructions, and they run only after CpuHasSsse3() or
// CpuHasAvx512Vbmi2().
//
// Encoder: eight input bytes at a time. Their 121-mask (bit k: byte k is 121) indexes a
// 256-entry table that holds, for those eight bytes, the run of 121s they start with,
// the run they end with, and a pshufb pattern plus constant that writes everything in
// between: literals in place, each inner run (at most six 121s, so never split) as its
// run byte. The leading run joins the run carried from earlier bytes and is written
// first; the trailing run is carried on.
//
// Decoder: sixteen encoded bytes at a time. Each byte's decoded length (1 for a literal,
// 2..14 for a run byte) is computed in a vector and prefix-summed into output offsets;
// the output is filled with 121s and the literals are stored at their offsets: sixteen
// independent stores instead of a chain of dependent ones. Long runs (sparse data) store
// sixteen 121s at each byte's offset instead of filling first.
//
// AVX-512 VBMI2 decoder: sixteen encoded bytes whose output fits 64 bytes (mixed data)
// become one `vpexpandb`: it spreads the sixteen output values (literals, and 121 for
// run bytes) to where each byte's output starts and leaves 121 everywhere else. The
// 64-bit mask of those starts is built with `pext`: a byte of decoded length L is the
// L-bit field 1, 0, ..., 0; pext of a word with a 1 at the bottom of each 16-bit lane,
// under a selector of L low ones per lane, concatenates four bytes' fields.
#include <cstdint>
#include <cstring>

#include "zero_run.h"
#include "zero_run_paths.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TFGC_ZERO_RUN_X86 1
#include <immintrin.h>
#endif

namespace tfgc {
namespace zero_run {
namespace internal {

#if defined(TFGC_ZERO_RUN_X86)

namespace {

constexpr uint8_t kLongestRunByte = kFirstRunByte + (kMaxRun - 2);  // 255

// How eight input bytes with a given 121-mask are encoded (mask 0xFF, all 121s, is
// handled separately).
struct EightBytes {
  uint64_t shuffle = 0;  // pshufb pattern: input byte index, or 0x80 for a zero byte
  uint64_t add = 0;      // OR-ed in: the run bytes of inner runs
  uint8_t length = 0;    // output bytes between the leading and the trailing run
  uint8_t lead = 0;      // 121s the eight bytes start with
  uint8_t trail = 0;     // 121s they end with
};

constexpr uint8_t RunByte(int k) {
  return k == 1 ? kZeroGroup : static_cast<uint8_t>(kFirstRunByte + k - 2);
}

constexpr struct EncodeTable {
  EightBytes of[256];
  constexpr EncodeTable() : of() {
    for (int mask = 0; mask < 255; ++mask) {
      auto is_zero = [mask](int k) { return ((mask >> k) & 1) != 0; };
      EightBytes e;
      while (is_zero(e.lead)) ++e.lead;
      while (is_zero(7 - e.trail)) ++e.trail;
      int out = 0;
      for (int k = e.lead; k < 8 - e.trail;) {
        uint64_t index = 0x80, byte = 0;
        if (is_zero(k)) {
          int run = 0;
          while (is_zero(k)) ++k, ++run;
          byte = RunByte(run);
        } else {
          index = static_cast<uint64_t>(k++);
        }
        e.shuffle |= index << (8 * out);
        e.add |= byte << (8 * out);
        ++out;
      }
      // Unused positions shuffle in zeros.
      for (int k = out; k < 8; ++k) e.shuffle |= uint64_t{0x80} << (8 * k);
      e.length = static_cast<uint8_t>(out);
      of[mask] = e;
    }
  }
} kEncodeTable;

// The encoding of a run of 0..20 121s (the carried run, < 14, plus a leading run, < 8):
// up to two bytes, written as one 16-bit store.
constexpr struct RunCodes {
  uint16_t bytes[21];
  uint8_t length[21];
  constexpr RunCodes() : bytes(), length() {
    for (int k = 1; k <= 20; ++k) {
      if (k < kMaxRun) {
        bytes[k] = RunByte(k);
        length[k] = 1;
      } else if (k == kMaxRun) {
        bytes[k] = kLongestRunByte;
        length[k] = 1;
      } else {
        bytes[k] = static_cast<uint16_t>(kLongestRunByte | RunByte(k - kMaxRun) << 8);
        length[k] = 2;
      }
    }
  }
} kRunCodes;

// Encodes eight bytes held in the low half of `v`, with 121-mask `mask`.
__attribute__((target("ssse3"))) inline void EncodeEight(__m128i v, unsigned mask,
                                                         uint8_t* out, int64_t& o,
                                                         uint64_t& run) {
  if (mask == 0xFF) {
    run += 8;
    if (run >= kMaxRun) {
      out[o++] = kLongestRunByte;
      run -= kMaxRun;
    }
    return;
  }
  const EightBytes& e = kEncodeTable.of[mask];
  const uint64_t total = run + e.lead;
  std::memcpy(out + o, &kRunCodes.bytes[total], 2);
  o += kRunCodes.length[total];
  const __m128i pattern = _mm_cvtsi64_si128(static_cast<int64_t>(e.shuffle));
  const uint64_t body =
      static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_shuffle_epi8(v, pattern))) | e.add;
  std::memcpy(out + o, &body, 8);
  o += e.length;
  run = e.trail;
}

// Decoded length of each of sixteen bytes: b - 241 for run bytes (2..14), 1 for
// literals (b - 241 saturates to 0 or 1 below 243).
__attribute__((target("ssse3"))) inline __m128i DecodedLengths(__m128i v) {
  const __m128i run_bias = _mm_set1_epi8(static_cast<char>(kFirstRunByte - 2));
  return _mm_max_epu8(_mm_subs_epu8(v, run_bias), _mm_set1_epi8(1));
}

// Long runs (sparse data): sixteen 121s at each byte's offset, then the byte itself, in
// order, so a later fill never covers an earlier byte. Offsets and values of sixteen
// bytes come as two 64-bit words each (storing the vectors and reading single bytes back
// stalls on store forwarding).
__attribute__((target("ssse3"))) inline void StoreAfterRuns(uint8_t* base, uint64_t offsets[2],
                                                            uint64_t values[2]) {
  const __m128i zero_groups = _mm_set1_epi8(static_cast<char>(kZeroGroup));
  for (int half = 0; half < 2; ++half) {
    for (int k = 0; k < 8; ++k, offsets[half] >>= 8, values[half] >>= 8) {
      uint8_t* at = base + (offsets[half] & 0xFF);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(at), zero_groups);
      *at = static_cast<uint8_t>(values[half]);
    }
  }
}

// The sixteen bytes of `v` as two 64-bit words, low half first.
__attribute__((target("ssse3"))) inline void SplitWords(__m128i v, uint64_t words[2]) {
  words[0] = static_cast<uint64_t>(_mm_cvtsi128_si64(v));
  words[1] = static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_srli_si128(v, 8)));
}

// Start offset of each of sixteen bytes' output: the exclusive prefix sum of their
// decoded lengths (at most 224 in all, so bytes suffice); `end` gets the inclusive one.
__attribute__((target("ssse3"))) inline __m128i StartOffsets(__m128i length, __m128i* end) {
  __m128i sum = length;
  sum = _mm_add_epi8(sum, _mm_slli_si128(sum, 1));
  sum = _mm_add_epi8(sum, _mm_slli_si128(sum, 2));
  sum = _mm_add_epi8(sum, _mm_slli_si128(sum, 4));
  sum = _mm_add_epi8(sum, _mm_slli_si128(sum, 8));
  *end = sum;
  return _mm_sub_epi8(sum, length);
}

}  // namespace

bool CpuHasSsse3() {
  static const bool has = __builtin_cpu_supports("ssse3");
  return has;
}

bool CpuHasAvx512Vbmi2() {
  static const bool has = __builtin_cpu_supports("avx512vbmi2") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("bmi2") &&
                          __builtin_cpu_supports("popcnt");
  return has;
}

__attribute__((target("ssse3"))) EncodeState EncodePrefixSsse3(const uint8_t* in, int64_t n,
                                                               uint8_t* out) {
  // With o + run <= i before eight bytes at i, their stores end before out + i + 16, so
  // sixteen bytes at i stay inside out (which holds n bytes) while i + 24 <= n.
  EncodeState s;
  const __m128i zero_groups = _mm_set1_epi8(static_cast<char>(kZeroGroup));
  for (; s.i + 24 <= n; s.i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + s.i));
    const unsigned mask =
        static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, zero_groups)));
    if (mask == 0) {  // sixteen literals, after the carried run
      std::memcpy(out + s.o, &kRunCodes.bytes[s.run], 2);
      s.o += kRunCodes.length[s.run];
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + s.o), v);
      s.o += 16;
      s.run = 0;
      continue;
    }
    EncodeEight(v, mask & 0xFF, out, s.o, s.run);
    EncodeEight(_mm_srli_si128(v, 8), mask >> 8, out, s.o, s.run);
  }
  return s;
}

__attribute__((target("ssse3"))) int64_t DecodedSizeSsse3(const uint8_t* in, int64_t n) {
  __m128i sums = _mm_setzero_si128();  // two 64-bit lanes
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    sums = _mm_add_epi64(sums, _mm_sad_epu8(DecodedLengths(v), _mm_setzero_si128()));
  }
  int64_t size = _mm_cvtsi128_si64(sums) + _mm_cvtsi128_si64(_mm_srli_si128(sums, 8));
  for (; i < n; ++i) size += in[i] >= kFirstRunByte ? in[i] - (kFirstRunByte - 2) : 1;
  return size;
}

__attribute__((target("ssse3"))) DecodeState DecodePrefixSsse3(const uint8_t* in, int64_t n,
                                                               uint8_t* out,
                                                               int64_t out_size) {
  // Sixteen bytes decode to at most 16 * 14 = 224 bytes; the fill stores whole vectors.
  constexpr int64_t kRoom = 16 * kMaxRun + 16;
  const __m128i zero_groups = _mm_set1_epi8(static_cast<char>(kZeroGroup));
  const __m128i largest_literal = _mm_set1_epi8(static_cast<char>(kMaxLiteral));
  DecodeState s;
  for (; s.i + 16 <= n && s.o + kRoom <= out_size; s.i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + s.i));
    const __m128i is_literal =
        _mm_cmpeq_epi8(_mm_max_epu8(v, largest_literal), largest_literal);
    if (_mm_movemask_epi8(is_literal) == 0xFFFF) {  // sixteen literals
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + s.o), v);
      s.o += 16;
      continue;
    }
    const __m128i length = DecodedLengths(v);
    __m128i end;
    const __m128i start = StartOffsets(length, &end);
    const __m128i value = _mm_or_si128(_mm_and_si128(is_literal, v),
                                       _mm_andnot_si128(is_literal, zero_groups));
    const int64_t total = _mm_extract_epi16(end, 7) >> 8;
    uint8_t* base = out + s.o;
    uint64_t offsets[2], values[2];
    SplitWords(start, offsets);
    SplitWords(value, values);
    if (total <= 64) {
      // Short runs (mixed data): fill with 121s, then store the literals at their offsets.
      for (int p = 0; p < 64; p += 16) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(base + p), zero_groups);
      }
      for (int half = 0; half < 2; ++half) {
        for (int k = 0; k < 8; ++k, offsets[half] >>= 8, values[half] >>= 8) {
          base[offsets[half] & 0xFF] = static_cast<uint8_t>(values[half]);
        }
      }
    } else {
      StoreAfterRuns(base, offsets, values);
    }
    s.o += total;
  }
  return s;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi2,bmi2,popcnt"))) DecodeState
DecodePrefixAvx512Vbmi2(const uint8_t* in, int64_t n, uint8_t* out, int64_t out_size) {
  // Sixteen bytes decode to at most 224 bytes; the expanded vector stores 64 and the
  // long-run loop sixteen past the last byte's start.
  constexpr int64_t kRoom = 16 * kMaxRun + 64;
  // A 1 at the bottom of each 16-bit lane: the first bit of four bytes' fields.
  constexpr uint64_t kFieldStarts = 0x0001000100010001ULL;
  const __m128i largest_literal = _mm_set1_epi8(static_cast<char>(kMaxLiteral));
  const __m128i zero_groups = _mm_set1_epi8(static_cast<char>(kZeroGroup));
  const __m512i zero_groups_64 = _mm512_set1_epi8(static_cast<char>(kZeroGroup));
  const __m256i ones = _mm256_set1_epi16(1);
  DecodeState s;
  for (; s.i + 16 <= n && s.o + kRoom <= out_size; s.i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + s.i));
    const __mmask16 runs = _mm_cmpgt_epu8_mask(v, largest_literal);
    uint8_t* base = out + s.o;
    if (runs == 0) {  // sixteen literals
      _mm_storeu_si128(reinterpret_cast<__m128i*>(base), v);
      s.o += 16;
      continue;
    }
    const __m128i length = DecodedLengths(v);
    // Per byte, L low ones in a 16-bit lane; four lanes per 64-bit word.
    const __m256i selectors =
        _mm256_sub_epi16(_mm256_sllv_epi16(ones, _mm256_cvtepu8_epi16(length)), ones);
    const uint64_t select[4] = {static_cast<uint64_t>(_mm256_extract_epi64(selectors, 0)),
                                static_cast<uint64_t>(_mm256_extract_epi64(selectors, 1)),
                                static_cast<uint64_t>(_mm256_extract_epi64(selectors, 2)),
                                static_cast<uint64_t>(_mm256_extract_epi64(selectors, 3))};
    const int64_t sum0 = _mm_popcnt_u64(select[0]);
    const int64_t sum1 = sum0 + _mm_popcnt_u64(select[1]);
    const int64_t sum2 = sum1 + _mm_popcnt_u64(select[2]);
    const int64_t total = sum2 + _mm_popcnt_u64(select[3]);
    const __m128i value = _mm_mask_blend_epi8(runs, v, zero_groups);
    if (total <= 64) {
      // Every byte has length >= 1, so sum2 <= 60 here and no shift reaches 64.
      const uint64_t starts = _pext_u64(kFieldStarts, select[0]) |
                              _pext_u64(kFieldStarts, select[1]) << sum0 |
                              _pext_u64(kFieldStarts, select[2]) << sum1 |
                              _pext_u64(kFieldStarts, select[3]) << sum2;
      _mm512_storeu_si512(base, _mm512_mask_expand_epi8(zero_groups_64, starts,
                                                        _mm512_castsi128_si512(value)));
    } else {
      __m128i end;
      uint64_t offsets[2], values[2];
      SplitWords(StartOffsets(length, &end), offsets);
      SplitWords(value, values);
      StoreAfterRuns(base, offsets, values);
    }
    s.o += total;
  }
  return s;
}

#else  // no x86-64 SIMD path in this build

bool CpuHasSsse3() { return false; }

bool CpuHasAvx512Vbmi2() { return false; }

EncodeState EncodePrefixSsse3(const uint8_t*, int64_t, uint8_t*) { return EncodeState(); }

DecodeState DecodePrefixSsse3(const uint8_t*, int64_t, uint8_t*, int64_t) {
  return DecodeState();
}

int64_t DecodedSizeSsse3(const uint8_t*, int64_t) { return 0; }

DecodeState DecodePrefixAvx512Vbmi2(const uint8_t*, int64_t, uint8_t*, int64_t) {
  return DecodeState();
}

#endif

}  // namespace internal
}  // namespace zero_run
}  // namespace tfgc
