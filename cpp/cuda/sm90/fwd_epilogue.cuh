// Epilogue of the warp-specialised Hopper forward: the normalised O tile of
// one consumer warpgroup, written from registers (column pairs, rows past
// seqlen_q and columns past head_dim dropped), and its rows' LSE.
#pragma once

#include <cute/tensor.hpp>

#include "cuda/utils.cuh"
#include "params.h"

namespace jax_flash::cuda::sm90 {

using namespace cute;

// acc_o: the normalised accumulator; tOc: its (row, col) in the query tile;
// lse: per accumulator row (rows of the rowcol view).
template <class Element, int kRows, class TO, class TC>
__device__ __forceinline__ void store_o_lse(const FwdParams& p, TO const& acc_o, TC const& tOc, const float (&lse)[kRows],
                                            int row0, int head, int batch) {
  Tensor rO = fwd::convert_regs<Element>(acc_o);
  Tensor o = make_tensor(rO.data(), fwd::acc_rowcol_layout(rO.layout()));
  Tensor c = make_tensor(tOc.data(), fwd::acc_rowcol_layout(tOc.layout()));
  static_assert(decltype(size<0>(o))::value == kRows);
  Element* o_base = static_cast<Element*>(p.o) + int64_t(batch) * p.o_batch_stride + int64_t(head) * p.o_head_stride;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int row = row0 + get<0>(c(r, 0));
    if (row >= p.seqlen_q) continue;
    Element* o_row = o_base + int64_t(row) * p.o_row_stride;
#pragma unroll
    for (int j = 0; j < size<1>(o); j += 2) {  // (j, j + 1): adjacent columns, adjacent registers
      const int col = get<1>(c(r, j));
      if (col < p.head_dim) *reinterpret_cast<uint32_t*>(o_row + col) = *reinterpret_cast<const uint32_t*>(&o(r, j));
    }
  }
  // Lanes with column 0 own their rows' LSE.
  if (get<1>(c(0, 0)) == 0) {
    float* lse_row = p.lse + (int64_t(batch) * p.heads_q + head) * int64_t(p.seqlen_q);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = row0 + get<0>(c(r, 0));
      if (row < p.seqlen_q) lse_row[row] = lse[r];
    }
  }
}

}  // namespace jax_flash::cuda::sm90
