// The masks-only variants (window, lengths, query offsets, segment ids;
// cuda::Variant) in the warp-specialised Hopper forward.
// - The producer warp walks a work tile's key tiles from the band's last
//   down to its first (Variant::key_tiles), skipping those whose segment-id
//   ranges cannot meet the query tile's: 32 tiles a round, one a lane, and
//   a ballot (FwdKeyWalk). Beside each K stage it puts the tile's index and
//   step flags: band / length masks, ids compared, the tile's last step.
// - The consumers mask the S tile of a flagged step (FwdTileMasks): the
//   band and lengths as four 32-bit bounds a tile, the ids from global
//   memory (the query rows' held in registers for the work tile).
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/common/utils.cuh"
#include "cuda/common/variants.cuh"
#include "params.h"

namespace jax_flash::cuda::sm90 {

using namespace cute;

// Step flags beside a K stage.
enum : int { kStepBand = 1, kStepSeg = 2, kStepLast = 4 };

template <int kStages>
struct FwdStageMeta {
  int n[kStages];      // the stage's key tile
  int flags[kStages];  // its kStep* flags
  int visits;          // the work tile visits a key tile (0: its rows see none)
};
struct FwdNoStageMeta {};

// The producer warp's walk over one work tile's key tiles (every lane holds
// the same state; warp-collective calls).
template <int kBlockM, int kBlockN>
struct FwdKeyWalk {
  static constexpr int kSeg = FwdParams::kSegmentBlock, kPer = kBlockN / kSeg;
  int lo;                        // lowest tile of the band
  int top = INT_MIN;             // the cached round's highest tile (bit l: tile top - l)
  uint32_t meet = 0, mixed = 0;  // its tiles whose ids may meet / are not all the query tile's one id
  // Band / length flags: tile n needs them when n * BN > c_hi, n * BN < c_lo,
  // or every tile does (rows past q_len, keys past kv_len in the tile: below).
  int c_hi, c_lo, kv_len;
  bool all_band;
  Variant::SegRange q_rng;

  // Key tiles [lo, hi) of query tile m_block.
  __device__ __forceinline__ void init(const Variant& var, int m_block, int& hi) {
    const int row0 = m_block * kBlockM;
    var.template key_tiles<kBlockN>(row0, row0 + kBlockM - 1, lo, hi);
    constexpr int64_t kBig = int64_t(1) << 30;
    // Columns c0 .. c0 + BN - 1 past the last row-0 key: c0 > row0 + offset + right - (BN - 1);
    // before the first key of the tile's last row: c0 < row0 + BM - 1 + offset - left.
    const int64_t hi_c = var.right() >= 0 ? int64_t(row0) + var.offset + var.right() - (kBlockN - 1) : kBig;
    const int64_t lo_c = var.left() >= 0 ? int64_t(row0) + kBlockM - 1 + var.offset - var.left() : -kBig;
    c_hi = int(max(-kBig, min(kBig, hi_c)));
    c_lo = int(max(-kBig, min(kBig, lo_c)));
    kv_len = var.kv_len;
    all_band = row0 + kBlockM > var.q_len;
    q_rng = var.q_range(row0, kBlockM);
    top = INT_MIN;
  }

  __device__ __forceinline__ int band_flag(int n) const {
    const int c0 = n * kBlockN;
    return all_band || c0 + kBlockN > kv_len || c0 > c_hi || c0 < c_lo ? kStepBand : 0;
  }

  // The highest tile at or below n to visit (-1: none) and its flags (less
  // kStepLast).
  __device__ __forceinline__ int next(const FwdParams& p, int batch, int n, int lane, int& flags) {
    const bool seg_ids = p.q_segment_ids != nullptr && p.kv_segment_ids != nullptr;
    if (!seg_ids || p.q_segment_ranges == nullptr || p.kv_segment_ranges == nullptr) {
      if (n < lo) return -1;
      flags = band_flag(n) | (seg_ids ? kStepSeg : 0);
      return n;
    }
    const int nb = (p.seqlen_k + kSeg - 1) / kSeg;
    const int32_t* rng = p.kv_segment_ranges + int64_t(batch) * nb * 2;
    while (n >= lo) {
      if (n > top || n <= top - 32) {  // a new round: tiles n, n - 1, ..., n - 31
        top = n;
        const int t = n - lane;
        bool meets = false, mix = false;
        if (t >= lo) {
          Variant::SegRange kr;
          kr.mn = INT32_MAX;
          kr.mx = INT32_MIN;
#pragma unroll
          for (int i = 0; i < kPer; ++i) {
            const int bb = t * kPer + i;
            if (bb < nb) {
              kr.mn = min(kr.mn, int(rng[2 * bb]));
              kr.mx = max(kr.mx, int(rng[2 * bb + 1]));
            }
          }
          meets = !Variant::disjoint(q_rng, kr);
          mix = !Variant::same_single(q_rng, kr);
        }
        meet = __ballot_sync(0xffffffffu, meets);
        mixed = __ballot_sync(0xffffffffu, mix);
      }
      const uint32_t m = meet & (0xffffffffu << (top - n));
      if (m != 0u) {
        const int l = __ffs(m) - 1;
        n = top - l;
        flags = band_flag(n) | (((mixed >> l) & 1u) ? kStepSeg : 0);
        return n;
      }
      n = top - 32;
    }
    return -1;
  }
};

// A consumer thread's masks for one work tile: the Variant's lengths and
// offset, and (segment ids) the ids of its two rows.
template <int kBlockN>
struct FwdTileMasks {
  int q_len, kv_len;
  int64_t offset;
  int qid[2];
  const int32_t* kv_ids;  // the batch's key ids (nullptr: none)

  template <class TC, class TC0>
  __device__ __forceinline__ void init(const FwdParams& p, const Variant& var, int batch, int row0, TC const& tSc,
                                       TC0 const& tSc0) {
    q_len = var.q_len;
    kv_len = var.kv_len;
    offset = var.offset;
    kv_ids = nullptr;
    qid[0] = qid[1] = 0;
    if (var.segments()) {
      kv_ids = p.kv_segment_ids + int64_t(batch) * p.seqlen_k;
      Tensor c0 = make_tensor(tSc0.data(), fwd::acc_rowcol_layout(tSc0.layout()));
      const int rb = get<0>(tSc(0)) - get<0>(tSc0(0));
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + rb + get<0>(c0(r, 0));
        qid[r] = row < p.seqlen_q ? int(p.q_segment_ids[int64_t(batch) * p.seqlen_q + row]) : 0;
      }
    }
  }

  // The step's masks on its S tile (raw scores or logits): -inf where a
  // row cannot see a key. tSc0: thread 0's partition of the tile
  // coordinates (compile-time values); this thread's are those plus one
  // (row, col) offset, so each element's test is that offset against an
  // immediate.
  template <class TS, class TC, class TC0>
  __device__ __forceinline__ void apply(const FwdParams& p, TS& acc_s, TC const& tSc, TC0 const& tSc0, int row0,
                                        int col0, int flags) const {
    Tensor s = make_tensor(acc_s.data(), fwd::acc_rowcol_layout(acc_s.layout()));
    Tensor c0 = make_tensor(tSc0.data(), fwd::acc_rowcol_layout(tSc0.layout()));
    constexpr int kRows = decltype(size<0>(s))::value;
    static_assert(kRows == 2);
    const int rb = get<0>(tSc(0)) - get<0>(tSc0(0));  // this thread's offset from thread 0
    const int cb = get<1>(tSc(0)) - get<1>(tSc0(0));
    if (flags & kStepBand) {
      // Variant::tile_mask at (row0, col0), moved onto thread 0's coordinates.
      constexpr int64_t kBig = int64_t(1) << 30;
      const int64_t base = int64_t(row0) + offset - col0;
      const int64_t right = p.causal ? 0 : p.window_right, left = p.window_left;
      Variant::TileMask tm;
      tm.hi = (right >= 0 ? int(max(-kBig, min(kBig, base + right))) : int(kBig)) - (cb - rb);
      tm.lo = (left >= 0 ? int(max(-kBig, min(kBig, base - left))) : -int(kBig)) - (cb - rb);
      tm.cmax = kv_len - col0 - cb;
      tm.rmax = q_len - row0 - rb;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int j = 0; j < size<1>(s); ++j)
          if (!tm(get<0>(c0(r, 0)), get<1>(c0(r, j)))) s(r, j) = -INFINITY;
      }
    }
    if (flags & kStepSeg) {
      // Sixteen columns' id loads in flight at a time.
      constexpr int kChunk = 16;
#pragma unroll
      for (int j0 = 0; j0 < size<1>(s); j0 += kChunk) {
        int kid[kChunk];
#pragma unroll
        for (int j = j0; j < j0 + kChunk && j < size<1>(s); ++j) {
          const int c = col0 + cb + get<1>(c0(0, j));
          kid[j - j0] = c < kv_len ? int(kv_ids[c]) : 0;  // past kv_len: masked by the band flags
        }
#pragma unroll
        for (int j = j0; j < j0 + kChunk && j < size<1>(s); ++j) {
#pragma unroll
          for (int r = 0; r < kRows; ++r)
            if (kid[j - j0] != qid[r]) s(r, j) = -INFINITY;
        }
      }
    }
  }
};

}  // namespace jax_flash::cuda::sm90
