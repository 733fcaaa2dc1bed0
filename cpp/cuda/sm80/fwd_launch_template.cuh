// Host side of one forward instantiation: tile choice per head dim, smem
// opt-in, launch. Included only by the instantiations/*.cu files.
#pragma once

#include <atomic>

#include <cuda_runtime_api.h>

#include "cuda/fwd_dispatch.h"
#include "cuda/sm80/fwd_kernel.cuh"

namespace jax_flash::cuda {

namespace fwd {

template <DType kDType>
using ElementOf = std::conditional_t<kDType == DType::kFloat16, cutlass::half_t, cutlass::bfloat16_t>;

// (BM, BN, warps) per head dim.
template <int D> struct FwdTile;
template <> struct FwdTile<32>  { static constexpr int kM = 128, kN = 64, kW = 4; };
template <> struct FwdTile<64>  { static constexpr int kM = 128, kN = 64, kW = 4; };
template <> struct FwdTile<96>  { static constexpr int kM = 128, kN = 32, kW = 4; };
template <> struct FwdTile<128> { static constexpr int kM = 128, kN = 32, kW = 4; };
template <> struct FwdTile<160> { static constexpr int kM = 128, kN = 64, kW = 8; };
template <> struct FwdTile<192> { static constexpr int kM = 128, kN = 64, kW = 8; };
template <> struct FwdTile<224> { static constexpr int kM = 128, kN = 64, kW = 8; };
template <> struct FwdTile<256> { static constexpr int kM = 128, kN = 64, kW = 8; };

}  // namespace fwd

namespace fwd {

// Launch the forward with an explicit configuration (also used by the
// standalone harness to compare tile shapes).
template <class Traits, bool kVec, int kVariants = kVarNone>
static cudaError_t launch_fwd(const FwdParams& params, cudaStream_t stream, bool vec = kVec) {
  auto kernel = &fwd_kernel<Traits, kVec, kVariants>;
  constexpr int kSmem = Traits::kSmemBytes;

  if constexpr (kSmem > 48 * 1024) {
    // The opt-in is per device; remember which devices have it.
    static std::atomic<unsigned long long> done_mask{0};
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    const unsigned long long bit = dev < 64 ? (1ull << dev) : 0ull;
    if (bit == 0 || !(done_mask.load(std::memory_order_acquire) & bit)) {
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
      if (err != cudaSuccess) return err;
      done_mask.fetch_or(bit, std::memory_order_acq_rel);
    }
  }

  FwdArgs args;
  args.p = params;
  args.scale_log2 = params.scale * 1.4426950408889634f;
  args.vec = vec;

  const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, params.heads_q, params.batch);
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(args);
  return cudaGetLastError();
}

template <int kHeadDim, DType kDType>
using DefaultTraits = FwdTraits<kHeadDim, FwdTile<kHeadDim>::kM, FwdTile<kHeadDim>::kN,
                                FwdTile<kHeadDim>::kW, ElementOf<kDType>>;

}  // namespace fwd

template <DType kDType, int kHeadDim>
cudaError_t run_fwd_hdim(const FwdParams& params, cudaStream_t stream) {
  // Vector copies only: the element-wise path (head_dim % 8 != 0, unaligned
  // rows) runs on the variants kernel, whose vector flag is a run-time value
  // (one instantiation fewer per head dim and dtype).
#if defined(JAX_FLASH_FWD_SM90)
  // Built with sm_90a (fwd_sm90_*.cu units): the wgmma kernel on cc 9.0
  // devices; it answers cudaErrorNotSupported elsewhere.
  if constexpr (kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256) {
    const cudaError_t err = run_fwd_sm90_hdim<kDType, kHeadDim>(params, stream);
    if (err != cudaErrorNotSupported) return err;
  }
#endif
  return fwd::launch_fwd<fwd::DefaultTraits<kHeadDim, kDType>, true>(params, stream);
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_FWD(DTYPE, HDIM)                              \
  template cudaError_t jax_flash::cuda::run_fwd_hdim<jax_flash::DType::DTYPE, HDIM>( \
      const jax_flash::FwdParams&, cudaStream_t);
