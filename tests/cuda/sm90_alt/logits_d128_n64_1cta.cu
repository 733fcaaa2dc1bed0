// Alternative Hopper logits configuration (fwd_sm90_harness --logits): head
// dim 128, kBlockN 64, one CTA per SM (255 registers: no spills in the
// soft-cap + ALiBi kernel), overlapped loop, bf16.
#include "cuda/fwd_sm90_launch_template.cuh"
#include "alt.h"

static cudaError_t sm90_logits_d128_n64_1cta(const jax_flash::FwdParams& p, cudaStream_t s) {
  using Masks = jax_flash::cuda::fwd::Sm90Traits<128, 64, cutlass::bfloat16_t, true, true, 1, 2, true>;
  return jax_flash::cuda::fwd::launch_fwd_sm90_logits<Masks>(p, s);
}
static Sm90AltRegister sm90_logits_d128_n64_1cta_reg("logits 1cta ov", 128, &sm90_logits_d128_n64_1cta);
