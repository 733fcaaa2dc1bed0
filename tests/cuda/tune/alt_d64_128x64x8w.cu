// Alternative forward tile shape for the harness timings: head dim 64, 128x64, 8 warps.
#include "cuda/sm80/fwd_launch_template.cuh"

cudaError_t alt_d64_128x64x8w(const jax_flash::FwdParams& p, cudaStream_t s) {
  using T = jax_flash::cuda::fwd::FwdTraits<64, 128, 64, 8, cutlass::bfloat16_t>;
  return jax_flash::cuda::fwd::launch_fwd<T, true>(p, s);
}
