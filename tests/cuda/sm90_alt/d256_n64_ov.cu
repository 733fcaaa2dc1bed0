// Alternative Hopper forward configuration (fwd_sm90_harness): head dim 256,
// kBlockN 64, overlap true, loads first true, 1 CTA(s) per SM, bf16.
// The default from 0ecb620 to 2026-11-23, kept for comparison.
#include "cuda/fwd_sm90_launch_template.cuh"
#include "alt.h"

using Cfg = jax_flash::cuda::fwd::Sm90Traits<256, 64, cutlass::bfloat16_t, true, true>;
SM90_ALT(sm90_d256_n64_ov, "ov loads-first BN=64", Cfg)
