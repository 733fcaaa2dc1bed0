// Masks-only variants (window, lengths, query offsets, segment ids;
// cuda::Variant) on a keys x queries tile of the Hopper backward: tile
// flags, the segment-range narrowing of the query tiles, the element masks
// of P^T and deterministic mode's dQ ranks. The warp-specialised kernel's
// roles use them (sm90/bwd_masks.cuh, bwd_mainloop.cuh, bwd_dq.cuh).
#pragma once

#include <climits>
#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/common/bwd_rows.cuh"  // lse_to_log2
#include "cuda/common/variants.cuh"
#include "params.h"

namespace jax_flash::cuda::bwd90 {

using namespace cute;

// Per-tile mask flags (bits): element masks needed; segment ids compared;
// above kTileRankShift, deterministic mode's rank of the tile's dQ reduce.
enum : int { kTileMask = 1, kTileSeg = 2, kTileRankShift = 2 };
__device__ __forceinline__ int tile_flags(const Variant& v, int m0, int M, int n0, int N,
                                          const Variant::SegRange& qr, const Variant::SegRange& kr) {
  return (v.tile_needs_mask(m0, M, n0, N, qr, kr) ? kTileMask : 0) | (v.tile_seg_check(qr, kr) ? kTileSeg : 0);
}

// Narrow the query tiles [m_begin, m_end) of height M to those between the
// first and the last whose segment ids may meet the key tile's (k_rng): all
// threads test the query's 16-row id ranges once, so a key tile of one packed
// document never walks the other documents' tiles. Tiles in between that
// cannot meet it are still skipped one by one (by the caller), unless
// ms.one_id: every block of the range and the key tile hold one id (a key
// tile inside a lone document), when no tile needs its ids searched or
// compared. Every thread of the CTA calls this (two barriers). kKeepBand
// (BwdConfig::kSegOrder): the range stays the band's, only ms.one_id is set.
template <int M, int kThreads, bool kKeepBand, class MaskSmem>
__device__ __forceinline__ void narrow_query_tiles(const Variant& var, const BwdParams& p, int b,
                                                   const Variant::SegRange& k_rng, int tid,
                                                   MaskSmem& ms, int& m_begin, int& m_end) {
  constexpr int kB = Variant::kSegBlock;
  static_assert(M % kB == 0);
  const int nblk = (p.seqlen_q + kB - 1) / kB;
  const int32_t* rng = p.q_segment_ranges + int64_t(b) * nblk * 2;
  const int blk0 = m_begin * (M / kB), blk1 = min(nblk, m_end * (M / kB));
  int lo = INT_MAX, hi = -1;
  bool one = true;
  for (int bb = blk0 + tid; bb < blk1; bb += kThreads) {
    const Variant::SegRange q{int(rng[2 * bb]), int(rng[2 * bb + 1])};
    if (!Variant::disjoint(q, k_rng)) {
      lo = min(lo, bb);
      hi = max(hi, bb);
    }
    // Any other id anywhere in the range (even in a block that the key
    // tile cannot meet: it may share a tile with one it does).
    one = one && Variant::same_single(q, k_rng);
  }
  if (tid == 0) {
    ms.scan[0] = INT_MAX;
    ms.scan[1] = -1;
    ms.one_id = 1;
  }
  __syncthreads();
  if (hi >= 0) {
    atomicMin(&ms.scan[0], lo);
    atomicMax(&ms.scan[1], hi);
  }
  if (!one) ms.one_id = 0;
  __syncthreads();
  lo = ms.scan[0];
  hi = ms.scan[1];
  if constexpr (kKeepBand) return;
  if (hi < 0) {
    m_end = m_begin;
  } else {
    m_begin = max(m_begin, lo / (M / kB));
    m_end = min(m_end, hi / (M / kB) + 1);
  }
}

// Deterministic mode, sorted ids (SegOrder kSegVisitors): the query tiles
// of the band [m_begin, m_end) that key tile k_rng visits, i.e. whose id
// range (Variant::seg_range over the tile's rows, as the producer's skip
// test and masks_dq_rank_sorted take it) meets the key tile's. Sorted, the
// tiles' lowest and highest ids never drop as the tile grows, so these form
// a run, and the CTA walks it alone: a skipped step takes no turn there, so
// walking the rest of the band only cost the skips (packed documents).
// Every thread of the CTA calls this (two barriers; ms.scan reused).
template <int M, int kThreads, class MaskSmem>
__device__ __forceinline__ void visiting_query_tiles(const BwdParams& p, int b, const Variant::SegRange& k_rng,
                                                     int tid, MaskSmem& ms, int& m_begin, int& m_end) {
  const int32_t* rng = Variant::batch_ranges(p.q_segment_ranges, p.seqlen_q, b);
  int lo = INT_MAX, hi = -1;
  for (int t = m_begin + tid; t < m_end; t += kThreads) {
    Variant::SegRange q;
    Variant::seg_range(rng, t * M, M, p.seqlen_q, q.mn, q.mx);
    if (!Variant::disjoint(q, k_rng)) {
      lo = min(lo, t);
      hi = max(hi, t);
    }
  }
  if (tid == 0) {
    ms.scan[0] = INT_MAX;
    ms.scan[1] = -1;
  }
  __syncthreads();
  if (hi >= 0) {
    atomicMin(&ms.scan[0], lo);
    atomicMax(&ms.scan[1], hi);
  }
  __syncthreads();
  lo = ms.scan[0];
  hi = ms.scan[1];
  if (hi < 0) {
    m_end = m_begin;
  } else {
    m_begin = lo;
    m_end = hi + 1;
  }
}

// The masks-only variants' element masks on one keys x queries tile:
// zero(r, c) for each element (row-col indices of the accumulator) that the
// band / lengths (a tile-relative TileMask taking (query, key)) or, where
// `seg`, the segment ids (the key row's id against the query column's, both
// from shared memory) hide. tSc0_rc: thread 0's coordinates (compile-time
// values); rb, cb: this thread's (key, query) offset from them, as a CuTe
// layout is linear in (thread, value); so every test is an offset register
// against an immediate (from this thread's coordinates, ptxas hoisted one
// register per query column out of the loop and spilled them at d64).
template <class TC0, class Zero>
__device__ __forceinline__ void masks_t(TC0 const& tSc0_rc, int rb, int cb, const int* qseg, const int* kseg,
                                        bool seg, Variant::TileMask tm, Zero&& zero) {
  constexpr int kRows = decltype(size<0>(tSc0_rc))::value;
  tm.hi -= rb - cb;
  tm.lo -= rb - cb;
  tm.rmax -= cb;
  tm.cmax -= rb;
#pragma unroll
  for (int c = 0; c < size<1>(tSc0_rc); ++c) {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (!tm(get<1>(tSc0_rc(r, c)), get<0>(tSc0_rc(r, c)))) zero(r, c);
  }
  if (seg) {
    int kid[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) kid[r] = kseg[rb + get<0>(tSc0_rc(r, 0))];
#pragma unroll
    for (int c = 0; c < size<1>(tSc0_rc); ++c) {
      const int qid = qseg[cb + get<1>(tSc0_rc(0, c))];
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (kid[r] != qid) zero(r, c);
    }
  }
}

// Deterministic mode: how many CTAs of higher key tile add into query tile
// mt before key tile nb (which visits it). For the band masks (causal,
// window, offsets, lengths) the key tiles at or above nb that visit mt are
// a run [nb, last] (query_tiles' bounds only grow with the key tile, until
// the tiles past kv_len, which visit nothing), and `last` never decreases
// as mt grows. So a CTA walks it up over its query tiles in turn: `last`
// holds the previous answer (nb to start, and again when the walk restarts
// at a lower query tile, i.e. the next q head), and a step costs a visit
// test or two, not a binary search's log2(n_blocks) (the dQ writer computes
// it between the staged tile and its add: the deterministic chain's path).
// Segment ids break the run, unless the CTA keeps the band's tiles and
// counts the skipped ones too (BwdConfig::kSegOrder).
template <int M, int N>
__device__ __forceinline__ int masks_dq_rank(const Variant& v, int nb, int n_blocks, int mt, int& last) {
  while (last + 1 < n_blocks) {
    int a = 0, z = 0;
    v.template query_tiles<M>((last + 1) * N, (last + 1) * N + N - 1, a, z);
    if (a > mt || mt >= z) break;
    ++last;
  }
  return last - nb;
}

// This thread's share of checking that a batch's id block ranges ([B, n, 2]:
// min, max) never decrease along the sequence; the caller combines them.
template <int kThreads>
__device__ __forceinline__ bool ranges_sorted(const int32_t* ranges, int seqlen, int b, int tid) {
  const int n = (seqlen + Variant::kSegBlock - 1) / Variant::kSegBlock;
  const int32_t* r = ranges + int64_t(b) * n * 2;
  bool ok = true;
  for (int i = tid; i + 1 < n; i += kThreads) ok = ok && r[2 * i] <= r[2 * i + 2] && r[2 * i + 1] <= r[2 * i + 3];
  return ok;
}

// Whether batch b's ids are all one, query and key (given sorted ranges:
// the first block's lowest and the last block's highest say it).
__device__ __forceinline__ bool ranges_one_id(const BwdParams& p, int b) {
  const int nq = (p.seqlen_q + Variant::kSegBlock - 1) / Variant::kSegBlock;
  const int nk = (p.seqlen_k + Variant::kSegBlock - 1) / Variant::kSegBlock;
  const int32_t* q = p.q_segment_ranges + int64_t(b) * nq * 2;
  const int32_t* k = p.kv_segment_ranges + int64_t(b) * nk * 2;
  return q[0] == q[2 * nq - 1] && k[0] == k[2 * nk - 1] && q[0] == k[0];
}

// masks_dq_rank for sorted ids (bwd_masks_setup's answer): the CTAs above nb
// that visit query tile mt (in the band, ids not disjoint: the producer's
// skip test) form a run [nb, last], since a key tile's lowest id and highest
// never drop as the tile grows; and last never drops as mt grows (the
// query tile's highest id does not either). So the steps the ids skip take
// no turn at all.
template <int M, int N>
__device__ __forceinline__ int masks_dq_rank_sorted(const Variant& v, const BwdParams& p, int b, int nb,
                                                    int n_blocks, int mt, int& last) {
  Variant::SegRange qr;
  Variant::seg_range(Variant::batch_ranges(p.q_segment_ranges, p.seqlen_q, b), mt * M, M, p.seqlen_q, qr.mn, qr.mx);
  while (last + 1 < n_blocks) {
    int a = 0, z = 0;
    v.template query_tiles<M>((last + 1) * N, (last + 1) * N + N - 1, a, z);
    if (a > mt || mt >= z || Variant::disjoint(qr, v.k_range((last + 1) * N, N))) break;
    ++last;
  }
  return last - nb;
}

}  // namespace jax_flash::cuda::bwd90
