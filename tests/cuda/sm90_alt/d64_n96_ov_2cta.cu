// Alternative Hopper forward configuration (fwd_sm90_harness): head dim 64,
// kBlockN 96, overlap true, loads first true, 2 CTA(s) per SM, bf16.
#include "cuda/fwd_sm90_launch_template.cuh"
#include "alt.h"

using Cfg = jax_flash::cuda::fwd::Sm90Traits<64, 96, cutlass::bfloat16_t, true, true, 2>;
SM90_ALT(sm90_d64_n96_ov_2cta, "ov BN=96 2cta", Cfg)
