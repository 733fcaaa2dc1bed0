// Harness-only alternative backward configuration, timed beside the
// production one by `bwd_harness variants` (bench): the generic variants
// kernels (soft-cap, ALiBi, dropout) on the plain 64 x 128 dK/dV tile at
// head dim 128, bf16 (production: 64-key tiles, bwd::VariantDkdv).
#include "cuda/sm80/bwd_launch_template.cuh"

cudaError_t jf_bwd_var_general_d128_tile128(const jax_flash::BwdParams& p, cudaStream_t s) {
  using namespace jax_flash;
  using namespace jax_flash::cuda;
  BwdLaunchFlags f;
  f.vec_ok = true;   // the bench's buffers: aligned, head_dim 128
  f.pair_ok = true;
  return bwd::launch_bwd<bwd::DefaultDkdv<128, DType::kBFloat16>,
                         bwd::DefaultDq<128, DType::kBFloat16>, kVarGeneral>(p, f, s);
}
