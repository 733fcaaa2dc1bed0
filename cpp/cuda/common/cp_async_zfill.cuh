// Predicated cp.async copies into shared memory: `valid` false copies no bytes
// and zero-fills the destination (rows or ids past the sequence end). Shared
// by the SM80 backward (sm80/bwd_common.cuh) and the float32 kernels
// (tf32/tile.cuh).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace jax_flash::cuda {

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}

}  // namespace jax_flash::cuda
