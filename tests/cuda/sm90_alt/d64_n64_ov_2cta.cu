// Alternative Hopper forward configuration (fwd_sm90_harness): head dim 64,
// kBlockN 64, overlap true, loads first true, 2 CTA(s) per SM, bf16.
// ptxas (nvcc 13.0): 122 registers, no spills.
#include "cuda/fwd_sm90_launch_template.cuh"
#include "alt.h"

using Cfg = jax_flash::cuda::fwd::Sm90Traits<64, 64, cutlass::bfloat16_t, true, true, 2>;
SM90_ALT(sm90_d64_n64_ov_2cta, "ov BN=64 2cta", Cfg)
