// The failure check every fuzz target uses: print what broke, then abort so that
// libFuzzer records the input as a crash.
#ifndef TFGC_OPS_FUZZ_FUZZ_CHECK_H_
#define TFGC_OPS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

namespace tfgc_fuzz {

inline void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "tfgc fuzz: check failed: %s\n", what);
    std::abort();
  }
}

}  // namespace tfgc_fuzz

#endif  // TFGC_OPS_FUZZ_FUZZ_CHECK_H_
