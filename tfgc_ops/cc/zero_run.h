// Zero-run encoding of quartic-encoded bytes (3LC, section 3.3), free of TensorFlow.
//
// Quartic bytes are 0..242; byte 121 is five zero 3-values. A run of k >= 2 bytes equal
// to 121 becomes one byte 243 + (k - 2) for k <= 14; longer runs are split greedily into
// runs of 14, and a remainder of one stays a literal 121. Decoding is total: every byte
// < 243 is a literal and every byte >= 243 is a run of 2..14 bytes of 121.
//
// The encoder splits its input into fixed-size blocks so that callers may run the two
// block phases on several threads; the output is identical to a single-threaded greedy
// encoding whatever the block size, because runs that cross block boundaries are joined
// in a serial planning step before any byte is written.
//
// EncodeSerial and Decode run the fastest path this CPU supports, chosen once at run
// time: SIMD loops (zero_run_x86.cc) on x86-64 with SSSE3, plus a faster decoder where
// the CPU also has AVX-512 VBMI2, and a portable scalar loop elsewhere. The environment
// variable TFGC_ZERO_RUN_ISA=ssse3 or =scalar caps the choice. Every path writes
// identical bytes.
#ifndef TFGC_OPS_CC_ZERO_RUN_H_
#define TFGC_OPS_CC_ZERO_RUN_H_

#include <cstdint>
#include <vector>

namespace tfgc {
namespace zero_run {

inline constexpr uint8_t kZeroGroup = 121;   // quartic code of five zero 3-values
inline constexpr uint8_t kMaxLiteral = 242;  // largest quartic code
inline constexpr uint8_t kFirstRunByte = 243;
inline constexpr int64_t kMaxRun = 14;

// The encoder's and decoder's implementations, slowest first. kAvx512Vbmi2 encodes as
// kSsse3 does and decodes with its own loop.
enum class Isa { kScalar, kSsse3, kAvx512Vbmi2 };

// Whether this CPU (and this build) can run `isa`.
bool IsaSupported(Isa isa);

// The path EncodeSerial and Decode take: the best supported one, at most the one that
// the environment variable TFGC_ZERO_RUN_ISA names ("scalar" or "ssse3"; any other value
// caps nothing). Read once per process.
Isa SelectedIsa();

// Greedy single-threaded encoding of in[0, n) into out, which must hold n bytes (bytes
// past the returned size may be overwritten). Input bytes must be <= kMaxLiteral.
// Returns the number of bytes written.
int64_t EncodeSerial(const uint8_t* in, int64_t n, uint8_t* out);
// EncodeSerial on a given path; `isa` must be supported.
int64_t EncodeSerialWith(Isa isa, const uint8_t* in, int64_t n, uint8_t* out);

// Index of the first byte > kMaxLiteral in in[0, n), or -1 if there is none.
int64_t FindInvalidByte(const uint8_t* in, int64_t n);

// Number of bytes that in[0, n) decodes to. Never overflows for n < 2^59.
int64_t DecodedSize(const uint8_t* in, int64_t n);
// DecodedSize on a given path; `isa` must be supported.
int64_t DecodedSizeWith(Isa isa, const uint8_t* in, int64_t n);

// Decodes in[0, n) into out, which must hold exactly DecodedSize(in, n) bytes.
void Decode(const uint8_t* in, int64_t n, uint8_t* out, int64_t out_size);
// Decode on a given path; `isa` must be supported.
void DecodeWith(Isa isa, const uint8_t* in, int64_t n, uint8_t* out, int64_t out_size);

// Block-parallel encoder. Blocks are encoded into `scratch` (n bytes, owned by the
// caller, e.g. a TensorFlow temporary) and copied to their place in the output. Usage:
//   ParallelEncoder enc(in, n, block_size, scratch);
//   for each block b (any thread, any order): enc.Summarize(b);
//   if (enc.FirstInvalidByte() >= 0) -> reject input
//   int64_t size = enc.Plan();           // serial
//   for each block b (any thread, any order): enc.Write(b, out);
class ParallelEncoder {
 public:
  ParallelEncoder(const uint8_t* in, int64_t n, int64_t block_size, uint8_t* scratch);

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  void Summarize(int64_t block);
  int64_t FirstInvalidByte() const;
  int64_t Plan();
  void Write(int64_t block, uint8_t* out) const;

 private:
  struct Block {
    int64_t begin = 0, end = 0;
    int64_t lead = 0;   // 121s at the start of the block
    int64_t trail = 0;  // 121s at the end (0 if the block is all 121s)
    bool all_zero_groups = false;
    int64_t first_invalid = -1;
    int64_t interior_size = 0;  // encoded bytes between the lead and the trail
    // Filled by Plan(): the run that ends at this block's lead and where it goes.
    int64_t run_before = 0;
    int64_t out_offset = 0;
  };
  const uint8_t* in_;
  int64_t n_;
  std::vector<Block> blocks_;
  uint8_t* scratch_;              // interiors are encoded here in place, then copied
  int64_t tail_run_ = 0;          // run after the last block that has a non-121 byte
  int64_t tail_offset_ = 0;
};

}  // namespace zero_run
}  // namespace tfgc

#endif  // TFGC_OPS_CC_ZERO_RUN_H_
