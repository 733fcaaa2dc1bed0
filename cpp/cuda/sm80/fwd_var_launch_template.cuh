// Host side of the forward variants instantiations (instantiations/fwd_var_*.cu
// and fwd_varm_*.cu). Kept out of fwd_launch_template.cuh so that the plain
// instantiation files, which call run_fwd_var_hdim for element-wise inputs,
// only see its declaration and never compile the variants kernel themselves.
#pragma once

#include "cuda/sm80/fwd_launch_template.cuh"

namespace jax_flash::cuda {

// Masks-only variants kernel (window, lengths, offsets, segments; vector
// copies): its own build unit per head dim and dtype (instantiations/fwd_varm_*.cu).
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_varm_hdim(const FwdParams& params, cudaStream_t stream);

// The generic variants kernel (same tiles; its own build unit per head dim
// and dtype, instantiations/fwd_var_hdim*_*.cu). Options with vector copies
// go to the Hopper variants kernels in 90a builds on cc 9.0
// (run_fwd_sm90_variants_hdim); else masks-only ones to the SM80 masks-only
// kernel, the rest to the generic one.
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_var_hdim(const FwdParams& params, bool vec_ok, cudaStream_t stream) {
  using Traits = fwd::DefaultTraits<kHeadDim, kDType>;
#if defined(JAX_FLASH_FWD_SM90)
  // Built with sm_90a: the Hopper variants kernels (fwd_sm90_{masks,logits,
  // logits_dropout}_*.cu units) on cc 9.0 devices; cudaErrorNotSupported
  // elsewhere (the SM80 kernels below then).
  if constexpr (kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256) {
    if (vec_ok && !params.plain_mask()) {
      const cudaError_t err = run_fwd_sm90_variants_hdim<kDType, kHeadDim>(params, stream);
      if (err != cudaErrorNotSupported) return err;
    }
  }
#endif
  if (vec_ok && !params.plain_mask() && variant_masks_only(params))
    return run_fwd_varm_hdim<kDType, kHeadDim>(params, stream);
  return fwd::launch_fwd<Traits, true, kVarGeneral>(params, stream, vec_ok);  // vec_ok read at run time
}

// Defined only in the fwd_varm_* units (JAX_FLASH_FWD_VARM_UNIT), so that the
// fwd_var_* units do not compile the masks-only kernel too.
#ifdef JAX_FLASH_FWD_VARM_UNIT
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_varm_hdim(const FwdParams& params, cudaStream_t stream) {
  return fwd::launch_fwd<fwd::DefaultTraits<kHeadDim, kDType>, true, kVarMasks>(params, stream);
}
#endif

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_FWD_VARIANTS(DTYPE, HDIM)                     \
  template cudaError_t jax_flash::cuda::run_fwd_var_hdim<jax_flash::DType::DTYPE, HDIM>( \
      const jax_flash::FwdParams&, bool, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_FWD_VARIANTS_MASKS(DTYPE, HDIM)               \
  template cudaError_t jax_flash::cuda::run_fwd_varm_hdim<jax_flash::DType::DTYPE, HDIM>( \
      const jax_flash::FwdParams&, cudaStream_t);
