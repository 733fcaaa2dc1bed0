// Alternative Hopper forward configuration timed (and tested) by
// fwd_sm90_harness: head dim 128, kBlockN 192, overlap false, loads first true, bf16.
#include "cuda/fwd_sm90_launch_template.cuh"

cudaError_t sm90_d128_n192_noov(const jax_flash::FwdParams& p, cudaStream_t s) {
  using namespace jax_flash::cuda::fwd;
  return launch_fwd_sm90<Sm90Traits<128, 192, cutlass::bfloat16_t, false, true>>(p, s);
}
