// The head dims with compiled kernels in this build, and the rounding of any
// head dim <= 256 onto them. Shared by the forward and backward dispatchers.
#pragma once

namespace jax_flash::cuda {

// CMake's JAX_FLASH_CUDA_HEAD_DIMS can restrict the build (quick compile checks).
#ifdef JAX_FLASH_ONLY_HEAD_DIMS
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
    if (head_dim <= d && (best == 0 || d < best)) best = d;
  return best;
}

}  // namespace jax_flash::cuda
