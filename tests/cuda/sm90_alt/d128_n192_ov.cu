// Alternative Hopper forward configuration (fwd_sm90_harness): head dim 128,
// kBlockN 192, overlap true, loads first true, 1 CTA(s) per SM, bf16.
#include "cuda/fwd_sm90_launch_template.cuh"
#include "alt.h"

using Cfg = jax_flash::cuda::fwd::Sm90Traits<128, 192, cutlass::bfloat16_t, true, true>;
SM90_ALT(sm90_d128_n192_ov, "ov BN=192", Cfg)
