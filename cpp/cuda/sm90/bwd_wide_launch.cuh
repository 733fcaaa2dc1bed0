// Host side of the Hopper (wgmma) wide-head backward (sm90/bwd_wide_kernel.cuh):
// availability check, smem opt-in, launch sequence (the SM80 path's
// preprocess and dQ convert kernels around the sm90 dK/dV kernel; in
// deterministic mode the kernel without dQ, then the SM80 atomic-free dQ
// kernel). Plain attention, head dim == the instantiated one, 16 B-aligned
// inputs; anything else answers cudaErrorNotSupported so that the caller
// falls back to the SM80 kernels. Included only by instantiations/bwd_sm90_hdim256_*.cu.
#pragma once

#include <atomic>

#include <cuda_runtime_api.h>

#include "cuda/bwd_dispatch.h"         // run_bwd_dq_hdim
#include "cuda/common/bwd_rows.cuh"     // launch_preprocess, launch_dq_convert, ElementOf
#include "cuda/sm90/bwd_wide_kernel.cuh"
#include "cuda/sm90/ready.h"

namespace jax_flash::cuda {

// The deterministic dQ kernel comes from the SM80 units
// (instantiations/bwd_hdim256_*.cu): not compiled again here.
extern template cudaError_t run_bwd_dq_hdim<DType::kBFloat16, 256>(const BwdParams&, BwdLaunchFlags, cudaStream_t);
extern template cudaError_t run_bwd_dq_hdim<DType::kFloat16, 256>(const BwdParams&, BwdLaunchFlags, cudaStream_t);

namespace bwd90 {

template <class Traits>
static cudaError_t launch_bwd_sm90_wide(const BwdParams& p, BwdLaunchFlags flags, cudaStream_t stream) {
  using Element = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
  if (p.deterministic || !flags.vec_ok || p.head_dim != D) return cudaErrorNotSupported;
  static std::atomic<unsigned long long> ready{0};
  if (!sm90_kernel_ready(&bwd_sm90_wide_dkdv_kernel<Traits>, Traits::kSmemBytes, ready))
    return cudaErrorNotSupported;
  float* dsum = static_cast<float*>(p.workspace);
  float* accum = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + bwd_dsum_bytes(p));
  bwd::launch_preprocess<Element>(p, dsum, accum, D, stream);
  if (p.seqlen_k > 0) {
    const dim3 grid((p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, p.heads_kv, p.batch);
    bwd_sm90_wide_dkdv_kernel<Traits><<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(
        p, dsum, accum, flags.pair_ok);
  }
  bwd::launch_dq_convert<Element>(p, accum, D, stream);
  return cudaGetLastError();
}

// Deterministic mode: no accumulator and no atomics. This kernel makes dK
// and dV alone (kDkdvOnly: four products a step instead of five), the SM80
// atomic-free dQ kernel (run_bwd_dq_hdim) dQ, after one preprocess for D.
template <class Traits, DType kDType>
static cudaError_t launch_bwd_sm90_wide_det(const BwdParams& p, BwdLaunchFlags flags, cudaStream_t stream) {
  static_assert(Traits::kDkdvOnly);
  using Element = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
  if (!p.deterministic || !flags.vec_ok || p.head_dim != D) return cudaErrorNotSupported;
  static std::atomic<unsigned long long> ready{0};
  if (!sm90_kernel_ready(&bwd_sm90_wide_dkdv_kernel<Traits>, Traits::kSmemBytes, ready))
    return cudaErrorNotSupported;
  float* dsum = static_cast<float*>(p.workspace);
  bwd::launch_preprocess<Element>(p, dsum, nullptr, D, stream);
  if (p.seqlen_k > 0) {
    const dim3 grid((p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, p.heads_kv, p.batch);
    bwd_sm90_wide_dkdv_kernel<Traits><<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(
        p, dsum, nullptr, flags.pair_ok);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return run_bwd_dq_hdim<kDType, D>(p, flags, stream);
}

}  // namespace bwd90

template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_wide_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  using Element = bwd::ElementOf<kDType>;
  if (params.deterministic)
    return bwd90::launch_bwd_sm90_wide_det<bwd90::BwdSm90WideTraits<kHeadDim, Element, true, 2, true, false, false, true>,
                                           kDType>(params, flags, stream);
  return bwd90::launch_bwd_sm90_wide<bwd90::BwdSm90WideTraits<kHeadDim, Element>>(params, flags, stream);
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_BWD_SM90_WIDE(DTYPE, HDIM)                                          \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_wide_hdim<jax_flash::DType::DTYPE, HDIM>(    \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);
