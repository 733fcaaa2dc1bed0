// Alternative forward tile shape for the harness timings: head dim 128, 128x128, 8 warps.
#include "cuda/sm80/fwd_launch_template.cuh"

cudaError_t alt_d128_128x128x8w(const jax_flash::FwdParams& p, cudaStream_t s) {
  using T = jax_flash::cuda::fwd::FwdTraits<128, 128, 128, 8, cutlass::bfloat16_t>;
  return jax_flash::cuda::fwd::launch_fwd<T, true>(p, s);
}
