// Host side of one float32 instantiation unit: shared-memory opt-in, grids
// and launches of the forward and of the backward's three kernels.
#pragma once

#include <algorithm>
#include <atomic>

#include <cuda_runtime_api.h>

#include "cuda/common/variants.cuh"
#include "cuda/tf32/bwd_dkdv_kernel.cuh"
#include "cuda/tf32/bwd_dq_kernel.cuh"
#include "cuda/tf32/bwd_dsum.cuh"
#include "cuda/tf32/fwd_kernel.cuh"
#include "cuda/tf32_dispatch.h"

namespace jax_flash::cuda {

namespace tf32 {

// Dynamic shared memory above 48 KB needs a per-device opt-in; each kernel
// remembers the devices it has (one bit a device).
template <class Kernel>
cudaError_t allow_smem(Kernel kernel, int bytes, std::atomic<unsigned long long>& done) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const unsigned long long bit = dev < 64 ? (1ull << dev) : 0ull;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) done.fetch_or(bit, std::memory_order_acq_rel);
  return err;
}

template <int D, bool kGeneral>
cudaError_t launch_fwd(const FwdParams& p, bool vec, cudaStream_t stream) {
  using Shape = FwdShape<D>;
  static std::atomic<unsigned long long> done{0};
  auto kernel = &fwd_kernel<D, kGeneral>;
  if (cudaError_t err = allow_smem(kernel, Shape::kSmemBytes, done); err != cudaSuccess) return err;
  FwdArgs args;
  args.p = p;
  args.scale_log2 = p.scale * 1.4426950408889634f;
  args.vec = vec;
  const dim3 grid((p.seqlen_q + Shape::kM - 1) / Shape::kM, p.heads_q, p.batch);
  kernel<<<grid, Shape::kThreads, Shape::kSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

template <int D, bool kGeneral>
cudaError_t launch_bwd(const BwdParams& p, bool vec, void* sm90_scratch, cudaStream_t stream) {
  float* dsum = static_cast<float*>(p.workspace);
#if defined(JAX_FLASH_BWD_SM90)
  // The Hopper kernels make D themselves, in their dO copy pass.
  if constexpr (!kGeneral && (D == 64 || D == 128)) {
    if (p.seqlen_q > 0 && p.seqlen_k > 0 && sm90_scratch != nullptr) {
      const cudaError_t err = run_bwd_sm90_tf32_hdim<D>(p, dsum, sm90_scratch, stream);
      if (err != cudaErrorNotSupported) return err;
    }
  }
#endif
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  if (rows > 0) {
    const int blocks = int(std::min<int64_t>((rows + 7) / 8, 16384));
    bwd_dsum_kernel<float><<<blocks, 256, 0, stream>>>(p, dsum);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  BwdArgs args;
  args.p = p;
  args.dsum = dsum;
  args.scale_log2 = p.scale * 1.4426950408889634f;
  args.vec = vec;
  if (p.seqlen_k > 0) {
    using Shape = DkdvShape<D>;
    static std::atomic<unsigned long long> done{0};
    auto kernel = &bwd_dkdv_kernel<D, kGeneral>;
    if (cudaError_t err = allow_smem(kernel, Shape::kSmemBytes, done); err != cudaSuccess) return err;
    const dim3 grid(((p.seqlen_k + Shape::kN - 1) / Shape::kN) * Shape::kSplits, p.heads_kv, p.batch);
    kernel<<<grid, Shape::kThreads, Shape::kSmemBytes, stream>>>(args);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  if (p.seqlen_q > 0) {
    using Shape = DqShape<D>;
    static std::atomic<unsigned long long> done{0};
    auto kernel = &bwd_dq_kernel<D, kGeneral>;
    if (cudaError_t err = allow_smem(kernel, Shape::kSmemBytes, done); err != cudaSuccess) return err;
    const dim3 grid((p.seqlen_q + Shape::kM - 1) / Shape::kM, p.heads_q, p.batch);
    kernel<<<grid, Shape::kThreads, Shape::kSmemBytes, stream>>>(args);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace tf32

// The masks-only kernels serve plain attention and window / lengths /
// offsets / segment ids; the general ones add soft-cap, ALiBi and dropout.
template <int kHeadDim>
cudaError_t run_fwd_tf32_hdim(const FwdParams& params, bool vec, cudaStream_t stream) {
  return variant_masks_only(params) ? tf32::launch_fwd<kHeadDim, false>(params, vec, stream)
                                    : tf32::launch_fwd<kHeadDim, true>(params, vec, stream);
}

template <int kHeadDim>
cudaError_t run_bwd_tf32_hdim(const BwdParams& params, bool vec, void* sm90_scratch, cudaStream_t stream) {
  return variant_masks_only(params) ? tf32::launch_bwd<kHeadDim, false>(params, vec, sm90_scratch, stream)
                                    : tf32::launch_bwd<kHeadDim, true>(params, vec, nullptr, stream);
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_TF32_FWD(HDIM) \
  template cudaError_t jax_flash::cuda::run_fwd_tf32_hdim<HDIM>(const jax_flash::FwdParams&, bool, cudaStream_t);
#define JAX_FLASH_INSTANTIATE_TF32_BWD(HDIM) \
  template cudaError_t jax_flash::cuda::run_bwd_tf32_hdim<HDIM>(const jax_flash::BwdParams&, bool, void*, cudaStream_t);
