// The 16-bit dtypes with compiled kernels in this build, and the dispatch on
// them. CMake's JAX_FLASH_CUDA_DTYPES can leave one out (CI's compile check
// builds bf16 alone): -DJAX_FLASH_NO_BF16 / -DJAX_FLASH_NO_FP16.
#pragma once

#include <type_traits>

#include <cuda_runtime_api.h>

#include "params.h"

namespace jax_flash::cuda {

constexpr bool dtype_compiled(DType t) {
#ifndef JAX_FLASH_NO_FP16
  if (t == DType::kFloat16) return true;
#endif
#ifndef JAX_FLASH_NO_BF16
  if (t == DType::kBFloat16) return true;
#endif
  return false;
}

// f(std::integral_constant<DType, t>) for a compiled dtype t, else
// cudaErrorInvalidValue (callers check dtype_compiled first).
template <class F>
cudaError_t with_dtype(DType t, F&& f) {
#ifndef JAX_FLASH_NO_FP16
  if (t == DType::kFloat16) return f(std::integral_constant<DType, DType::kFloat16>{});
#endif
#ifndef JAX_FLASH_NO_BF16
  if (t == DType::kBFloat16) return f(std::integral_constant<DType, DType::kBFloat16>{});
#endif
  return cudaErrorInvalidValue;
}

}  // namespace jax_flash::cuda
