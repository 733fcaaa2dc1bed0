// Host side of one Hopper (wgmma) forward instantiation: tile choice per
// head dim, availability check, smem opt-in, launch. Included only by
// instantiations/fwd_sm90_*.cu (and the standalone sm90 harness).
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/fwd_dispatch.h"
#include "cuda/fwd_vector_ok.h"
#include "cuda/fwd_sm90_kernel.cuh"
#include "cuda/sm90_ready.h"

namespace jax_flash::cuda {

namespace fwd {

template <DType kDType>
using Sm90ElementOf = std::conditional_t<kDType == DType::kFloat16, cutlass::half_t, cutlass::bfloat16_t>;

// Default configuration per head dim (BM = 128, 2 warpgroups); measured on
// the H100 (benchmarks/NOTES.md, "Hopper forward at head dim 64"):
// - d64, d128: two CTAs per SM (128 registers a thread), each wgmma waited on.
//   The other CTA's wgmmas fill this one's softmax; the overlapped loop's
//   extra P registers do not fit the cap without spills. d128 takes BN = 64
//   so that O (64 registers) + S fit.
// - d256: one CTA (O alone is 128 registers), overlapped loop, next tiles'
//   loads issued behind the wgmmas (faster at d256, ~equal at d64/d128).
template <int D> struct Sm90Tile;
template <> struct Sm90Tile<64> {
  static constexpr int kN = 128;
  static constexpr bool kOverlap = false, kLoadsFirst = true;
  static constexpr int kCtasPerSm = 2;
};
template <> struct Sm90Tile<128> {
  static constexpr int kN = 64;
  static constexpr bool kOverlap = false, kLoadsFirst = true;
  static constexpr int kCtasPerSm = 2;
};
template <> struct Sm90Tile<256> {
  static constexpr int kN = 64;
  static constexpr bool kOverlap = true, kLoadsFirst = false;
  static constexpr int kCtasPerSm = 1;
};

template <int kHeadDim, DType kDType>
using Sm90DefaultTraits = Sm90Traits<kHeadDim, Sm90Tile<kHeadDim>::kN, Sm90ElementOf<kDType>, Sm90Tile<kHeadDim>::kOverlap,
                                     Sm90Tile<kHeadDim>::kLoadsFirst, Sm90Tile<kHeadDim>::kCtasPerSm>;

// Masks-only variants: the plain configuration with kMasks (same tiles, so
// the cost over plain is the mask work alone; on the H100 1.5-6% over plain
// causal at d128 8k, benchmarks/NOTES.md).
template <int kHeadDim, DType kDType>
using Sm90MasksTraits = Sm90Traits<kHeadDim, Sm90Tile<kHeadDim>::kN, Sm90ElementOf<kDType>, Sm90Tile<kHeadDim>::kOverlap,
                                   Sm90Tile<kHeadDim>::kLoadsFirst, Sm90Tile<kHeadDim>::kCtasPerSm, 2, true>;

// 16 B vector copies legal (cuda/fwd_vector_ok.h).
inline bool sm90_vector_ok(const FwdParams& p) { return fwd_vector_ok(p); }

// This instantiation can run here (cached per device; cuda/sm90_ready.h).
template <class Traits>
static bool sm90_ready() {
  static std::atomic<unsigned long long> state{0};
  return sm90_kernel_ready(&fwd_sm90_kernel<Traits>, Traits::kSmemBytes, state, Traits::kCtasPerSm > 1);
}

// Launch the Hopper forward; cudaErrorNotSupported when this device or
// build cannot run it (the caller falls back to the SM80 kernel).
template <class Traits>
cudaError_t launch_fwd_sm90(const FwdParams& params, cudaStream_t stream) {
  if (!sm90_ready<Traits>()) return cudaErrorNotSupported;
  FwdArgs args;
  args.p = params;
  args.scale_log2 = params.scale * 1.4426950408889634f;
  args.vec = true;
  const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, params.heads_q, params.batch);
  args.order_group = params.causal ? fwd_order_group(grid.x, params.heads_q, params.batch, params.seqlen_k,
                                                     Traits::kHeadDim, params.heads_kv,
                                                     int(sizeof(typename Traits::Element)), params.segment_ids())
                                   : 0;
  fwd_sm90_kernel<Traits><<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

// Soft-cap / ALiBi on the logits kernel built on MasksTraits (soft-cap +
// ALiBi on MasksTraitsBoth); the transform set picks the instantiation.
// Dropout alone (with or without the masks) on its own MasksTraits kernel.
// cudaErrorNotSupported: dropout with soft-cap or ALiBi, none of the three,
// no 16 B vector copies, or no sm_90a here.
template <class MasksTraits, class MasksTraitsBoth = MasksTraits>
cudaError_t launch_fwd_sm90_logits(const FwdParams& params, cudaStream_t stream) {
  const bool dropout = variant_dropout(params);
  const int logits = (params.softcap > 0.f ? kLogitSoftcap : 0) | (params.alibi_slopes ? kLogitAlibi : 0);
  if ((dropout && logits != 0) || (!dropout && logits == 0) || !sm90_vector_ok(params)) return cudaErrorNotSupported;
  if (dropout) return launch_fwd_sm90<Sm90LogitsTraits<MasksTraits, kLogitDropout>>(params, stream);
  if (logits == kLogitSoftcap)
    return launch_fwd_sm90<Sm90LogitsTraits<MasksTraits, kLogitSoftcap>>(params, stream);
  if (logits == kLogitAlibi) return launch_fwd_sm90<Sm90LogitsTraits<MasksTraits, kLogitAlibi>>(params, stream);
  return launch_fwd_sm90<Sm90LogitsTraits<MasksTraitsBoth, kLogitSoftcap | kLogitAlibi>>(params, stream);
}

// Logits kernels' tiles: the masks configuration, except soft-cap + ALiBi
// at d64 on BN 64 (BN 128 spilled 270 B there and measured 1.83x plain
// causal against 1.56x on BN 64, H100 d64 8k; benchmarks/NOTES.md).
template <int kHeadDim, DType kDType>
using Sm90LogitsBothMasksTraits =
    std::conditional_t<kHeadDim == 64,
                       Sm90Traits<64, 64, Sm90ElementOf<kDType>, false, true, 2, 2, true>,
                       Sm90MasksTraits<kHeadDim, kDType>>;

}  // namespace fwd

// Masks-only variants (window, lengths, query offsets, segment ids; also
// plain parameters) on the wgmma kernel. cudaErrorNotSupported, for the
// caller to fall back to the SM80 masks kernel, when: soft-cap, ALiBi or
// dropout is set; 16 B vector copies are not legal; the device is not
// cc 9.0 or the build has no sm_90a binary. The rest (head_dim <= kHeadDim,
// sizes, pointers) the caller has checked, as for run_fwd_sm90_hdim.
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_sm90_masks_hdim(const FwdParams& params, cudaStream_t stream) {
  if (!variant_masks_only(params) || !fwd::sm90_vector_ok(params)) return cudaErrorNotSupported;
  using Masks = fwd::Sm90MasksTraits<kHeadDim, kDType>;
  if constexpr (Masks::kRuns) {
    if (params.segment_ids())
      return fwd::launch_fwd_sm90<fwd::Sm90NoRunsTraits<Masks>>(params, stream);
  }
  return fwd::launch_fwd_sm90<Masks>(params, stream);
}

// Soft-cap and / or ALiBi without dropout, or dropout alone (head dims 64 /
// 128), with or without the masks-only variants, on the wgmma kernel.
// cudaErrorNotSupported (the caller then takes the SM80 generic variants
// kernel) when: dropout is set with soft-cap or ALiBi, none of the three
// is, 16 B vector copies are not legal, or the device / build cannot run
// sm_90a. The caller checks the rest, as above.
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_sm90_logits_hdim(const FwdParams& params, cudaStream_t stream) {
  return fwd::launch_fwd_sm90_logits<fwd::Sm90MasksTraits<kHeadDim, kDType>,
                                     fwd::Sm90LogitsBothMasksTraits<kHeadDim, kDType>>(params, stream);
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_FWD_SM90_MASKS(DTYPE, HDIM)                                      \
  template cudaError_t jax_flash::cuda::run_fwd_sm90_masks_hdim<jax_flash::DType::DTYPE, HDIM>( \
      const jax_flash::FwdParams&, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_FWD_SM90_LOGITS(DTYPE, HDIM)                                      \
  template cudaError_t jax_flash::cuda::run_fwd_sm90_logits_hdim<jax_flash::DType::DTYPE, HDIM>( \
      const jax_flash::FwdParams&, cudaStream_t);
