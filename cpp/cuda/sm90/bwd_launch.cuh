// Host side of the warp-specialised Hopper backward: which calls it takes,
// the TMA descriptors, the launch sequence (the D pre-pass, the accumulator
// clear, the kernel, the dQ convert) and the entry points that pick a
// configuration. Included only by instantiations/bwd_sm90_{hdim,masks,
// logits}*.cu (head dims 64 / 128).
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/bwd_dispatch.h"
#include "cuda/common/device.h"  // sm_count
#include "cuda/common/bwd_rows.cuh"  // launch_preprocess, rows_vec_ok, ElementOf
#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/sm90/ready.h"
#include "cuda/common/tile_order.h"

namespace jax_flash::cuda::sm90 {

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
  return 2 * n_blocks <= sm_count() ? m_tiles / n_blocks : 0;
}

// Atomic mode runs ordered (as deterministic mode does) where
// bwd_prefers_order allows and the grid is at least 8 CTAs an SM: H100 bf16
// fwd+bwd, causal 512 / 1k rows at 15-31 CTAs an SM +3-18%, at 4 or fewer
// 4-15% slower (the order's waits at the start of the grid are not paid
// back by the skipped accumulator clear); H200, non-causal 512-4k rows at
// 15.5 CTAs an SM, d64 / d128: +0-2.7%.
inline bool run_ordered(const BwdParams& p, int block_n, int head_dim) {
  if (p.deterministic) return true;
  if (!bwd_prefers_order(p) || !bwd_order_fits_dq(p, head_dim)) return false;
  const int sms = sm_count();
  const int64_t ctas = int64_t((p.seqlen_k + block_n - 1) / block_n) * p.heads_kv * p.batch;
  return sms > 0 && ctas >= 8 * int64_t(sms);
}

// Plain attention (Cfg::kMasks: the masks-only variants; Cfg::kLogits: a
// logit transform set on top; Cfg::kWide: the wide-head kernel, plain
// attention), head_dim <= the config's (TMA zero-fills the columns past it,
// which then add nothing to any product; the epilogues drop them), 16 B
// aligned rows (TMA), seqlen_q and seqlen_k > 0; else cudaErrorNotSupported
// (the caller runs the SM80 kernels). rotate: the query-tile rotation
// (BwdWork), 0 for none.
template <class Cfg>
cudaError_t launch_bwd_ws(const BwdParams& p, BwdLaunchFlags flags, int rotate, cudaStream_t stream) {
  using Element = typename Cfg::Element;
  constexpr int M = Cfg::kBlockM, N = Cfg::kBlockN, D = Cfg::kHeadDim;
  static_assert(M % kBwdOrderRows == 0);
  if (p.head_dim > D || !flags.vec_ok || p.seqlen_q <= 0 || p.seqlen_k <= 0) return cudaErrorNotSupported;
  if constexpr (Cfg::kLogits != 0) {
    // Exactly this kernel's logit transforms (with or without masks).
    if (bwd90::logits_kind(p) != Cfg::kLogits) return cudaErrorNotSupported;
  } else if constexpr (Cfg::kMasks) {
    if (!variant_masks_only(p)) return cudaErrorNotSupported;  // the masks-only variants
  }
  // The masks kernels (the logits ones too: kLogits implies kMasks) rank
  // deterministic dQ adds by masks_dq_rank, whose runs segment ids break;
  // the logit transforms change no step's skip, so they rank alike. With
  // segment ids, deterministic mode takes the kSegOrder kernel, which keeps
  // the runs (masks only); that kernel takes nothing else.
  if constexpr (Cfg::kMasks) {
    if ((p.deterministic && p.segment_ids()) != Cfg::kSegOrder) return cudaErrorNotSupported;
  }
  if (p.deterministic && !bwd_order_fits_dq(p, D)) return cudaErrorNotSupported;
  if (!bwd::rows_vec_ok(p.o, p.head_dim, p.o_batch_stride, p.o_row_stride, p.o_head_stride))
    return cudaErrorNotSupported;
  auto* kernel = &bwd_ws_kernel<Cfg>;
  static std::atomic<unsigned long long> ready{0};
  if (!sm90_kernel_ready(kernel, Cfg::kSmemBytes, ready)) return cudaErrorNotSupported;
  static_assert(kBwdRowPad % M == 0);
  const int rows_pad = bwd_padded_rows(p.seqlen_q);
  char* ws = static_cast<char*>(p.workspace);
  float* dsum = reinterpret_cast<float*>(ws);
  float* accum = reinterpret_cast<float*>(ws + bwd_dsum_bytes(p));

  BwdKernelParams<Cfg> kp;
  auto gmem = [&](const void* ptr, int rows, int heads, int64_t row, int64_t head, int64_t batch) {
    return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)),
                       make_layout(gmem_shape(rows, p.head_dim, heads, p.batch), make_stride(row, _1{}, head, batch)));
  };
  const auto q_tile = Shape<Int<M>, Int<D>>{};
  const auto k_tile = Shape<Int<N>, Int<D>>{};
  kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, gmem(p.q, p.seqlen_q, p.heads_q, p.q_row_stride, p.q_head_stride, p.q_batch_stride),
                           take<0, 2>(typename Cfg::SmemLayoutQ{}), q_tile, _1{});
  kp.tma_do = make_tma_copy(SM90_TMA_LOAD{}, gmem(p.dout, p.seqlen_q, p.heads_q, p.do_row_stride, p.do_head_stride, p.do_batch_stride),
                            take<0, 2>(typename Cfg::SmemLayoutQ{}), q_tile, _1{});
  kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, gmem(p.k, p.seqlen_k, p.heads_kv, p.k_row_stride, p.k_head_stride, p.k_batch_stride),
                           typename Cfg::SmemLayoutK{}, k_tile, _1{});
  kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, gmem(p.v, p.seqlen_k, p.heads_kv, p.v_row_stride, p.v_head_stride, p.v_batch_stride),
                           typename Cfg::SmemLayoutK{}, k_tile, _1{});
  kp.p = p;
  kp.dsum = dsum;
  kp.dq_accum = accum;
  kp.rows_pad = rows_pad;
  kp.scale_log2 = p.scale * 1.4426950408889634f;
  kp.pair_ok = flags.pair_ok;
  const int key_tiles = (p.seqlen_k + N - 1) / N;
  kp.dq_order = p.deterministic ? static_cast<int*>(p.dq) : nullptr;  // (bwd_dispatch.h: dq's buffer until the convert)
  kp.order_rows = (p.seqlen_q + kBwdOrderRows - 1) / kBwdOrderRows;
  kp.rotate = Cfg::kWide || (p.deterministic && !Cfg::kMasks) ? rotate : 0;  // (masks_dq_rank: highest first)
  kp.order_group = p.causal ? bwd_order_group(key_tiles, p.heads_kv, p.batch, p.seqlen_q, D, p.heads_q,
                                              int(sizeof(Element)), p.segment_ids())
                            : 0;

  // D = rowsum(dO O). The pre-pass also clears the dQ accumulator, except
  // when ordered (deterministic, no masks): each tile's first add is then a
  // store (bwd_write_dq); and the ordered mode's counters.
  bwd::FlatClear clear;
  if (kp.dq_order == nullptr || Cfg::kMasks) {
    clear.ptr[0] = reinterpret_cast<float4*>(accum);
    clear.count[0] = int64_t(p.batch) * p.heads_q * rows_pad * (D / 4);
  }
  if (kp.dq_order != nullptr) {  // 16-byte aligned, whole float4s (bwd_order_fits_dq)
    clear.ptr[1] = reinterpret_cast<float4*>(kp.dq_order);
    clear.count[1] = int64_t(bwd_order_bytes(p, D) / sizeof(float4));
  }
  bwd::launch_preprocess<Element>(p, dsum, nullptr, D, stream, clear);
  kernel<<<dim3(key_tiles, p.heads_kv, p.batch), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(kp);
  const dim3 convert_grid((p.seqlen_q + M - 1) / M, p.heads_q, p.batch);
  const bool dq_vec = bwd::rows_vec_ok(p.dq, p.head_dim, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  bwd_dq_convert_kernel<Cfg><<<convert_grid, 256, 0, stream>>>(p, accum, rows_pad, flags.pair_ok, dq_vec);
  return cudaGetLastError();
}

}  // namespace jax_flash::cuda::sm90

namespace jax_flash::cuda {

// Plain attention, vector-aligned inputs, non-empty sequences (else
// NotSupported: the SM80 kernels); ordered where run_ordered says so.
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  using Cfg = sm90::BwdConfig<kHeadDim, bwd::ElementOf<kDType>>;
  BwdParams p = params;
  p.deterministic = sm90::run_ordered(p, Cfg::kBlockN, Cfg::kHeadDim);
  const int rotate = p.deterministic ? sm90::order_rotation(p, Cfg::kBlockM, Cfg::kBlockN) : 0;
  return sm90::launch_bwd_ws<Cfg>(p, flags, rotate, stream);
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

// Deterministic mode with segment ids, masks only: the kSegOrder
// instantiation (own units: instantiations/bwd_sm90_masks_seg_order_*.cu).
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_masks_seg_order_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  using Cfg = sm90::BwdConfig<kHeadDim, bwd::ElementOf<kDType>, true, 0, true>;
  return sm90::launch_bwd_ws<Cfg>(params, flags, 0, stream);
}

}  // namespace jax_flash::cuda

namespace jax_flash::cuda::sm90 {

// The kernel configuration of logit-transform set L (fwd::kLogit* bits).
template <int kHeadDim, class T, bool kSegOrder>
struct BwdLogitsCfg {
  template <int L>
  using type = BwdConfig<kHeadDim, T, true, L, kSegOrder>;
};

// Launches the transform set `params` asks for on Cfg<set>: kDropoutSets,
// the three with dropout and a transform, else the other four (soft-cap,
// ALiBi, both, dropout alone); NotSupported for the rest.
template <template <int> class Cfg, bool kDropoutSets>
cudaError_t launch_bwd_logits_set(const BwdParams& params, BwdLaunchFlags flags, int rotate, cudaStream_t stream) {
  constexpr int kCap = fwd::kLogitSoftcap, kAlibi = fwd::kLogitAlibi, kDrop = fwd::kLogitDropout;
  const int kind = bwd90::logits_kind(params);
  if constexpr (kDropoutSets) {
    switch (kind) {
      case kCap | kDrop:
        return launch_bwd_ws<Cfg<kCap | kDrop>>(params, flags, rotate, stream);
      case kAlibi | kDrop:
        return launch_bwd_ws<Cfg<kAlibi | kDrop>>(params, flags, rotate, stream);
      case kCap | kAlibi | kDrop:
        return launch_bwd_ws<Cfg<kCap | kAlibi | kDrop>>(params, flags, rotate, stream);
      default:
        return cudaErrorNotSupported;
    }
  } else {
    switch (kind) {
      case kCap:
        return launch_bwd_ws<Cfg<kCap>>(params, flags, rotate, stream);
      case kAlibi:
        return launch_bwd_ws<Cfg<kAlibi>>(params, flags, rotate, stream);
      case kCap | kAlibi:
        return launch_bwd_ws<Cfg<kCap | kAlibi>>(params, flags, rotate, stream);
      case kDrop:
        return launch_bwd_ws<Cfg<kDrop>>(params, flags, rotate, stream);
      default:
        return cudaErrorNotSupported;
    }
  }
}

}  // namespace jax_flash::cuda::sm90

namespace jax_flash::cuda {

// Soft-cap and / or ALiBi without dropout, or dropout alone, with or
// without the masks-only variants, atomic mode and deterministic without
// segment ids, vector-aligned inputs (else NotSupported: the SM80 kernels):
// the warp-specialised kernel's kLogits instantiations (sm90/bwd_logits.cuh),
// one a transform set.
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_logits_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  using Cfg = sm90::BwdLogitsCfg<kHeadDim, bwd::ElementOf<kDType>, false>;
  return sm90::launch_bwd_logits_set<Cfg::template type, false>(params, flags, 0, stream);
}

// Dropout with soft-cap and / or ALiBi: the same kernel's three kLogits
// sets with the dropout bit (own units, instantiations/
// bwd_sm90_logits_dropout_*.cu, so that they build beside the others).
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_logits_dropout_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  using Cfg = sm90::BwdLogitsCfg<kHeadDim, bwd::ElementOf<kDType>, false>;
  return sm90::launch_bwd_logits_set<Cfg::template type, true>(params, flags, 0, stream);
}

// Deterministic mode with segment ids and a transform set: the kSegOrder
// logits instantiations (own units, instantiations/
// bwd_sm90_logits{,_dropout}_seg_order_*.cu; kDropoutSets as above).
template <DType kDType, int kHeadDim, bool kDropoutSets>
cudaError_t run_bwd_sm90_logits_seg_order_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream) {
  using Cfg = sm90::BwdLogitsCfg<kHeadDim, bwd::ElementOf<kDType>, true>;
  return sm90::launch_bwd_logits_set<Cfg::template type, kDropoutSets>(params, flags, 0, stream);
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_BWD_SM90_LOGITS_SEG_ORDER(DTYPE, HDIM, SETS)                                     \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_logits_seg_order_hdim<jax_flash::DType::DTYPE, HDIM, SETS>( \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD_SM90_LOGITS_DROPOUT(DTYPE, HDIM)                                      \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_logits_dropout_hdim<jax_flash::DType::DTYPE, HDIM>( \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD_SM90_LOGITS(DTYPE, HDIM)                                       \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_logits_hdim<jax_flash::DType::DTYPE, HDIM>(  \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD_SM90_MASKS_SEG_ORDER(DTYPE, HDIM)                                     \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_masks_seg_order_hdim<jax_flash::DType::DTYPE, HDIM>( \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD_SM90_MASKS(DTYPE, HDIM)                                        \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_masks_hdim<jax_flash::DType::DTYPE, HDIM>(   \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_BWD_SM90(DTYPE, HDIM)                                              \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_hdim<jax_flash::DType::DTYPE, HDIM>(         \
      const jax_flash::BwdParams&, jax_flash::cuda::BwdLaunchFlags, cudaStream_t);
