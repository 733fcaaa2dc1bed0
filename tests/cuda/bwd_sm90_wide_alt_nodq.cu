// Timing experiment for the d256 harness: the default configuration of the
// Hopper wide-head backward with the dQ atomics left out (kDiagNoDq; dQ is
// wrong). bf16 only.
#include "cuda/bwd_sm90_wide_launch_template.cuh"

using jax_flash::cuda::bwd90::BwdSm90WideTraits;
using jax_flash::cuda::bwd90::launch_bwd_sm90_wide;

cudaError_t bwd_sm90_d256_nodq(const jax_flash::BwdParams& p, jax_flash::cuda::BwdLaunchFlags f, cudaStream_t s) {
  if (p.dtype == jax_flash::DType::kFloat16) return cudaErrorNotSupported;
  return launch_bwd_sm90_wide<BwdSm90WideTraits<256, cutlass::bfloat16_t, true, 0, true>>(p, f, s);
}
