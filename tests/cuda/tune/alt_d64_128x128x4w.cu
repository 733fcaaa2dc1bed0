// Alternative forward tile shape for the harness timings: head dim 64, 128x128, 4 warps.
#include "cuda/sm80/fwd_launch_template.cuh"

cudaError_t alt_d64_128x128x4w(const jax_flash::FwdParams& p, cudaStream_t s) {
  using T = jax_flash::cuda::fwd::FwdTraits<64, 128, 128, 4, cutlass::bfloat16_t>;
  return jax_flash::cuda::fwd::launch_fwd<T, true>(p, s);
}
