// Alternative Hopper forward configuration (fwd_sm90_harness): head dim 64,
// kBlockN 128, overlap false, loads first true, 3 CTAs per SM of 1 warpgroup, bf16.
// ptxas (nvcc 13.0): 161 registers (cap 168), no spills; smem 72 KB a CTA.
#include "cuda/fwd_sm90_launch_template.cuh"
#include "alt.h"

using Cfg = jax_flash::cuda::fwd::Sm90Traits<64, 128, cutlass::bfloat16_t, false, true, 3, 1>;
SM90_ALT(sm90_d64_n128_noov_1wg_3cta, "noov BN=128 1wg 3cta", Cfg)
