// Host side of the forward variants instantiations (instantiations/fwd_var_*.cu).
// Kept out of fwd_launch_template.cuh so that the plain instantiation files,
// which call run_fwd_var_hdim for element-wise inputs, only see its
// declaration and never compile the variants kernel themselves.
#pragma once

#include "cuda/fwd_launch_template.cuh"

namespace jax_flash::cuda {

// The generic variants kernel (same tiles; its own build unit per head dim
// and dtype, instantiations/fwd_var_hdim*_*.cu).
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_var_hdim(const FwdParams& params, bool vec_ok, cudaStream_t stream) {
  using Traits = fwd::DefaultTraits<kHeadDim, kDType>;
  return fwd::launch_fwd<Traits, true, true>(params, stream, vec_ok);  // vec_ok read at run time
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_FWD_VARIANTS(DTYPE, HDIM)                     \
  template cudaError_t jax_flash::cuda::run_fwd_var_hdim<jax_flash::DType::DTYPE, HDIM>( \
      const jax_flash::FwdParams&, bool, cudaStream_t);
