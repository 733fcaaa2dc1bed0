// Float32 backward, dQ: one CTA of 4 warps per 64 query rows (16 a warp),
// head and batch, looping over the key tiles: S = Q K^T and dP = dO V^T
// recomputed, dS in registers as the A operand of dQ += dS K. No atomics
// (the dK/dV kernel recomputes its own S), so the float32 backward is
// deterministic in either mode.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/variants.cuh"
#include "cuda/tf32/bwd_elem.cuh"
#include "cuda/tf32/mma.cuh"
#include "cuda/tf32/tile.cuh"
#include "params.h"

namespace jax_flash::cuda::tf32 {

struct BwdArgs {
  BwdParams p;
  const float* dsum;  // D = rowsum(dO * O), [batch, heads_q, seqlen_q]
  float scale_log2;
  bool vec;           // 16 B copies legal for q, k, v, dout
};

template <int D>
struct DqShape {
  static constexpr int kM = 64;                  // query rows per CTA
  static constexpr int kN = D >= 128 ? 32 : 64;  // keys per tile
  static constexpr int kThreads = 128;
  using TQ = Tile<kM, D, kThreads>;
  using TK = Tile<kN, D, kThreads>;
  static constexpr int kSmemBytes = int(sizeof(float)) * (2 * TQ::kFloats + 2 * TK::kFloats);
};

template <int D, bool kGeneral>
__global__ void __launch_bounds__(128) bwd_dq_kernel(const __grid_constant__ BwdArgs args) {
  using Shape = DqShape<D>;
  constexpr int M = Shape::kM, N = Shape::kN;
  using TQ = typename Shape::TQ;
  using TK = typename Shape::TK;
  constexpr int S = TQ::kStride;
  constexpr int NT = N / 8, DT = D / 8;

  extern __shared__ __align__(16) float smem[];
  float* sQ = smem;
  float* sdO = sQ + TQ::kFloats;
  float* sK = sdO + TQ::kFloats;
  float* sV = sK + TK::kFloats;

  const BwdParams& p = args.p;
  const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wr = (tid / 32) * 16;
  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z;
  const int hkv = h / (p.heads_q / p.heads_kv);
  const int m0 = m_block * M;
  const int hd = p.head_dim;

  const Variant var(p, b, h);
  int lo, hi;
  var.template key_tiles<N>(m0, m0 + M - 1, lo, hi);
  const Variant::SegRange q_rng = var.q_range(m0, M);
  auto next_tile = [&](int n) {
    ++n;
    if (var.segments())
      for (; n < hi; ++n)
        if (!Variant::disjoint(q_rng, var.k_range(n * N, N))) break;
    return n;
  };

  const float* k = static_cast<const float*>(p.k) + b * p.k_batch_stride + hkv * p.k_head_stride;
  const float* v = static_cast<const float*>(p.v) + b * p.v_batch_stride + hkv * p.v_head_stride;

  const int rows[2] = {m0 + wr + g, m0 + wr + g + 8};
  float lse2[2], dsr[2];
  int qid[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t idx = (int64_t(b) * p.heads_q + h) * p.seqlen_q + rows[r];
    const bool ok = rows[r] < p.seqlen_q;
    lse2[r] = ok ? lse_to_log2(p.lse[idx]) : INFINITY;
    dsr[r] = ok ? args.dsum[idx] : 0.f;
    qid[r] = var.q_segment(rows[r]);
  }
  float acc[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  bool transform = false;
  if constexpr (kGeneral) transform = var.transforms_logits();

  int n = next_tile(lo - 1);
  if (n < hi) {
    const float* qg = static_cast<const float*>(p.q) + b * p.q_batch_stride + int64_t(m0) * p.q_row_stride +
                      h * p.q_head_stride;
    const float* dg = static_cast<const float*>(p.dout) + b * p.do_batch_stride +
                      int64_t(m0) * p.do_row_stride + h * p.do_head_stride;
    TQ::load(sQ, qg, p.q_row_stride, p.seqlen_q - m0, hd, args.vec, tid);
    TQ::load(sdO, dg, p.do_row_stride, p.seqlen_q - m0, hd, args.vec, tid);
    TK::load(sK, k + int64_t(n) * N * p.k_row_stride, p.k_row_stride, p.seqlen_k - n * N, hd, args.vec, tid);
    TK::load(sV, v + int64_t(n) * N * p.v_row_stride, p.v_row_stride, p.seqlen_k - n * N, hd, args.vec, tid);
    cp_async_commit();
  }
  bool first = true;
  while (n < hi) {
    const int col0 = n * N;
    cp_async_wait_all();
    if (first) {
      TQ::round(sQ, tid);
      TQ::round(sdO, tid);
    }
    first = false;
    TK::round(sK, tid);
    TK::round(sV, tid);
    __syncthreads();  // K(n), V(n) landed

    float s[NT][4], dp[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D; kk += 8) {
      uint32_t aq[4], ad[4];
      a_frag<S>(sQ, wr, kk, g, t, aq);
      a_frag<S>(sdO, wr, kk, g, t, ad);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        uint32_t bk[2], bv[2];
        b_frag_nk<S>(sK, j * 8, kk, g, t, bk);
        b_frag_nk<S>(sV, j * 8, kk, g, t, bv);
        mma(s[j], aq, bk);
        mma(dp[j], ad, bv);
      }
    }
    const int n_next = next_tile(n);
    __syncthreads();  // everyone is done with V(n)
    if (n_next < hi)
      TK::load(sV, v + int64_t(n_next) * N * p.v_row_stride, p.v_row_stride, p.seqlen_k - n_next * N, hd,
               args.vec, tid);
    cp_async_commit();

    const Variant::SegRange k_rng = var.k_range(col0, N);
    const bool need_mask = var.tile_needs_mask(m0, M, col0, N, q_rng, k_rng);
    const bool seg = need_mask && var.tile_seg_check(q_rng, k_rng);
#pragma unroll
    for (int j = 0; j < NT; j += 2) {
      bool kb[8] = {true, true, true, true, true, true, true, true};
      if constexpr (kGeneral) {
        if (var.dropout()) var.keep_oct(rows[0], col0 + j * 8 + 2 * t, col0 + (j + 1) * 8 + 2 * t, kb);
      }
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, col = col0 + (j + jj) * 8 + 2 * t + (e & 1);
          probs_dscores<kGeneral>(var, p.scale, args.scale_log2, transform, need_mask, seg, rows[r], col,
                                  qid[r], lse2[r], dsr[r], kb[4 * jj + e], s[j + jj][e], dp[j + jj][e]);
        }
      }
    }

    // dQ += dS K (dS: dp's accumulator tiles as A operands).
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      uint32_t a[4];
      a_from_acc(dp[j], a);
#pragma unroll
      for (int i = 0; i < DT; ++i) {
        uint32_t bb[2];
        b_from_rows<S>(sK, j * 8, i * 8, g, t, bb);
        mma(acc[i], a, bb);
      }
    }
    __syncthreads();  // everyone is done with K(n)
    if (n_next < hi)
      TK::load(sK, k + int64_t(n_next) * N * p.k_row_stride, p.k_row_stride, p.seqlen_k - n_next * N, hd,
               args.vec, tid);
    cp_async_commit();
    n = n_next;
  }
  cp_async_wait_all();

  float* dq = static_cast<float*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = rows[r];
    if (row >= p.seqlen_q) continue;
    float* out = dq + int64_t(row) * p.dq_row_stride;
#pragma unroll
    for (int i = 0; i < DT; ++i) {
      const int c = i * 8 + 2 * t;
      if (c < hd) out[c] = acc[i][2 * r] * p.scale;
      if (c + 1 < hd) out[c + 1] = acc[i][2 * r + 1] * p.scale;
    }
  }
}

}  // namespace jax_flash::cuda::tf32
