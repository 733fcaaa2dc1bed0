// Alternative forward tile shape for the harness timings: head dim 256, 128x32, 8 warps.
#include "cuda/fwd_launch_template.cuh"

cudaError_t alt_d256_128x32x8w(const jax_flash::FwdParams& p, cudaStream_t s) {
  using T = jax_flash::cuda::fwd::FwdTraits<256, 128, 32, 8, cutlass::bfloat16_t>;
  return jax_flash::cuda::fwd::launch_fwd<T, true>(p, s);
}
