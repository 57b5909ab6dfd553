// Which x86 vector instructions the codecs' loops may use, decided once per process.
//
// The portable loops use SSE2, which every x86-64 CPU has. Loops that use AVX2 are
// compiled with a target attribute and run only where UseAvx2() is true: the CPU has
// AVX2 and the environment does not cap the choice (TFGC_CODEC_ISA=sse2 makes a
// process take the SSE2 loops, so that tests can compare both on one machine).
#ifndef TFGC_OPS_CC_CPU_ISA_H_
#define TFGC_OPS_CC_CPU_ISA_H_

namespace tfgc {

bool UseAvx2();

}  // namespace tfgc

#endif  // TFGC_OPS_CC_CPU_ISA_H_
