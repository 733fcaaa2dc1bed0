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
// the same kernel (BwdWideConfig's kMasks), atomic mode only (deterministic
// mode runs the SM80 pair: the masks' dQ order is the d64 / d128 writers').
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_wide_masks_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  if (params.deterministic) return cudaErrorNotSupported;
  using Cfg = sm90::BwdWideConfig<kHeadDim, bwd::ElementOf<kDType>, true>;
  return sm90::launch_bwd_ws<Cfg>(params, flags, 1, stream);
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_BWD_SM90_WIDE_MASKS(DTYPE, HDIM)                                        \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_wide_masks_hdim<jax_flash::DType::DTYPE, HDIM>(  \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD_SM90_WIDE(DTYPE, HDIM)                                          \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_wide_hdim<jax_flash::DType::DTYPE, HDIM>(    \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);
