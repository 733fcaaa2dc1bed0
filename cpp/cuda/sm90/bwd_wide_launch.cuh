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
// without segment ids (launch_bwd_ws; with them the kSegOrder units, below), where the
// order keeper ranks as the d64 / d128 writers do (masks_dq_rank: highest
// key tile first, so no rotation). Atomic mode staggers as plain does.
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_wide_masks_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  using Cfg = sm90::BwdWideConfig<kHeadDim, bwd::ElementOf<kDType>, true>;
  return sm90::launch_bwd_ws<Cfg>(params, flags, params.deterministic ? 0 : 1, stream);
}

// Deterministic mode with segment ids, masks only: the kSegOrder
// instantiation (own units: instantiations/bwd_sm90_masks_seg_order_hdim256_*.cu).
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_wide_masks_seg_order_hdim(const BwdParams& params, BwdLaunchFlags flags,
                                                   cudaStream_t stream) {
  using Cfg = sm90::BwdWideConfig<kHeadDim, bwd::ElementOf<kDType>, true, 0, true>;
  return sm90::launch_bwd_ws<Cfg>(params, flags, 0, stream);
}

// The wide kernel's configuration of logit-transform set L.
namespace sm90 {
template <int kHeadDim, class T, bool kSegOrder>
struct BwdWideLogitsCfg {
  template <int L>
  using type = BwdWideConfig<kHeadDim, T, true, L, kSegOrder>;
};
}  // namespace sm90

// Soft-cap / ALiBi / dropout in any set (with or without the masks-only
// variants) on the same kernel, in the modes the masks kernel runs (above).
// kDropoutSets: the three sets with dropout and a transform (own units),
// else the other four.
template <DType kDType, int kHeadDim, bool kDropoutSets>
cudaError_t run_bwd_sm90_wide_logits_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  using Cfg = sm90::BwdWideLogitsCfg<kHeadDim, bwd::ElementOf<kDType>, false>;
  return sm90::launch_bwd_logits_set<Cfg::template type, kDropoutSets>(params, flags, params.deterministic ? 0 : 1,
                                                                       stream);
}

// Deterministic mode with segment ids and a transform set: the kSegOrder
// instantiations (own units: instantiations/
// bwd_sm90_logits{,_dropout}_seg_order_hdim256_*.cu).
template <DType kDType, int kHeadDim, bool kDropoutSets>
cudaError_t run_bwd_sm90_wide_logits_seg_order_hdim(const BwdParams& params, BwdLaunchFlags flags,
                                                    cudaStream_t stream) {
  using Cfg = sm90::BwdWideLogitsCfg<kHeadDim, bwd::ElementOf<kDType>, true>;
  return sm90::launch_bwd_logits_set<Cfg::template type, kDropoutSets>(params, flags, 0, stream);
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_BWD_SM90_WIDE_LOGITS(DTYPE, HDIM, SETS)                                          \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_wide_logits_hdim<jax_flash::DType::DTYPE, HDIM, SETS>(    \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD_SM90_WIDE_LOGITS_SEG_ORDER(DTYPE, HDIM, SETS)                                \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_wide_logits_seg_order_hdim<jax_flash::DType::DTYPE, HDIM, \
                                                                               SETS>(                          \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD_SM90_WIDE_MASKS_SEG_ORDER(DTYPE, HDIM)                                   \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_wide_masks_seg_order_hdim<jax_flash::DType::DTYPE, HDIM>( \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD_SM90_WIDE_MASKS(DTYPE, HDIM)                                        \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_wide_masks_hdim<jax_flash::DType::DTYPE, HDIM>(  \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD_SM90_WIDE(DTYPE, HDIM)                                          \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_wide_hdim<jax_flash::DType::DTYPE, HDIM>(    \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);
