// Persistent tile scheduler of the Hopper forward: a grid of at most one
// CTA per SM walks the (query tile, head, batch) work items with a stride
// of the grid size. The linear order is cuda/tile_order.h's: head-major for
// full attention (a wave's CTAs share one head's K and V in L2), sectioned
// longest-first for causal (the long tiles start first, the short ones fill
// the tail).
#pragma once

#include "cuda/tile_order.h"

namespace jax_flash::cuda::sm90 {

struct TileScheduler {
  int num_m, heads, batch;  // query tiles, q heads, batch
  int group;                // tile_order.h section size (0: head-major)
  bool causal;

  __device__ __forceinline__ int total() const { return num_m * heads * batch; }
  __device__ __forceinline__ int first() const { return int(blockIdx.x); }
  __device__ __forceinline__ int next(int t) const { return t + int(gridDim.x); }
  __device__ __forceinline__ TileCoord coord(int t) const {
    const int bx = t % num_m, rest = t / num_m;
    return tile_coord(bx, rest % heads, rest / heads, num_m, heads, batch, causal, group);
  }
};

}  // namespace jax_flash::cuda::sm90
