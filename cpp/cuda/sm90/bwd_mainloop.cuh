// The consumers of the warp-specialised Hopper backward: two warpgroups,
// 64 keys each, accumulate dK and dV in registers over the CTA's steps.
// Per step (a query tile of one q head):
//   S^T  = K Q^T, dP^T = V dO^T          SS, issued together
//   P^T  = exp2(S^T scale log2e - lse2)  (under the dP^T wgmma)
//   dS^T = P^T (dP^T - D)
//   dV  += P^T dO, dK += dS^T Q          RS: P^T and dS^T from registers
//   dS^T -> shared memory, then (both halves there) dQ = dS K, each
//   warpgroup half of it (bwd_config.cuh: query rows at d64, head dim at
//   d128); the tile goes to the step's dQ writer (bwd_dq.cuh).
// (kTurns: d64, plain, soft-cap alone, dropout alone) The warpgroups issue
// S^T / dP^T in turns.
// (kMasks) The producer's step flags say which steps need element masks
// and which have nothing to do (bwd_masks.cuh). (kLogits) Soft-cap, ALiBi
// or dropout change how P^T and dS^T are made (bwd_logits.cuh).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/common/bwd_rows.cuh"  // kLog2e
#include "cuda/common/utils.cuh"     // acc_rowcol_layout, convert_regs
#include "cuda/sm90/bwd_dq.cuh"
#include "cuda/sm90/bwd_logits.cuh"
#include "cuda/sm90/bwd_masks.cuh"
#include "cuda/sm90/bwd_params.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace jax_flash::cuda::sm90 {

template <class Cfg>
struct BwdMainloop {
  using Config = Cfg;
  using Element = typename Cfg::Element;
  static constexpr int M = Cfg::kBlockM, N = Cfg::kBlockN, D = Cfg::kHeadDim;
  static constexpr int kLogits = Cfg::kLogits;
  static constexpr int kTransform = kLogits & (kLogitSoftcap | kLogitAlibi);
  static constexpr bool kCap = (kLogits & kLogitSoftcap) != 0;
  static constexpr bool kDropout = (kLogits & kLogitDropout) != 0;

  typename Cfg::TiledMmaSdP mma_sdp;
  typename Cfg::TiledMmadKV mma_dkv;
  typename Cfg::TiledMmadQ mma_dq;
  int ct;  // consumer thread, 0..255

  __device__ __forceinline__ explicit BwdMainloop(int consumer_thread) : ct(consumer_thread) {}

  using AccKV = decltype(partition_fragment_C(typename Cfg::TiledMmadKV{}, Shape<Int<N>, Int<D>>{}));

  template <class Work>
  __device__ __forceinline__ void run(const BwdKernelParams<Cfg>& kp, typename Cfg::SharedStorage& ss, const Work& w,
                                      AccKV& acc_dk, AccKV& acc_dv) {
    const BwdParams& p = kp.p;
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQ{});
    Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQt{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Cfg::SmemLayoutQ{});
    Tensor sdOt = make_tensor(make_smem_ptr(ss.dout.data()), typename Cfg::SmemLayoutQt{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Cfg::SmemLayoutK{});
    Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename Cfg::SmemLayoutKt{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Cfg::SmemLayoutK{});
    Tensor sdSt = make_tensor(make_smem_ptr(ss.ds.data()), typename Cfg::SmemLayoutdSt{});
    Tensor sdS = make_tensor(make_smem_ptr(ss.ds.data()), typename Cfg::SmemLayoutdS{});

    // The smem operands' descriptors depend on the warpgroup alone: sliced
    // at a warp-uniform index, their per-step offsets stay uniform (sliced
    // at ct, every wgmma had moved them through R2UR; SASS, d128: the loop
    // 912 -> 804 instructions with the stmatrix stores and the step cursor).
    const int wg = __shfl_sync(0xffffffffu, ct / 128, 0);
    auto wg_sdp = mma_sdp.get_thread_slice(wg * 128);
    auto wg_dkv = mma_dkv.get_thread_slice(wg * 128);
    auto wg_dq = mma_dq.get_thread_slice(wg * 128);
    Tensor tSrK = wg_sdp.partition_fragment_A(sK);        // (MMA, MMA_M, MMA_K)
    Tensor tSrV = wg_sdp.partition_fragment_A(sV);
    Tensor tSrQ = wg_sdp.partition_fragment_B(sQ);        // (MMA, MMA_N, MMA_K, stage)
    Tensor tSrdO = wg_sdp.partition_fragment_B(sdO);
    Tensor tdVrdOt = wg_dkv.partition_fragment_B(sdOt);   // (MMA, MMA_N, MMA_K, stage)
    Tensor tdKrQt = wg_dkv.partition_fragment_B(sQt);
    Tensor tdQrdS = wg_dq.partition_fragment_A(sdS);      // (MMA, MMA_M, MMA_K, stage)
    Tensor tdQrKt = wg_dq.partition_fragment_B(sKt);

    auto thr_sdp = mma_sdp.get_thread_slice(ct);
    Tensor tSc = thr_sdp.partition_C(make_identity_tensor(Shape<Int<N>, Int<M>>{}));
    Tensor tSc_rc = make_tensor(tSc.data(), fwd::acc_rowcol_layout(tSc.layout()));
    // dS^T to shared memory with stmatrix (queries contiguous, as the
    // accumulator holds them): a plain 32-bit copy through the swizzled
    // pointer had compiled to generic 64-bit stores with 64-bit address math.
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
    auto r2s_thr = r2s.get_thread_slice(ct);
    Tensor tdSsdS = r2s_thr.partition_D(sdSt);             // (CPY, CPY_N, CPY_M, stage)

    using AccS = decltype(partition_fragment_C(mma_sdp, Shape<Int<N>, Int<M>>{}));
    static_assert(decltype(size<1>(AccS{}))::value == 1 && decltype(size<2>(AccS{}))::value == 1);
    const int Sq = p.seqlen_q, Sk = p.seqlen_k, n0 = w.n_block * N;

    // (kMasks) Thread 0's coordinates, compile-time values (masks_t).
    Tensor tSc0 = mma_sdp.get_thread_slice(0).partition_C(make_identity_tensor(Shape<Int<N>, Int<M>>{}));
    Tensor tSc0_rc = make_tensor(tSc0.data(), fwd::acc_rowcol_layout(tSc0.layout()));

    // (Cfg::kTurns) The warpgroups take turns to issue S^T / dP^T (named
    // barriers kBarTurn + wg), warpgroup 0 first, so that its exponentials
    // run under the other's products instead of beside its own (where it
    // pays, with the measurements: BwdConfig::kTurns).
    constexpr bool turns = Cfg::kTurns;
    if (turns && wg == 1) named_arrive(kBarTurn + 0, Cfg::kConsumerThreads);

    barrier_wait(ss.kv_full, 0u);
    RingState<Cfg::kStages> ring;
    // d64's 128-query steps leave the registers tightest (S^T and dP^T: 64
    // each). There S^T / dP^T are declared per step (declared once, ptxas
    // serialised every wgmma: warning C7512) and the causal / edge masks are
    // a second pass after the exponentials (inside their loop, the index
    // math spilled 584 B). At d128 the accumulators are declared once (per
    // step, ptxas spilled 20 B instead of 4; H100 fwd+bwd +1-2% at 4k / 16k).
    constexpr bool kTight = M == 128;
    AccS acc_s_once, acc_dp_once;
    auto at = w.cursor();
    for (int step = 0; step < w.steps; ++step, at.advance()) {
      AccS acc_s_step, acc_dp_step;
      AccS& acc_s = kTight ? acc_s_step : acc_s_once;
      AccS& acc_dp = kTight ? acc_dp_step : acc_dp_once;
      const int st = ring.index;
      const int m0 = at.m_block() * M;
      barrier_wait(ss.full[st], ring.phase);
      int flags = 0;
      if constexpr (Cfg::kMasks) {
        flags = __shfl_sync(0xffffffffu, ss.ms.flags[st], 0);  // warp-uniform branches
        if (flags & kStepSkip) {  // ids disjoint from the key tile's: nothing loaded, nothing to add
          barrier_arrive(ss.empty[st]);
          if (step > 0) named_sync(bwd_dq_empty(step - 1), kDqBarThreads);  // the writers' handshake, nothing staged
          named_arrive(bwd_dq_full(step), kDqBarThreads);
          ring.advance();
          continue;
        }
      }
      if (turns) named_sync(kBarTurn + wg, Cfg::kConsumerThreads);
      fwd::wgmma_issue<true, false>(mma_sdp, tSrK, tSrQ(_, _, _, st), acc_s);
      fwd::wgmma_issue<true, false>(mma_sdp, tSrV, tSrdO(_, _, _, st), acc_dp);
      if (turns) named_arrive(kBarTurn + (wg ^ 1), Cfg::kConsumerThreads);
      Tensor s = make_tensor(acc_s.data(), fwd::acc_rowcol_layout(acc_s.layout()));
      // (kMasks) This thread's (key, query) offset from thread 0's coordinates.
      [[maybe_unused]] const int rb = get<0>(tSc_rc(0, 0)) - get<0>(tSc0_rc(0, 0));
      [[maybe_unused]] const int cb = get<1>(tSc_rc(0, 0)) - get<1>(tSc0_rc(0, 0));
      // (kMasks) The variants' element masks as a second pass (a select an
      // element), after P^T (with soft-cap, after P^T and dS^T).
      [[maybe_unused]] auto variant_masks = [&](auto&& zero) {
        if constexpr (Cfg::kMasks) {
          if (flags & bwd90::kTileMask)
            bwd90::masks_t(tSc0_rc, rb, cb, ss.ms.qseg[st], ss.ms.kseg, flags & bwd90::kTileSeg,
                           ss.ms.variant(p, w.batch).tile_mask(m0, n0), zero);
        }
      };
      // (dropout) The keep bits, under the S^T and dP^T wgmmas.
      [[maybe_unused]] auto keep = [&]() {
        if constexpr (kDropout) {
          const uint32_t seed[2] = {ss.ls.seed[0], ss.ls.seed[1]};
          return bwd90::dropout_bits_t(tSc_rc, seed, ss.ls.drop_threshold, w.batch, at.head, m0, n0);
        } else {
          return 0;
        }
      }();
      if constexpr (kTransform != 0) {
        // Soft-cap and / or ALiBi (bwd_logits.cuh).
        auto alibi = [&]() {
          if constexpr ((kTransform & kLogitAlibi) != 0)
            return bwd90::AlibiTile(ss.ls.slope[st] * bwd::kLog2e, m0 + ss.ms.offset, n0, M, N, rb, cb);
          else
            return bwd90::AlibiTile(0.f, 0, 0, M, N, 0, 0);
        };
        warpgroup_wait<1>();
        warpgroup_fence_operand(acc_s);
        bwd90::logits_pass1<kTransform, true>(s, tSc0_rc, cb, ss.lse2[st], kp.scale_log2, kCap ? ss.ls.qk_mul : 0.f,
                                              alibi());
        if constexpr (!kCap) variant_masks([&](int r, int c) { s(r, c) = 0.f; });
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_dp);
        Tensor ds = make_tensor(acc_dp.data(), fwd::acc_rowcol_layout(acc_dp.layout()));
        // (dropout with them) dP^T through the keep mask first, P^T after:
        // dS^T = P^T (keep dP^T / (1 - rate) - D) [(1 - t^2)], dV takes the
        // dropped P^T, as in the dropout-only branch below.
        [[maybe_unused]] auto keep_scaled = [&](auto& t) {  // t = keep t / (1 - rate)
          if constexpr (kDropout) {
            const float ks = ss.ls.keep_scale;
            CUTE_UNROLL
            for (int c = 0; c < size<1>(t); ++c) {
              CUTE_UNROLL
              for (int r = 0; r < size<0>(t); ++r) t(r, c) = keep(r, c) ? t(r, c) * ks : 0.f;
            }
          }
        };
        if constexpr (kCap) {
          keep_scaled(ds);
          bwd90::softcap_pass2<kLogits, true>(s, ds, tSc0_rc, cb, ss.lse2[st], ss.dsum[st], ss.ls.cap_log2, alibi());
          variant_masks([&](int r, int c) {
            s(r, c) = 0.f;
            ds(r, c) = 0.f;
          });
          keep_scaled(s);
        } else {
          [[maybe_unused]] const float ks = kDropout ? ss.ls.keep_scale : 1.f;
          CUTE_UNROLL
          for (int c = 0; c < size<1>(ds); ++c) {
            const float dd = ss.dsum[st][get<1>(tSc_rc(0, c))];
            CUTE_UNROLL
            for (int r = 0; r < size<0>(ds); ++r) {
              if constexpr (kDropout)
                ds(r, c) = s(r, c) * ((keep(r, c) ? ds(r, c) * ks : 0.f) - dd);
              else
                ds(r, c) = s(r, c) * (ds(r, c) - dd);
            }
          }
          keep_scaled(s);
        }
      } else {
        // P^T: columns are queries, so lse2 (and D) vary along columns. This
        // thread's columns come in adjacent pairs, read as float2. With 16
        // columns (64 rows, kStatsInRegs) the LSE pairs go to registers under
        // the wgmmas (ncu, d128: the exponentials' shared loads had stalled
        // ~9% of the samples) and D's under the P^T math; with 32 (d64) that
        // many registers spilled (ptxas: 192 B), so they are read where used.
        constexpr int kPairs = decltype(size<1>(s))::value / 2;
        constexpr bool kStatsInRegs = kPairs <= 8;
        auto pair_at = [&](const float* row, int j) {
          return *reinterpret_cast<const float2*>(row + get<1>(tSc_rc(0, 2 * j)));
        };
        float2 lse2[kStatsInRegs ? kPairs : 1], dsum[kStatsInRegs ? kPairs : 1];
        auto prefetch = [&](const float* row, float2* dst) {
          if constexpr (kStatsInRegs) {
            CUTE_UNROLL
            for (int j = 0; j < kPairs; ++j) dst[j] = pair_at(row, j);
          }
        };
        auto stat = [&](const float2* regs, const float* row, int j) {
          if constexpr (kStatsInRegs)
            return regs[j];
          else
            return pair_at(row, j);
        };
        prefetch(ss.lse2[st], lse2);
        warpgroup_wait<1>();
        warpgroup_fence_operand(acc_s);
        prefetch(ss.dsum[st], dsum);

        const bool mask = !Cfg::kMasks && ((p.causal && m0 < n0 + N - 1) || n0 + N > Sk || m0 + M > Sq);
        // The exponentials, with the causal / edge masks inside their loop
        // (d128) or without them: one branch a step, not one an element (a
        // taken branch per element had sat between the exponentials).
        auto exps = [&](auto masked) {
          CUTE_UNROLL
          for (int j = 0; j < kPairs; ++j) {
            const float2 l2 = stat(lse2, ss.lse2[st], j);
            CUTE_UNROLL
            for (int c = 2 * j; c < 2 * j + 2; ++c) {
              const int qc = get<1>(tSc_rc(0, c));
              const float l = c == 2 * j ? l2.x : l2.y;
              CUTE_UNROLL
              for (int r = 0; r < size<0>(s); ++r) {
                float pv = exp2f(s(r, c) * kp.scale_log2 - l);
                if constexpr (decltype(masked)::value) {
                  const int key = n0 + get<0>(tSc_rc(r, c)), query = m0 + qc;
                  pv = key < Sk && query < Sq && (!p.causal || key <= query) ? pv : 0.f;
                }
                s(r, c) = pv;
              }
            }
          }
        };
        if (!kTight && mask)
          exps(cute::true_type{});
        else
          exps(cute::false_type{});
        if (kTight && mask) {  // (the same masks, a second pass)
          CUTE_UNROLL
          for (int c = 0; c < size<1>(s); ++c) {
            const int query = m0 + get<1>(tSc_rc(0, c));
            CUTE_UNROLL
            for (int r = 0; r < size<0>(s); ++r) {
              const int key = n0 + get<0>(tSc_rc(r, c));
              s(r, c) = key < Sk && query < Sq && (!p.causal || key <= query) ? s(r, c) : 0.f;
            }
          }
        }
        variant_masks([&](int r, int c) { s(r, c) = 0.f; });  // under the dP^T wgmma
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_dp);
        Tensor ds = make_tensor(acc_dp.data(), fwd::acc_rowcol_layout(acc_dp.layout()));
        if constexpr (kDropout) {
          // dS^T = P^T (keep dP^T / (1 - rate) - D); dV takes the dropped P^T.
          const float ks = ss.ls.keep_scale;
          CUTE_UNROLL
          for (int c = 0; c < size<1>(ds); ++c) {
            const float dd = ss.dsum[st][get<1>(tSc_rc(0, c))];
            CUTE_UNROLL
            for (int r = 0; r < size<0>(ds); ++r) {
              const bool kept = keep(r, c);
              ds(r, c) = s(r, c) * ((kept ? ds(r, c) * ks : 0.f) - dd);
              s(r, c) = kept ? s(r, c) * ks : 0.f;
            }
          }
        } else {
          CUTE_UNROLL
          for (int j = 0; j < kPairs; ++j) {
            const float2 dd = stat(dsum, ss.dsum[st], j);
            CUTE_UNROLL
            for (int r = 0; r < size<0>(ds); ++r) {
              ds(r, 2 * j) = s(r, 2 * j) * (ds(r, 2 * j) - dd.x);
              ds(r, 2 * j + 1) = s(r, 2 * j + 1) * (ds(r, 2 * j + 1) - dd.y);
            }
          }
        }
      }

      // dV += P^T dO, dK += dS^T Q (RS); dS^T also to shared memory for dQ.
      Tensor rP = fwd::convert_regs<Element>(acc_s);
      Tensor tdVrP = make_tensor(rP.data(), fwd::PAsALayout<M>{});
      fwd::wgmma_issue<false, true>(mma_dkv, tdVrP, tdVrdOt(_, _, _, st), acc_dv);
      Tensor rdS = fwd::convert_regs<Element>(acc_dp);
      Tensor tdKrdS = make_tensor(rdS.data(), fwd::PAsALayout<M>{});
      fwd::wgmma_issue<false, true>(mma_dkv, tdKrdS, tdKrQt(_, _, _, st), acc_dk);
      cute::copy(r2s, r2s_thr.retile_S(rdS), tdSsdS(_, _, _, st));
      cutlass::arch::fence_view_async_shared();  // st.shared -> wgmma reads
      named_sync(kBarDsReady, Cfg::kConsumerThreads);

      Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<M>, Int<D>>{});
      Tensor tdQrdS_st = tdQrdS(_, _, _, st);
      fwd::wgmma_issue<true, false>(mma_dq, tdQrdS_st, tdQrKt, acc_dq);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_dq);
      barrier_arrive(ss.empty[st]);  // Q, dO, LSE and D of this stage are free

      if (step > 0) named_sync(bwd_dq_empty(step - 1), kDqBarThreads);  // the last tile's writer has read it
      dq_to_staged<Cfg::kConsumerThreads>(acc_dq, ss.dq.data(), ct);
      cutlass::arch::fence_view_async_shared();  // st.shared -> the bulk copy's reads
      named_arrive(bwd_dq_full(step), kDqBarThreads);
      ring.advance();
    }
    if (turns && wg == 0) named_sync(kBarTurn + 0, Cfg::kConsumerThreads);  // warpgroup 1's last hand-over
    warpgroup_fence_operand(acc_dv);
    warpgroup_fence_operand(acc_dk);
  }
};

}  // namespace jax_flash::cuda::sm90
