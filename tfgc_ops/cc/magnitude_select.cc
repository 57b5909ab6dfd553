#include "magnitude_select.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>  // part of every x86-64 CPU: no run-time dispatch needed
#endif
#if defined(__x86_64__)
#include <immintrin.h>  // AVX2, used only where UseAvx2()
#endif

#include "cpu_isa.h"

namespace tfgc {
namespace magnitude_select {
namespace {

constexpr uint32_t kLargestFinite = 0x7F7FFFFF;  // FLT_MAX's pattern
constexpr uint32_t kFirstNonFinite = 0x7F800000;  // +inf's pattern; NaNs lie above
constexpr int kTopShift = 20;                     // top level: bits 20..30 (2048 bins)
constexpr int kTopBins = 1 << (31 - kTopShift);
constexpr int kFiniteTopBins = kFirstNonFinite >> kTopShift;  // 2040; the rest are non-finite
constexpr int kLowShift = 10;                                 // then bits 10..19, then 0..9
constexpr int kLowBins = 1 << kLowShift;
constexpr uint32_t kLowMask = kLowBins - 1;
constexpr uint32_t kBelowTopMask = (1u << kTopShift) - 1;

// For each 8-bit mask, the lanes it sets in ascending order (the rest 0): a permutation
// that moves a group's kept values to its front.
constexpr struct CompressOrder {
  uint8_t lanes[256][8];
  constexpr CompressOrder() : lanes() {
    for (int mask = 0; mask < 256; ++mask) {
      int slot = 0;
      for (int lane = 0; lane < 8; ++lane) {
        if (mask >> lane & 1) lanes[mask][slot++] = static_cast<uint8_t>(lane);
      }
    }
  }
} kCompressOrder;

inline uint32_t Pattern(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits & 0x7FFFFFFF;
}

// The bin of counts[0, bins) that holds the entry of rank `rank` (>= 1) counted from the
// top, and how many entries lie in the bins above it.
int BinOfRank(const uint32_t* counts, int bins, int64_t rank, int64_t* above) {
  int64_t seen = 0;
  for (int b = bins - 1; b > 0; --b) {
    if (seen + counts[b] >= rank) {
      *above = seen;
      return b;
    }
    seen += counts[b];
  }
  *above = seen;
  return 0;
}

// Sets selection->threshold and ties to those of the value of rank `rank` (>= 1, from
// the top) among `found` values of top bin `top_bin`, given their low 20 bits.
void FindInTopBin(const uint32_t* low_bits, int64_t found, int64_t rank, int top_bin,
                  Selection* selection) {
  std::array<uint32_t, kLowBins> middle{}, low{};
  for (int64_t j = 0; j < found; ++j) ++middle[low_bits[j] >> kLowShift];
  int64_t above_middle = 0, above_low = 0;
  const int middle_bin = BinOfRank(middle.data(), kLowBins, rank, &above_middle);
  const uint32_t middle_bits = static_cast<uint32_t>(middle_bin);
  for (int64_t j = 0; j < found; ++j) {
    low[low_bits[j] & kLowMask] += (low_bits[j] >> kLowShift) == middle_bits;
  }
  const int64_t low_rank = rank - above_middle;
  const int low_bin = BinOfRank(low.data(), kLowBins, low_rank, &above_low);
  selection->threshold = static_cast<uint32_t>(top_bin) << kTopShift |
                         static_cast<uint32_t>(middle_bin) << kLowShift |
                         static_cast<uint32_t>(low_bin);
  selection->ties = low_rank - above_low;
}

#if defined(__x86_64__)

// Below this many values the histograms' passes are cheap (the input sits in cache).
// The fuzz target sets both far lower, so that its small inputs reach this path.
#ifndef TFGC_SELECT_BRACKET_MIN_VALUES
#define TFGC_SELECT_BRACKET_MIN_VALUES (int64_t{1} << 20)
#endif
#ifndef TFGC_SELECT_SAMPLE_SIZE
#define TFGC_SELECT_SAMPLE_SIZE (int64_t{1} << 15)
#endif
constexpr int64_t kBracketMinValues = TFGC_SELECT_BRACKET_MIN_VALUES;
constexpr int64_t kSampleSize = TFGC_SELECT_SAMPLE_SIZE;
static_assert(kSampleSize <= kBracketMinValues, "the sample's stride must be at least 1");

// Sample k's offset in its stride, in [0, stride): a hash of k, so that the sample
// does not alias with an input that repeats with a period dividing the stride (a tiled
// gradient, where sample positions k * stride would see a few of its values only).
inline int64_t SampleOffset(int64_t k, int64_t stride) {
  uint32_t h = static_cast<uint32_t>(k) * 0x9E3779B9u;  // lowbias32 of k's Weyl step
  h ^= h >> 16;
  h *= 0x7FEB352Du;
  h ^= h >> 15;
  h *= 0x846CA68Bu;
  h ^= h >> 16;
  return static_cast<int64_t>((static_cast<uint64_t>(h) * static_cast<uint64_t>(stride)) >> 32);
}

// The selection, with AVX2, in one pass over x where a sample predicts the threshold:
// the threshold's rank among a sample of patterns, with a margin of eight
// standard deviations of a sampled rank, gives patterns lo <= hi; one pass counts the
// values above hi (and the zeros and non-finite ones) and keeps the patterns in
// [lo, hi], among which the histograms find the threshold. False (nothing set) where
// the threshold was not in [lo, hi] or the candidates overflowed their room: then the
// caller selects by the histograms of every value, so that the answer never depends on
// the sample.
__attribute__((target("avx2"))) bool SelectInBracket(const float* x, int64_t n, int64_t wanted,
                                                     bool non_finite_in_wanted,
                                                     std::vector<uint32_t>* scratch,
                                                     Selection* selection) {
  const int64_t stride = n / kSampleSize;
  std::vector<uint32_t> sample(kSampleSize);
  int64_t sample_non_finite = 0;
  for (int64_t k = 0; k < kSampleSize; ++k) {
    sample[k] = Pattern(x[k * stride + SampleOffset(k, stride)]);
    sample_non_finite += sample[k] >= kFirstNonFinite;
  }
  // The threshold's expected rank from the top of every pattern, non-finite included.
  double rank = static_cast<double>(wanted);
  if (!non_finite_in_wanted) rank += static_cast<double>(sample_non_finite) * stride;
  const double sampled = rank / static_cast<double>(stride);
  const double fraction = std::clamp(sampled / kSampleSize, 0.0, 1.0);
  const double margin = 8.0 * std::sqrt(kSampleSize * fraction * (1.0 - fraction)) + 16.0;
  // Sample ranks from the top, 1-based; a high rank before the first leaves the top
  // open, a low rank past the last the bottom.
  const double high_rank = sampled - margin, low_rank = sampled + margin;
  // Nearly every value, or none (wanted <= 0): the histograms' cases.
  if (!(high_rank <= kSampleSize && low_rank >= 1.0)) return false;
  const auto pattern_of_rank = [&](double r) {
    const int64_t index = static_cast<int64_t>(r) - 1;  // r in [1, kSampleSize]
    std::nth_element(sample.begin(), sample.begin() + index, sample.end(),
                     std::greater<uint32_t>());
    return sample[index];
  };
  const uint32_t hi = std::min(kLargestFinite, high_rank < 1.0 ? kLargestFinite
                                                                : pattern_of_rank(high_rank));
  const uint32_t lo = std::max(1u, low_rank > kSampleSize ? 1u : pattern_of_rank(low_rank));
  if (lo > hi) return false;
  // Many values equal to lo or hi (ties) put more in [lo, hi] than the margin allows
  // for: where the sample holds more than twice the margin there, the pass would
  // overflow its room, so the histograms of every value take it from the start.
  int64_t sampled_inside = 0;
  for (const uint32_t p : sample) sampled_inside += (p >= lo) & (p <= hi);
  if (static_cast<double>(sampled_inside) > 4.0 * margin) return false;

  // Room for twice the expected candidates: more means the sample misled.
  const int64_t expected = static_cast<int64_t>(2.0 * margin * stride);
  const int64_t room = 2 * expected + 4096;
  scratch->resize(static_cast<size_t>(room) + 8);
  uint32_t* candidates = scratch->data();
  int64_t found = 0;
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i above_hi = _mm256_set1_epi32(static_cast<int>(hi));
  const __m256i below_lo = _mm256_set1_epi32(static_cast<int>(lo - 1));
  const __m256i last_finite = _mm256_set1_epi32(static_cast<int>(kLargestFinite));
  const __m256i zero = _mm256_setzero_si256();
  // Per-lane counts, negated (a compare gives -1): each lane sees at most n / 8 values.
  __m256i minus_above = zero, minus_zeros = zero, minus_non_finite = zero;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i p = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)),
                                       magnitude);
    const __m256i above = _mm256_cmpgt_epi32(p, above_hi);
    minus_above = _mm256_add_epi32(minus_above, above);
    minus_zeros = _mm256_add_epi32(minus_zeros, _mm256_cmpeq_epi32(p, zero));
    minus_non_finite = _mm256_add_epi32(minus_non_finite, _mm256_cmpgt_epi32(p, last_finite));
    const __m256i inside = _mm256_andnot_si256(above, _mm256_cmpgt_epi32(p, below_lo));
    const unsigned mask = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(inside)));
    if (mask == 0) continue;
    if (found > room) return false;
    const __m256i order = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kCompressOrder.lanes[mask])));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(candidates + found),
                        _mm256_permutevar8x32_epi32(p, order));
    found += __builtin_popcount(mask);
  }
  alignas(32) int32_t lanes[3][8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[0]), minus_above);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[1]), minus_zeros);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[2]), minus_non_finite);
  int64_t above = 0, zeros = 0, non_finite = 0;
  for (int k = 0; k < 8; ++k) {
    above -= lanes[0][k];
    zeros -= lanes[1][k];
    non_finite -= lanes[2][k];
  }
  for (; i < n; ++i) {
    const uint32_t p = Pattern(x[i]);
    above += p > hi;
    zeros += p == 0;
    non_finite += p > kLargestFinite;
    if (p >= lo && p <= hi) {
      if (found > room) return false;
      candidates[found++] = p;
    }
  }
  if (found > room) return false;

  const int64_t nonzero_finite = n - zeros - non_finite;
  if (non_finite_in_wanted) wanted -= non_finite;
  wanted = std::min(std::max<int64_t>(wanted, 0), nonzero_finite);
  const int64_t finite_above = above - non_finite;  // hi <= the largest finite pattern
  if (wanted > 0 && !(finite_above < wanted && wanted <= finite_above + found)) return false;
  selection->count = wanted + non_finite;
  if (wanted == 0) {
    selection->threshold = kLargestFinite;
    return true;
  }
  // The candidates' top bins, then the bin of the wanted rank, as Select does for all.
  std::array<uint32_t, kTopBins> top{};
  for (int64_t j = 0; j < found; ++j) ++top[candidates[j] >> kTopShift];
  int64_t above_top = 0;
  const int64_t rank_in_bracket = wanted - finite_above;
  const int top_bin = BinOfRank(top.data(), kFiniteTopBins, rank_in_bracket, &above_top);
  int64_t in_bin = 0;
  for (int64_t j = 0; j < found; ++j) {  // in place: in_bin <= j
    const uint32_t p = candidates[j];
    candidates[in_bin] = p & kBelowTopMask;
    in_bin += (p >> kTopShift) == static_cast<uint32_t>(top_bin);
  }
  FindInTopBin(candidates, in_bin, rank_in_bracket - above_top, top_bin, selection);
  return true;
}

#endif  // __x86_64__

}  // namespace

Selection Select(const float* x, int64_t n, int64_t wanted, bool non_finite_in_wanted,
                 std::vector<uint32_t>* scratch) {
#if defined(__x86_64__)
  Selection bracketed;
  if (n >= kBracketMinValues && UseAvx2() &&
      SelectInBracket(x, n, wanted, non_finite_in_wanted, scratch, &bracketed)) {
    return bracketed;
  }
#endif
  // Interleaved histograms: values of one exponent fall in few bins, and increments of
  // one bin would otherwise wait on each other.
  constexpr int kWays = 4;
  std::vector<uint32_t> ways(kWays * kTopBins);
  int64_t zeros = 0;
  int64_t i = 0;
#if defined(__SSE2__)
  // Bins and zeros of eight values per step in SSE2; only the increments stay scalar.
  {
    const __m128i magnitude = _mm_set1_epi32(0x7FFFFFFF);
    const __m128i zero = _mm_setzero_si128();
    __m128i minus_zeros = zero;  // -1 per zero, per lane
    alignas(16) uint32_t bins[8];
    for (; i + 8 <= n; i += 8) {
      const __m128i a = _mm_and_si128(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)), magnitude);
      const __m128i b = _mm_and_si128(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i + 4)), magnitude);
      minus_zeros = _mm_add_epi32(minus_zeros, _mm_cmpeq_epi32(a, zero));
      minus_zeros = _mm_add_epi32(minus_zeros, _mm_cmpeq_epi32(b, zero));
      _mm_store_si128(reinterpret_cast<__m128i*>(bins), _mm_srli_epi32(a, kTopShift));
      _mm_store_si128(reinterpret_cast<__m128i*>(bins + 4), _mm_srli_epi32(b, kTopShift));
      for (int k = 0; k < 8; ++k) ++ways[(k % kWays) * kTopBins + bins[k]];
    }
    alignas(16) int32_t lanes[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes), minus_zeros);
    for (const int32_t lane : lanes) zeros -= lane;  // each lane counts at most n / 4
  }
#endif
  for (; i + kWays <= n; i += kWays) {
    for (int w = 0; w < kWays; ++w) {
      const uint32_t p = Pattern(x[i + w]);
      ++ways[w * kTopBins + (p >> kTopShift)];
      zeros += p == 0;
    }
  }
  for (; i < n; ++i) {
    const uint32_t p = Pattern(x[i]);
    ++ways[p >> kTopShift];
    zeros += p == 0;
  }
  std::array<uint32_t, kTopBins> top{};
  for (int w = 0; w < kWays; ++w) {
    for (int b = 0; b < kTopBins; ++b) top[b] += ways[w * kTopBins + b];
  }
  top[0] -= static_cast<uint32_t>(zeros);  // zeros are never selected
  int64_t non_finite = 0;
  for (int b = kFiniteTopBins; b < kTopBins; ++b) non_finite += top[b];
  const int64_t nonzero_finite = n - zeros - non_finite;
  if (non_finite_in_wanted) wanted -= non_finite;
  wanted = std::min(std::max<int64_t>(wanted, 0), nonzero_finite);

  Selection selection;
  selection.count = wanted + non_finite;
  if (wanted == 0) {  // only the non-finite values, which lie above every finite one
    selection.threshold = kLargestFinite;
    return selection;
  }
  int64_t above_top = 0;
  const int top_bin = BinOfRank(top.data(), kFiniteTopBins, wanted, &above_top);

  // The nonzero values of that bin, their low 20 bits (in any order: only histograms
  // read them); every value looked at is written and only those in the bin are kept (no
  // branch on the data), hence the one spare slot.
  scratch->resize(static_cast<size_t>(top[top_bin]) + 1);
  uint32_t* candidates = scratch->data();
  int64_t found = 0;
  const auto keep_if_in_bin = [&](int64_t j) {
    const uint32_t p = Pattern(x[j]);
    candidates[found] = p & kBelowTopMask;
    found += ((p >> kTopShift) == static_cast<uint32_t>(top_bin)) & (p != 0);
  };
  int64_t next = 0;
#if defined(__SSE2__)
  // One bin holds a few percent of the values: test eight at once and look closer only
  // at groups with one in the bin (the scalar step also drops zeros, which bin 0 holds).
  const __m128i magnitude = _mm_set1_epi32(0x7FFFFFFF);
  const __m128i bin = _mm_set1_epi32(top_bin);
  for (; next + 8 <= n; next += 8) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + next));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + next + 4));
    const __m128i a_in =
        _mm_cmpeq_epi32(_mm_srli_epi32(_mm_and_si128(a, magnitude), kTopShift), bin);
    const __m128i b_in =
        _mm_cmpeq_epi32(_mm_srli_epi32(_mm_and_si128(b, magnitude), kTopShift), bin);
    if (_mm_movemask_epi8(_mm_or_si128(a_in, b_in)) == 0) continue;
    for (int k = 0; k < 8; ++k) keep_if_in_bin(next + k);
  }
#endif
  for (; next < n; ++next) keep_if_in_bin(next);
  FindInTopBin(candidates, found, wanted - above_top, top_bin, &selection);
  return selection;
}

namespace {

// Bit i of a byte moved to bit 7 - i: movemask's lane order to the bitmap's.
constexpr struct ReversedBytes {
  uint8_t of[256];
  constexpr ReversedBytes() : of() {
    for (int b = 0; b < 256; ++b) {
      for (int i = 0; i < 8; ++i) of[b] |= static_cast<uint8_t>(((b >> i) & 1) << (7 - i));
    }
  }
} kReversed;

// The write pass's state, with the outputs chosen at compile time (bit 0: bitmap, 1:
// positions, 2: values, 3: reconstruction), so that no loop tests them. Values go
// through `One` in position order, or in groups of eight free of ties through a vector
// loop that stages what it keeps with `Stage`, or all eight at once through the slots
// and `Kept`.
template <int kOutputs>
class Writing {
 public:
  static constexpr bool kBitmap = kOutputs & 1, kPositions = kOutputs & 2,
                        kValues = kOutputs & 4, kReconstruction = kOutputs & 8,
                        kList = kPositions || kValues;

  Writing(const float* x, const Selection& selection, const Outputs& out)
      : x_(x), threshold_(selection.threshold), ties_(selection.ties), out_(out) {}

  // One value, in order: the only place that counts ties.
  void One(int64_t i) {
    const float v = x_[i];
    const uint32_t p = Pattern(v);
    const bool tie = p == threshold_;
    ties_seen_ += tie;
    const bool keep = (p > threshold_) | (tie & (ties_seen_ <= ties_));
    if (kReconstruction) out_.reconstruction[i] = keep ? v : 0.0f;
    if (kBitmap) {
      byte_ = byte_ << 1 | static_cast<uint32_t>(keep);
      if ((i & 7) == 7) out_.bitmap[i >> 3] = static_cast<uint8_t>(byte_);
    }
    if (kList) Stage(i, keep);
  }

  // Stages value i: written always, kept only if `keep` (no branch on the data).
  void Stage(int64_t i, bool keep) {
    if (kPositions) staged_positions_[staged_] = static_cast<int32_t>(i);
    if (kValues) staged_values_[staged_] = x_[i];
    staged_ += keep;
    if (staged_ >= kStage) Flush();
  }

  // Room for a group of eight at the end of the stage (up to eight may be written,
  // `kept` are kept).
  int32_t* positions_slot() { return staged_positions_ + staged_; }
  float* values_slot() { return staged_values_ + staged_; }
  void Kept(int kept) {
    staged_ += kept;
    if (staged_ >= kStage) Flush();
  }

  // After the last value: the partial bitmap byte and whatever is staged.
  void Finish(int64_t n) {
    if (kBitmap && (n & 7) != 0) out_.bitmap[n >> 3] = static_cast<uint8_t>(byte_ << (8 - (n & 7)));
    if (kList) Flush();
  }

 private:
  // Selected positions and values collect in a small buffer, flushed when full; a group
  // of eight may be written past kStage, hence the spare room.
  static constexpr int kStage = 256;

  void Flush() {
    if (kPositions) std::copy(staged_positions_, staged_positions_ + staged_, out_.positions + written_);
    if (kValues) std::copy(staged_values_, staged_values_ + staged_, out_.values + written_);
    written_ += staged_;
    staged_ = 0;
  }

  const float* x_;
  const uint32_t threshold_;
  const int64_t ties_;
  const Outputs out_;
  int64_t ties_seen_ = 0, written_ = 0;
  uint32_t byte_ = 0;
  int staged_ = 0;
  int32_t staged_positions_[kStage + 8];
  float staged_values_[kStage + 8];
};

template <int kOutputs>
void WriteSome(const float* x, int64_t n, const Selection& selection, const Outputs& out) {
  Writing<kOutputs> writing(x, selection, out);
  int64_t i = 0;
#if defined(__SSE2__)
  // Eight values at a time; a group holding a value equal to the threshold goes through
  // `One`, which keeps the ties in position order.
  const __m128i thresholds = _mm_set1_epi32(static_cast<int>(selection.threshold));
  const __m128i magnitude = _mm_set1_epi32(0x7FFFFFFF);
  for (; i + 8 <= n; i += 8) {
    const __m128 v0 = _mm_loadu_ps(x + i), v1 = _mm_loadu_ps(x + i + 4);
    const __m128i p0 = _mm_and_si128(_mm_castps_si128(v0), magnitude);
    const __m128i p1 = _mm_and_si128(_mm_castps_si128(v1), magnitude);
    const __m128i tied = _mm_or_si128(_mm_cmpeq_epi32(p0, thresholds),
                                      _mm_cmpeq_epi32(p1, thresholds));
    if (_mm_movemask_epi8(tied) != 0) {
      for (int k = 0; k < 8; ++k) writing.One(i + k);
      continue;
    }
    // Patterns are below 2^31, so the signed comparison orders them.
    const __m128 keep0 = _mm_castsi128_ps(_mm_cmpgt_epi32(p0, thresholds));
    const __m128 keep1 = _mm_castsi128_ps(_mm_cmpgt_epi32(p1, thresholds));
    if (writing.kReconstruction) {
      _mm_storeu_ps(out.reconstruction + i, _mm_and_ps(v0, keep0));
      _mm_storeu_ps(out.reconstruction + i + 4, _mm_and_ps(v1, keep1));
    }
    unsigned mask = static_cast<unsigned>(_mm_movemask_ps(keep0) | _mm_movemask_ps(keep1) << 4);
    if (writing.kBitmap) out.bitmap[i >> 3] = kReversed.of[mask];
    if (writing.kList) {
      for (; mask != 0; mask &= mask - 1) writing.Stage(i + __builtin_ctz(mask), true);
    }
  }
#endif
  for (; i < n; ++i) writing.One(i);
  writing.Finish(n);
}

#if defined(__x86_64__)

// WriteSome with AVX2: a group of eight free of ties is one compare, and its kept values
// and positions are moved to the stage by one permutation each (no branch per value).
template <int kOutputs>
__attribute__((target("avx2"))) void WriteSomeAvx2(const float* x, int64_t n,
                                                   const Selection& selection,
                                                   const Outputs& out) {
  Writing<kOutputs> writing(x, selection, out);
  const __m256i thresholds = _mm256_set1_epi32(static_cast<int>(selection.threshold));
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256i p = _mm256_and_si256(_mm256_castps_si256(v), magnitude);
    if (!_mm256_testz_si256(_mm256_cmpeq_epi32(p, thresholds), _mm256_cmpeq_epi32(p, p))) {
      for (int k = 0; k < 8; ++k) writing.One(i + k);
      continue;
    }
    const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(p, thresholds));
    if (writing.kReconstruction) _mm256_storeu_ps(out.reconstruction + i, _mm256_and_ps(v, keep));
    const unsigned mask = static_cast<unsigned>(_mm256_movemask_ps(keep));
    if (writing.kBitmap) out.bitmap[i >> 3] = kReversed.of[mask];
    if (writing.kList) {
      const __m256i order = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kCompressOrder.lanes[mask])));
      if (writing.kPositions) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(writing.positions_slot()),
                            _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(i)), order));
      }
      if (writing.kValues) {
        _mm256_storeu_ps(writing.values_slot(), _mm256_permutevar8x32_ps(v, order));
      }
      writing.Kept(__builtin_popcount(mask));
    }
  }
  for (; i < n; ++i) writing.One(i);
  writing.Finish(n);
}

#endif  // __x86_64__

#if defined(__x86_64__)

// For each 8-bit mask (bit k: lane k is selected), the rank of each selected lane among
// the selected ones (the others 0, masked out): the permutation that moves a group's next
// values to the lanes they decode to.
constexpr struct ExpandOrder {
  uint8_t lanes[256][8];
  constexpr ExpandOrder() : lanes() {
    for (int mask = 0; mask < 256; ++mask) {
      int rank = 0;
      for (int lane = 0; lane < 8; ++lane) {
        if (mask >> lane & 1) lanes[mask][lane] = static_cast<uint8_t>(rank++);
      }
    }
  }
} kExpandOrder;

// Expand's whole bytes with AVX2, while eight of the `count` values remain to be read:
// each byte's eight outputs in one store (the selected lanes from one load and one
// permutation, zeros elsewhere), so no pass fills the zeros first. Returns the bytes
// done (out[0, 8 * bytes) written) and sets *next to the values they used.
__attribute__((target("avx2"))) int64_t ExpandAvx2(const uint8_t* bitmap, int64_t n,
                                                   const float* values, int64_t count,
                                                   float* out, int64_t* next) {
  const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  int64_t byte = 0, used = 0;
  for (; 8 * byte + 8 <= n && used + 8 <= count; ++byte) {
    const unsigned mask = kReversed.of[bitmap[byte]];  // bit k: position 8 * byte + k
    const __m256i order = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kExpandOrder.lanes[mask])));
    const __m256i selected = _mm256_cmpeq_epi32(
        _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(mask)), lane_bits), lane_bits);
    const __m256 v = _mm256_permutevar8x32_ps(_mm256_loadu_ps(values + used), order);
    _mm256_storeu_ps(out + 8 * byte, _mm256_and_ps(v, _mm256_castsi256_ps(selected)));
    used += __builtin_popcount(mask);
  }
  *next = used;
  return byte;
}

#endif  // __x86_64__

using Writer = void (*)(const float*, int64_t, const Selection&, const Outputs&);

template <int... kOutputs>
constexpr std::array<Writer, sizeof...(kOutputs)> Writers(std::integer_sequence<int, kOutputs...>) {
  return {&WriteSome<kOutputs>...};
}

constexpr auto kWriters = Writers(std::make_integer_sequence<int, 16>());

#if defined(__x86_64__)
template <int... kOutputs>
constexpr std::array<Writer, sizeof...(kOutputs)> WritersAvx2(
    std::integer_sequence<int, kOutputs...>) {
  return {&WriteSomeAvx2<kOutputs>...};
}

constexpr auto kWritersAvx2 = WritersAvx2(std::make_integer_sequence<int, 16>());
#endif

}  // namespace

int64_t CountSelected(const uint8_t* bitmap, int64_t n) {
  const int64_t whole = n / 8;
  int64_t count = 0, i = 0;
  for (; i + 8 <= whole; i += 8) {
    uint64_t word;
    std::memcpy(&word, bitmap + i, sizeof(word));
    count += __builtin_popcountll(word);
  }
  for (; i < whole; ++i) count += __builtin_popcount(bitmap[i]);
  if (n & 7) count += __builtin_popcount(bitmap[whole] >> (8 - (n & 7)));
  return count;
}

void Expand(const uint8_t* bitmap, int64_t n, const float* values, float* out) {
  int64_t byte = 0, next = 0;
#if defined(__x86_64__)
  if (UseAvx2()) byte = ExpandAvx2(bitmap, n, values, CountSelected(bitmap, n), out, &next);
#endif
  std::fill(out + 8 * byte, out + n, 0.0f);
  for (; byte * 8 < n; ++byte) {
    // Bit j of the reversed byte is position 8 * byte + j; padding bits past n drop.
    unsigned bits = kReversed.of[bitmap[byte]];
    if (byte * 8 + 8 > n) bits &= (1u << (n - byte * 8)) - 1;
    for (; bits != 0; bits &= bits - 1) out[byte * 8 + __builtin_ctz(bits)] = values[next++];
  }
}

bool PositionsAscendWithin(const int32_t* positions, int64_t count, int64_t n) {
  int64_t previous = -1;
  for (int64_t j = 0; j < count; ++j) {
    if (positions[j] <= previous) return false;
    previous = positions[j];
  }
  return previous < n;
}

void ExpandPositions(const int32_t* positions, int64_t count, const float* values, int64_t n,
                     float* out) {
  // Zeros between the positions, written in order: one sequential pass over `out`,
  // where a zero fill then a scatter would write it twice.
  int64_t start = 0;
  for (int64_t j = 0; j < count; ++j) {
    std::fill(out + start, out + positions[j], 0.0f);
    out[positions[j]] = values[j];
    start = positions[j] + 1;
  }
  std::fill(out + start, out + n, 0.0f);
}

void Write(const float* x, int64_t n, const Selection& selection, const Outputs& outputs) {
  const int which = (outputs.bitmap != nullptr) | (outputs.positions != nullptr) << 1 |
                    (outputs.values != nullptr) << 2 | (outputs.reconstruction != nullptr) << 3;
#if defined(__x86_64__)
  if (UseAvx2()) return kWritersAvx2[which](x, n, selection, outputs);
#endif
  kWriters[which](x, n, selection, outputs);
}

}  // namespace magnitude_select
}  // namespace tfgc
