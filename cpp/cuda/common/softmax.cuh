// Online softmax over the rows of an S tile held in SM80 MMA accumulators
// (the Hopper forward runs it on wgmma accumulators: sm90/softmax_step.cuh).
// Scores arrive raw; scale * log2(e) is fused into the exp2 (FFMA). The output accumulator stays unnormalised until finalize().
#pragma once

#include <cmath>

#include "cuda/common/utils.cuh"

namespace jax_flash::cuda::fwd {

// kLazy: O is rescaled only when a row's max rises by more than
// kMaxSlackLog2 (below); else on every tile, as the SM80 kernels and the
// Hopper d64 forward do (there the vote and branch cost spills in the loop
// and measured 2-6% slower; benchmarks/NOTES.md).
template <int kRows, bool kLazy = false>
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

  // kLazy: a row's running max moves only when a tile raises it by more than
  // kMaxSlackLog2 (exp2 units). Until then P = exp2(s - max) stays below
  // 2^8, far inside the 16-bit range (relative precision does not depend on
  // magnitude), and O needs no rescale: a warp whose rows all keep their max
  // skips the O multiply (a uniform branch). The LSE uses the max the sums
  // were taken against, so it is exact either way.
  static constexpr float kMaxSlackLog2 = 8.f;

  // Row r's running max after a tile whose quad-reduced max (including the
  // running one) is m; returns O's factor for the row (1 when it stays) and
  // sets moved when it changed. Every score masked so far keeps max -inf
  // ((-inf - -inf) is NaN: no move).
  __device__ __forceinline__ float advance(int r, float m, float scale_log2, bool& moved) {
    const float old = row_max[r];
    if constexpr (kLazy) {
      const bool move = (m - old) * scale_log2 > kMaxSlackLog2;
      moved |= move;
      if (move) row_max[r] = m;
      return move ? exp2f(old * scale_log2 - m * scale_log2) : 1.f;
    } else {
      row_max[r] = m;
      moved = true;
      return exp2f(old * scale_log2 - max_sub(r, scale_log2));
    }
  }

  // Row r of s (a row-column view) -> P = exp2(s * scale_log2 - m_sub), in
  // place; returns the row's sum (this thread's part).
  template <class TS>
  static __device__ __forceinline__ float exp2_row(TS& s, int r, float scale_log2, float m_sub) {
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < size<1>(s); ++c) {
      const float pv = exp2f(s(r, c) * scale_log2 - m_sub);
      s(r, c) = pv;
      sum += pv;
    }
    return sum;
  }

  // The value subtracted inside exp2 for row r: 0 while the row has seen no
  // key, so that exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.
  __device__ __forceinline__ float max_sub(int r, float scale_log2) const {
    return row_max[r] == -INFINITY ? 0.f : row_max[r] * scale_log2;
  }
  // The same for scores held as s + shift (kShift; row_max_with).
  template <bool kShift>
  __device__ __forceinline__ float max_sub(int r, float scale_log2, float shift) const {
    return kShift ? max_sub(r, scale_log2) - shift * scale_log2 : max_sub(r, scale_log2);
  }

  // This thread's max of row r of s, with the running max: kShift adds
  // shift to every score of the thread first (scores held relative to a
  // per-thread offset, e.g. ALiBi in distance units).
  template <bool kShift, class TS>
  __device__ __forceinline__ float row_max_with(TS const& s, int r, float shift) const {
    float m = kShift ? -INFINITY : row_max[r];
#pragma unroll
    for (int c = 0; c < size<1>(s); ++c) m = fmaxf(m, s(r, c));
    if constexpr (kShift) m = fmaxf(row_max[r], m + shift);
    return m;
  }

  // acc_s: raw masked scores of one K tile -> overwritten with
  // P = exp2(s * scale_log2 - max * scale_log2) (scale_log2 > 0).
  // acc_o: rescaled by exp2((old_max - new_max) * scale_log2) (kLazy: only
  // in warps where a row's max moved).
  // kShift: the scores are s + shift (shift: this thread's, the same for
  // all its values); P = exp2((s + shift - max) * scale_log2).
  template <bool kShift = false, class TS, class TO>
  __device__ __forceinline__ void update(TS& acc_s, TO& acc_o, float scale_log2, float shift = 0.f) {
    Tensor s = make_tensor(acc_s.data(), acc_rowcol_layout(acc_s.layout()));
    Tensor o = make_tensor(acc_o.data(), acc_rowcol_layout(acc_o.layout()));
    static_assert(decltype(size<0>(s))::value == kRows);
    float corr[kRows];
    bool moved = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float m = row_max_with<kShift>(s, r, shift);
      corr[r] = advance(r, quad_allreduce(m, MaxOp{}), scale_log2, moved);
      const float sum = exp2_row(s, r, scale_log2, max_sub<kShift>(r, scale_log2, shift));
      row_sum[r] = row_sum[r] * corr[r] + sum;
      if constexpr (!kLazy) {
#pragma unroll
        for (int c = 0; c < size<1>(o); ++c) o(r, c) *= corr[r];
      }
    }
    if constexpr (kLazy) {
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int c = 0; c < size<1>(o); ++c) o(r, c) *= corr[r];
        }
      }
    }
  }

  // A fixed stabiliser instead of the running max, for scores bounded
  // above and below (soft-cap alone: tanh in [-1, 1]): every row's max is
  // set once to m, P = exp2(s * scale_log2 - m * scale_log2), and O is never
  // rescaled. No max pass, no quad reduction and no vote per tile. The
  // caller keeps s * scale_log2 - m * scale_log2 within [-126, 24] for every
  // score (no P underflows, none can overflow the sums); the LSE in
  // finalize() is exact as with the running max.
  __device__ __forceinline__ void fix_max(float m) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) row_max[r] = m;
  }
  template <class TS>
  __device__ __forceinline__ void update_fixed(TS& acc_s, float scale_log2) {
    Tensor s = make_tensor(acc_s.data(), acc_rowcol_layout(acc_s.layout()));
    static_assert(decltype(size<0>(s))::value == kRows);
#pragma unroll
    for (int r = 0; r < kRows; ++r) row_sum[r] += exp2_row(s, r, scale_log2, row_max[r] * scale_log2);
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
