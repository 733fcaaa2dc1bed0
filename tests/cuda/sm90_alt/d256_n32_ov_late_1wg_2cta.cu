// Alternative Hopper forward configuration (fwd_sm90_harness): head dim 256,
// kBlockN 32, overlap true, loads first false, 2 CTAs per SM of 1 warpgroup, bf16.
// ptxas (nvcc 13.0): 220 registers, no spills; smem 96 KB a CTA.
#include "cuda/fwd_sm90_launch_template.cuh"
#include "alt.h"

using Cfg = jax_flash::cuda::fwd::Sm90Traits<256, 32, cutlass::bfloat16_t, true, false, 2, 1>;
SM90_ALT(sm90_d256_n32_ov_late_1wg_2cta, "ov late-loads BN=32 1wg 2cta", Cfg)
