// Entropy coding of quartic bytes (an alternative to 3LC's zero-run encoding), free of
// TensorFlow.
//
// A quartic byte holds five 3-values. The model: within one group of bytes (one tensor),
// every 3-value is nonzero with probability p and then +1 or -1 alike, independently of
// the others. A byte with k nonzero 3-values then has probability (1-p)^(5-k) (p/2)^k, so
// one number per group describes the whole distribution, and the bytes are rANS-coded
// with it. On ResNet-20 gradients under error feedback this comes within 1-3% of the
// per-tensor order-0 entropy and needs no frequency table in the message.
//
// Format of an encoding of groups g_0..g_{T-1} (their sizes are known to both sides):
//   q_0 .. q_{T-1}  uint16 little-endian; the group's p is q / 65536. q = 0 means the
//                   group is all 121 (five zero 3-values) and codes no symbol.
//   state           uint32 little-endian: the final rANS state.
//   stream          renormalisation bytes, in the order the decoder reads them.
// rANS: 32-bit state in [2^23, 2^31), byte-wise renormalisation, probabilities in 1/65536.
// Symbols are laid out by class k (nonzero 3-values), then by byte value. Class k has
// kClassSize[k] bytes, each of frequency f_k:
//   f_k = max(1, round(65536 (1 - q/65536)^(5-k) (q/131072)^k)) for k = 1..5, in exact
//   integer arithmetic, and f_0 = 65536 - sum of the others; while f_0 < 1 the class with
//   the largest total frequency above 1 per symbol gives up the difference.
// Decoding ends with the state back at 2^23 and every byte read, or the input is rejected.
#ifndef TFGC_OPS_CC_QUARTIC_RANS_H_
#define TFGC_OPS_CC_QUARTIC_RANS_H_

#include <cstdint>
#include <vector>

namespace tfgc {
namespace quartic_rans {

inline constexpr int kClasses = 6;
inline constexpr int64_t kClassSize[kClasses] = {1, 10, 40, 80, 80, 32};
inline constexpr uint32_t kProbBits = 16;
inline constexpr uint32_t kProbScale = 1u << kProbBits;
inline constexpr int64_t kHeaderBytesPerGroup = 2;
inline constexpr int64_t kStateBytes = 4;

// The frequencies of one group's model.
struct Model {
  uint32_t freq[kClasses];   // frequency of each symbol of class k
  uint32_t start[kClasses];  // cumulative frequency where class k begins
};

// The model for q in 1..65535.
Model ModelFor(uint32_t q);

// The q that the encoder sends for a group: 0 if it has no nonzero 3-value, else the
// share of nonzero 3-values in 1/65536, rounded and kept in 1..65535.
uint32_t QFor(const uint8_t* quartic, int64_t n);

// Number of nonzero 3-values in quartic byte b (0..242).
int NonzeroCount(uint8_t b);

// Largest encoding of n bytes in `groups` groups.
int64_t MaxEncodedSize(int64_t n, int64_t groups);

// Encodes in[0, sum of group_sizes), bytes <= 242, into out, which must hold
// MaxEncodedSize bytes. Returns the number of bytes written.
int64_t Encode(const uint8_t* in, const int64_t* group_sizes, int64_t num_groups, uint8_t* out);

// Decodes in[0, n) into out, which holds the sum of group_sizes bytes. Returns nullptr on
// success, else a message saying why the input is not a valid encoding (out's content is
// then unspecified but nothing outside it is written).
const char* Decode(const uint8_t* in, int64_t n, const int64_t* group_sizes, int64_t num_groups,
                   uint8_t* out);

}  // namespace quartic_rans
}  // namespace tfgc

#endif  // TFGC_OPS_CC_QUARTIC_RANS_H_
