// The work of one backward CTA: its key tile (from the launch order) and the
// steps it walks, (q head of the kv group, query tile), in the same order
// for the producer, the dQ writers and the consumers.
#pragma once

#include "cuda/common/tile_order.h"
#include "params.h"

namespace jax_flash::cuda::sm90 {

template <int kBlockM, int kBlockN>
struct BwdWork {
  int n_block, head_kv, batch;
  int first_head;  // of the kv group
  int m_begin;     // first query tile visited
  int num_m;       // query tiles visited per q head
  int steps;       // group * num_m

  int n_blocks;
  int rotate;      // (deterministic) key tile n starts at query tile n * rotate, wrapping

  // Causal attention (top-left: key j visible to query i iff j <= i) skips
  // the query tiles wholly above the key tile. Causal grids run the
  // heaviest key tiles (lowest) first, in L2-sized sections of pairs.
  // Deterministic mode launches the highest key tile first instead (head-
  // major), so that a CTA only ever waits for CTAs launched before it.
  __device__ __forceinline__ BwdWork(const BwdParams& p, int order_group, int rotate_) : rotate(rotate_) {
    n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
    const bool det = p.deterministic;
    const TileCoord c = tile_coord(blockIdx.x, blockIdx.y, blockIdx.z, n_blocks, gridDim.y, gridDim.z, det,
                                   det ? 0 : order_group);
    n_block = c.tile;
    head_kv = c.head;
    batch = c.batch;
    const int group = p.heads_q / p.heads_kv;
    first_head = head_kv * group;
    m_begin = p.causal ? n_block * kBlockN / kBlockM : 0;
    const int m_end = (p.seqlen_q + kBlockM - 1) / kBlockM;
    num_m = m_end > m_begin ? m_end - m_begin : 0;
    steps = group * num_m;
  }
  // The query tiles [m_begin_, m_end_) instead (the masks variants' bounds).
  __device__ __forceinline__ void set_query_tiles(int m_begin_, int m_end_, int group) {
    m_begin = m_begin_;
    num_m = m_end_ > m_begin_ ? m_end_ - m_begin_ : 0;
    steps = group * num_m;
  }
  __device__ __forceinline__ int head(int step) const { return first_head + step / num_m; }
  __device__ __forceinline__ int m_block(int step) const {
    const int i = step % num_m;
    return m_begin + (rotate > 0 ? (i + n_block * rotate) % num_m : i);
  }
  // The consumers' walk over the steps in the same order as m_block(step)
  // and head(step), advanced without their per-step division.
  struct Cursor {
    int i, head, rot0, num_m, m_begin;
    __device__ __forceinline__ int m_block() const {
      const int j = i + rot0;
      return m_begin + (j >= num_m ? j - num_m : j);
    }
    __device__ __forceinline__ void advance() {
      if (++i == num_m) {
        i = 0;
        ++head;
      }
    }
  };
  __device__ __forceinline__ Cursor cursor() const {
    return Cursor{0, first_head, rotate > 0 && num_m > 0 ? n_block * rotate % num_m : 0, num_m, m_begin};
  }
  // (deterministic) How many CTAs add into query tile m before this one:
  // those of higher key tile that visit it, or with the rotation, those that
  // reach it earlier (k, k-1, .., 0, then n_blocks-1, .., k+1, k the last
  // key tile starting at or before m).
  __device__ __forceinline__ int dq_rank(const BwdParams& p, int m) const {
    if (rotate > 0) {
      const int k = min(n_blocks - 1, m / rotate);
      return n_block <= k ? k - n_block : k + n_blocks - n_block;
    }
    const int last = p.causal ? min(n_blocks - 1, ((m + 1) * kBlockM - 1) / kBlockN) : n_blocks - 1;
    return last - n_block;
  }
};

}  // namespace jax_flash::cuda::sm90
