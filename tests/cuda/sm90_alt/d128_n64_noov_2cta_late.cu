// Alternative Hopper forward configuration (fwd_sm90_harness): head dim 128,
// kBlockN 64, overlap false, loads first false, 2 CTA(s) per SM, bf16.
#include "cuda/fwd_sm90_launch_template.cuh"
#include "alt.h"

using Cfg = jax_flash::cuda::fwd::Sm90Traits<128, 64, cutlass::bfloat16_t, false, false, 2>;
SM90_ALT(sm90_d128_n64_noov_2cta_late, "noov late-loads BN=64 2cta", Cfg)
