// Alternative Hopper forward configuration (fwd_sm90_harness): head dim 64,
// kBlockN 128, overlap false, loads first false, 2 CTA(s) per SM, bf16.
#include "cuda/fwd_sm90_launch_template.cuh"
#include "alt.h"

using Cfg = jax_flash::cuda::fwd::Sm90Traits<64, 128, cutlass::bfloat16_t, false, false, 2>;
SM90_ALT(sm90_d64_n128_noov_2cta_late, "noov late-loads BN=128 2cta", Cfg)
