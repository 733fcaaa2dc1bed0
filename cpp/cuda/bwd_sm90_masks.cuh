// Masks-only variants (window, lengths, query offsets, segment ids;
// cuda::Variant) in the Hopper dK/dV kernel: the per-CTA pieces that the
// plain kernel has no use for. The kernel's kMasks instantiation keeps these
// in shared memory past its SharedStorage (BwdSm90Traits::MaskSmem, counted
// in kSmemBytes), so the plain instantiation's layout and code stay as they
// were.
#pragma once

#include <climits>
#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/bwd_kernel.cuh"  // lse_to_log2
#include "cuda/variants.cuh"
#include "params.h"

namespace jax_flash::cuda::bwd90 {

using namespace cute;

template <int kBlockM, int kBlockN, int kStages>
struct BwdSm90MaskSmem {
  int qseg[kStages][kBlockM];  // query segment ids of each stage's tile
  int kseg[kBlockN];           // the key tile's segment ids
  int scan[2];                 // first / last 16-row block whose ids meet the key tile's
  int one_id;                  // 1: the scanned blocks and the key tile all hold one id
  int q_len, kv_len;           // the Variant's per-batch values (Variant::Variant(p, b, ...))
  int k_mn, k_mx;              // the key tile's id range
  int64_t offset;
  // Iterations ahead: step k's (iteration, tile flags) in ring[k % 4],
  // written by thread 0 two steps before (see the kernel).
  int ring[4][2];
  // (Masks-only kernels) The search's window: query tile m_begin +
  // win_base + l (l < 32) meets the key tile's ids when bit l of win_meet is
  // set, and takes tile flags win_flags[l]. Warp 0 alone reads and fills it
  // (fill_query_window).
  int win_base;
  uint32_t win_meet;
  int win_flags[32];

  __device__ __forceinline__ Variant variant(const FwdParams& p, int b) const {
    return Variant(p, b, q_len, kv_len, offset);
  }
  __device__ __forceinline__ Variant::SegRange k_rng() const { return Variant::SegRange{k_mn, k_mx}; }
};

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
// compared. Every thread of the CTA calls this (two barriers).
template <int M, int kThreads, class MaskSmem>
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
  if (hi < 0) {
    m_end = m_begin;
  } else {
    m_begin = max(m_begin, lo / (M / kB));
    m_end = min(m_end, hi / (M / kB) + 1);
  }
}

// Warp 0's window of 32 query tiles from rel0 on (relative to m_begin; nm
// in all) against key tile n0: one lane a tile loads its 16-row id ranges
// (with segment ids over several ids) and computes its tile flags, so the
// per-step search is a bit test and a shared-memory read, and pays one
// global round trip per 32 tiles instead of one per step (ncu, packed
// documents: warp 0 late at the step's first barrier). Every lane of warp 0
// calls this; returns the window's meet bits.
template <int M, int N, class MaskSmem>
__device__ __forceinline__ uint32_t fill_query_window(const Variant& v, const Variant::SegRange& kr, int m_begin,
                                                      int nm, int n0, int rel0, MaskSmem& ms) {
  const int lane = int(threadIdx.x & 31), rel = rel0 + lane;
  bool meet = false;
  int fl = 0;
  if (rel < nm) {
    const int m0 = (m_begin + rel) * M;
    // one_id: every tile met holds the key tile's one id.
    const Variant::SegRange qr = ms.one_id ? kr : v.q_range(m0, M);
    meet = !Variant::disjoint(qr, kr);
    fl = tile_flags(v, m0, M, n0, N, qr, kr);
  }
  const uint32_t bits = __ballot_sync(0xffffffffu, meet);
  __syncwarp();  // every lane has read the old window
  ms.win_flags[lane] = fl;
  if (lane == 0) {
    ms.win_base = rel0;
    ms.win_meet = bits;
  }
  __syncwarp();
  return bits;
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

// P^T = exp2(S^T scale log2e - lse log2e) on one keys x queries tile, with
// the masks-only variants' element masks (masks_t) where `mask` (`seg`: the
// segment ids too). make_tm() gives the tile's TileMask, called only where
// `mask` (its window / lengths bounds were ~40 instructions a step that
// ptxas did not sink into the branch).
template <class TS, class TC, class TC0, class MakeTileMask>
__device__ __forceinline__ void masked_probs_t(TS& s, TC const& tSc_rc, TC0 const& tSc0_rc, const float* lse,
                                               const int* qseg, const int* kseg, float scale_log2, bool mask,
                                               bool seg, MakeTileMask&& make_tm) {
  constexpr int kRows = decltype(size<0>(s))::value;
  const int rb = get<0>(tSc_rc(0, 0)) - get<0>(tSc0_rc(0, 0));  // key offset
  const int cb = get<1>(tSc_rc(0, 0)) - get<1>(tSc0_rc(0, 0));  // query offset
#pragma unroll
  for (int c = 0; c < size<1>(s); ++c) {
    const float l2 = bwd::lse_to_log2(lse[cb + get<1>(tSc0_rc(0, c))]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) s(r, c) = exp2f(s(r, c) * scale_log2 - l2);
  }
  // The masks as a second pass over P^T (a select per element), so that
  // their values are not live beside the exponentials' (interleaved, the
  // d128 kernel ran out of registers: ptxas C7519 at the dV wgmma).
  if (!mask) return;
  masks_t(tSc0_rc, rb, cb, qseg, kseg, seg, make_tm(), [&](int r, int c) { s(r, c) = 0.f; });
}

// Deterministic mode: how many CTAs of higher key tile add into query tile
// mt before key tile nb (which visits it). For the band masks (causal,
// window, offsets, lengths) the key tiles at or above nb that visit mt are
// a run [nb, last] (query_tiles' bounds only grow with the key tile, until
// the tiles past kv_len, which visit nothing), so a binary search finds
// `last`. Segment ids break the run.
template <int M, int N>
__device__ __forceinline__ int masks_dq_rank(const Variant& v, int nb, int n_blocks, int mt) {
  int lo = nb, hi = n_blocks - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    int a = 0, z = 0;
    v.template query_tiles<M>(mid * N, mid * N + N - 1, a, z);
    if (a <= mt && mt < z)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo - nb;
}

}  // namespace jax_flash::cuda::bwd90
