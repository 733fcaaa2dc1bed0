// Declarations shared by fwd_launch.cu (dispatch, no CuTe) and the
// per-(dtype, head dim) instantiation files.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/common/variants.cuh"  // variant_masks_only, variant_dropout_with_transform
#include "params.h"

namespace jax_flash::cuda {

// Plain forward (params.plain_mask(), 16 B vector copies legal) on the kernel
// compiled for head dim kHeadDim (>= params.head_dim).
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_hdim(const FwdParams& params, cudaStream_t stream);

// The variants kernels (masks-only or generic), also the plain forward's
// element-wise copy path.
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_var_hdim(const FwdParams& params, bool vec_ok, cudaStream_t stream);

// The warp-specialised Hopper forward (cpp/cuda/sm90/) for plain attention
// with TMA-aligned inputs (instantiations/fwd_sm90_*.cu, built only when
// the archs include 90a); cudaErrorNotSupported when the device is not
// cc 9.0, the kernel has no sm_90a binary, seqlen_k is 0 or scale <= 0.
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_sm90_hdim(const FwdParams& params, cudaStream_t stream);

// The same kernel for the masks-only variants (instantiations/
// fwd_sm90_masks_*.cu, 90a builds only; tried first by run_fwd_var_hdim for
// masks-only calls with vector copies at head dims 64/128/256): also
// cudaErrorNotSupported for soft-cap / ALiBi / dropout or inputs without
// 16 B vector alignment (the SM80 masks or generic kernel takes those).
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_sm90_masks_hdim(const FwdParams& params, cudaStream_t stream);

// The same kernel for soft-cap and / or ALiBi, or dropout alone, with or
// without the masks-only variants (instantiations/fwd_sm90_logits_*.cu, 90a
// builds only; tried first by run_fwd_var_hdim for such calls with vector
// copies, at head dims 64/128/256): cudaErrorNotSupported for dropout with
// soft-cap or ALiBi, none of the three, inputs without 16 B vector
// alignment, or a device / build without sm_90a (the SM80 generic kernel
// takes those).
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_sm90_logits_hdim(const FwdParams& params, cudaStream_t stream);

// Dropout with soft-cap and / or ALiBi on the same kernel
// (instantiations/fwd_sm90_logits_dropout_*.cu, 90a builds only; tried
// first by run_fwd_var_hdim for such calls with vector copies).
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_sm90_logits_dropout_hdim(const FwdParams& params, cudaStream_t stream);

// The Hopper variants kernel for a call with vector copies and options: the
// masks kernel for the masks-only ones, else the logits kernels (dropout
// with a transform: its own units); cudaErrorNotSupported where none runs.
template <DType kDType, int kHeadDim>
inline cudaError_t run_fwd_sm90_variants_hdim(const FwdParams& params, cudaStream_t stream) {
  if (variant_masks_only(params)) return run_fwd_sm90_masks_hdim<kDType, kHeadDim>(params, stream);
  return variant_dropout_with_transform(params) ? run_fwd_sm90_logits_dropout_hdim<kDType, kHeadDim>(params, stream)
                                                : run_fwd_sm90_logits_hdim<kDType, kHeadDim>(params, stream);
}

}  // namespace jax_flash::cuda
