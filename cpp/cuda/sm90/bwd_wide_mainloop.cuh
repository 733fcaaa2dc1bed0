// The consumers of the wide-head (head dim 256) warp-specialised Hopper
// backward: two warpgroups that share the CTA's 64 keys, warpgroup 0
// accumulating dV and warpgroup 1 dK (bwd_wide_config.cuh). Per step (a
// query tile of one q head):
//   warpgroup 0: S^T = K Q^T -> P^T -> smem (named barrier: arrive)
//                dV += P^T dO (RS, P^T from registers)
//   warpgroup 1: dP^T = V dO^T; (named barrier: wait) P^T from smem;
//                dS^T = P^T (dP^T - D) -> smem; dK += dS^T Q (RS)
//   (named barrier: dS^T in smem)
//   both: dQ part 0 = dS K, staged in the step's dO stage once both
//   warpgroups are done with it; part 1, staged in its Q stage; a writer
//   warp adds both to the float32 accumulator with bulk reduces (in
//   deterministic mode in the tiles' fixed order; bwd_wide_dq.cuh) and
//   hands the stages back to the producer.
// (Added by the consumers from registers with red.global.add.v4, as this
// kernel first did, the adds cost d256 fwd+bwd 30% of its time: 427 against
// 606 TFLOP/s with them left out, H200 4k.)
// (kMasks, atomic mode) Warpgroup 0 zeroes the hidden elements of P^T
// (bwd90::masks_t), so dS^T, made from it, is zero there too; a step the
// ids skip (bwd_masks.cuh) releases both rings and does nothing else.
// (kLogits) Warpgroup 0 makes P^T with the transform (bwd_logits_tile.cuh);
// with soft-cap it hands warpgroup 1 P^T (1 - t^2) instead of P^T, which is
// all dS^T = P^T (dP^T - D)(1 - t^2) needs of t. Dropout: each warpgroup
// makes the keep bits of its (identical) accumulator positions; warpgroup 0
// hands over the kept-and-dropped P^T and runs dV on the dropped one,
// warpgroup 1 takes keep dP^T / (1 - rate).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/sm90/bwd_dq.cuh"  // dq_to_staged
#include "cuda/sm90/bwd_logits.cuh"  // logits_pass1, with_bias, dropout_bits_t, AlibiTile
#include "cuda/sm90/bwd_masks.cuh"   // kStepSkip, bwd90::masks_t
#include "cuda/sm90/bwd_params.cuh"
#include "cuda/sm90/bwd_wide_config.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "cuda/common/utils.cuh"  // acc_rowcol_layout, convert_regs

namespace jax_flash::cuda::sm90 {

template <class Cfg>
struct BwdWideMainloop {
  using Config = Cfg;
  using Element = typename Cfg::Element;
  static constexpr int M = Cfg::kBlockM, N = Cfg::kBlockN, D = Cfg::kHeadDim;
  static constexpr int kTransform = Cfg::kLogits & (kLogitSoftcap | kLogitAlibi);
  static constexpr bool kCap = (Cfg::kLogits & kLogitSoftcap) != 0;
  static constexpr bool kDropout = (Cfg::kLogits & kLogitDropout) != 0;

  typename Cfg::TiledMmaSdP mma_sdp;  // one warpgroup
  typename Cfg::TiledMmadKV mma_dkv;  // one warpgroup: dV (0) or dK (1)
  typename Cfg::TiledMmadQ mma_dq;    // both, one dQ part
  int ct;  // consumer thread, 0..255

  __device__ __forceinline__ explicit BwdWideMainloop(int consumer_thread) : ct(consumer_thread) {}

  using AccKV = decltype(partition_fragment_C(typename Cfg::TiledMmadKV{}, Shape<Int<N>, Int<D>>{}));

  // acc: this warpgroup's dV (warpgroup 0) or dK (warpgroup 1).
  template <class Work>
  __device__ __forceinline__ void run(const BwdKernelParams<Cfg>& kp, typename Cfg::SharedStorage& ss, const Work& w,
                                      AccKV& acc) {
    const BwdParams& p = kp.p;
    const int wg = __shfl_sync(0xffffffffu, ct / 128, 0);  // warp-uniform
    const int wt = ct % 128;
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQ{});
    Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQt{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Cfg::SmemLayoutdO{});
    Tensor sdOt = make_tensor(make_smem_ptr(ss.dout.data()), typename Cfg::SmemLayoutdOt{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Cfg::SmemLayoutK{});
    Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename Cfg::SmemLayoutKt{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Cfg::SmemLayoutK{});
    Tensor sPt = make_tensor(make_smem_ptr(ss.pt.data()), typename Cfg::SmemLayoutSt{});
    Tensor sdSt = make_tensor(make_smem_ptr(ss.ds.data()), typename Cfg::SmemLayoutSt{});
    Tensor sdS = make_tensor(make_smem_ptr(ss.ds.data()), typename Cfg::SmemLayoutdS{});

    // The smem operands' descriptors depend on the warpgroup alone: sliced
    // at a warp-uniform index (a one-warpgroup MMA's at 0), their offsets
    // stay uniform registers (sliced at the thread, R2UR moves per wgmma).
    auto wg_sdp = mma_sdp.get_thread_slice(0);
    auto wg_dkv = mma_dkv.get_thread_slice(0);
    auto wg_dq = mma_dq.get_thread_slice(wg * 128);
    // Warpgroup 0 reads (K, Q), warpgroup 1 (V, dO): separate fragments
    // rather than one set on a selected pointer, so that the descriptors'
    // smem addresses stay compile-time immediates.
    Tensor tSrK = wg_sdp.partition_fragment_A(sK);       // (MMA, MMA_M, MMA_K)
    Tensor tSrV = wg_sdp.partition_fragment_A(sV);
    Tensor tSrQ = wg_sdp.partition_fragment_B(sQ);       // (MMA, MMA_N, MMA_K, stage)
    Tensor tSrdO = wg_sdp.partition_fragment_B(sdO);
    Tensor tdVrdOt = wg_dkv.partition_fragment_B(sdOt);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tdKrQt = wg_dkv.partition_fragment_B(sQt);    // (MMA, MMA_N, MMA_K, stage)
    Tensor tdQrdS = wg_dq.partition_fragment_A(sdS);     // (MMA, MMA_M, MMA_K, buffer)
    constexpr int kCols = D / Cfg::kDqParts;
    Tensor tdQrKt0 = wg_dq.partition_fragment_B(local_tile(sKt, Shape<Int<kCols>, Int<N>>{}, make_coord(0, 0)));
    Tensor tdQrKt1 = wg_dq.partition_fragment_B(local_tile(sKt, Shape<Int<kCols>, Int<N>>{}, make_coord(1, 0)));
    static_assert(Cfg::kDqParts == 2);

    auto thr_sdp = mma_sdp.get_thread_slice(wt);
    Tensor tSc = thr_sdp.partition_C(make_identity_tensor(Shape<Int<N>, Int<M>>{}));
    Tensor tSc_rc = make_tensor(tSc.data(), fwd::acc_rowcol_layout(tSc.layout()));
    // (kMasks) Thread 0's coordinates and this thread's (key, query) offset
    // from them (bwd90::masks_t's form).
    Tensor tSc0 = mma_sdp.get_thread_slice(0).partition_C(make_identity_tensor(Shape<Int<N>, Int<M>>{}));
    Tensor tSc0_rc = make_tensor(tSc0.data(), fwd::acc_rowcol_layout(tSc0.layout()));
    [[maybe_unused]] const int rb = get<0>(tSc_rc(0, 0)) - get<0>(tSc0_rc(0, 0));
    [[maybe_unused]] const int cb = get<1>(tSc_rc(0, 0)) - get<1>(tSc0_rc(0, 0));
    // P^T / dS^T accumulator fragments <-> smem (queries contiguous) with
    // stmatrix / ldmatrix: a plain 32-bit copy through the swizzled pointer
    // had compiled to generic 64-bit accesses with 64-bit address math.
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
    auto r2s_thr = r2s.get_thread_slice(wt);
    auto s2r = make_tiled_copy_C(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma_sdp);
    auto s2r_thr = s2r.get_thread_slice(wt);
    Tensor tPsPt = r2s_thr.partition_D(sPt);      // (CPY, CPY_N, CPY_M, buffer)
    Tensor tPsPt_src = s2r_thr.partition_S(sPt);
    Tensor tdSsdSt = r2s_thr.partition_D(sdSt);

    using AccS = decltype(partition_fragment_C(mma_sdp, Shape<Int<N>, Int<M>>{}));
    static_assert(decltype(size<1>(AccS{}))::value == 1 && decltype(size<2>(AccS{}))::value == 1);
    using AccQ = decltype(partition_fragment_C(mma_dq, Shape<Int<M>, Int<kCols>>{}));
    const int Sq = p.seqlen_q, Sk = p.seqlen_k, n0 = w.n_block * N;

    // Warpgroup 0: P^T in place of the S^T wgmma in flight on a; (kMasks)
    // the step's flags say which masks apply; (kCap) pc <- P^T (1 - t^2).
    auto make_p = [&](AccS& a, int st, int m0, [[maybe_unused]] int flags, [[maybe_unused]] auto& pc) {
      Tensor s = make_tensor(a.data(), fwd::acc_rowcol_layout(a.layout()));
      if constexpr (kTransform != 0) {
        warpgroup_wait<0>();
        warpgroup_fence_operand(a);
        const bwd90::AlibiTile al = (kTransform & kLogitAlibi) != 0
                                        ? bwd90::AlibiTile(ss.ls.slope[st] * bwd::kLog2e, m0 + ss.ms.offset, n0, M, N,
                                                           rb, cb)
                                        : bwd90::AlibiTile(0.f, 0, 0, M, N, 0, 0);
        // Soft-cap: s <- t; else (ALiBi) s <- P^T.
        bwd90::logits_pass1<kTransform, true>(s, tSc0_rc, cb, ss.lse2[st], kp.scale_log2, kCap ? ss.ls.qk_mul : 0.f,
                                              al);
        if constexpr (kCap) {
          const float cap_log2 = ss.ls.cap_log2;
          bwd90::with_bias<(kTransform & kLogitAlibi) != 0>(tSc0_rc, al, [&](auto&& arg) {
            CUTE_UNROLL
            for (int c = 0; c < size<1>(s); ++c) {
              const float l2 = ss.lse2[st][cb + get<1>(tSc0_rc(0, c))];
              CUTE_UNROLL
              for (int r = 0; r < size<0>(s); ++r) {
                const float t = s(r, c);
                const float pv = exp2f(fmaf(t, cap_log2, arg(r, c, l2)));
                s(r, c) = pv;
                pc(r, c) = Element(pv * fmaf(-t, t, 1.f));
              }
            }
          });
        }
      } else {
        // Columns are queries, so the LSE varies along columns.
        float lse2[decltype(size<1>(s))::value];
        CUTE_UNROLL
        for (int c = 0; c < size<1>(s); ++c) lse2[c] = ss.lse2[st][get<1>(tSc_rc(0, c))];
        warpgroup_wait<0>();
        warpgroup_fence_operand(a);
        // (kMasks: the Variant's tile mask covers causal and the edges too.)
        const bool mask = !Cfg::kMasks && ((p.causal && m0 < n0 + N - 1) || n0 + N > Sk || m0 + M > Sq);
        CUTE_UNROLL
        for (int c = 0; c < size<1>(s); ++c) {
          CUTE_UNROLL
          for (int r = 0; r < size<0>(s); ++r) {
            float pv = exp2f(s(r, c) * kp.scale_log2 - lse2[c]);
            if (mask) {
              const int key = n0 + get<0>(tSc_rc(r, c)), query = m0 + get<1>(tSc_rc(r, c));
              pv = key < Sk && query < Sq && (!p.causal || key <= query) ? pv : 0.f;
            }
            s(r, c) = pv;
          }
        }
      }
      if constexpr (Cfg::kMasks) {
        if (flags & bwd90::kTileMask)
          bwd90::masks_t(tSc0_rc, rb, cb, ss.ms.qseg[st], ss.ms.kseg, flags & bwd90::kTileSeg,
                         ss.ms.variant(p, w.batch).tile_mask(m0, n0), [&](int r, int c) {
                           s(r, c) = 0.f;
                           if constexpr (kCap) pc(r, c) = Element(0.f);
                         });
      }
    };
    // (dropout) This thread's keep bits of the step's tile (both warpgroups
    // hold the same positions).
    [[maybe_unused]] auto keep_bits = [&](int m0, int head) {
      if constexpr (kDropout) {
        const uint32_t seed[2] = {ss.ls.seed[0], ss.ls.seed[1]};
        return bwd90::dropout_bits_t(tSc_rc, seed, ss.ls.drop_threshold, w.batch, head, m0, n0);
      } else {
        return 0;
      }
    };

    barrier_wait(ss.kv_full, 0u);
    RingState<Cfg::kStages> ring;
    RingState<Cfg::kDoStages> do_ring;
    auto at = w.cursor();
    for (int step = 0; step < w.steps; ++step, at.advance()) {
      const int st = ring.index, buf = step & 1, ds = do_ring.index;
      const int m0 = at.m_block() * M;
      barrier_wait(ss.full[st], ring.phase);
      int flags = 0;
      if constexpr (Cfg::kMasks) {
        flags = __shfl_sync(0xffffffffu, ss.ms.flags[st], 0);  // warp-uniform branches
        if (flags & kStepSkip) {  // nothing loaded: release both rings' buffers (thread 0 for the writer too)
          barrier_arrive(ss.empty[st]);
          if (ct == 0) barrier_arrive(ss.empty[st]);
          barrier_wait(ss.do_full[ds], do_ring.phase);
          barrier_arrive(ss.do_empty[ds]);
          if (ct == 0) barrier_arrive(ss.do_empty[ds]);
          ring.advance();
          do_ring.advance();
          continue;
        }
      }
      AccS acc_s;  // S^T (warpgroup 0) or dP^T (warpgroup 1)
      // P^T (warpgroup 0) or dS^T (1) in 16 bits: the A operand of dV / dK,
      // one variable for both so that one set of registers stays live
      // until the wgmma has read it.
      Tensor rA = make_tensor<Element>(acc_s.layout());
      Tensor tA = make_tensor(rA.data(), fwd::PAsALayout<M>{});
      if (wg == 0) {
        fwd::wgmma_issue<true, false>(mma_sdp, tSrK, tSrQ(_, _, _, st), acc_s);
        Tensor rPc = make_tensor<Element>(acc_s.layout());  // (kCap) P^T (1 - t^2)
        Tensor pc = make_tensor(rPc.data(), fwd::acc_rowcol_layout(rPc.layout()));
        [[maybe_unused]] const auto keep = keep_bits(m0, at.head);  // (under the S^T wgmma)
        make_p(acc_s, st, m0, flags, pc);
        barrier_arrive(ss.empty[st]);  // Q (S^T) and the LSE: done with this stage
        if constexpr (kCap) {
          cute::copy(r2s, r2s_thr.retile_S(rPc), tPsPt(_, _, _, buf));
        } else {
          rA = fwd::convert_regs<Element>(acc_s);
          cute::copy(r2s, r2s_thr.retile_S(rA), tPsPt(_, _, _, buf));
        }
        named_arrive(kBarWideP, Cfg::kConsumerThreads);  // (read by warpgroup 1's loads, no wgmma: no proxy fence)
        if constexpr (kDropout) {  // dV takes the dropped P^T
          Tensor s = make_tensor(acc_s.data(), fwd::acc_rowcol_layout(acc_s.layout()));
          const float ks = ss.ls.keep_scale;
          CUTE_UNROLL
          for (int c = 0; c < size<1>(s); ++c) {
            CUTE_UNROLL
            for (int r = 0; r < size<0>(s); ++r) s(r, c) = keep(r, c) ? s(r, c) * ks : 0.f;
          }
        }
        if constexpr (kCap || kDropout) rA = fwd::convert_regs<Element>(acc_s);
        barrier_wait(ss.do_full[ds], do_ring.phase);
        fwd::wgmma_issue<false, true>(mma_dkv, tA, tdVrdOt(_, _, _, ds), acc);
      } else {
        barrier_wait(ss.do_full[ds], do_ring.phase);
        fwd::wgmma_issue<true, false>(mma_sdp, tSrV, tSrdO(_, _, _, ds), acc_s);
        [[maybe_unused]] const auto keep = keep_bits(m0, at.head);  // (under the dP^T wgmma)
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_s);
        barrier_arrive(ss.do_empty[ds]);  // dO (dP^T): this warpgroup is done with it
        // dS^T = P^T (dP^T - D), P^T read back (16-bit) at this thread's own
        // accumulator positions (warpgroup 0's partition).
        Tensor s = make_tensor(acc_s.data(), fwd::acc_rowcol_layout(acc_s.layout()));
        named_sync(kBarWideP, Cfg::kConsumerThreads);
        Tensor rPb = make_tensor<Element>(acc_s.layout());
        cute::copy(s2r, tPsPt_src(_, _, _, buf), s2r_thr.retile_D(rPb));
        Tensor pr = make_tensor(rPb.data(), fwd::acc_rowcol_layout(rPb.layout()));
        CUTE_UNROLL
        for (int c = 0; c < size<1>(s); ++c) {
          const float dd = ss.dsum[st][get<1>(tSc_rc(0, c))];
          CUTE_UNROLL
          for (int r = 0; r < size<0>(s); ++r) {
            if constexpr (kDropout)
              s(r, c) = float(pr(r, c)) * ((keep(r, c) ? s(r, c) * ss.ls.keep_scale : 0.f) - dd);
            else
              s(r, c) = float(pr(r, c)) * (s(r, c) - dd);
          }
        }
        rA = fwd::convert_regs<Element>(acc_s);
        cute::copy(r2s, r2s_thr.retile_S(rA), tdSsdSt(_, _, _, buf));
        cutlass::arch::fence_view_async_shared();  // st.shared -> the dQ wgmmas
        fwd::wgmma_issue<false, true>(mma_dkv, tA, tdKrQt(_, _, _, st), acc);
      }
      // dS^T in smem; also keeps warpgroup 0 from arriving on the P^T barrier
      // twice before warpgroup 1 has waited on it once.
      named_sync(kBarWideDs, Cfg::kConsumerThreads);

      // dQ: part 0 into the dO stage, part 1 into the Q stage, once dV and
      // dK (the last readers of both) are complete in both warpgroups; the
      // stages' empty barriers also wait for the writer.
      AccQ acc_dq;
      Tensor tdQrdS_b = tdQrdS(_, _, _, buf);
      fwd::wgmma_issue<true, false>(mma_dq, tdQrdS_b, tdQrKt0, acc_dq);
      warpgroup_wait<0>();  // dV / dK, and dQ part 0
      warpgroup_fence_operand(acc);
      warpgroup_fence_operand(acc_dq);
      // Done reading the stages (warpgroup 0: dO, 1: Q and D); they stay
      // held by the writer's arrival until the staged parts are read.
      barrier_arrive(wg == 0 ? ss.do_empty[ds] : ss.empty[st]);
      named_sync(kBarWideStagesFree, Cfg::kConsumerThreads);
      // Staged in the order the threads hold it (bwd_dq.cuh: conflict-free
      // float4 stores; the accumulator takes the part as one contiguous run).
      dq_to_staged<Cfg::kConsumerThreads>(acc_dq, ss.dq_part(0, ds), ct);
      fwd::wgmma_issue<true, false>(mma_dq, tdQrdS_b, tdQrKt1, acc_dq);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_dq);
      dq_to_staged<Cfg::kConsumerThreads>(acc_dq, ss.dq_part(1, st), ct);
      cutlass::arch::fence_view_async_shared();  // st.shared -> the bulk reduces
      named_arrive(bwd_wide_dq_staged(step), kWideDqBarThreads);
      ring.advance();
      do_ring.advance();
    }
    warpgroup_fence_operand(acc);
  }
};

}  // namespace jax_flash::cuda::sm90
