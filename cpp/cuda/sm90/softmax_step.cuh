// The Hopper forwards' online-softmax step over a wgmma S accumulator, split
// from the O rescale so that the rescale can wait for the P V wgmma of the
// previous tile (in flight while this runs).
#pragma once

#include <cute/tensor.hpp>

#include "cuda/common/softmax.cuh"
#include "cuda/common/utils.cuh"

namespace jax_flash::cuda::fwd {

// Online softmax of one S tile that leaves O alone: P overwrites the raw
// scores, corr[r] gets the factor by which O must be rescaled (once the
// P V wgmma of the previous tile, in flight meanwhile, has landed); the
// return value says whether any row of the warp moved its max (else
// corr is all 1 and the rescale is skipped; OnlineSoftmax::kMaxSlackLog2).
// kShift / shift: as OnlineSoftmax::update.
template <bool kShift = false, int kRows, bool kLazy, class TS>
__device__ __forceinline__ bool softmax_step(OnlineSoftmax<kRows, kLazy>& sm, TS& acc_s, float (&corr)[kRows],
                                             float scale_log2, float shift = 0.f) {
  Tensor s = make_tensor(acc_s.data(), acc_rowcol_layout(acc_s.layout()));
  static_assert(decltype(size<0>(s))::value == kRows);
  bool moved = false;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float m = sm.template row_max_with<kShift>(s, r, shift);
    corr[r] = sm.advance(r, quad_allreduce(m, MaxOp{}), scale_log2, moved);
    const float sum = sm.exp2_row(s, r, scale_log2, sm.template max_sub<kShift>(r, scale_log2, shift));
    sm.row_sum[r] = sm.row_sum[r] * corr[r] + sum;
  }
  if constexpr (kLazy) return __any_sync(0xffffffffu, moved);
  else return true;
}

template <int kRows, class TO>
__device__ __forceinline__ void rescale_rows(TO& acc_o, float const (&corr)[kRows], bool moved) {
  if (!moved) return;  // warp-uniform
  Tensor o = make_tensor(acc_o.data(), acc_rowcol_layout(acc_o.layout()));
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int c = 0; c < size<1>(o); ++c) o(r, c) *= corr[r];
  }
}

}  // namespace jax_flash::cuda::fwd
