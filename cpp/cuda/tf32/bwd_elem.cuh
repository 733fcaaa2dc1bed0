// The backward's element-wise step, shared by the dQ and the dK/dV kernels
// (which hold S and dP transposed to each other): raw s = q.k and dp = dO.v
// of one (query row, key) pair -> P (dropped and rescaled, the dV operand)
// and dS = P (keep dP / (1 - rate) - D) (1 - tanh^2), before the scale.
#pragma once

#include <cmath>

#include "cuda/common/variants.cuh"

namespace jax_flash::cuda::tf32 {

// lse (natural log) -> log2 units; a row that saw no key (-inf) gets +inf,
// so that exp2(l - lse2) = 0.
__device__ __forceinline__ float lse_to_log2(float l) {
  return l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
}

template <bool kGeneral>
__device__ __forceinline__ void probs_dscores(const Variant& var, float scale, float scale_log2,
                                              bool transform, bool mask, bool seg, int row, int col,
                                              int qid, float lse2, float dsum, bool keep, float& s,
                                              float& dp) {
  float dt = 1.f, l;
  if (kGeneral && transform) l = var.logit_log2(s, scale, row, col, dt);
  else l = s * scale_log2;
  const bool vis = !mask || var.visible(row, col, qid, seg);
  const float pr = vis ? exp2f(l - lse2) : 0.f;
  float dpv = dp, pd = pr;
  if constexpr (kGeneral) {
    if (var.dropout()) {
      dpv = keep ? dpv * var.keep_scale : 0.f;
      pd = keep ? pr * var.keep_scale : 0.f;
    }
  }
  s = pd;
  dp = pr * (dpv - dsum) * dt;
}

}  // namespace jax_flash::cuda::tf32
