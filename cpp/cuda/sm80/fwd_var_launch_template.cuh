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
// and dtype, instantiations/fwd_var_hdim*_*.cu). Masks-only variants with
// vector copies go to the Hopper masks kernel in 90a builds on cc 9.0, else
// to the SM80 masks-only kernel; soft-cap / ALiBi without dropout, with
// vector copies, to the Hopper logits kernel there, else to the generic one.
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_var_hdim(const FwdParams& params, bool vec_ok, cudaStream_t stream) {
  using Traits = fwd::DefaultTraits<kHeadDim, kDType>;
  if (vec_ok && !params.plain_mask() && variant_masks_only(params)) {
#if defined(JAX_FLASH_FWD_SM90)
    // Built with sm_90a (fwd_sm90_masks_*.cu units): the Hopper kernel on
    // cc 9.0 devices; cudaErrorNotSupported elsewhere (SM80 kernel then).
    if constexpr (kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256) {
      const cudaError_t err = run_fwd_sm90_masks_hdim<kDType, kHeadDim>(params, stream);
      if (err != cudaErrorNotSupported) return err;
    }
#endif
    return run_fwd_varm_hdim<kDType, kHeadDim>(params, stream);
  }
#if defined(JAX_FLASH_FWD_SM90)
  // Soft-cap / ALiBi / dropout in any set (with or without masks): the
  // Hopper logits kernels (fwd_sm90_logits_*.cu units; dropout with a
  // transform: fwd_sm90_logits_dropout_*.cu) on cc 9.0 devices;
  // cudaErrorNotSupported otherwise, then the generic kernel.
  if constexpr (kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256) {
    if (vec_ok && !variant_masks_only(params)) {
      const cudaError_t err = variant_dropout_with_transform(params)
                                  ? run_fwd_sm90_logits_dropout_hdim<kDType, kHeadDim>(params, stream)
                                  : run_fwd_sm90_logits_hdim<kDType, kHeadDim>(params, stream);
      if (err != cudaErrorNotSupported) return err;
    }
  }
#endif
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
