// The loops behind zero_run.h's EncodeSerial and Decode, shared by the portable scalar
// path (zero_run.cc) and the SIMD path (zero_run_x86.cc). Not part of the public API.
//
// A SIMD loop handles a prefix of its input and hands its state over to the scalar loop,
// which finishes the bytes too close to the end of either buffer for wide loads and
// stores.
#ifndef TFGC_OPS_CC_ZERO_RUN_PATHS_H_
#define TFGC_OPS_CC_ZERO_RUN_PATHS_H_

#include <cstdint>

namespace tfgc {
namespace zero_run {
namespace internal {

// Encoder state after in[0, i): out[0, o) is written, and `run` (< kMaxRun) trailing 121s
// are pending. Invariant: o + run <= i.
struct EncodeState {
  int64_t i = 0, o = 0;
  uint64_t run = 0;
};

// Decoder state: in[0, i) is decoded into out[0, o).
struct DecodeState {
  int64_t i = 0, o = 0;
};

// Portable loops, from a given state to the end; EncodeScalar returns the encoded size.
int64_t EncodeScalar(const uint8_t* in, int64_t n, uint8_t* out, EncodeState state);
void DecodeScalar(const uint8_t* in, int64_t n, uint8_t* out, int64_t out_size,
                  DecodeState state);

// SIMD loops over a prefix (zero_run_x86.cc); callable only where the CPU has SSSE3
// (AVX-512 VBMI2 for the last one).
bool CpuHasSsse3();
EncodeState EncodePrefixSsse3(const uint8_t* in, int64_t n, uint8_t* out);
DecodeState DecodePrefixSsse3(const uint8_t* in, int64_t n, uint8_t* out, int64_t out_size);
int64_t DecodedSizeSsse3(const uint8_t* in, int64_t n);
bool CpuHasAvx512Vbmi2();
DecodeState DecodePrefixAvx512Vbmi2(const uint8_t* in, int64_t n, uint8_t* out,
                                    int64_t out_size);

}  // namespace internal
}  // namespace zero_run
}  // namespace tfgc

#endif  // TFGC_OPS_CC_ZERO_RUN_PATHS_H_
