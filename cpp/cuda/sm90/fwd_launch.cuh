// Host side of the warp-specialised Hopper forward: which calls it takes,
// the TMA descriptors, the persistent grid, the launch. Included only by
// instantiations/fwd_sm90_hdim*_*.cu.
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "cuda/common/device.h"  // sm_count
#include "cuda/common/fwd_vector_ok.h"
#include "cuda/common/tile_order.h"
#include "cuda/common/variants.cuh"
#include "cuda/fwd_dispatch.h"
#include "cuda/tf32_dispatch.h"
#include "cuda/sm90/fwd_kernel.cuh"
#include "cuda/sm90/ready.h"
#include "cuda/sm90/tf32_operands.cuh"

namespace jax_flash::cuda {

namespace sm90 {

template <DType kDType>
using ElementOf = std::conditional_t<kDType == DType::kFloat16, cutlass::half_t, cutlass::bfloat16_t>;

// TMA needs 16 B aligned bases and strides (head_dim in whole 16 B chunks).
inline bool tma_ok(const FwdParams& p) { return fwd_vector_ok(p); }

// TF32 (Cfg::kTf32) takes the call's scratch: the tile counter and the
// rounded K / transposed V copies (tf32_operands.cuh), made here first.
template <class Cfg>
cudaError_t launch_fwd_ws(const FwdParams& p, cudaStream_t stream, void* tf32_scratch = nullptr) {
  using G = typename Cfg::GmemElement;
  static std::atomic<unsigned long long> ready{0};
  if (!sm90_kernel_ready(&fwd_ws_kernel<Cfg>, Cfg::kSmemBytes, ready)) return cudaErrorNotSupported;
  // Rows that see no key (seqlen_k == 0) are the SM80 kernel's; so is a
  // scale <= 0 on raw scores, whose running max would have to be a minimum
  // (the SM80 kernels scale the scores first). The logit transforms put the
  // scale into the logits and take any.
  if (p.seqlen_k == 0 || !tma_ok(p) || (Cfg::kTransform == 0 && !(p.scale > 0.f))) return cudaErrorNotSupported;
  if (Cfg::kTf32 && (tf32_scratch == nullptr || p.head_dim > Cfg::kHeadDim)) return cudaErrorNotSupported;
  const int64_t num_m = (int64_t(p.seqlen_q) + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int64_t total = num_m * p.heads_q * p.batch;
  const int sms = sm_count();
  if (total >= (int64_t(1) << 31) || sms <= 0) return cudaErrorNotSupported;

  FwdKernelParams<Cfg> kp;
  auto gmem = [](const void* ptr, int rows, int cols, const FwdParams& p, int heads, int64_t row, int64_t head,
                 int64_t batch) {
    return make_tensor(make_gmem_ptr(static_cast<G const*>(ptr)),
                       make_layout(gmem_shape(rows, cols, heads, p.batch), make_stride(row, _1{}, head, batch)));
  };
  kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, gmem(p.q, p.seqlen_q, p.head_dim, p, p.heads_q, p.q_row_stride, p.q_head_stride, p.q_batch_stride),
                           typename Cfg::SmemLayoutQ{}, Shape<Int<Cfg::kBlockM>, Int<Cfg::kHeadDim>>{}, _1{});
  int32_t* counter = p.tile_counter;
  if constexpr (Cfg::kTf32) {
    const Tf32KvScratch layout(p);
    char* base = static_cast<char*>(tf32_scratch);
    float* k_copy = reinterpret_cast<float*>(base + layout.k_offset);
    float* vt_copy = reinterpret_cast<float*>(base + layout.vt_offset);
    counter = static_cast<int32_t*>(tf32_scratch);
    const int keys = tf32_keys_padded(p.seqlen_k), hd = p.head_dim;
    Tf32PrepArgs prep;
    prep.x = {static_cast<const float*>(p.k), p.k_batch_stride, p.k_row_stride, p.k_head_stride, k_copy, nullptr};
    prep.y = {static_cast<const float*>(p.v), p.v_batch_stride, p.v_row_stride, p.v_head_stride, nullptr, vt_copy};
    prep.rows = p.seqlen_k;
    prep.heads = p.heads_kv;
    prep.head_dim = hd;
    if (const cudaError_t err = launch_tf32_prep<Cfg::kHeadDim>(prep, p.batch, stream); err != cudaSuccess) return err;
    const int64_t kh = int64_t(p.seqlen_k) * hd, vh = int64_t(hd) * keys;
    kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, gmem(k_copy, p.seqlen_k, hd, p, p.heads_kv, hd, kh, kh * p.heads_kv),
                             take<0, 2>(typename Cfg::SmemLayoutKV{}), Shape<Int<Cfg::kBlockN>, Int<Cfg::kHeadDim>>{}, _1{});
    kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, gmem(vt_copy, hd, keys, p, p.heads_kv, keys, vh, vh * p.heads_kv),
                             take<0, 2>(typename Cfg::SmemLayoutVt{}), Shape<Int<Cfg::kHeadDim>, Int<Cfg::kBlockN>>{}, _1{});
  } else {
    kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, gmem(p.k, p.seqlen_k, p.head_dim, p, p.heads_kv, p.k_row_stride, p.k_head_stride, p.k_batch_stride),
                             take<0, 2>(typename Cfg::SmemLayoutKV{}), Shape<Int<Cfg::kBlockN>, Int<Cfg::kHeadDim>>{}, _1{});
    kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, gmem(p.v, p.seqlen_k, p.head_dim, p, p.heads_kv, p.v_row_stride, p.v_head_stride, p.v_batch_stride),
                             take<0, 2>(typename Cfg::SmemLayoutKV{}), Shape<Int<Cfg::kBlockN>, Int<Cfg::kHeadDim>>{}, _1{});
  }
  kp.tma_o = make_tma_copy(SM90_TMA_STORE{},
                           make_tensor(make_gmem_ptr(static_cast<G*>(p.o)),
                                       make_layout(gmem_shape(p.seqlen_q, p.head_dim, p.heads_q, p.batch),
                                                   make_stride(p.o_row_stride, _1{}, p.o_head_stride, p.o_batch_stride))),
                           typename Cfg::SmemLayoutOHalf{}, Shape<_64, Int<Cfg::kHeadDim>>{}, _1{});
  kp.p = p;
  kp.scale_log2 = p.scale * 1.4426950408889634f;
  kp.sched.num_m = int(num_m);
  kp.sched.heads = p.heads_q;
  kp.sched.batch = p.batch;
  kp.sched.causal = p.causal;
  kp.sched.group = p.causal ? fwd_order_group(int(num_m), p.heads_q, p.batch, p.seqlen_k, Cfg::kHeadDim, p.heads_kv,
                                              int(sizeof(G)), Cfg::kMasks && p.segment_ids())
                            : 0;
  kp.sched.counter = counter;
  if (counter != nullptr) {
    const cudaError_t err = cudaMemsetAsync(counter, 0, sizeof(int32_t), stream);
    if (err != cudaSuccess) return err;
  }
  const int grid = int(total < sms ? total : sms);
  fwd_ws_kernel<Cfg><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(kp);
  return cudaGetLastError();
}

}  // namespace sm90

// Plain attention (full or causal, GQA) on the warp-specialised kernel;
// cudaErrorNotSupported (the caller falls back to the SM80 kernel) when the
// device is not cc 9.0, the build has no sm_90a binary, the rows are not
// 16 B aligned for TMA, or seqlen_k is 0.
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_sm90_hdim(const FwdParams& params, cudaStream_t stream) {
  // d64: three consumer warpgroups (192-row tiles), so that two softmaxes
  // run under each warpgroup's wgmmas (ncu at 16k with two: tensor pipe
  // 51%, issue-bound softmax). H100, bf16, against two in the same run:
  // 4k +10% (full) / +4% (causal), 16k +13% / +12%. Each warpgroup skips
  // the key tiles its rows do not see (FwdMainloop::run), which took 1k
  // (5.33 x 192 rows) from +1% / -7% against two to +7% / +10%, and causal
  // 2k / 4k / 16k +6 / +7 / +2% over three without the skip. From 512
  // queries (512: +8% / +5%); at 256 the second 192-row tile is mostly
  // idle (-4% / -7%).
  if constexpr (kHeadDim == 64)
    if (params.seqlen_q >= 512)
      return sm90::launch_fwd_ws<sm90::FwdConfig<kHeadDim, sm90::ElementOf<kDType>, 3>>(params, stream);
  return sm90::launch_fwd_ws<sm90::FwdConfig<kHeadDim, sm90::ElementOf<kDType>>>(params, stream);
}

// Masks-only variants (window, lengths, query offsets, segment ids; also
// plain parameters) on the warp-specialised kernel. cudaErrorNotSupported,
// for the caller to fall back to the SM80 masks kernel, as above and when
// soft-cap, ALiBi or dropout is set. The rest (head_dim <= kHeadDim, sizes,
// pointers) the caller has checked, as for run_fwd_sm90_hdim.
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_sm90_masks_hdim(const FwdParams& params, cudaStream_t stream) {
  if (!variant_masks_only(params)) return cudaErrorNotSupported;
  // d64: three consumer warpgroups from 2k queries, as for plain attention
  // (H100/H200 A/B, 8k causal: window / lengths / segments equal to two,
  // per-batch offsets -4%).
  if constexpr (kHeadDim == 64)
    if (params.seqlen_q >= 2048)
      return sm90::launch_fwd_ws<sm90::FwdConfig<kHeadDim, sm90::ElementOf<kDType>, 3, true>>(params, stream);
  return sm90::launch_fwd_ws<sm90::FwdConfig<kHeadDim, sm90::ElementOf<kDType>, 2, true>>(params, stream);
}

// Soft-cap and / or ALiBi without dropout, or dropout alone, with or
// without the masks-only variants, on the warp-specialised kernel (one
// instantiation per transform set). cudaErrorNotSupported (the caller then
// takes the SM80 generic variants kernel) as above and when dropout is set
// with soft-cap or ALiBi, or none of the three is.
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_sm90_logits_hdim(const FwdParams& params, cudaStream_t stream) {
  using E = sm90::ElementOf<kDType>;
  const bool dropout = variant_dropout(params);
  const int logits = (params.softcap > 0.f ? fwd::kLogitSoftcap : 0) | (params.alibi_slopes ? fwd::kLogitAlibi : 0);
  if ((dropout && logits != 0) || (!dropout && logits == 0)) return cudaErrorNotSupported;
  // d64 from 2k queries: soft-cap (alone or with ALiBi) on three consumer
  // warpgroups, whose third softmax covers its tanh; ALiBi alone and dropout
  // on two (H200 A/B, 8k causal, time three / two warpgroups: soft-cap
  // 0.426 / 0.485 ms, both 0.458 / 0.483; ALiBi 0.342 / 0.334, dropout
  // 0.723 / 0.636: the third warpgroup's 160 registers spill there).
  if constexpr (kHeadDim == 64) {
    if (params.seqlen_q >= 2048 && !dropout && (logits & fwd::kLogitSoftcap) != 0) {
      if (logits == fwd::kLogitSoftcap)
        return sm90::launch_fwd_ws<sm90::FwdConfig<64, E, 3, true, fwd::kLogitSoftcap>>(params, stream);
      return sm90::launch_fwd_ws<sm90::FwdConfig<64, E, 3, true, fwd::kLogitSoftcap | fwd::kLogitAlibi>>(params, stream);
    }
  }
  if (dropout) return sm90::launch_fwd_ws<sm90::FwdConfig<kHeadDim, E, 2, true, fwd::kLogitDropout>>(params, stream);
  if (logits == fwd::kLogitSoftcap)
    return sm90::launch_fwd_ws<sm90::FwdConfig<kHeadDim, E, 2, true, fwd::kLogitSoftcap>>(params, stream);
  if (logits == fwd::kLogitAlibi)
    return sm90::launch_fwd_ws<sm90::FwdConfig<kHeadDim, E, 2, true, fwd::kLogitAlibi>>(params, stream);
  return sm90::launch_fwd_ws<sm90::FwdConfig<kHeadDim, E, 2, true, fwd::kLogitSoftcap | fwd::kLogitAlibi>>(params, stream);
}

// Dropout with soft-cap and / or ALiBi (with or without the masks-only
// variants): the same kernel's three kLogits sets with the dropout bit, two
// consumer warpgroups (own units, instantiations/fwd_sm90_logits_dropout_*.cu).
// cudaErrorNotSupported for anything else, as for run_fwd_sm90_logits_hdim.
template <DType kDType, int kHeadDim>
cudaError_t run_fwd_sm90_logits_dropout_hdim(const FwdParams& params, cudaStream_t stream) {
  using E = sm90::ElementOf<kDType>;
  constexpr int kCap = fwd::kLogitSoftcap, kAlibi = fwd::kLogitAlibi, kDrop = fwd::kLogitDropout;
  if (!variant_dropout(params)) return cudaErrorNotSupported;
  const int logits = (params.softcap > 0.f ? kCap : 0) | (params.alibi_slopes ? kAlibi : 0);
  switch (logits) {
    case kCap:
      return sm90::launch_fwd_ws<sm90::FwdConfig<kHeadDim, E, 2, true, kCap | kDrop>>(params, stream);
    case kAlibi:
      return sm90::launch_fwd_ws<sm90::FwdConfig<kHeadDim, E, 2, true, kAlibi | kDrop>>(params, stream);
    case kCap | kAlibi:
      return sm90::launch_fwd_ws<sm90::FwdConfig<kHeadDim, E, 2, true, kCap | kAlibi | kDrop>>(params, stream);
    default:
      return cudaErrorNotSupported;
  }
}

// Float32 on TF32 wgmmas, head dims up to kHeadDim (64, 128): plain
// attention and the masks-only variants; `scratch` holds
// tf32_fwd_scratch_bytes. cudaErrorNotSupported as for run_fwd_sm90_hdim and
// for soft-cap, ALiBi or dropout (the caller then runs the mma.sync kernel).
template <int kHeadDim>
cudaError_t run_fwd_sm90_tf32_hdim(const FwdParams& params, void* scratch, cudaStream_t stream) {
  using E = cutlass::tfloat32_t;
  if (params.plain_mask()) return sm90::launch_fwd_ws<sm90::FwdConfig<kHeadDim, E>>(params, stream, scratch);
  if (!variant_masks_only(params)) return cudaErrorNotSupported;
  return sm90::launch_fwd_ws<sm90::FwdConfig<kHeadDim, E, 2, true>>(params, stream, scratch);
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_FWD_SM90_TF32(HDIM)                                      \
  template cudaError_t jax_flash::cuda::run_fwd_sm90_tf32_hdim<HDIM>(const jax_flash::FwdParams&, void*, \
                                                                    cudaStream_t);

#define JAX_FLASH_INSTANTIATE_FWD_SM90_LOGITS_DROPOUT(DTYPE, HDIM)                                      \
  template cudaError_t jax_flash::cuda::run_fwd_sm90_logits_dropout_hdim<jax_flash::DType::DTYPE, HDIM>( \
      const jax_flash::FwdParams&, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_FWD_SM90_MASKS(DTYPE, HDIM)                                      \
  template cudaError_t jax_flash::cuda::run_fwd_sm90_masks_hdim<jax_flash::DType::DTYPE, HDIM>( \
      const jax_flash::FwdParams&, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_FWD_SM90_LOGITS(DTYPE, HDIM)                                      \
  template cudaError_t jax_flash::cuda::run_fwd_sm90_logits_hdim<jax_flash::DType::DTYPE, HDIM>( \
      const jax_flash::FwdParams&, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_FWD_SM90(DTYPE, HDIM)                                      \
  template cudaError_t jax_flash::cuda::run_fwd_sm90_hdim<jax_flash::DType::DTYPE, HDIM>( \
      const jax_flash::FwdParams&, cudaStream_t);
