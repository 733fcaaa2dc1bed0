// Alternative Hopper forward configuration timed (and tested) by
// fwd_sm90_harness: head dim 128, kBlockN 128, overlap true, loads first false, bf16.
#include "cuda/fwd_sm90_launch_template.cuh"

cudaError_t sm90_d128_n128_ov_late(const jax_flash::FwdParams& p, cudaStream_t s) {
  using namespace jax_flash::cuda::fwd;
  return launch_fwd_sm90<Sm90Traits<128, 128, cutlass::bfloat16_t, true, false>>(p, s);
}
