// Alternative Hopper forward configurations timed (and tested) by
// fwd_sm90_harness: the non-overlapped loop (each wgmma waited on before the
// softmax) at head dim 128, bf16.
#include "cuda/fwd_sm90_launch_template.cuh"

cudaError_t sm90_alt_d128_no_overlap(const jax_flash::FwdParams& p, cudaStream_t s) {
  using namespace jax_flash::cuda::fwd;
  return launch_fwd_sm90<Sm90Traits<128, 128, cutlass::bfloat16_t, false>>(p, s);
}
