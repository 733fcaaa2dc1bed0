// Masking of one S tile: keys past seqlen_k, and (top-left causal) keys after
// the query. Applied only to tiles that cross the diagonal or the key end.
#pragma once

#include <cmath>

#include "cuda/common/utils.cuh"

namespace jax_flash::cuda::fwd {

// Whether tile (rows [row0, row0+BM), cols [col0, col0+BN)) needs a mask.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ bool tile_needs_mask(int row0, int col0, int seqlen_k, bool causal) {
  return col0 + kBlockN > seqlen_k || (causal && col0 + kBlockN - 1 > row0);
}

// acc_s: MMA accumulator; coords: the same partition of an identity tensor
// over the (BM, BN) tile, giving each value's (row, col) inside the tile.
template <class TS, class TC>
__device__ __forceinline__ void apply_mask(TS& acc_s, TC const& coords, int row0, int col0,
                                           int seqlen_k, bool causal) {
#pragma unroll
  for (int i = 0; i < size(acc_s); ++i) {
    const int row = row0 + get<0>(coords(i));
    const int col = col0 + get<1>(coords(i));
    if (col >= seqlen_k || (causal && col > row)) acc_s(i) = -INFINITY;
  }
}

}  // namespace jax_flash::cuda::fwd
