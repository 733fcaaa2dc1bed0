// Alternative Hopper logits configuration (fwd_sm90_harness --logits): head
// dim 64 with kBlockN 64 (the default masks tile is BN 128, whose 64-register
// S accumulator leaves the ALiBi transforms spilling), 2 CTAs per SM, bf16.
#include "cuda/fwd_sm90_launch_template.cuh"
#include "alt.h"

static cudaError_t sm90_logits_d64_n64(const jax_flash::FwdParams& p, cudaStream_t s) {
  using Masks = jax_flash::cuda::fwd::Sm90Traits<64, 64, cutlass::bfloat16_t, false, true, 2, 2, true>;
  return jax_flash::cuda::fwd::launch_fwd_sm90_logits<Masks>(p, s);
}
static Sm90AltRegister sm90_logits_d64_n64_reg("logits BN=64", 64, &sm90_logits_d64_n64);
