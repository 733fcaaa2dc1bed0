// Host side of the forward variants instantiations (instantiations/fwd_var_*.cu
// and fwd_varm_*.cu). Kept out of fwd_launch_template.cuh so that the plain
// instantiation files, which call run_fwd_var_hdim for element-wise inputs,
// only see its declaration and never compile the variants kernel themselves.
#pragma once

#include "cuda/fwd_launch_template.cuh"

namespace jax_flash::cuda {

// Masks-only variants kernel (window, lengths, offsets, segments; vector
// copies): its own build unit per head dim and dtype (instantiations/fwd_varm_*.cu).
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_varm_hdim(const FwdParams& params, cudaStream_t stream);

namespace fwd {
// launch_fwd for the masks-only kernel (kVariants = kVarMasks).
template <class Traits>
cudaError_t launch_fwd_masks(const FwdParams& params, cudaStream_t stream) {
  auto kernel = &fwd_kernel<Traits, true, kVarMasks>;
  constexpr int kSmem = Traits::kSmemBytes;
  if constexpr (kSmem > 48 * 1024) {
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
  args.vec = true;
  const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, params.heads_q, params.batch);
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(args);
  return cudaGetLastError();
}
}  // namespace fwd

// The generic variants kernel (same tiles; its own build unit per head dim
// and dtype, instantiations/fwd_var_hdim*_*.cu). Masks-only variants with
// vector copies go to the masks-only kernel.
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_var_hdim(const FwdParams& params, bool vec_ok, cudaStream_t stream) {
  using Traits = fwd::DefaultTraits<kHeadDim, kDType>;
  if (vec_ok && !params.plain_mask() && variant_masks_only(params))
    return run_fwd_varm_hdim<kDType, kHeadDim>(params, stream);
  return fwd::launch_fwd<Traits, true, true>(params, stream, vec_ok);  // vec_ok read at run time
}

// Defined only in the fwd_varm_* units (JAX_FLASH_FWD_VARM_UNIT), so that the
// fwd_var_* units do not compile the masks-only kernel too.
#ifdef JAX_FLASH_FWD_VARM_UNIT
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_varm_hdim(const FwdParams& params, cudaStream_t stream) {
  return fwd::launch_fwd_masks<fwd::DefaultTraits<kHeadDim, kDType>>(params, stream);
}
#endif

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_FWD_VARIANTS(DTYPE, HDIM)                     \
  template cudaError_t jax_flash::cuda::run_fwd_var_hdim<jax_flash::DType::DTYPE, HDIM>( \
      const jax_flash::FwdParams&, bool, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_FWD_VARIANTS_MASKS(DTYPE, HDIM)               \
  template cudaError_t jax_flash::cuda::run_fwd_varm_hdim<jax_flash::DType::DTYPE, HDIM>( \
      const jax_flash::FwdParams&, cudaStream_t);
