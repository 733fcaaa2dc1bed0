// Harness-only configurations of the Hopper backward (d128): kDqBulk = dQ
// tile staged in smem and added by bulk async reduce copies instead of
// per-element fp32 atomics.
#include "cuda/bwd_sm90_launch_template.cuh"

namespace jf = jax_flash::cuda;

cudaError_t bwd_sm90_d128_dqbulk(const jax_flash::BwdParams& p, jf::BwdLaunchFlags f, cudaStream_t s) {
  if (p.dtype == jax_flash::DType::kFloat16)
    return jf::bwd90::launch_bwd_sm90<jf::bwd90::BwdSm90Traits<128, cutlass::half_t, true>>(p, f, s);
  return jf::bwd90::launch_bwd_sm90<jf::bwd90::BwdSm90Traits<128, cutlass::bfloat16_t, true>>(p, f, s);
}
