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

// The variants kernels (any option beyond plain causal/full attention, and
// the plain forward's element-wise copy path) exist only for some of those
// head dims, to bound the build (CMake JAX_FLASH_CUDA_VARIANT_HEAD_DIMS,
// default 32;64;128;256): a head dim of 96 runs them at 128, 160..224 at 256.
// -DJAX_FLASH_VARIANT_HDIMS_SELECTED -DJAX_FLASH_VHDIM_64 ... restricts them;
// without it every compiled head dim has them.
inline constexpr int kVariantHeadDimsWanted[] = {
#if defined(JAX_FLASH_VARIANT_HDIMS_SELECTED)
#ifdef JAX_FLASH_VHDIM_32
    32,
#endif
#ifdef JAX_FLASH_VHDIM_64
    64,
#endif
#ifdef JAX_FLASH_VHDIM_96
    96,
#endif
#ifdef JAX_FLASH_VHDIM_128
    128,
#endif
#ifdef JAX_FLASH_VHDIM_160
    160,
#endif
#ifdef JAX_FLASH_VHDIM_192
    192,
#endif
#ifdef JAX_FLASH_VHDIM_224
    224,
#endif
#ifdef JAX_FLASH_VHDIM_256
    256,
#endif
#else
    32, 64, 96, 128, 160, 192, 224, 256,
#endif
    0};  // 0: sentinel

template <int D>
constexpr bool head_dim_compiled() {
  for (int d : kCompiledHeadDims)
    if (d == D) return true;
  return false;
}

template <int D>
constexpr bool variant_head_dim_compiled() {
  if (!head_dim_compiled<D>()) return false;
  for (int d : kVariantHeadDimsWanted)
    if (d == D) return true;
  return false;
}

// The Hopper (wgmma) kernels exist at head dims 64, 128 and 256. A plain
// kernel head dim D between them runs zero-padded on the next one (when
// built): returns it, or 0 (D is itself a Hopper head dim). Each measured
// faster than D's own SM80 kernel despite the padding (H200, bf16, 1k / 4k
// rows, full and causal): forward 1.36-2.21x, forward+backward 1.17-1.89x
// (d32 on 64 the least).
template <int D>
constexpr int hopper_pad_head_dim() {
  constexpr int kPad = D == 32 ? 64 : D == 96 ? 128 : (D == 160 || D == 192 || D == 224) ? 256 : 0;
  if constexpr (kPad == 0) {
    return 0;
  } else {
    return head_dim_compiled<kPad>() ? kPad : 0;
  }
}

// The same for the variants kernels: head dim 32, which has variants
// kernels of its own in default builds, runs zero-padded on the Hopper 64
// variants kernels (when built); returns 64 there, else 0.
template <int D>
constexpr int hopper_pad_variant_head_dim() {
  if constexpr (D == 32) {
    return variant_head_dim_compiled<64>() ? 64 : 0;
  } else {
    return 0;
  }
}

// Smallest compiled head dim >= head_dim (the kernel zero-pads the rest), or 0.
inline int round_head_dim(int head_dim) {
  int best = 0;
  for (int d : kCompiledHeadDims)
    if (d > 0 && head_dim <= d && (best == 0 || d < best)) best = d;
  return best;
}

// The same for the variants kernels.
inline int round_variant_head_dim(int head_dim) {
  int best = 0;
  for (int d : kCompiledHeadDims) {
    bool wanted = false;
    for (int w : kVariantHeadDimsWanted) wanted = wanted || (w > 0 && w == d);
    if (wanted && d > 0 && head_dim <= d && (best == 0 || d < best)) best = d;
  }
  return best;
}

template <int D, bool kVariants, class Fn>
cudaError_t call_if_compiled(Fn& fn) {
  if constexpr (kVariants ? variant_head_dim_compiled<D>() : head_dim_compiled<D>()) {
    return fn(std::integral_constant<int, D>{});
  } else {
    return cudaErrorInvalidValue;
  }
}

// fn(std::integral_constant<int, D>{}) for the kernel head dim D that serves
// head_dim (plain kernels, or with kVariants the variants kernels);
// cudaErrorInvalidValue when no compiled kernel does.
template <bool kVariants = false, class Fn>
cudaError_t dispatch_head_dim(int head_dim, Fn&& fn) {
  switch (kVariants ? round_variant_head_dim(head_dim) : round_head_dim(head_dim)) {
    case 32: return call_if_compiled<32, kVariants>(fn);
    case 64: return call_if_compiled<64, kVariants>(fn);
    case 96: return call_if_compiled<96, kVariants>(fn);
    case 128: return call_if_compiled<128, kVariants>(fn);
    case 160: return call_if_compiled<160, kVariants>(fn);
    case 192: return call_if_compiled<192, kVariants>(fn);
    case 224: return call_if_compiled<224, kVariants>(fn);
    case 256: return call_if_compiled<256, kVariants>(fn);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace jax_flash::cuda
