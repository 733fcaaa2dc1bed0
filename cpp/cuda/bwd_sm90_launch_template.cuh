// Host side of the Hopper (wgmma) backward: availability check, smem
// opt-in, launch sequence (the SM80 path's preprocess and dQ convert kernels
// around the sm90 dK/dV kernel). Atomic dQ mode, plain attention, head dim
// == the instantiated one, 16 B-aligned inputs; anything else answers
// cudaErrorNotSupported so the caller can fall back to run_bwd_hdim.
// Included only by instantiations/bwd_sm90_*.cu.
#pragma once

#include <atomic>

#include <cuda_runtime_api.h>

#include "cuda/bwd_launch_template.cuh"  // rows_grid, BwdLaunchFlags
#include "cuda/bwd_sm90_kernel.cuh"

namespace jax_flash::cuda {

namespace bwd90 {

template <DType kDType>
using ElementOf = std::conditional_t<kDType == DType::kFloat16, cutlass::half_t, cutlass::bfloat16_t>;

// Same contract as fwd::sm90_ready: cc 9.0, an sm_90a binary of this kernel,
// smem opt-in done; cached per device (bit 2*dev checked, 2*dev+1 usable).
template <class Traits>
bool sm90_bwd_ready() {
  static std::atomic<unsigned long long> state{0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev >= 32) {
    cudaGetLastError();
    return false;
  }
  const unsigned long long checked = 1ull << (2 * dev), usable = 1ull << (2 * dev + 1);
  const unsigned long long s = state.load(std::memory_order_acquire);
  if (s & checked) return (s & usable) != 0;
  bool ok = false;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
      major == 9 && minor == 0) {
    auto kernel = &bwd_sm90_dkdv_kernel<Traits>;
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.binaryVersion == 90 &&
        attr.ptxVersion == 90) {
      ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                Traits::kSmemBytes) == cudaSuccess;
    }
  }
  cudaGetLastError();
  state.fetch_or(checked | (ok ? usable : 0ull), std::memory_order_acq_rel);
  return ok;
}

template <class Traits>
cudaError_t launch_bwd_sm90(const BwdParams& p, BwdLaunchFlags flags, cudaStream_t stream) {
  using Element = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
  if (p.deterministic || !flags.vec_ok || p.head_dim != D) return cudaErrorNotSupported;
  if (!sm90_bwd_ready<Traits>()) return cudaErrorNotSupported;
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  float* dsum = static_cast<float*>(p.workspace);
  float* accum = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + bwd_dsum_bytes(p));
  if (rows > 0) bwd::bwd_preprocess_kernel<Element><<<bwd::rows_grid(rows), 256, 0, stream>>>(p, dsum, accum, D);
  if (p.seqlen_k > 0) {
    const dim3 grid((p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, p.heads_kv, p.batch);
    bwd_sm90_dkdv_kernel<Traits><<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(
        p, dsum, accum, flags.pair_ok);
  }
  if (rows > 0) bwd::bwd_dq_convert_kernel<Element><<<bwd::rows_grid(rows), 256, 0, stream>>>(p, accum, D);
  return cudaGetLastError();
}

}  // namespace bwd90

// Plain attention, atomic mode, vector-aligned inputs (else NotSupported).
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  return bwd90::launch_bwd_sm90<bwd90::BwdSm90Traits<kHeadDim, bwd90::ElementOf<kDType>>>(params, flags,
                                                                                          stream);
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_BWD_SM90(DTYPE, HDIM)                                              \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_hdim<jax_flash::DType::DTYPE, HDIM>(         \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);
