// Host side of the Hopper (wgmma) backward. Plain attention and every
// variant run the warp-specialised kernel (sm90/bwd_launch.cuh); the older
// lockstep kernel here (availability check, smem opt-in, the SM80 path's
// preprocess and dQ convert kernels around its dK/dV kernel) serves plain
// attention only where the new kernel declines. Head dim == the
// instantiated one, 16 B-aligned inputs; anything else answers
// cudaErrorNotSupported so the caller can fall back to the SM80 kernels.
// Included only by instantiations/bwd_sm90_*.cu.
#pragma once

#include <atomic>

#include <cuda_runtime_api.h>

#include "cuda/bwd_launch_template.cuh"  // launch_preprocess, ElementOf, BwdLaunchFlags
#include "cuda/bwd_sm90_kernel.cuh"
#include "cuda/sm90/bwd_launch.cuh"
#include "cuda/sm90_ready.h"

namespace jax_flash::cuda {

namespace bwd90 {

// This instantiation can run here (cached per device; cuda/sm90_ready.h).
template <class Traits>
static bool sm90_bwd_ready() {
  static std::atomic<unsigned long long> state{0};
  return sm90_kernel_ready(&bwd_sm90_dkdv_kernel<Traits>, Traits::kSmemBytes, state);
}

// Deterministic mode, not causal: the stride between the first query tiles
// of successive key-tile CTAs (the kernel's dq_rotate), or 0 for none. A CTA
// then may wait for one of lower key tile, which launches after it; so only
// when a whole row of key tiles fits on half the SMs, which leaves room for
// it to become resident (else the plain highest-first order, whose waits all
// point at CTAs launched earlier).
inline int order_rotation(const BwdParams& p, int block_m, int block_n) {
  if (p.causal) return 0;
  const int n_blocks = (p.seqlen_k + block_n - 1) / block_n;
  const int m_tiles = (p.seqlen_q + block_m - 1) / block_m;
  if (n_blocks < 2 || n_blocks > m_tiles) return 0;
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return 0;
  return 2 * n_blocks <= sms ? m_tiles / n_blocks : 0;
}

template <class Traits>
cudaError_t launch_bwd_sm90(const BwdParams& p, BwdLaunchFlags flags, cudaStream_t stream) {
  using Element = typename Traits::Element;
  constexpr int D = Traits::kHeadDim;
  if (!flags.vec_ok || p.head_dim != D) return cudaErrorNotSupported;
  if constexpr (fwd::LogitsOf<Traits>::value != 0) {
    // Soft-cap / ALiBi without dropout, or dropout alone (exactly this
    // kernel's set), with or without masks, atomic mode.
    if (p.deterministic || logits_kind(p) != fwd::LogitsOf<Traits>::value) return cudaErrorNotSupported;
  } else if constexpr (Traits::kMasks) {
    // Masks-only variants; deterministic mode without segment ids (the
    // kernel's masks_rank; with them the SM80 pair).
    if (!variant_masks_only(p) || (p.deterministic && (p.q_segment_ids || p.kv_segment_ids))) return cudaErrorNotSupported;
  }
  if (p.deterministic && (!Traits::kDqBulk || bwd_order_bytes(p, D) == 0)) return cudaErrorNotSupported;
  if (!sm90_bwd_ready<Traits>()) return cudaErrorNotSupported;
  const int key_tiles = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  char* ws = static_cast<char*>(p.workspace);
  float* dsum = reinterpret_cast<float*>(ws);
  float* accum = reinterpret_cast<float*>(ws + bwd_dsum_bytes(p));
  int* order = nullptr;
  int rotate = 0;
  if (p.deterministic) {
    static_assert(Traits::kBlockM >= kBwdOrderRows);  // the counters cover its query tiles
    order = reinterpret_cast<int*>(ws + bwd_dsum_bytes(p) + bwd_accum_bytes(p, D));
    const cudaError_t err = cudaMemsetAsync(order, 0, bwd_order_bytes(p, D), stream);
    if (err != cudaSuccess) return err;
    // (masks: the rank rule assumes the highest-first order)
    rotate = Traits::kMasks ? 0 : order_rotation(p, Traits::kBlockM, Traits::kBlockN);
    // Long causal rows, few pairs: lowest key tile first (the kernel's top
    // comment; benchmarks/NOTES.md "Deterministic causal order").
    if (!Traits::kMasks && p.causal && key_tiles >= kLowFirstMinKeyTiles &&
        int64_t(p.heads_kv) * p.batch <= kLowFirstMaxPairs)
      rotate = kDqLowFirst;
  }
  bwd::launch_preprocess<Element>(p, dsum, accum, D, stream);
  if (p.seqlen_k > 0) {
    const dim3 grid(key_tiles, p.heads_kv, p.batch);
    // Atomic mode: no CTA waits on another, so any launch order is safe.
    const int order_group = p.causal && !p.deterministic
                                ? bwd_order_group(key_tiles, p.heads_kv, p.batch, p.seqlen_q, D, p.heads_q,
                                                  int(sizeof(Element)), p.segment_ids())
                                : 0;
    bwd_sm90_dkdv_kernel<Traits><<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(
        p, dsum, accum, order, rotate, flags.pair_ok, order_group);
  }
  bwd::launch_dq_convert<Element>(p, accum, D, stream);
  return cudaGetLastError();
}

}  // namespace bwd90

// Query rows per step: 128 at d64 (its 64-row steps were barrier-bound), 64
// above (the d128 accumulators leave no registers for more).
template <int kHeadDim>
inline constexpr int kBwdSm90BlockM = kHeadDim <= 64 ? 128 : 64;

// Plain attention, vector-aligned inputs (else NotSupported): the
// warp-specialised kernel (sm90/bwd_kernel.cuh); this file's older kernel
// where that one declines (O rows not 16 B aligned, empty sequences).
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  {
    using Cfg = sm90::BwdConfig<kHeadDim, bwd::ElementOf<kDType>>;
    const int rotate = params.deterministic ? bwd90::order_rotation(params, Cfg::kBlockM, Cfg::kBlockN) : 0;
    const cudaError_t err = sm90::launch_bwd_ws<Cfg>(params, flags, rotate, stream);
    if (err != cudaErrorNotSupported) return err;
  }
  using Traits = bwd90::BwdSm90Traits<kHeadDim, bwd::ElementOf<kDType>, true, false, false,
                                      kBwdSm90BlockM<kHeadDim>>;
  return bwd90::launch_bwd_sm90<Traits>(params, flags, stream);
}

// Masks-only variants (window, lengths, query offsets, segment ids), atomic
// mode and deterministic without segment ids, vector-aligned inputs (else
// NotSupported: the SM80 kernels): the warp-specialised kernel's kMasks
// instantiation (sm90/bwd_masks.cuh).
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_masks_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  using Cfg = sm90::BwdConfig<kHeadDim, bwd::ElementOf<kDType>, true>;
  return sm90::launch_bwd_ws<Cfg>(params, flags, 0, stream);
}

// The older kernel's logits instantiations, no longer launched: the CUDA
// harnesses under tests/cuda/ (bwd_alt.cu) still build them. The soft-cap
// tanh pass there is held before the dP^T wait (kTanhFirst) only with
// ALiBi too.
template <int kLogits>
inline constexpr bool kBwdSm90TanhFirst = kLogits == (fwd::kLogitSoftcap | fwd::kLogitAlibi);

namespace bwd90 {
template <DType kDType, int kHeadDim, int kLogits, bool kTanhFirst = kBwdSm90TanhFirst<kLogits>>
using LogitsTraitsFor =
    BwdSm90LogitsTraits<BwdSm90Traits<kHeadDim, bwd::ElementOf<kDType>, true, false, false,
                                      kBwdSm90BlockM<kHeadDim>, true>,
                        kLogits, kTanhFirst>;
}  // namespace bwd90

// Soft-cap and / or ALiBi without dropout, or dropout alone, with or
// without the masks-only variants, atomic mode, vector-aligned inputs (else
// NotSupported: the SM80 kernels): the warp-specialised kernel's kLogits
// instantiations (sm90/bwd_logits.cuh), one a transform set.
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_logits_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  constexpr int kCap = fwd::kLogitSoftcap, kAlibi = fwd::kLogitAlibi, kDrop = fwd::kLogitDropout;
  using T = bwd::ElementOf<kDType>;
  switch (bwd90::logits_kind(params)) {
    case kCap:
      return sm90::launch_bwd_ws<sm90::BwdConfig<kHeadDim, T, true, kCap>>(params, flags, 0, stream);
    case kAlibi:
      return sm90::launch_bwd_ws<sm90::BwdConfig<kHeadDim, T, true, kAlibi>>(params, flags, 0, stream);
    case kCap | kAlibi:
      return sm90::launch_bwd_ws<sm90::BwdConfig<kHeadDim, T, true, kCap | kAlibi>>(params, flags, 0, stream);
    case kDrop:
      return sm90::launch_bwd_ws<sm90::BwdConfig<kHeadDim, T, true, kDrop>>(params, flags, 0, stream);
    default:
      return cudaErrorNotSupported;
  }
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_BWD_SM90_LOGITS(DTYPE, HDIM)                                       \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_logits_hdim<jax_flash::DType::DTYPE, HDIM>(  \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD_SM90_MASKS(DTYPE, HDIM)                                        \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_masks_hdim<jax_flash::DType::DTYPE, HDIM>(   \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD_SM90(DTYPE, HDIM)                                              \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_hdim<jax_flash::DType::DTYPE, HDIM>(         \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);
