// Alternative configuration of the Hopper wide-head backward for the d256
// harness (bwd_sm90_wide_harness.cu): the default with kDqSplit off
// (sm90/bwd_wide_kernel.cuh). bf16 and fp16.
#include "cuda/sm90/bwd_wide_launch.cuh"

using jax_flash::cuda::bwd90::BwdSm90WideTraits;
using jax_flash::cuda::bwd90::launch_bwd_sm90_wide;

cudaError_t bwd_sm90_d256_nosplit(const jax_flash::BwdParams& p, jax_flash::cuda::BwdLaunchFlags f, cudaStream_t s) {
  if (p.dtype == jax_flash::DType::kFloat16)
    return launch_bwd_sm90_wide<BwdSm90WideTraits<256, cutlass::half_t, false, 2, true>>(p, f, s);
  return launch_bwd_sm90_wide<BwdSm90WideTraits<256, cutlass::bfloat16_t, false, 2, true>>(p, f, s);
}
