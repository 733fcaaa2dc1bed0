// The work of one backward CTA: its key tile (from the launch order) and the
// steps it walks, (q head of the kv group, query tile), in the same order
// for the producer, the dQ writer and the consumers.
#pragma once

#include "cuda/tile_order.h"
#include "params.h"

namespace jax_flash::cuda::sm90 {

template <int kBlockM, int kBlockN>
struct BwdWork {
  int n_block, head_kv, batch;
  int first_head;  // of the kv group
  int m_begin;     // first query tile visited
  int num_m;       // query tiles visited per q head
  int steps;       // group * num_m

  // Causal attention (top-left: key j visible to query i iff j <= i) skips
  // the query tiles wholly above the key tile. Causal grids run the
  // heaviest key tiles (lowest) first, in L2-sized sections of pairs.
  __device__ __forceinline__ BwdWork(const BwdParams& p, int order_group) {
    const int n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
    const TileCoord c = tile_coord(blockIdx.x, blockIdx.y, blockIdx.z, n_blocks, gridDim.y, gridDim.z, false,
                                   order_group);
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
  __device__ __forceinline__ int head(int step) const { return first_head + step / num_m; }
  __device__ __forceinline__ int m_block(int step) const { return m_begin + step % num_m; }
};

}  // namespace jax_flash::cuda::sm90
