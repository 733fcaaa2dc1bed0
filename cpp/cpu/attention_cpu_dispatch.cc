// Picks, once, the best compiled instruction-set variant of the CPU kernels
// (attention_cpu_impl.cc is built once per variant into its own namespace).
#include "cpu/attention_cpu.h"

namespace jax_flash::cpu {

#define JF_DECLARE_VARIANT(ns)                                       \
  namespace ns {                                                     \
  void attention_fwd_impl(const FwdParams& p, const Executor& exec); \
  void attention_bwd_impl(const BwdParams& p, const Executor& exec); \
  }
JF_DECLARE_VARIANT(generic)
#if defined(JAX_FLASH_CPU_X86_VARIANTS)
JF_DECLARE_VARIANT(avx2)
JF_DECLARE_VARIANT(avx512)
#endif
#undef JF_DECLARE_VARIANT

namespace {

enum class Isa { kGeneric, kAvx2, kAvx512 };

Isa detect() {
#if defined(JAX_FLASH_CPU_X86_VARIANTS)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
    return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kGeneric;
}

Isa isa() {
  static const Isa chosen = detect();
  return chosen;
}

}  // namespace

void attention_fwd(const FwdParams& p, const Executor& exec) {
  switch (isa()) {
#if defined(JAX_FLASH_CPU_X86_VARIANTS)
    case Isa::kAvx512: return avx512::attention_fwd_impl(p, exec);
    case Isa::kAvx2: return avx2::attention_fwd_impl(p, exec);
#endif
    default: return generic::attention_fwd_impl(p, exec);
  }
}

void attention_bwd(const BwdParams& p, const Executor& exec) {
  switch (isa()) {
#if defined(JAX_FLASH_CPU_X86_VARIANTS)
    case Isa::kAvx512: return avx512::attention_bwd_impl(p, exec);
    case Isa::kAvx2: return avx2::attention_bwd_impl(p, exec);
#endif
    default: return generic::attention_bwd_impl(p, exec);
  }
}

const char* isa_name() {
  switch (isa()) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "generic";
  }
}

}  // namespace jax_flash::cpu
