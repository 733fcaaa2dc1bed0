// The head dims with compiled kernels in this build, and the rounding of any
// head dim <= 256 onto them. Shared by the forward and backward dispatchers.
#pragma once

#include <type_traits>

#include <cuda_runtime_api.h>

namespace jax_flash::cuda {

// CMake's JAX_FLASH_CUDA_HEAD_DIMS can restrict the build (quick compile checks):
// -DJAX_FLASH_SELECTED_HEAD_DIMS -DJAX_FLASH_HDIM_64 -DJAX_FLASH_HDIM_128 ...
// (one flag per head dim: nvcc splits option values at commas, so a
// comma-separated list in one -D breaks as soon as it names two dims).
#if defined(JAX_FLASH_SELECTED_HEAD_DIMS)
inline constexpr int kCompiledHeadDims[] = {
#ifdef JAX_FLASH_HDIM_32
    32,
#endif
#ifdef JAX_FLASH_HDIM_64
    64,
#endif
#ifdef JAX_FLASH_HDIM_96
    96,
#endif
#ifdef JAX_FLASH_HDIM_128
    128,
#endif
#ifdef JAX_FLASH_HDIM_160
    160,
#endif
#ifdef JAX_FLASH_HDIM_192
    192,
#endif
#ifdef JAX_FLASH_HDIM_224
    224,
#endif
#ifdef JAX_FLASH_HDIM_256
    256,
#endif
    0};  // 0: sentinel, never matches a head dim
#elif defined(JAX_FLASH_ONLY_HEAD_DIMS)
inline constexpr int kCompiledHeadDims[] = {JAX_FLASH_ONLY_HEAD_DIMS};
#else
inline constexpr int kCompiledHeadDims[] = {32, 64, 96, 128, 160, 192, 224, 256};
#endif

template <int D>
constexpr bool head_dim_compiled() {
  for (int d : kCompiledHeadDims)
    if (d == D) return true;
  return false;
}

// Smallest compiled head dim >= head_dim (the kernel zero-pads the rest), or 0.
inline int round_head_dim(int head_dim) {
  int best = 0;
  for (int d : kCompiledHeadDims)
    if (d > 0 && head_dim <= d && (best == 0 || d < best)) best = d;
  return best;
}

template <int D, class Fn>
cudaError_t call_if_compiled(Fn& fn) {
  if constexpr (head_dim_compiled<D>()) {
    return fn(std::integral_constant<int, D>{});
  } else {
    return cudaErrorInvalidValue;
  }
}

// fn(std::integral_constant<int, D>{}) for the kernel head dim D that serves
// head_dim; cudaErrorInvalidValue when no compiled kernel does.
template <class Fn>
cudaError_t dispatch_head_dim(int head_dim, Fn&& fn) {
  switch (round_head_dim(head_dim)) {
    case 32: return call_if_compiled<32>(fn);
    case 64: return call_if_compiled<64>(fn);
    case 96: return call_if_compiled<96>(fn);
    case 128: return call_if_compiled<128>(fn);
    case 160: return call_if_compiled<160>(fn);
    case 192: return call_if_compiled<192>(fn);
    case 224: return call_if_compiled<224>(fn);
    case 256: return call_if_compiled<256>(fn);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace jax_flash::cuda
