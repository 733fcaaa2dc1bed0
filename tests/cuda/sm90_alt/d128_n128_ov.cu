// Alternative Hopper forward configuration (fwd_sm90_harness): head dim 128,
// kBlockN 128, overlap true, loads first true, 1 CTA(s) per SM, bf16.
// The default before 2026-11-23 (one CTA per SM), kept for comparison.
#include "cuda/fwd_sm90_launch_template.cuh"
#include "alt.h"

using Cfg = jax_flash::cuda::fwd::Sm90Traits<128, 128, cutlass::bfloat16_t, true, true>;
SM90_ALT(sm90_d128_n128_ov, "ov BN=128 1cta", Cfg)
