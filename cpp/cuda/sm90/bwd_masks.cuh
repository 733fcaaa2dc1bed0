// The masks-only variants (window, lengths, query offsets, segment ids;
// cuda::Variant) in the warp-specialised Hopper backward.
// - Before the warps take their roles, the whole CTA bounds the query tiles
//   its key tile can meet (the band and the lengths; with segment ids, the
//   first and last tiles whose id ranges meet the key tile's) and keeps the
//   per-CTA values in shared memory.
// - The producer decides each step's flags (element masks, segment ids
//   compared, or nothing to do: ids disjoint from the key tile's) and puts
//   them beside the stage, with the query tile's ids when compared. The dQ
//   writer works out the skipped steps the same way.
// - The consumers zero the hidden elements of P^T in a second pass, under
//   the dP^T wgmma (sm90/bwd_masks_tile.cuh masks_t).
// The band's key tiles that meet a query tile form a run, so deterministic
// mode ranks a dQ add by a walk up it (bwd90::masks_dq_rank); with segment
// ids only the kSegOrder kernel, which keeps the band's tiles and counts the
// skipped steps too (the launcher's rule), unless the ids are sorted: then
// it walks the tiles it visits alone (bwd90::visiting_query_tiles).
#pragma once

#include <climits>
#include <cstdint>

#include "cuda/common/variants.cuh"
#include "cuda/sm90/bwd_masks_tile.cuh"  // narrow_query_tiles, tile_flags, masks_t, kTileMask, kTileSeg
#include "params.h"

namespace jax_flash::cuda::sm90 {

// Step flags: bwd90::kTileMask, bwd90::kTileSeg, or kStepSkip.
inline constexpr int kStepSkip = 4;

// How the kSegOrder kernels rank the dQ adds (bwd_masks_setup's answer; the
// same for every CTA of a batch, which a per-CTA fact such as ms.one_id is
// not: ranking by it could wait on a turn that no CTA takes).
//   kSegBandTurns: ids out of order: every step of a key tile's band takes
//     its turn (masks_dq_rank), a skipped one adding nothing.
//   kSegVisitors: the query and key id block ranges never decrease
//     (documents packed in order): only the CTAs that visit a tile take
//     turns there (masks_dq_rank_sorted), a skipped step none.
//   kSegOneId: one id for the whole batch: nothing is skipped, and the band's
//     run is the visitors' (masks_dq_rank, without the ranges' reads).
enum SegOrder : int { kSegBandTurns = 0, kSegVisitors = 1, kSegOneId = 2 };

template <int kBlockM, int kBlockN, int kStages>
struct BwdMaskSmem {
  int qseg[kStages][kBlockM];  // the stage's query ids (kTileSeg steps)
  int kseg[kBlockN];           // the key tile's ids
  int flags[kStages];          // the stage's step flags
  int scan[2];                 // narrow_query_tiles' first / last 16-row block
  int one_id;                  // every block scanned and the key tile hold one id
  int q_len, kv_len;           // the Variant's per-batch values
  int k_mn, k_mx;              // the key tile's id range
  // Variant::tile_needs_mask of query tile m0 against this key tile, as
  // 32-bit tests (the producer has 24 registers): m0 < mask_below (the
  // band's right side), m0 > mask_above (its left), or key_edge (keys past
  // kv_len in the tile), or m0 + M > q_len.
  int mask_below, mask_above, key_edge;
  int64_t offset;

  __device__ __forceinline__ Variant variant(const FwdParams& p, int b) const {
    return Variant(p, b, q_len, kv_len, offset);
  }
  __device__ __forceinline__ Variant::SegRange k_rng() const { return Variant::SegRange{k_mn, k_mx}; }
};
struct BwdNoMaskSmem {};

// Every thread of the CTA: the query tiles [m_begin, m_end) key tile n0
// may meet, and the per-CTA values into ms. Two or four __syncthreads.
// Returns (kKeepBand) how the dQ order ranks (SegOrder, below), else 0.
template <int M, int N, int kThreads, bool kKeepBand, class MaskSmem>
__device__ __forceinline__ int bwd_masks_setup(const BwdParams& p, int b, int first_head, int n0, int tid,
                                                MaskSmem& ms, int& m_begin, int& m_end) {
  const Variant var(p, b, first_head);
  var.template query_tiles<M>(n0, n0 + N - 1, m_begin, m_end);
  const Variant::SegRange k_rng = var.k_range(n0, N);
  if (tid == 0) {
    ms.q_len = var.q_len;
    ms.kv_len = var.kv_len;
    ms.offset = var.offset;
    ms.k_mn = k_rng.mn;
    ms.k_mx = k_rng.mx;
    constexpr int64_t kBig = int64_t(1) << 30;
    const int64_t below = var.right() >= 0 ? int64_t(n0) + N - 1 - var.offset - var.right() : -kBig;
    const int64_t above = var.left() >= 0 ? int64_t(n0) - (M - 1) - var.offset + var.left() : kBig;
    ms.mask_below = int(max(-kBig, min(kBig, below)));
    ms.mask_above = int(max(-kBig, min(kBig, above)));
    ms.key_edge = n0 + N > var.kv_len;
  }
  if (tid < N)
    ms.kseg[tid] = var.segments() && n0 + tid < p.seqlen_k ? int(p.kv_segment_ids[int64_t(b) * p.seqlen_k + n0 + tid]) : 0;
  if (var.seg_ranges() && m_end > m_begin) {
    bwd90::narrow_query_tiles<M, kThreads, kKeepBand>(var, p, b, k_rng, tid, ms, m_begin, m_end);
  } else if (tid == 0) {
    ms.one_id = 0;
  }
  if constexpr (kKeepBand) {
    // Deterministic with segment ids (BwdConfig::kSegOrder): every CTA of
    // the batch finds the same answer, so they all rank alike.
    const int ok = var.seg_ranges() ? int(bwd90::ranges_sorted<kThreads>(p.q_segment_ranges, p.seqlen_q, b, tid) &&
                                          bwd90::ranges_sorted<kThreads>(p.kv_segment_ranges, p.seqlen_k, b, tid))
                                    : 0;
    if (!__syncthreads_and(ok)) return kSegBandTurns;  // (also the barrier below)
    if (bwd90::ranges_one_id(p, b)) return kSegOneId;
    // (the ms.scan reads above are behind the barrier of __syncthreads_and)
    if (m_end > m_begin) bwd90::visiting_query_tiles<M, kThreads>(p, b, k_rng, tid, ms, m_begin, m_end);
    return kSegVisitors;
  }
  __syncthreads();
  return 0;
}

// Deterministic mode: the rank of this CTA's dQ add into query tile m (how
// many CTAs add into it first), for the d64 / d128 dQ writers and the wide
// kernel's order keeper alike. Masks kernels walk the band's run up
// (bwd90::masks_dq_rank; run_last / run_m hold the walk, which restarts at
// each q head); the kSegOrder ones with sorted ids count the visitors alone
// (bwd90::masks_dq_rank_sorted; `seg`: SegOrder); plain ones BwdWork::dq_rank.
template <class Cfg, class Work, class MaskSmem>
__device__ __forceinline__ int dq_order_rank(const BwdParams& p, const MaskSmem& ms, const Work& w, int m,
                                             [[maybe_unused]] int seg, [[maybe_unused]] int& run_last,
                                             [[maybe_unused]] int& run_m) {
  if constexpr (Cfg::kMasks) {
    constexpr int M = Cfg::kBlockM, N = Cfg::kBlockN;
    if (m < run_m) run_last = w.n_block;  // the next q head: the walk restarts
    run_m = m;
    const Variant v = ms.variant(p, w.batch);
    if constexpr (Cfg::kSegOrder)
      return seg == kSegVisitors ? bwd90::masks_dq_rank_sorted<M, N>(v, p, w.batch, w.n_block, w.n_blocks, m, run_last)
                                 : bwd90::masks_dq_rank<M, N>(v, w.n_block, w.n_blocks, m, run_last);
    else
      return bwd90::masks_dq_rank<M, N>(v, w.n_block, w.n_blocks, m, run_last);
  } else {
    return w.dq_rank(p, m);
  }
}

// The producer: step flags of query tile m0 (all lanes compute the same),
// bwd90::tile_flags in the precomputed 32-bit form.
template <int M, class MaskSmem>
__device__ __forceinline__ int bwd_step_flags(const BwdParams& p, int b, int m0, const MaskSmem& ms) {
  int flags = 0;
  if (p.q_segment_ids != nullptr && p.kv_segment_ids != nullptr && !ms.one_id) {
    Variant::SegRange qr;  // unknown (no ranges): meets everything
    if (p.q_segment_ranges != nullptr && p.kv_segment_ranges != nullptr) {
      Variant::seg_range(Variant::batch_ranges(p.q_segment_ranges, p.seqlen_q, b), m0, M, p.seqlen_q, qr.mn, qr.mx);
    }
    const Variant::SegRange kr = ms.k_rng();
    if (Variant::disjoint(qr, kr)) return kStepSkip;
    if (!Variant::same_single(qr, kr)) flags = bwd90::kTileMask | bwd90::kTileSeg;
  }
  if (ms.key_edge || m0 + M > ms.q_len || m0 < ms.mask_below || m0 > ms.mask_above) flags |= bwd90::kTileMask;
  return flags;
}

}  // namespace jax_flash::cuda::sm90
