// Float32 forward on TF32 tensor cores (mma.sync m16n8k8: sm_80 and newer),
// FlashAttention-2 order: one CTA of 4 warps per 64 query rows (16 a warp),
// head and batch; key tiles stream through shared memory from the last one
// down (the masked tiles first), V(j) loading while S = Q K(j)^T runs and
// K(j - 1) while the softmax and O += P V(j) run. Every option goes through
// the Variant policy (cuda/common/variants.cuh); kGeneral adds the soft-cap / ALiBi
// logits and dropout, which the masks-only kernel compiles out.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/variants.cuh"
#include "cuda/tf32/mma.cuh"
#include "cuda/tf32/tile.cuh"
#include "params.h"

namespace jax_flash::cuda::tf32 {

struct FwdArgs {
  FwdParams p;
  float scale_log2;  // scale * log2(e)
  bool vec;          // 16 B copies legal for q, k, v
};

template <int D>
struct FwdShape {
  static constexpr int kM = 64;                   // query rows per CTA
  static constexpr int kN = D >= 256 ? 32 : 64;   // keys per tile
  static constexpr int kThreads = 128;
  using TQ = Tile<kM, D, kThreads>;
  using TK = Tile<kN, D, kThreads>;
  static constexpr int kSmemBytes = int(sizeof(float)) * (TQ::kFloats + 2 * TK::kFloats);
};

template <int D, bool kGeneral>
__global__ void __launch_bounds__(128, 2) fwd_kernel(const __grid_constant__ FwdArgs args) {
  using Shape = FwdShape<D>;
  constexpr int M = Shape::kM, N = Shape::kN;
  using TQ = typename Shape::TQ;
  using TK = typename Shape::TK;
  constexpr int S = TQ::kStride;
  constexpr int NT = N / 8, DT = D / 8;

  extern __shared__ __align__(16) float smem[];
  float* sQ = smem;
  float* sK = sQ + TQ::kFloats;
  float* sV = sK + TK::kFloats;

  const FwdParams& p = args.p;
  const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wr = (tid / 32) * 16;  // the warp's first row in the tile
  // Last query tile first: with a causal mask it visits the most key tiles.
  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x);
  const int head = blockIdx.y, batch = blockIdx.z;
  const int head_kv = head / (p.heads_q / p.heads_kv);
  const int row0 = m_block * M;
  const int hd = p.head_dim;

  const Variant var(p, batch, head);
  int lo, hi;
  var.template key_tiles<N>(row0, row0 + M - 1, lo, hi);
  const Variant::SegRange q_rng = var.q_range(row0, M);
  // Next key tile below n (lo - 1 when none), skipping tiles whose segment
  // ids cannot meet this query tile's.
  auto prev_tile = [&](int n) {
    --n;
    if (var.segments())
      for (; n >= lo; --n)
        if (!Variant::disjoint(q_rng, var.k_range(n * N, N))) break;
    return n;
  };

  const float* q = static_cast<const float*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const float* k = static_cast<const float*>(p.k) + batch * p.k_batch_stride + head_kv * p.k_head_stride;
  const float* v = static_cast<const float*>(p.v) + batch * p.v_batch_stride + head_kv * p.v_head_stride;

  const int rows[2] = {row0 + wr + g, row0 + wr + g + 8};
  float acc_o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) acc_o[i][0] = acc_o[i][1] = acc_o[i][2] = acc_o[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  bool transform = false;
  if constexpr (kGeneral) transform = var.transforms_logits();

  int n = prev_tile(hi);
  if (n >= lo) {
    TQ::load(sQ, q + int64_t(row0) * p.q_row_stride, p.q_row_stride, p.seqlen_q - row0, hd, args.vec, tid);
    TK::load(sK, k + int64_t(n) * N * p.k_row_stride, p.k_row_stride, p.seqlen_k - n * N, hd, args.vec, tid);
    cp_async_commit();
  }
  bool first = true;
  while (n >= lo) {
    const int col0 = n * N;
    cp_async_wait_all();
    if (first) TQ::round(sQ, tid);
    first = false;
    TK::round(sK, tid);
    __syncthreads();  // K(n) landed; everyone is done with V(n + 1)
    TK::load(sV, v + int64_t(col0) * p.v_row_stride, p.v_row_stride, p.seqlen_k - col0, hd, args.vec, tid);
    cp_async_commit();

    float s[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D; kk += 8) {
      uint32_t a[4];
      a_frag<S>(sQ, wr, kk, g, t, a);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        uint32_t b[2];
        b_frag_nk<S>(sK, j * 8, kk, g, t, b);
        mma(s[j], a, b);
      }
    }
    const int n_next = prev_tile(n);

    // Scores -> logits in log2 units, masked to -inf.
    const Variant::SegRange k_rng = var.k_range(col0, N);
    const bool need_mask = var.tile_needs_mask(row0, M, col0, N, q_rng, k_rng);
    const bool seg = need_mask && var.tile_seg_check(q_rng, k_rng);
    int qid[2] = {0, 0};
    if (seg) {
      qid[0] = var.q_segment(rows[0]);
      qid[1] = var.q_segment(rows[1]);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, col = col0 + j * 8 + 2 * t + (e & 1);
        float l;
        if (transform) {
          float dt;
          l = var.logit_log2(s[j][e], p.scale, rows[r], col, dt);
        } else {
          l = s[j][e] * args.scale_log2;
        }
        if (need_mask && !var.visible(rows[r], col, qid[r], seg)) l = -INFINITY;
        s[j][e] = l;
      }
    }

    cp_async_wait_all();
    TK::round(sV, tid);
    __syncthreads();  // V(n) landed; everyone is done with K(n)
    if (n_next >= lo) {
      TK::load(sK, k + int64_t(n_next) * N * p.k_row_stride, p.k_row_stride, p.seqlen_k - n_next * N,
               hd, args.vec, tid);
      cp_async_commit();
    }

    // Online softmax (rows g and g + 8 of the warp's 16).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = row_max[r];
#pragma unroll
      for (int j = 0; j < NT; ++j) m = fmaxf(m, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
      m = quad_max(m);
      // A row that has seen no key yet keeps -inf: subtract 0 (exp2(-inf) = 0).
      const float corr = m == -INFINITY ? 1.f : exp2f(row_max[r] - m);
      const float sub = m == -INFINITY ? 0.f : m;
      row_max[r] = m;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        s[j][2 * r] = exp2f(s[j][2 * r] - sub);
        s[j][2 * r + 1] = exp2f(s[j][2 * r + 1] - sub);
        sum += s[j][2 * r] + s[j][2 * r + 1];
      }
      row_sum[r] = row_sum[r] * corr + sum;
#pragma unroll
      for (int i = 0; i < DT; ++i) {
        acc_o[i][2 * r] *= corr;
        acc_o[i][2 * r + 1] *= corr;
      }
    }
    if constexpr (kGeneral) {
      // Dropout of P after the (undropped) row sums; 1 / (1 - rate) at the end.
      if (var.dropout()) {
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
          bool kb[8];
          var.keep_oct(rows[0], col0 + j * 8 + 2 * t, col0 + (j + 1) * 8 + 2 * t, kb);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (!kb[e]) s[j][e] = 0.f;
            if (!kb[4 + e]) s[j + 1][e] = 0.f;
          }
        }
      }
    }

    // O += P V: P's accumulator tiles are the A operands (mma.cuh).
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      uint32_t a[4];
      a_from_acc(s[j], a);
#pragma unroll
      for (int i = 0; i < DT; ++i) {
        uint32_t b[2];
        b_from_rows<S>(sV, j * 8, i * 8, g, t, b);
        mma(acc_o[i], a, b);
      }
    }
    n = n_next;
  }
  cp_async_wait_all();

  // o = acc / rowsum (0 for a row that saw no key), lse natural log.
  float keep_scale = 1.f;
  if constexpr (kGeneral) keep_scale = var.dropout() ? var.keep_scale : 1.f;
  float* o = static_cast<float*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(row_sum[r]);
    const bool empty = !(sum > 0.f);
    const float f = empty ? 0.f : keep_scale / sum;
    const int row = rows[r];
    if (row >= p.seqlen_q) continue;
    float* orow = o + int64_t(row) * p.o_row_stride;
#pragma unroll
    for (int i = 0; i < DT; ++i) {
      const int c = i * 8 + 2 * t;
      if (c < hd) orow[c] = acc_o[i][2 * r] * f;
      if (c + 1 < hd) orow[c + 1] = acc_o[i][2 * r + 1] * f;
    }
    if (t == 0)
      p.lse[(int64_t(batch) * p.heads_q + head) * p.seqlen_q + row] =
          empty ? -INFINITY : (row_max[r] + log2f(sum)) * 0.6931471805599453f;
  }
}

}  // namespace jax_flash::cuda::tf32
