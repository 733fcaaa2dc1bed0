// Host side of the wide-head (head dim 256) warp-specialised Hopper
// backward (bwd_wide_config.cuh): its configuration, launched by
// launch_bwd_ws (bwd_launch.cuh), in both modes. Included only by
// instantiations/bwd_sm90_hdim256_*.cu.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/sm90/bwd_launch.cuh"
#include "cuda/sm90/bwd_wide_config.cuh"

namespace jax_flash::cuda {

// Plain attention, head_dim <= kHeadDim, vector-aligned inputs, non-empty
// sequences (else NotSupported: the SM80 kernels). Atomic mode staggers
// each key tile's first query tile (BwdWork's rotation by one), so that the
// CTAs running side by side add into different dQ tiles. The ordered path
// (deterministic mode, or run_ordered's choice) rotates only where
// order_rotation says its waits stay short.
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_wide_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  using Cfg = sm90::BwdWideConfig<kHeadDim, bwd::ElementOf<kDType>>;
  BwdParams p = params;
  p.deterministic = sm90::run_ordered(p, Cfg::kBlockN, Cfg::kHeadDim);
  const int rotate = p.deterministic ? sm90::order_rotation(p, Cfg::kBlockM, Cfg::kBlockN) : 1;
  return sm90::launch_bwd_ws<Cfg>(p, flags, rotate, stream);
}

// The masks-only variants (window, lengths, query offsets, segment ids) on
// the same kernel (BwdWideConfig's kMasks), atomic mode, and deterministic
// without segment ids (launch_bwd_ws; with them the SM80 pair), where the
// order keeper ranks as the d64 / d128 writers do (masks_dq_rank: highest
// key tile first, so no rotation). Atomic mode staggers as plain does.
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_wide_masks_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  using Cfg = sm90::BwdWideConfig<kHeadDim, bwd::ElementOf<kDType>, true>;
  return sm90::launch_bwd_ws<Cfg>(params, flags, params.deterministic ? 0 : 1, stream);
}

// Soft-cap / ALiBi / dropout in any set (with or without the masks-only
// variants) on the same kernel, in the modes the masks kernel runs (above).
// kDropoutSets: the three sets with dropout and a transform (own units),
// else the other four.
template <DType kDType, int kHeadDim, bool kDropoutSets>
cudaError_t run_bwd_sm90_wide_logits_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  const int rotate = params.deterministic ? 0 : 1;
  constexpr int kCap = fwd::kLogitSoftcap, kAlibi = fwd::kLogitAlibi, kDrop = fwd::kLogitDropout;
  using T = bwd::ElementOf<kDType>;
  auto run = [&](auto cfg) { return sm90::launch_bwd_ws<decltype(cfg)>(params, flags, rotate, stream); };
  const int kind = bwd90::logits_kind(params);
  if constexpr (kDropoutSets) {
    switch (kind) {
      case kCap | kDrop:
        return run(sm90::BwdWideConfig<kHeadDim, T, true, kCap | kDrop>{});
      case kAlibi | kDrop:
        return run(sm90::BwdWideConfig<kHeadDim, T, true, kAlibi | kDrop>{});
      case kCap | kAlibi | kDrop:
        return run(sm90::BwdWideConfig<kHeadDim, T, true, kCap | kAlibi | kDrop>{});
      default:
        return cudaErrorNotSupported;
    }
  } else {
    switch (kind) {
      case kCap:
        return run(sm90::BwdWideConfig<kHeadDim, T, true, kCap>{});
      case kAlibi:
        return run(sm90::BwdWideConfig<kHeadDim, T, true, kAlibi>{});
      case kCap | kAlibi:
        return run(sm90::BwdWideConfig<kHeadDim, T, true, kCap | kAlibi>{});
      case kDrop:
        return run(sm90::BwdWideConfig<kHeadDim, T, true, kDrop>{});
      default:
        return cudaErrorNotSupported;
    }
  }
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_BWD_SM90_WIDE_LOGITS(DTYPE, HDIM, SETS)                                          \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_wide_logits_hdim<jax_flash::DType::DTYPE, HDIM, SETS>(    \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD_SM90_WIDE_MASKS(DTYPE, HDIM)                                        \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_wide_masks_hdim<jax_flash::DType::DTYPE, HDIM>(  \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD_SM90_WIDE(DTYPE, HDIM)                                          \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_wide_hdim<jax_flash::DType::DTYPE, HDIM>(    \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);
