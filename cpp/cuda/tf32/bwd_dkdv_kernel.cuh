// Float32 backward, dK and dV: one CTA of 4 warps per 64 keys (16 a warp)
// of one kv head, looping over the q heads of its group and the query tiles:
// S^T = K Q^T and dP^T = V dO^T (keys as rows), then dV += P^T dO and
// dK += dS^T Q with P^T and dS^T in registers as A operands. Head dim 256
// splits the dK / dV columns over two CTAs (kDC = 128 each: the two
// accumulators would not fit in registers), each recomputing S^T and dP^T.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/variants.cuh"
#include "cuda/tf32/bwd_dq_kernel.cuh"  // BwdArgs
#include "cuda/tf32/bwd_elem.cuh"
#include "cuda/tf32/mma.cuh"
#include "cuda/tf32/tile.cuh"
#include "dropout.h"
#include "params.h"

namespace jax_flash::cuda::tf32 {

template <int D>
struct DkdvShape {
  static constexpr int kN = 64;                  // keys per CTA
  static constexpr int kM = D >= 128 ? 32 : 64;  // query rows per tile
  static constexpr int kDC = D > 128 ? 128 : D;  // dK / dV columns per CTA
  static constexpr int kSplits = D / kDC;
  static constexpr int kThreads = 128;
  using TK = Tile<kN, D, kThreads>;
  using TQ = Tile<kM, D, kThreads>;
  static constexpr int kSmemBytes =
      int(sizeof(float)) * (2 * TK::kFloats + 2 * TQ::kFloats + 2 * kM);
};

template <int D, bool kGeneral>
__global__ void __launch_bounds__(128) bwd_dkdv_kernel(const __grid_constant__ BwdArgs args) {
  using Shape = DkdvShape<D>;
  constexpr int N = Shape::kN, M = Shape::kM, DC = Shape::kDC;
  using TK = typename Shape::TK;
  using TQ = typename Shape::TQ;
  constexpr int S = TK::kStride;
  constexpr int MT = M / 8, CT = DC / 8;

  extern __shared__ __align__(16) float smem[];
  float* sK = smem;
  float* sV = sK + TK::kFloats;
  float* sQ = sV + TK::kFloats;
  float* sdO = sQ + TQ::kFloats;
  float* sLse = sdO + TQ::kFloats;  // M raw lse values (natural log)
  float* sDsum = sLse + M;          // M values of D

  const BwdParams& p = args.p;
  const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wr = (tid / 32) * 16;
  const int nb = int(blockIdx.x) / Shape::kSplits;
  const int dc0 = (int(blockIdx.x) % Shape::kSplits) * DC;
  const int hkv = blockIdx.y, b = blockIdx.z;
  const int group = p.heads_q / p.heads_kv;
  const int n0 = nb * N;
  const int hd = p.head_dim;

  Variant var(p, b, hkv * group);
  int m_begin, m_end;
  var.template query_tiles<M>(n0, n0 + N - 1, m_begin, m_end);
  const Variant::SegRange k_rng = var.k_range(n0, N);
  const int nm = m_end > m_begin ? m_end - m_begin : 0;
  const int total = group * nm;
  // Next (q head, query tile) iteration after it, skipping query tiles whose
  // segment ids cannot meet this key tile's.
  auto next_it = [&](int it) {
    ++it;
    if (var.segments())
      for (; it < total; ++it)
        if (!Variant::disjoint(var.q_range((m_begin + it % nm) * M, M), k_rng)) break;
    return it;
  };

  const float* q = static_cast<const float*>(p.q);
  const float* dout = static_cast<const float*>(p.dout);
  auto issue = [&](int it) {
    const int h = hkv * group + it / nm;
    const int m0 = (m_begin + it % nm) * M;
    TQ::load(sQ, q + b * p.q_batch_stride + int64_t(m0) * p.q_row_stride + h * p.q_head_stride, p.q_row_stride,
             p.seqlen_q - m0, hd, args.vec, tid);
    TQ::load(sdO, dout + b * p.do_batch_stride + int64_t(m0) * p.do_row_stride + h * p.do_head_stride,
             p.do_row_stride, p.seqlen_q - m0, hd, args.vec, tid);
    const int64_t base = (int64_t(b) * p.heads_q + h) * p.seqlen_q + m0;
    for (int r = tid; r < M; r += Shape::kThreads) {
      const bool ok = m0 + r < p.seqlen_q;
      cp_async4(sLse + r, p.lse + (ok ? base + r : 0), ok);
      cp_async4(sDsum + r, args.dsum + (ok ? base + r : 0), ok);
    }
  };

  const int keys[2] = {n0 + wr + g, n0 + wr + g + 8};
  float acc_dk[CT][4], acc_dv[CT][4];
#pragma unroll
  for (int i = 0; i < CT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[i][e] = acc_dv[i][e] = 0.f;

  int it = next_it(-1);
  if (it < total) {
    const float* kg = static_cast<const float*>(p.k) + b * p.k_batch_stride + int64_t(n0) * p.k_row_stride +
                      hkv * p.k_head_stride;
    const float* vg = static_cast<const float*>(p.v) + b * p.v_batch_stride + int64_t(n0) * p.v_row_stride +
                      hkv * p.v_head_stride;
    TK::load(sK, kg, p.k_row_stride, p.seqlen_k - n0, hd, args.vec, tid);
    TK::load(sV, vg, p.v_row_stride, p.seqlen_k - n0, hd, args.vec, tid);
    issue(it);
    cp_async_commit();
  }
  bool first = true;
  while (it < total) {
    const int h = hkv * group + it / nm;
    const int m0 = (m_begin + it % nm) * M;
    cp_async_wait_all();
    if (first) {
      TK::round(sK, tid);
      TK::round(sV, tid);
    }
    first = false;
    TQ::round(sQ, tid);
    TQ::round(sdO, tid);
    __syncthreads();  // Q, dO, lse, D of this iteration landed
    if constexpr (kGeneral) var.set_head(h);
    bool transform = false;
    if constexpr (kGeneral) transform = var.transforms_logits();

    // S^T = K Q^T, dP^T = V dO^T: rows keys, columns queries.
    float st[MT][4], dpt[MT][4];
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[j][e] = dpt[j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D; kk += 8) {
      uint32_t ak[4], av[4];
      a_frag<S>(sK, wr, kk, g, t, ak);
      a_frag<S>(sV, wr, kk, g, t, av);
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        uint32_t bq[2], bd[2];
        b_frag_nk<S>(sQ, j * 8, kk, g, t, bq);
        b_frag_nk<S>(sdO, j * 8, kk, g, t, bd);
        mma(st[j], ak, bq);
        mma(dpt[j], av, bd);
      }
    }

    const Variant::SegRange q_rng = var.q_range(m0, M);
    const bool need_mask = var.tile_needs_mask(m0, M, n0, N, q_rng, k_rng);
    const bool seg = need_mask && var.tile_seg_check(q_rng, k_rng);
#pragma unroll
    for (int j = 0; j < MT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = keys[e >> 1];
        const int c = j * 8 + 2 * t + (e & 1);  // query row in the tile
        const int row = m0 + c;
        bool keep = true;
        if constexpr (kGeneral) {
          // One Philox call per element here (the rows of a call are the
          // columns of this transposed tile).
          if (var.dropout()) keep = dropout_keep(var.seed, b, h, row, key, var.drop_threshold);
        }
        probs_dscores<kGeneral>(var, p.scale, args.scale_log2, transform, need_mask, seg, row, key,
                                seg ? var.q_segment(row) : 0, lse_to_log2(sLse[c]), sDsum[c], keep,
                                st[j][e], dpt[j][e]);
      }
    }

    // dV += P^T dO, dK += dS^T Q over this CTA's columns [dc0, dc0 + DC).
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      uint32_t ap[4], as[4];
      a_from_acc(st[j], ap);
      a_from_acc(dpt[j], as);
#pragma unroll
      for (int i = 0; i < CT; ++i) {
        uint32_t bd[2], bq[2];
        b_from_rows<S>(sdO, j * 8, dc0 + i * 8, g, t, bd);
        b_from_rows<S>(sQ, j * 8, dc0 + i * 8, g, t, bq);
        mma(acc_dv[i], ap, bd);
        mma(acc_dk[i], as, bq);
      }
    }
    const int it_next = next_it(it);
    __syncthreads();  // everyone is done with Q, dO, lse, D
    if (it_next < total) issue(it_next);
    cp_async_commit();
    it = it_next;
  }
  cp_async_wait_all();

  float* dk = static_cast<float*>(p.dk) + b * p.dk_batch_stride + hkv * p.dk_head_stride;
  float* dv = static_cast<float*>(p.dv) + b * p.dv_batch_stride + hkv * p.dv_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = keys[r];
    if (key >= p.seqlen_k) continue;
    float* krow = dk + int64_t(key) * p.dk_row_stride;
    float* vrow = dv + int64_t(key) * p.dv_row_stride;
#pragma unroll
    for (int i = 0; i < CT; ++i) {
      const int c = dc0 + i * 8 + 2 * t;
      if (c < hd) {
        krow[c] = acc_dk[i][2 * r] * p.scale;
        vrow[c] = acc_dv[i][2 * r];
      }
      if (c + 1 < hd) {
        krow[c + 1] = acc_dk[i][2 * r + 1] * p.scale;
        vrow[c + 1] = acc_dv[i][2 * r + 1];
      }
    }
  }
}

}  // namespace jax_flash::cuda::tf32
