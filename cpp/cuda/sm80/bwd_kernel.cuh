// Backward kernels (FlashAttention-2 algorithm 2 on SM80 mma.sync):
//   bwd_dkdv_kernel        per key tile: loops over the q heads of its kv
//                          group and the query tiles; dK, dV in registers;
//                          optionally dQ += dS K through fp32 atomics
//   bwd_dq_kernel          deterministic dQ: per query tile, loops over keys
// The row passes around them (D = rowsum(dO * O) before, the dQ convert
// after) serve the Hopper backward too: common/bwd_rows.cuh.
#pragma once

#include <cmath>

#include "cuda/common/bwd_rows.cuh"  // lse_to_log2, kLog2e
#include "cuda/common/variants.cuh"
#include "cuda/sm80/bwd_common.cuh"

namespace jax_flash::cuda::bwd {

// No variants: an empty stand-in for cuda::Variant.
struct NoVariantBwd {
  __device__ __forceinline__ NoVariantBwd(const FwdParams&, int, int) {}
};

// ---------------------------------------------------------------------------
// S (fp32, in place) -> P = exp2(S * scale * log2e - lse * log2e), zero where
// masked. lse2(r) returns the row's lse in log2 units (+inf for rows that
// must not contribute). row0/col0: global index of the tile's first row/col.
template <class Acc, class Coords, class Lse2>
__device__ __forceinline__ void scores_to_probs(Acc& s, Coords const& cs, Lse2 const& lse2,
                                                float scale_log2, bool mask, bool causal,
                                                int row0, int col0, int seqlen_k) {
  Tensor srr = make_tensor(s.data(), rowcol(s.layout()));
  Tensor crr = make_tensor(cs.data(), rowcol(cs.layout()));
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(srr); ++mi) {
    const int r = get<0>(crr(mi, 0));
    const float l2 = lse2(mi, r);
    if (!mask) {
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(srr); ++ni) srr(mi, ni) = exp2f(srr(mi, ni) * scale_log2 - l2);
    } else {
      const int row = row0 + r;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(srr); ++ni) {
        const int col = col0 + get<1>(crr(mi, ni));
        const bool keep = col < seqlen_k && (!causal || col <= row);
        srr(mi, ni) = keep ? exp2f(srr(mi, ni) * scale_log2 - l2) : 0.f;
      }
    }
  }
}

// Masks-only variants: S -> P like scores_to_probs, with the Variant's
// visibility (band, lengths: 32-bit tile-relative tests; segment ids only
// where the tile's ids are not one) on tiles that need element masks.
template <class Acc, class Coords, class Lse2, class Qid>
__device__ __forceinline__ void variant_mask_probs(Acc& s, Coords const& cs, const Variant& var,
                                                   Lse2 const& lse2, float scale_log2, bool mask,
                                                   bool seg, int row0, int col0, Qid const& qid) {
  Tensor srr = make_tensor(s.data(), rowcol(s.layout()));
  Tensor crr = make_tensor(cs.data(), rowcol(cs.layout()));
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(srr); ++mi) {
    const int r = get<0>(crr(mi, 0));
    const float l2 = lse2(mi, r);
    if (!mask) {
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(srr); ++ni) srr(mi, ni) = exp2f(srr(mi, ni) * scale_log2 - l2);
    } else {
      const Variant::TileMask tm = var.tile_mask(row0, col0);
      const int id = seg ? qid(mi, row0 + r) : 0;
      CUTE_UNROLL
      for (int ni = 0; ni < size<1>(srr); ++ni) {
        const int c = get<1>(crr(mi, ni));
        bool keep = tm(r, c);
        if (seg) keep = keep && var.kv_id_is(col0 + c, id);
        srr(mi, ni) = keep ? exp2f(srr(mi, ni) * scale_log2 - l2) : 0.f;
      }
    }
  }
}

// dP (in place) -> dS = P * (dP - D).
template <class AccP, class AccdP, class Coords, class Dsum>
__device__ __forceinline__ void probs_to_dscores(AccP const& pr, AccdP& dp, Coords const& cs,
                                                 Dsum const& dsum) {
  Tensor prr = make_tensor(pr.data(), rowcol(pr.layout()));
  Tensor drr = make_tensor(dp.data(), rowcol(dp.layout()));
  Tensor crr = make_tensor(cs.data(), rowcol(cs.layout()));
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(drr); ++mi) {
    const float d = dsum(mi, get<0>(crr(mi, 0)));
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(drr); ++ni) drr(mi, ni) = prr(mi, ni) * (drr(mi, ni) - d);
  }
}

// Variants: raw S = Q K^T and raw dP = dO V^T (both fp32, in place) ->
//   s  <- P~ = keep * P / (1 - rate)  (P itself without dropout), for dV
//   dp <- dS = P * (keep * dP / (1 - rate) - D) * (1 - tanh^2)   (soft-cap)
// where P = exp2(logit2 - lse2) on visible elements, 0 elsewhere. dQ and dK
// are scale * dS K and scale * dS^T Q (the scale is applied by the caller).
// kTransform: soft-cap / ALiBi present (logits element by element); else the
// plain kernels' exp2(S * scale_log2 - lse2).
template <bool kTransform, class Acc, class AccdP, class Coords, class Lse2, class Dsum, class Qid>
__device__ __forceinline__ void variant_probs_dscores(Acc& s, AccdP& dp, Coords const& cs,
                                                      const Variant& var, float scale,
                                                      float scale_log2, bool mask, bool seg,
                                                      int row0, int col0, Lse2 const& lse2,
                                                      Dsum const& dsum, Qid const& qid) {
  Tensor srr = make_tensor(s.data(), rowcol(s.layout()));
  Tensor drr = make_tensor(dp.data(), rowcol(dp.layout()));
  Tensor crr = make_tensor(cs.data(), rowcol(cs.layout()));
  // Row-col rows 2m, 2m + 1 are rows r, r + 8 of one MMA tile (keep_oct).
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(srr); mi += 2) {
    int row[2], id[2];
    float l2[2], d[2];
    CUTE_UNROLL
    for (int e = 0; e < 2; ++e) {
      const int r = get<0>(crr(mi + e, 0));
      row[e] = row0 + r;
      l2[e] = lse2(mi + e, r);
      d[e] = dsum(mi + e, r);
      id[e] = (mask && seg) ? qid(mi + e, row[e]) : 0;
    }
    // Two MMA tiles' column pairs (ni, ni + 2) a step: one keep_oct call.
    static_assert(decltype(size<1>(srr))::value % 4 == 0);
    CUTE_UNROLL
    for (int n4 = 0; n4 < size<1>(srr); n4 += 4) {
      bool k[8] = {true, true, true, true, true, true, true, true};
      if (var.dropout()) var.keep_oct(row[0], col0 + get<1>(crr(mi, n4)), col0 + get<1>(crr(mi, n4 + 2)), k);
      CUTE_UNROLL
      for (int e8 = 0; e8 < 8; ++e8) {
        const int ni = n4 + 2 * (e8 >> 2), er = (e8 >> 1) & 1, ec = e8 & 1;
        const int col = col0 + get<1>(crr(mi, ni));
        float& sv = srr(mi + er, ni + ec);
        float& dv = drr(mi + er, ni + ec);
        float dt = 1.f;
        float l;
        if constexpr (kTransform) {
          l = var.logit_log2(sv, scale, row[er], col + ec, dt);
        } else {
          l = sv * scale_log2;
        }
        const bool vis = !mask || var.visible(row[er], col + ec, id[er], seg);
        const float pr = vis ? exp2f(l - l2[er]) : 0.f;
        float dpv = dv, pd = pr;
        if (var.dropout()) {
          dpv = k[e8] ? dpv * var.keep_scale : 0.f;
          pd = k[e8] ? pr * var.keep_scale : 0.f;
        }
        sv = pd;
        dv = kTransform ? pr * (dpv - d[er]) * dt : pr * (dpv - d[er]);
      }
    }
  }
}

// Write an fp32 accumulator tile as Element pairs into swizzled smem.
template <class Element, class Acc, class Coords, class SLayout>
__device__ __forceinline__ void acc_to_smem(Acc const& acc, Coords const& cs, Element* smem,
                                            SLayout const& sl) {
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    const int r = get<0>(cs(i)), c = get<1>(cs(i));
    *reinterpret_cast<uint32_t*>(smem + sl(r, c)) = pack2<Element>(acc(i), acc(i + 1));
  }
}

// ---------------------------------------------------------------------------
// dK/dV (and, with kAtomicDq, the dQ partial sums) for one key tile.
// kVariants: kVarNone (plain), kVarGeneral (every variant, run-time
// branches), kVarMasks (window, lengths, offsets, segments: the plain
// kernel's order and register use, element masks on boundary tiles only).
template <class Cfg, bool kAtomicDq, int kVariants = kVarNone>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
bwd_dkdv_kernel(const __grid_constant__ BwdParams p, const float* __restrict__ dsum, float* __restrict__ dq_accum,
                const bool vec_ok, const bool pair_ok) {
  using Element = typename Cfg::Element;
  constexpr int M = Cfg::kBlockM, N = Cfg::kBlockN, D = Cfg::kHeadDim, T = Cfg::kThreads;
  using TQ = typename Cfg::TileQ;
  using TK = typename Cfg::TileK;
  using TP = typename Cfg::TileP;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* sQ_ptr = reinterpret_cast<Element*>(smem_raw);  // 2 stages
  Element* sdO_ptr = sQ_ptr + 2 * TQ::kElems;               // 2 stages
  Element* sK_ptr = sdO_ptr + 2 * TQ::kElems;
  Element* sV_ptr = sK_ptr + TK::kElems;
  Element* sP_ptr = sV_ptr + TK::kElems;
  Element* sdS_ptr = sP_ptr + TP::kElems;
  float* sLse = reinterpret_cast<float*>(sdS_ptr + TP::kElems);  // 2 stages of M
  float* sDsum = sLse + 2 * M;                                     // 2 stages of M

  const int tid = threadIdx.x;
  const int nb = blockIdx.x, hkv = blockIdx.y, b = blockIdx.z;
  const int Sq = p.seqlen_q, Sk = p.seqlen_k, hd = p.head_dim;
  const int group = p.heads_q / p.heads_kv;
  const int n0 = nb * N;
  int m_begin = p.causal ? n0 / M : 0;
  int m_end = (Sq + M - 1) / M;
  using VarT = std::conditional_t<kVariants != 0, Variant, NoVariantBwd>;
  VarT var(p, b, hkv * group);
  [[maybe_unused]] Variant::SegRange k_rng;
  if constexpr (kVariants != 0) {
    var.template query_tiles<M>(n0, n0 + N - 1, m_begin, m_end);
    k_rng = var.k_range(n0, N);
  }
  const int nm = m_end > m_begin ? m_end - m_begin : 0;
  const int total = group * nm;
  // Next (q head, query tile) iteration after `it`, skipping query tiles
  // whose segment ids cannot meet this key tile's; rng gets the tile's range.
  [[maybe_unused]] Variant::SegRange q_rng_cur, q_rng_next;
  auto next_it = [&](int it, Variant::SegRange& rng) {
    ++it;
    if constexpr (kVariants != 0) {
      if (var.segments()) {
        for (; it < total; ++it) {
          rng = var.q_range((m_begin + it % nm) * M, M);
          if (!Variant::disjoint(rng, k_rng)) break;
        }
      }
    }
    return it;
  };

  const Element* q = static_cast<const Element*>(p.q);
  const Element* dout = static_cast<const Element*>(p.dout);

  // K, V: once.
  {
    const Element* kg = static_cast<const Element*>(p.k) + b * p.k_batch_stride +
                        int64_t(n0) * p.k_row_stride + hkv * p.k_head_stride;
    const Element* vg = static_cast<const Element*>(p.v) + b * p.v_batch_stride +
                        int64_t(n0) * p.v_row_stride + hkv * p.v_head_stride;
    load_tile<N, D, T>(sK_ptr, typename TK::Layout{}, kg, p.k_row_stride, Sk - n0, hd, vec_ok, tid);
    load_tile<N, D, T>(sV_ptr, typename TK::Layout{}, vg, p.v_row_stride, Sk - n0, hd, vec_ok, tid);
  }
  // Q, dO, lse, D of iteration `it` into stage `st`.
  auto issue = [&](int it, int st) {
    const int h = hkv * group + it / nm;
    const int m0 = (m_begin + it % nm) * M;
    const Element* qg = q + b * p.q_batch_stride + int64_t(m0) * p.q_row_stride + h * p.q_head_stride;
    const Element* dg =
        dout + b * p.do_batch_stride + int64_t(m0) * p.do_row_stride + h * p.do_head_stride;
    load_tile<M, D, T>(sQ_ptr + st * TQ::kElems, typename TQ::Layout{}, qg, p.q_row_stride,
                       Sq - m0, hd, vec_ok, tid);
    load_tile<M, D, T>(sdO_ptr + st * TQ::kElems, typename TQ::Layout{}, dg, p.do_row_stride,
                       Sq - m0, hd, vec_ok, tid);
    const int64_t row_base = (int64_t(b) * p.heads_q + h) * Sq + m0;
    for (int r = tid; r < M; r += T) {
      const bool valid = m0 + r < Sq;
      cp_async4(sLse + st * M + r, p.lse + (valid ? row_base + r : 0), valid);
      cp_async4(sDsum + st * M + r, dsum + (valid ? row_base + r : 0), valid);
    }
  };
  int it = next_it(-1, q_rng_cur);
  if (it < total) issue(it, 0);
  cp_async_commit();

  // MMAs, copies and register fragments.
  typename Cfg::MmaSdP mma_sdp;
  typename Cfg::MmadKV mma_dkv;
  typename Cfg::MmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);

  using LdsmN = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using LdsmT = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  auto cpA_sdp = make_tiled_copy_A(LdsmN{}, mma_sdp);
  auto cpB_sdp = make_tiled_copy_B(LdsmN{}, mma_sdp);
  auto cpA_dkv = make_tiled_copy_A(LdsmT{}, mma_dkv);
  auto cpB_dkv = make_tiled_copy_B(LdsmT{}, mma_dkv);
  auto cpA_dq = make_tiled_copy_A(LdsmN{}, mma_dq);
  auto cpB_dq = make_tiled_copy_B(LdsmT{}, mma_dq);
  auto tcA_sdp = cpA_sdp.get_thread_slice(tid);
  auto tcB_sdp = cpB_sdp.get_thread_slice(tid);
  auto tcA_dkv = cpA_dkv.get_thread_slice(tid);
  auto tcB_dkv = cpB_dkv.get_thread_slice(tid);
  auto tcA_dq = cpA_dq.get_thread_slice(tid);
  auto tcB_dq = cpB_dq.get_thread_slice(tid);

  Tensor sK = make_tensor(make_smem_ptr(sK_ptr), typename TK::Layout{});
  Tensor sV = make_tensor(make_smem_ptr(sV_ptr), typename TK::Layout{});
  Tensor sKt = make_tensor(make_smem_ptr(sK_ptr), typename TK::Transposed{});
  Tensor sP = make_tensor(make_smem_ptr(sP_ptr), typename TP::Layout{});
  Tensor sPt = make_tensor(make_smem_ptr(sP_ptr), typename TP::Transposed{});
  Tensor sdS = make_tensor(make_smem_ptr(sdS_ptr), typename TP::Layout{});
  Tensor sdSt = make_tensor(make_smem_ptr(sdS_ptr), typename TP::Transposed{});

  Tensor tSrQ = thr_sdp.partition_fragment_A(shape_only<Element, M, D>());
  Tensor tSrK = thr_sdp.partition_fragment_B(shape_only<Element, N, D>());
  Tensor tSrdO = thr_sdp.partition_fragment_A(shape_only<Element, M, D>());
  Tensor tSrV = thr_sdp.partition_fragment_B(shape_only<Element, N, D>());
  Tensor tdVrPt = thr_dkv.partition_fragment_A(shape_only<Element, N, M>());
  Tensor tdVrdOt = thr_dkv.partition_fragment_B(shape_only<Element, D, M>());
  Tensor tdKrdSt = thr_dkv.partition_fragment_A(shape_only<Element, N, M>());
  Tensor tdKrQt = thr_dkv.partition_fragment_B(shape_only<Element, D, M>());
  Tensor tdQrdS = thr_dq.partition_fragment_A(shape_only<Element, M, N>());
  Tensor tdQrKt = thr_dq.partition_fragment_B(shape_only<Element, D, N>());

  Tensor tSsK = tcB_sdp.partition_S(sK);
  Tensor tSsV = tcB_sdp.partition_S(sV);
  Tensor tdVsPt = tcA_dkv.partition_S(sPt);
  Tensor tdKsdSt = tcA_dkv.partition_S(sdSt);
  Tensor tdQsdS = tcA_dq.partition_S(sdS);
  Tensor tdQsKt = tcB_dq.partition_S(sKt);

  Tensor cS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<M>, Int<N>>{}));
  Tensor cKV = thr_dkv.partition_C(make_identity_tensor(Shape<Int<N>, Int<D>>{}));
  Tensor cQ = thr_dq.partition_C(make_identity_tensor(Shape<Int<M>, Int<D>>{}));

  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<N>, Int<D>>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<N>, Int<D>>{});
  clear(acc_dk);
  clear(acc_dv);

  const float scale_log2 = p.scale * kLog2e;

  for (int st = 0; it < total; st ^= 1) {
    const int h = hkv * group + it / nm;
    const int m0 = (m_begin + it % nm) * M;
    const int it_next = next_it(it, q_rng_next);
    cp_async_wait_all();
    __syncthreads();
    if (it_next < total) issue(it_next, st ^ 1);
    cp_async_commit();

    Tensor sQ = make_tensor(make_smem_ptr(sQ_ptr + st * TQ::kElems), typename TQ::Layout{});
    Tensor sQt = make_tensor(make_smem_ptr(sQ_ptr + st * TQ::kElems), typename TQ::Transposed{});
    Tensor sdO = make_tensor(make_smem_ptr(sdO_ptr + st * TQ::kElems), typename TQ::Layout{});
    Tensor sdOt = make_tensor(make_smem_ptr(sdO_ptr + st * TQ::kElems), typename TQ::Transposed{});
    const float* lse_st = sLse + st * M;
    const float* dsum_st = sDsum + st * M;

    // S = Q K^T -> P.
    Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<M>, Int<N>>{});
    clear(acc_s);
    gemm_ss(mma_sdp, acc_s, tSrQ, tSrK, tcA_sdp.partition_S(sQ), tSsK, cpA_sdp, cpB_sdp, tcA_sdp,
            tcB_sdp);
    Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<M>, Int<N>>{});
    clear(acc_dp);
    if constexpr (kVariants == kVarMasks) {
      const bool mask = var.tile_needs_mask(m0, M, n0, N, q_rng_cur, k_rng);
      const bool seg = var.tile_seg_check(q_rng_cur, k_rng);
      variant_mask_probs(acc_s, cS, var, [&](int, int r) { return lse_to_log2(lse_st[r]); },
                         scale_log2, mask, seg, m0, n0,
                         [&](int, int row) { return var.q_segment(row); });
      gemm_ss(mma_sdp, acc_dp, tSrdO, tSrV, tcA_sdp.partition_S(sdO), tSsV, cpA_sdp, cpB_sdp,
              tcA_sdp, tcB_sdp);
      probs_to_dscores(acc_s, acc_dp, cS, [&](int, int r) { return dsum_st[r]; });
    } else if constexpr (kVariants == kVarGeneral) {
      // dP = dO V^T first, then P, dropout, dS and the soft-cap factor in one pass.
      var.set_head(h);
      gemm_ss(mma_sdp, acc_dp, tSrdO, tSrV, tcA_sdp.partition_S(sdO), tSsV, cpA_sdp, cpB_sdp,
              tcA_sdp, tcB_sdp);
      const bool mask = var.tile_needs_mask(m0, M, n0, N, q_rng_cur, k_rng);
      const bool seg = var.tile_seg_check(q_rng_cur, k_rng);
      auto lse_f = [&](int, int r) { return lse_to_log2(lse_st[r]); };
      auto dsum_f = [&](int, int r) { return dsum_st[r]; };
      auto qid_f = [&](int, int row) { return var.q_segment(row); };
      if (var.transforms_logits())
        variant_probs_dscores<true>(acc_s, acc_dp, cS, var, p.scale, scale_log2, mask, seg, m0,
                                    n0, lse_f, dsum_f, qid_f);
      else
        variant_probs_dscores<false>(acc_s, acc_dp, cS, var, p.scale, scale_log2, mask, seg, m0,
                                     n0, lse_f, dsum_f, qid_f);
    } else {
      const bool mask = (p.causal && m0 < n0 + N - 1) || (n0 + N > Sk);
      scores_to_probs(acc_s, cS, [&](int, int r) { return lse_to_log2(lse_st[r]); }, scale_log2,
                      mask, p.causal, m0, n0, Sk);

      // dP = dO V^T -> dS = P (dP - D).
      gemm_ss(mma_sdp, acc_dp, tSrdO, tSrV, tcA_sdp.partition_S(sdO), tSsV, cpA_sdp, cpB_sdp,
              tcA_sdp, tcB_sdp);
      probs_to_dscores(acc_s, acc_dp, cS, [&](int, int r) { return dsum_st[r]; });
    }

    acc_to_smem(acc_s, cS, sP_ptr, typename TP::Layout{});
    acc_to_smem(acc_dp, cS, sdS_ptr, typename TP::Layout{});
    __syncthreads();

    // dV += P^T dO, dK += dS^T Q.
    gemm_ss(mma_dkv, acc_dv, tdVrPt, tdVrdOt, tdVsPt, tcB_dkv.partition_S(sdOt), cpA_dkv, cpB_dkv,
            tcA_dkv, tcB_dkv);
    gemm_ss(mma_dkv, acc_dk, tdKrdSt, tdKrQt, tdKsdSt, tcB_dkv.partition_S(sQt), cpA_dkv, cpB_dkv,
            tcA_dkv, tcB_dkv);

    // The variants kernel serves both modes (one instantiation: build time);
    // deterministic mode passes no accumulator.
    if (kAtomicDq && (kVariants == 0 || dq_accum != nullptr)) {
      // dQ (unscaled) += dS K, fp32 atomics into [b, h, row, D].
      Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<M>, Int<D>>{});
      clear(acc_dq);
      gemm_ss(mma_dq, acc_dq, tdQrdS, tdQrKt, tdQsdS, tdQsKt, cpA_dq, cpB_dq, tcA_dq, tcB_dq);
      float* base = dq_accum + ((int64_t(b) * p.heads_q + h) * Sq + m0) * D;
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dq); i += 2) {
        const int r = get<0>(cQ(i)), c = get<1>(cQ(i));
        if (m0 + r < Sq) {
          float* dst = base + int64_t(r) * D + c;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
          atomicAdd(reinterpret_cast<float2*>(dst), make_float2(acc_dq(i), acc_dq(i + 1)));
#else
          atomicAdd(dst, acc_dq(i));
          atomicAdd(dst + 1, acc_dq(i + 1));
#endif
        }
      }
    }
    it = it_next;
    if constexpr (kVariants != 0) q_rng_cur = q_rng_next;
  }

  cp_async_wait_all();  // nothing in flight at exit (no iterations: K, V)

  // Epilogue: dK = scale * dS^T Q, dV.
  Element* dk = static_cast<Element*>(p.dk) + b * p.dk_batch_stride + int64_t(n0) * p.dk_row_stride +
                hkv * p.dk_head_stride;
  Element* dv = static_cast<Element*>(p.dv) + b * p.dv_batch_stride + int64_t(n0) * p.dv_row_stride +
                hkv * p.dv_head_stride;
  store_acc(acc_dk, cKV, dk, p.dk_row_stride, Sk - n0, hd, p.scale, pair_ok);
  store_acc(acc_dv, cKV, dv, p.dv_row_stride, Sk - n0, hd, 1.f, pair_ok);
}

// ---------------------------------------------------------------------------
// Deterministic dQ for one query tile: loops over the key tiles, dS stays in
// registers as the A operand of dQ += dS K. Writes dq directly.
template <class Cfg, int kVariants = kVarNone>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
bwd_dq_kernel(const __grid_constant__ BwdParams p, const float* __restrict__ dsum, const bool vec_ok,
              const bool pair_ok) {
  using Element = typename Cfg::Element;
  constexpr int M = Cfg::kBlockM, N = Cfg::kBlockN, D = Cfg::kHeadDim, T = Cfg::kThreads;
  using TQ = typename Cfg::TileQ;
  using TK = typename Cfg::TileK;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* sQ_ptr = reinterpret_cast<Element*>(smem_raw);
  Element* sdO_ptr = sQ_ptr + TQ::kElems;
  Element* sK_ptr = sdO_ptr + TQ::kElems;   // 2 stages
  Element* sV_ptr = sK_ptr + 2 * TK::kElems;  // 2 stages

  const int tid = threadIdx.x;
  // Last query tile first: under a causal mask (or a query offset) the later
  // tiles visit the most key tiles, so launching them first leaves the light
  // ones for the tail.
  const int mb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int Sq = p.seqlen_q, Sk = p.seqlen_k, hd = p.head_dim;
  const int hkv = h / (p.heads_q / p.heads_kv);
  const int m0 = mb * M;
  int n_begin = 0;
  int n_end = (Sk + N - 1) / N;
  if (p.causal) n_end = min(n_end, (min(m0 + M, Sq) + N - 1) / N);
  using VarT = std::conditional_t<kVariants != 0, Variant, NoVariantBwd>;
  const VarT var(p, b, h);
  [[maybe_unused]] Variant::SegRange q_rng;
  if constexpr (kVariants != 0) {
    var.template key_tiles<N>(m0, m0 + M - 1, n_begin, n_end);
    q_rng = var.q_range(m0, M);
  }
  // Next key tile after n, skipping tiles whose segment ids cannot match;
  // rng gets the tile's range.
  [[maybe_unused]] Variant::SegRange k_rng_cur, k_rng_next;
  auto next_n = [&](int n, Variant::SegRange& rng) {
    ++n;
    if constexpr (kVariants != 0) {
      if (var.segments()) {
        for (; n < n_end; ++n) {
          rng = var.k_range(n * N, N);
          if (!Variant::disjoint(q_rng, rng)) break;
        }
      }
    }
    return n;
  };

  {
    const Element* qg = static_cast<const Element*>(p.q) + b * p.q_batch_stride +
                        int64_t(m0) * p.q_row_stride + h * p.q_head_stride;
    const Element* dg = static_cast<const Element*>(p.dout) + b * p.do_batch_stride +
                        int64_t(m0) * p.do_row_stride + h * p.do_head_stride;
    load_tile<M, D, T>(sQ_ptr, typename TQ::Layout{}, qg, p.q_row_stride, Sq - m0, hd, vec_ok, tid);
    load_tile<M, D, T>(sdO_ptr, typename TQ::Layout{}, dg, p.do_row_stride, Sq - m0, hd, vec_ok,
                       tid);
  }
  const Element* kbase =
      static_cast<const Element*>(p.k) + b * p.k_batch_stride + hkv * p.k_head_stride;
  const Element* vbase =
      static_cast<const Element*>(p.v) + b * p.v_batch_stride + hkv * p.v_head_stride;
  auto issue = [&](int n, int st) {
    const int n0 = n * N;
    load_tile<N, D, T>(sK_ptr + st * TK::kElems, typename TK::Layout{},
                       kbase + int64_t(n0) * p.k_row_stride, p.k_row_stride, Sk - n0, hd, vec_ok,
                       tid);
    load_tile<N, D, T>(sV_ptr + st * TK::kElems, typename TK::Layout{},
                       vbase + int64_t(n0) * p.v_row_stride, p.v_row_stride, Sk - n0, hd, vec_ok,
                       tid);
  };
  int n = next_n(n_begin - 1, k_rng_cur);
  if (n < n_end) issue(n, 0);
  cp_async_commit();

  typename Cfg::Mma mma;
  auto thr = mma.get_thread_slice(tid);
  using LdsmN = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using LdsmT = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  auto cpA = make_tiled_copy_A(LdsmN{}, mma);
  auto cpB = make_tiled_copy_B(LdsmN{}, mma);
  auto cpBt = make_tiled_copy_B(LdsmT{}, mma);
  auto tcA = cpA.get_thread_slice(tid);
  auto tcB = cpB.get_thread_slice(tid);
  auto tcBt = cpBt.get_thread_slice(tid);

  Tensor sQ = make_tensor(make_smem_ptr(sQ_ptr), typename TQ::Layout{});
  Tensor sdO = make_tensor(make_smem_ptr(sdO_ptr), typename TQ::Layout{});
  Tensor tSsQ = tcA.partition_S(sQ);
  Tensor tSsdO = tcA.partition_S(sdO);
  Tensor tSrQ = thr.partition_fragment_A(shape_only<Element, M, D>());
  Tensor tSrdO = thr.partition_fragment_A(shape_only<Element, M, D>());
  Tensor tSrK = thr.partition_fragment_B(shape_only<Element, N, D>());
  Tensor tSrV = thr.partition_fragment_B(shape_only<Element, N, D>());
  Tensor tdQrKt = thr.partition_fragment_B(shape_only<Element, D, N>());

  Tensor cS = thr.partition_C(make_identity_tensor(Shape<Int<M>, Int<N>>{}));
  Tensor cQ = thr.partition_C(make_identity_tensor(Shape<Int<M>, Int<D>>{}));

  // Per-thread rows: lse (log2 units) and D.
  Tensor crr = make_tensor(cS.data(), rowcol(cS.layout()));
  constexpr int kRows = decltype(size<0>(crr))::value;
  float lse2[kRows], dsr[kRows];
  [[maybe_unused]] int qids[kRows];
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    const int row = m0 + get<0>(crr(i, 0));
    const int64_t idx = (int64_t(b) * p.heads_q + h) * Sq + row;
    lse2[i] = row < Sq ? lse_to_log2(p.lse[idx]) : INFINITY;
    dsr[i] = row < Sq ? dsum[idx] : 0.f;
    if constexpr (kVariants != 0) qids[i] = var.q_segment(row);
  }
  Tensor acc_dq = partition_fragment_C(mma, Shape<Int<M>, Int<D>>{});
  clear(acc_dq);
  const float scale_log2 = p.scale * kLog2e;

  for (int st = 0; n < n_end; st ^= 1) {
    const int n0 = n * N;
    const int n_nxt = next_n(n, k_rng_next);
    cp_async_wait_all();
    __syncthreads();
    if (n_nxt < n_end) issue(n_nxt, st ^ 1);
    cp_async_commit();

    Tensor sK = make_tensor(make_smem_ptr(sK_ptr + st * TK::kElems), typename TK::Layout{});
    Tensor sKt = make_tensor(make_smem_ptr(sK_ptr + st * TK::kElems), typename TK::Transposed{});
    Tensor sV = make_tensor(make_smem_ptr(sV_ptr + st * TK::kElems), typename TK::Layout{});

    Tensor acc_s = partition_fragment_C(mma, Shape<Int<M>, Int<N>>{});
    clear(acc_s);
    gemm_ss(mma, acc_s, tSrQ, tSrK, tSsQ, tcB.partition_S(sK), cpA, cpB, tcA, tcB);
    Tensor acc_dp = partition_fragment_C(mma, Shape<Int<M>, Int<N>>{});
    clear(acc_dp);
    if constexpr (kVariants == kVarMasks) {
      const bool mask = var.tile_needs_mask(m0, M, n0, N, q_rng, k_rng_cur);
      const bool seg = var.tile_seg_check(q_rng, k_rng_cur);
      variant_mask_probs(acc_s, cS, var, [&](int i, int) { return lse2[i]; }, scale_log2, mask,
                         seg, m0, n0, [&](int i, int) { return qids[i]; });
      gemm_ss(mma, acc_dp, tSrdO, tSrV, tSsdO, tcB.partition_S(sV), cpA, cpB, tcA, tcB);
      probs_to_dscores(acc_s, acc_dp, cS, [&](int i, int) { return dsr[i]; });
    } else if constexpr (kVariants == kVarGeneral) {
      gemm_ss(mma, acc_dp, tSrdO, tSrV, tSsdO, tcB.partition_S(sV), cpA, cpB, tcA, tcB);
      const bool mask = var.tile_needs_mask(m0, M, n0, N, q_rng, k_rng_cur);
      const bool seg = var.tile_seg_check(q_rng, k_rng_cur);
      auto lse_f = [&](int i, int) { return lse2[i]; };
      auto dsum_f = [&](int i, int) { return dsr[i]; };
      auto qid_f = [&](int i, int) { return qids[i]; };
      if (var.transforms_logits())
        variant_probs_dscores<true>(acc_s, acc_dp, cS, var, p.scale, scale_log2, mask, seg, m0,
                                    n0, lse_f, dsum_f, qid_f);
      else
        variant_probs_dscores<false>(acc_s, acc_dp, cS, var, p.scale, scale_log2, mask, seg, m0,
                                     n0, lse_f, dsum_f, qid_f);
    } else {
      const bool mask = (p.causal && n0 + N - 1 > m0) || (n0 + N > Sk);
      scores_to_probs(acc_s, cS, [&](int i, int) { return lse2[i]; }, scale_log2, mask,
                      p.causal, m0, n0, Sk);

      gemm_ss(mma, acc_dp, tSrdO, tSrV, tSsdO, tcB.partition_S(sV), cpA, cpB, tcA, tcB);
      probs_to_dscores(acc_s, acc_dp, cS, [&](int i, int) { return dsr[i]; });
    }

    Tensor rdS = convert_frag<Element>(acc_dp);
    Tensor rdS_a = make_tensor(rdS.data(), acc_as_a(rdS.layout()));
    gemm_rs(mma, acc_dq, rdS_a, tdQrKt, tcBt.partition_S(sKt), cpBt, tcBt);
    n = n_nxt;
    if constexpr (kVariants != 0) k_rng_cur = k_rng_next;
  }

  cp_async_wait_all();  // nothing in flight at exit (no key tiles: Q, dO)

  Element* dq = static_cast<Element*>(p.dq) + b * p.dq_batch_stride + int64_t(m0) * p.dq_row_stride +
                h * p.dq_head_stride;
  store_acc(acc_dq, cQ, dq, p.dq_row_stride, Sq - m0, hd, p.scale, pair_ok);
}

}  // namespace jax_flash::cuda::bwd
