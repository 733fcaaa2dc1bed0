// Online softmax over the rows of an S tile held in SM80 MMA accumulators.
// Scores arrive raw; scale * log2(e) is fused into the exp2 (FFMA). The output accumulator stays unnormalised until finalize().
#pragma once

#include <cmath>

#include "cuda/utils.cuh"

namespace jax_flash::cuda::fwd {

template <int kRows>
struct OnlineSoftmax {
  float row_max[kRows];  // running max of the raw scores (-inf: nothing seen yet)
  float row_sum[kRows];  // per-thread partial sums (quad-reduced in finalize)

  __device__ __forceinline__ OnlineSoftmax() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // acc_s: raw masked scores of one K tile -> overwritten with
  // P = exp2(s * scale_log2 - max * scale_log2) (scale_log2 > 0).
  // acc_o: rescaled by exp2((old_max - new_max) * scale_log2).
  template <class TS, class TO>
  __device__ __forceinline__ void update(TS& acc_s, TO& acc_o, float scale_log2) {
    Tensor s = make_tensor(acc_s.data(), acc_rowcol_layout(acc_s.layout()));
    Tensor o = make_tensor(acc_o.data(), acc_rowcol_layout(acc_o.layout()));
    static_assert(decltype(size<0>(s))::value == kRows);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float m = row_max[r];
#pragma unroll
      for (int c = 0; c < size<1>(s); ++c) m = fmaxf(m, s(r, c));
      m = quad_allreduce(m, MaxOp{});
      // A row with every score masked so far keeps max -inf; subtract 0 then,
      // so that exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.
      const float m_sub = (m == -INFINITY) ? 0.f : m * scale_log2;
      const float corr = exp2f(row_max[r] * scale_log2 - m_sub);
      row_max[r] = m;
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < size<1>(s); ++c) {
        const float pv = exp2f(s(r, c) * scale_log2 - m_sub);
        s(r, c) = pv;
        sum += pv;
      }
      row_sum[r] = row_sum[r] * corr + sum;
#pragma unroll
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= corr;
    }
  }

  // Normalise acc_o by the row sums; lse[r] gets the natural-log LSE
  // (-inf for a row that saw no key, whose output is then 0).
  template <class TO>
  __device__ __forceinline__ void finalize(TO& acc_o, float (&lse)[kRows], float scale_log2) {
    Tensor o = make_tensor(acc_o.data(), acc_rowcol_layout(acc_o.layout()));
    constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float sum = quad_allreduce(row_sum[r], SumOp{});
      const bool empty = !(sum > 0.f);  // 0 or NaN
      const float inv = empty ? 0.f : 1.f / sum;
      lse[r] = empty ? -INFINITY : row_max[r] * scale_log2 * kLn2 + logf(sum);
#pragma unroll
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= inv;
    }
  }
};

}  // namespace jax_flash::cuda::fwd
