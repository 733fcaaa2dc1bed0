// Alternative Hopper forward configuration (fwd_sm90_harness): head dim 64,
// kBlockN 64, overlap false, loads first true, 4 CTAs per SM of 1 warpgroup, bf16.
// ptxas (nvcc 13.0): 114 registers, no spills; smem 40 KB a CTA.
#include "cuda/fwd_sm90_launch_template.cuh"
#include "alt.h"

using Cfg = jax_flash::cuda::fwd::Sm90Traits<64, 64, cutlass::bfloat16_t, false, true, 4, 1>;
SM90_ALT(sm90_d64_n64_noov_1wg_4cta, "noov BN=64 1wg 4cta", Cfg)
