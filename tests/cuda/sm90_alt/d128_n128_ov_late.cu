// Alternative Hopper forward configuration (fwd_sm90_harness): head dim 128,
// kBlockN 128, overlap true, loads first false, 1 CTA(s) per SM, bf16.
#include "cuda/fwd_sm90_launch_template.cuh"
#include "alt.h"

using Cfg = jax_flash::cuda::fwd::Sm90Traits<128, 128, cutlass::bfloat16_t, true, false>;
SM90_ALT(sm90_d128_n128_ov_late, "ov late-loads BN=128", Cfg)
