#include <cstring>

#include "kernels.h"

namespace polychip::cpu {

bool CpuHasAvx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

bool CpuHasAvx512() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return CpuHasAvx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

const KernelTable* SelectKernels(const char* isa_name) {
  if (isa_name == nullptr || *isa_name == 0 || std::strcmp(isa_name, "auto") == 0) {
    if (CpuHasAvx512()) return &Avx512Kernels();
    if (CpuHasAvx2()) return &Avx2Kernels();
    return &ScalarKernels();
  }
  if (std::strcmp(isa_name, "scalar") == 0) return &ScalarKernels();
  if (std::strcmp(isa_name, "avx2") == 0) return CpuHasAvx2() ? &Avx2Kernels() : nullptr;
  if (std::strcmp(isa_name, "avx512") == 0) return CpuHasAvx512() ? &Avx512Kernels() : nullptr;
  return nullptr;
}

}  // namespace polychip::cpu
