// Host side of one backward instantiation: tile choice per head dim, smem
// opt-in, the launch sequence. Included only by instantiations/bwd_*.cu.
#pragma once

#include <atomic>

#include <cuda_runtime_api.h>

#include "cuda/bwd_dispatch.h"
#include "cuda/sm80/bwd_kernel.cuh"

namespace jax_flash::cuda {

namespace bwd {

// dK/dV kernel: (BM, BN, warps, warps along M for S/dP, along N for dK/dV,
// along M for dQ). Deterministic dQ kernel: (warps along M, BN).
template <int D> struct BwdTile;
template <> struct BwdTile<32>  { static constexpr int kM = 128, kN = 128, kW = 8, kS = 4, kKV = 4, kQ = 4, kDqW = 8, kDqN = 128; };
template <> struct BwdTile<64>  { static constexpr int kM = 64,  kN = 128, kW = 8, kS = 2, kKV = 4, kQ = 2, kDqW = 8, kDqN = 128; };
template <> struct BwdTile<96>  { static constexpr int kM = 64,  kN = 128, kW = 8, kS = 2, kKV = 4, kQ = 4, kDqW = 8, kDqN = 64; };
template <> struct BwdTile<128> { static constexpr int kM = 64,  kN = 128, kW = 8, kS = 2, kKV = 4, kQ = 2, kDqW = 8, kDqN = 64; };
template <> struct BwdTile<160> { static constexpr int kM = 64,  kN = 64,  kW = 8, kS = 4, kKV = 4, kQ = 4, kDqW = 8, kDqN = 32; };
template <> struct BwdTile<192> { static constexpr int kM = 64,  kN = 64,  kW = 8, kS = 4, kKV = 4, kQ = 4, kDqW = 8, kDqN = 32; };
template <> struct BwdTile<224> { static constexpr int kM = 64,  kN = 64,  kW = 8, kS = 4, kKV = 4, kQ = 4, kDqW = 8, kDqN = 32; };
template <> struct BwdTile<256> { static constexpr int kM = 64,  kN = 64,  kW = 8, kS = 4, kKV = 2, kQ = 2, kDqW = 8, kDqN = 32; };

template <int D, DType kDType>
using DefaultDkdv = DkdvConfig<ElementOf<kDType>, D, BwdTile<D>::kM, BwdTile<D>::kN, BwdTile<D>::kW,
                               BwdTile<D>::kS, BwdTile<D>::kKV, BwdTile<D>::kQ>;
template <int D, DType kDType>
using DefaultDq = DqConfig<ElementOf<kDType>, D, BwdTile<D>::kDqW, BwdTile<D>::kDqN>;

// cudaFuncSetAttribute for > 48 KB of dynamic smem, once per device.
// The launchers that keep such a once-per-device record in a function-local
// static are `static` themselves (here and in the other launch templates):
// nvcc gives every translation unit its own copy of a kernel (its host stub
// is local), so a record shared across units through an inline function
// would let one unit's launch skip the opt-in another unit's kernel needs.
template <class Kernel>
cudaError_t opt_in_smem(Kernel kernel, int bytes, std::atomic<unsigned long long>& done_mask) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const unsigned long long bit = dev < 64 ? (1ull << dev) : 0ull;
  if (bit != 0 && (done_mask.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  done_mask.fetch_or(bit, std::memory_order_acq_rel);
  return cudaSuccess;
}

// The atomic-free dQ kernel (deterministic mode), dsum already made.
template <class DqCfg, int kVariants = kVarNone>
static cudaError_t launch_dq(const BwdParams& p, const float* dsum, BwdLaunchFlags flags, cudaStream_t stream) {
  const dim3 grid((p.seqlen_q + DqCfg::kBlockM - 1) / DqCfg::kBlockM, p.heads_q, p.batch);
  constexpr int smem = int(DqCfg::kSmemBytes);
  static std::atomic<unsigned long long> mask{0};
  auto kernel = &bwd_dq_kernel<DqCfg, kVariants>;
  cudaError_t err = opt_in_smem(kernel, smem, mask);
  if (err != cudaSuccess) return err;
  kernel<<<grid, DqCfg::kThreads, smem, stream>>>(p, dsum, flags.vec_ok, flags.pair_ok);
  return cudaGetLastError();
}

// The whole backward with explicit configurations (the harness may call it
// with other tiles).
template <class DkdvCfg, class DqCfg, int kVariants = kVarNone>
static cudaError_t launch_bwd(const BwdParams& p, BwdLaunchFlags flags, cudaStream_t stream) {
  using Element = typename DkdvCfg::Element;
  constexpr int D = DkdvCfg::kHeadDim;
  static_assert(DqCfg::kHeadDim == D);
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  float* dsum = static_cast<float*>(p.workspace);
  float* accum = p.deterministic
                     ? nullptr
                     : reinterpret_cast<float*>(static_cast<char*>(p.workspace) + bwd_dsum_bytes(p));

  launch_preprocess<Element>(p, dsum, accum, D, stream);
  if (p.seqlen_k > 0) {
    const dim3 grid((p.seqlen_k + DkdvCfg::kBlockN - 1) / DkdvCfg::kBlockN, p.heads_kv, p.batch);
    constexpr int smem = int(DkdvCfg::kSmemBytes);
    if (p.deterministic) {
      static std::atomic<unsigned long long> mask{0};
      // Variants: the atomic kernel with no accumulator (one instantiation).
      auto kernel = &bwd_dkdv_kernel<DkdvCfg, kVariants != 0, kVariants>;
      cudaError_t err = opt_in_smem(kernel, smem, mask);
      if (err != cudaSuccess) return err;
      kernel<<<grid, DkdvCfg::kThreads, smem, stream>>>(p, dsum, nullptr, flags.vec_ok,
                                                        flags.pair_ok);
    } else {
      static std::atomic<unsigned long long> mask{0};
      auto kernel = &bwd_dkdv_kernel<DkdvCfg, true, kVariants>;
      cudaError_t err = opt_in_smem(kernel, smem, mask);
      if (err != cudaSuccess) return err;
      kernel<<<grid, DkdvCfg::kThreads, smem, stream>>>(p, dsum, accum, flags.vec_ok,
                                                        flags.pair_ok);
    }
  }
  if (rows > 0) {
    if (p.deterministic) {
      const cudaError_t err = launch_dq<DqCfg, kVariants>(p, dsum, flags, stream);
      if (err != cudaSuccess) return err;
    } else {
      launch_dq_convert<Element>(p, accum, D, stream);
    }
  }
  return cudaGetLastError();
}

}  // namespace bwd

template <DType kDType, int kHeadDim>
cudaError_t run_bwd_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
#if defined(JAX_FLASH_BWD_SM90)
  // Built with sm_90a (bwd_sm90_*.cu units): the wgmma dK/dV kernel where it
  // applies; at 256 the wide-head kernel (a warpgroup keeps dV, the other dK;
  // run_bwd tries it before it turns atomic mode into the SM80 pair there).
  if constexpr (kHeadDim == 64 || kHeadDim == 128) {
    const cudaError_t err = run_bwd_sm90_hdim<kDType, kHeadDim>(params, flags, stream);
    if (err != cudaErrorNotSupported) return err;
  } else if constexpr (kHeadDim == 256) {
    const cudaError_t err = run_bwd_sm90_wide_hdim<kDType, kHeadDim>(params, flags, stream);
    if (err != cudaErrorNotSupported) return err;
  }
#endif
  return bwd::launch_bwd<bwd::DefaultDkdv<kHeadDim, kDType>, bwd::DefaultDq<kHeadDim, kDType>>(
      params, flags, stream);
}

namespace bwd {
// Variants dK/dV tile: at head dims 96 and 128 the plain 64 x 128 tile sits at 255
// registers and the variant state pushes it into heavy spills (~450 B at d128,
// ptxas sm_90a), so the variants kernel takes 64-key tiles there (as d160+ do).
template <int D, DType kDType>
using VariantDkdv = std::conditional_t<
    D == 96 || D == 128,
    DkdvConfig<ElementOf<kDType>, D, BwdTile<D>::kM, 64, BwdTile<D>::kW, BwdTile<D>::kS,
               BwdTile<D>::kKV, BwdTile<D>::kQ>,
    DefaultDkdv<D, kDType>>;
}  // namespace bwd

// The generic variants kernels (own build unit: instantiations/bwd_var_*.cu).
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_var_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  return bwd::launch_bwd<bwd::VariantDkdv<kHeadDim, kDType>, bwd::DefaultDq<kHeadDim, kDType>,
                         kVarGeneral>(params, flags, stream);
}

// Masks-only variants (window, lengths, offsets, segments): the plain tiles
// (the masks-only kernels keep the plain kernels' register use), fused
// atomic dQ in atomic mode (instantiations/bwd_varm_*.cu).
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_varm_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  return bwd::launch_bwd<bwd::DefaultDkdv<kHeadDim, kDType>, bwd::DefaultDq<kHeadDim, kDType>,
                         kVarMasks>(params, flags, stream);
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_BWD_VARIANTS(DTYPE, HDIM)                                      \
  template cudaError_t jax_flash::cuda::run_bwd_var_hdim<jax_flash::DType::DTYPE, HDIM>(      \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD_VARIANTS_MASKS(DTYPE, HDIM)                                \
  template cudaError_t jax_flash::cuda::run_bwd_varm_hdim<jax_flash::DType::DTYPE, HDIM>(     \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD(DTYPE, HDIM)                                               \
  template cudaError_t jax_flash::cuda::run_bwd_hdim<jax_flash::DType::DTYPE, HDIM>(          \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);
