#include "cpu_isa.h"

#include <cstdlib>
#include <cstring>

namespace tfgc {

bool UseAvx2() {
  static const bool use = [] {
    const char* cap = std::getenv("TFGC_CODEC_ISA");
    if (cap != nullptr && std::strcmp(cap, "sse2") == 0) return false;
#if defined(__x86_64__) || defined(__i386__)
    return static_cast<bool>(__builtin_cpu_supports("avx2"));
#else
    return false;
#endif
  }();
  return use;
}

}  // namespace tfgc
