// For the Hopper harnesses that include bwd_harness.cu but do not link the
// SM80 generic variants kernels its variants benches time (those benches
// never run there): NotSupported stand-ins. Include before bwd_harness.cu.
#pragma once

#include "cuda/bwd_dispatch.h"

namespace jax_flash::cuda {
template <>
inline cudaError_t run_bwd_var_hdim<DType::kBFloat16, 64>(const BwdParams&, BwdLaunchFlags, cudaStream_t) {
  return cudaErrorNotSupported;
}
template <>
inline cudaError_t run_bwd_var_hdim<DType::kBFloat16, 128>(const BwdParams&, BwdLaunchFlags, cudaStream_t) {
  return cudaErrorNotSupported;
}
}  // namespace jax_flash::cuda
