// Harness-only alternative backward configuration, timed beside the
// production one by `bwd_harness variants` (bench): the generic variants
// kernels (soft-cap, ALiBi, dropout) on the plain 64 x 128 dK/dV tile at
// head dim 128, bf16 (production: 64-key tiles, bwd::VariantDkdv).
#include "cuda/bwd_launch_template.cuh"

cudaError_t jf_bwd_var_general_d128_tile128(const jax_flash::BwdParams& p, cudaStream_t s) {
  using namespace jax_flash;
  using namespace jax_flash::cuda;
  BwdLaunchFlags f;
  f.vec_ok = true;   // the bench's buffers: aligned, head_dim 128
  f.pair_ok = true;
  return bwd::launch_bwd<bwd::DefaultDkdv<128, DType::kBFloat16>,
                         bwd::DefaultDq<128, DType::kBFloat16>, kVarGeneral>(p, f, s);
}

#if defined(JAX_FLASH_BWD_SM90)
// The lockstep Hopper soft-cap backward (bf16, head dim 64 or 128, soft-cap
// with or without ALiBi as the params say) with the other tanh schedule
// (kBwdSm90TanhFirst flipped: held before the dP^T wait <-> left to ptxas).
// Production runs the warp-specialised kernel (cpp/cuda/sm90/bwd_logits.cuh)
// since 2026-11-26; this stays until the lockstep kernel is deleted.
#include "cuda/bwd_sm90_launch_template.cuh"

cudaError_t jf_bwd_sm90_logits_alt(const jax_flash::BwdParams& p, cudaStream_t s) {
  using namespace jax_flash;
  using namespace jax_flash::cuda;
  BwdLaunchFlags f;
  f.vec_ok = true;  // the bench's buffers: aligned
  f.pair_ok = true;
  constexpr int kCap = fwd::kLogitSoftcap, kBoth = fwd::kLogitSoftcap | fwd::kLogitAlibi;
  constexpr DType B16 = DType::kBFloat16;
  constexpr bool kCapHeld = kBwdSm90TanhFirst<kCap>, kBothHeld = kBwdSm90TanhFirst<kBoth>;
  const bool both = p.alibi_slopes != nullptr;
  if (p.softcap <= 0.f) return cudaErrorNotSupported;
  if (p.head_dim == 64)
    return both ? bwd90::launch_bwd_sm90<bwd90::LogitsTraitsFor<B16, 64, kBoth, !kBothHeld>>(p, f, s)
                : bwd90::launch_bwd_sm90<bwd90::LogitsTraitsFor<B16, 64, kCap, !kCapHeld>>(p, f, s);
  return both ? bwd90::launch_bwd_sm90<bwd90::LogitsTraitsFor<B16, 128, kBoth, !kBothHeld>>(p, f, s)
              : bwd90::launch_bwd_sm90<bwd90::LogitsTraitsFor<B16, 128, kCap, !kCapHeld>>(p, f, s);
}
#endif
