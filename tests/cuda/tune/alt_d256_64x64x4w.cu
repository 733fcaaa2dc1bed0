// Alternative forward tile shape for the harness timings: head dim 256, 64x64, 4 warps.
#include "cuda/sm80/fwd_launch_template.cuh"

cudaError_t alt_d256_64x64x4w(const jax_flash::FwdParams& p, cudaStream_t s) {
  using T = jax_flash::cuda::fwd::FwdTraits<256, 64, 64, 4, cutlass::bfloat16_t>;
  return jax_flash::cuda::fwd::launch_fwd<T, true>(p, s);
}
