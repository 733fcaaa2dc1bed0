// Host side of the wide-head (head dim 256) warp-specialised Hopper
// backward (bwd_wide_config.cuh): its configurations, launched by
// launch_bwd_ws (bwd_launch.cuh). In deterministic mode the kernel makes dK
// and dV alone and the SM80 atomic-free dQ kernel dQ. Included only by
// instantiations/bwd_sm90_hdim256_*.cu.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/bwd_dispatch.h"  // run_bwd_dq_hdim
#include "cuda/sm90/bwd_launch.cuh"
#include "cuda/sm90/bwd_wide_config.cuh"

namespace jax_flash::cuda {

// The deterministic dQ kernel comes from the SM80 units
// (instantiations/bwd_hdim256_*.cu): not compiled again here.
extern template cudaError_t run_bwd_dq_hdim<DType::kBFloat16, 256>(const BwdParams&, BwdLaunchFlags, cudaStream_t);
extern template cudaError_t run_bwd_dq_hdim<DType::kFloat16, 256>(const BwdParams&, BwdLaunchFlags, cudaStream_t);

// Plain attention, head_dim == kHeadDim, vector-aligned inputs, non-empty
// sequences (else NotSupported: the SM80 kernels). Atomic mode staggers
// each key tile's first query tile (BwdWork's rotation by one), so that the
// CTAs running side by side add into different dQ tiles.
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_wide_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  using T = bwd::ElementOf<kDType>;
  if (!params.deterministic) return sm90::launch_bwd_ws<sm90::BwdWideConfig<kHeadDim, T>>(params, flags, 1, stream);
  const cudaError_t err = sm90::launch_bwd_ws<sm90::BwdWideConfig<kHeadDim, T, true>>(params, flags, 0, stream);
  if (err != cudaSuccess) return err;
  return run_bwd_dq_hdim<kDType, kHeadDim>(params, flags, stream);
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_BWD_SM90_WIDE(DTYPE, HDIM)                                          \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_wide_hdim<jax_flash::DType::DTYPE, HDIM>(    \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);
