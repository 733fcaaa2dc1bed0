// Declarations shared by bwd_launch.cu (dispatch, no CuTe) and the
// per-(dtype, head dim) backward instantiation files.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "params.h"

namespace jax_flash::cuda {

// Flags computed once on the host from pointers and strides.
struct BwdLaunchFlags {
  bool vec_ok = false;   // 16 B cp.async loads legal for q, k, v, dout
  bool pair_ok = false;  // 4 B stores legal for dq, dk, dv
};

// Backward on the kernels compiled for head dim kHeadDim (>= params.head_dim).
// params.workspace holds bwd_workspace_layout(...) bytes.
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream);

// Same with the generic variants kernels (params.plain_mask() is false).
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_var_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream);

// Masks-only variants (no soft-cap, ALiBi, dropout): kernels without that code.
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_varm_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream);

// The warp-specialised Hopper backward (cpp/cuda/sm90/) for plain attention,
// atomic or deterministic, with head_dim <= kHeadDim (zero-padded: the
// dispatcher sends head dims between 64 / 128 / 256 here), vector-aligned inputs
// and non-empty sequences (instantiations/bwd_sm90_*.cu, built only when the
// archs include 90a); cudaErrorNotSupported otherwise (the SM80 kernels take
// those), or when the device is not cc 9.0.
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream);

// Deterministic mode with segment ids, masks only, on the Hopper kernel's
// kSegOrder instantiation (instantiations/bwd_sm90_masks_seg_order_*.cu).
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_masks_seg_order_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream);

// Masks-only variants (window, lengths, query offsets, segment ids) on the
// Hopper kernel, atomic mode and deterministic without segment ids
// (instantiations/bwd_sm90_masks_*.cu, built with
// the variants units of head dims 64 / 128 when the archs include 90a);
// cudaErrorNotSupported where it does not apply.
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_masks_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream);

// Soft-cap and / or ALiBi, or dropout alone (with or without the
// masks-only variants) on the Hopper kernel, atomic mode and deterministic
// without segment ids (instantiations/bwd_sm90_logits_*.cu, built like the
// masks units); cudaErrorNotSupported where it does not apply.
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_logits_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream);

// Dropout with soft-cap and / or ALiBi (with or without the masks-only
// variants) on the Hopper kernel, atomic mode and deterministic without
// segment ids (instantiations/bwd_sm90_logits_dropout_*.cu, built like the
// logits units).
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_logits_dropout_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream);

// Deterministic mode with segment ids and a transform set (kDropoutSets:
// dropout with a transform) on the kSegOrder logits instantiations
// (instantiations/bwd_sm90_logits{,_dropout}_seg_order_*.cu).
template <DType kDType, int kHeadDim, bool kDropoutSets>
cudaError_t run_bwd_sm90_logits_seg_order_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream);

// Same for head dim 256 (sm90/bwd_wide_config.cuh: the warpgroups keep dV
// and dK; instantiations/bwd_sm90_hdim256_*.cu), plain attention, both modes.
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_wide_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream);

// The masks-only variants on it (head dims 160-256 padded to 256), atomic
// mode and deterministic without segment ids (instantiations/
// bwd_sm90_masks_hdim256_*.cu, built with the variants units);
// cudaErrorNotSupported where it does not apply.
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_wide_masks_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream);

// Deterministic mode with segment ids on it, masks only: the kSegOrder
// instantiation (instantiations/bwd_sm90_masks_seg_order_hdim256_*.cu).
template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_wide_masks_seg_order_hdim(const BwdParams& params, BwdLaunchFlags flags,
                                                   cudaStream_t stream);

// Soft-cap / ALiBi / dropout on it, in the same modes: kDropoutSets, dropout
// with a transform (instantiations/bwd_sm90_logits_dropout_hdim256_*.cu), else
// the other sets (bwd_sm90_logits_hdim256_*.cu).
template <DType kDType, int kHeadDim, bool kDropoutSets>
cudaError_t run_bwd_sm90_wide_logits_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream);

// Deterministic mode with segment ids and a transform set on it (instantiations/
// bwd_sm90_logits{,_dropout}_seg_order_hdim256_*.cu).
template <DType kDType, int kHeadDim, bool kDropoutSets>
cudaError_t run_bwd_sm90_wide_logits_seg_order_hdim(const BwdParams& params, BwdLaunchFlags flags,
                                                    cudaStream_t stream);

// Workspace: [dsum: B*Hq*Sq floats][dq accumulator: B*Hq*Sq'*kHeadDim floats],
// each part 256 B aligned, where Sq' is Sq rounded up to whole kBwdRowPad
// tiles (below) and kHeadDim is the widest kernel's that may run (a plain
// head dim of 96 runs padded on the Hopper kernel of 128: 128). The
// accumulator is there in atomic mode, and in deterministic mode where the
// Hopper kernel may run it (padded head dims 64, 128 and 256, every
// option set), which orders its dQ
// reduces with B*Hq*ceil(Sq/64) int counters. Those live at the start of dq's
// own buffer, which nothing reads or writes until the convert kernel
// overwrites all of it after the backward: so the scratch is the same as in
// atomic mode (and cuDNN's). The SM80 deterministic kernels need neither.
inline constexpr int kBwdOrderRows = 64;  // query rows per order counter
inline size_t bwd_align256(size_t n) { return (n + 255) & ~size_t(255); }
// Atomic mode may take the Hopper kernels' ordered (deterministic) path for
// plain rows where large grids measured it faster: causal rows of at most 1k
// queries, and non-causal rows of at most 4k at head dims up to 128 (H200,
// ordered / atomic 1.000-1.027; at d256 and 16k it was slower).
// sm90::run_ordered decides; each dQ tile's first add is then a store, so
// the accumulator is not cleared first. Its counters are in dq's buffer
// (bwd_order_fits_dq), as deterministic mode's are.
inline bool bwd_prefers_order(const BwdParams& p) {
  if (p.deterministic || !p.plain_mask()) return false;
  return p.causal ? p.seqlen_q <= 1024 : p.seqlen_q <= 4096 && p.head_dim <= 128;
}
inline bool bwd_det_ordered(const BwdParams& p, int padded_head_dim) {
  return (p.deterministic || bwd_prefers_order(p)) &&
         (padded_head_dim == 64 || padded_head_dim == 128 || padded_head_dim == 256);
}
inline size_t bwd_dsum_bytes(const BwdParams& p) {
  return bwd_align256(sizeof(float) * size_t(p.batch) * size_t(p.heads_q) * size_t(p.seqlen_q));
}
// The accumulator's rows per (batch, q head) are padded to whole 128-row
// tiles: the warp-specialised Hopper kernel reduces into it a tile at a
// time (sm90/bwd_dq.cuh); the other kernels use the first seqlen_q rows.
inline constexpr int kBwdRowPad = 128;
inline int bwd_padded_rows(int seqlen_q) { return (seqlen_q + kBwdRowPad - 1) / kBwdRowPad * kBwdRowPad; }
inline size_t bwd_accum_bytes(const BwdParams& p, int padded_head_dim) {
  if (p.deterministic && !bwd_det_ordered(p, padded_head_dim)) return 0;
  return bwd_align256(sizeof(float) * size_t(p.batch) * size_t(p.heads_q) * size_t(bwd_padded_rows(p.seqlen_q)) *
                      size_t(padded_head_dim));
}
// The order counters' bytes (whole float4s: the pre-pass clears them so),
// or 0 where no ordered Hopper kernel may run.
inline size_t bwd_order_bytes(const BwdParams& p, int padded_head_dim) {
  if (!bwd_det_ordered(p, padded_head_dim)) return 0;
  const size_t tiles = (size_t(p.seqlen_q) + kBwdOrderRows - 1) / kBwdOrderRows;
  return (sizeof(int) * size_t(p.batch) * size_t(p.heads_q) * tiles + 15) / 16 * 16;
}
// Whether the counters fit at the start of dq's buffer: 16-byte aligned,
// and within the bytes dq's elements span (a 16-bit dq row of 64 or more
// elements spans 128 bytes; the counters take 4 bytes per 64 rows).
inline bool bwd_order_fits_dq(const BwdParams& p, int padded_head_dim) {
  const size_t bytes = bwd_order_bytes(p, padded_head_dim);
  if (bytes == 0 || (reinterpret_cast<uintptr_t>(p.dq) & 15) != 0) return false;
  const int64_t last = int64_t(p.batch - 1) * p.dq_batch_stride + int64_t(p.seqlen_q - 1) * p.dq_row_stride +
                       int64_t(p.heads_q - 1) * p.dq_head_stride + p.head_dim;  // elements spanned
  return bytes <= size_t(last) * (p.dtype == DType::kFloat32 ? 4 : 2);
}

}  // namespace jax_flash::cuda
