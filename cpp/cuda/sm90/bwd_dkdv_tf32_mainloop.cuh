// Consumer mainloop of the Hopper float32 dK / dV kernel: one warpgroup, 64
// keys, every step (query tile of a q head) of the work tile. S^T(i) and
// dP^T(i) are issued together with dV += P^T(i-1) dO(i-1) and dK += dS^T(i-1)
// Q(i-1), and P^T(i), dS^T(i) are made while those run; the two consumer
// warpgroups issue in turn (ping-pong).
#pragma once

#include <cmath>

#include <cute/tensor.hpp>

#include "cuda/common/utils.cuh"
#include "cuda/sm90/bwd_dkdv_tf32_config.cuh"
#include "cuda/sm90/bwd_dkdv_tf32_producer.cuh"
#include "cuda/sm90/fwd_mainloop.cuh"  // kPingBarrier
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/tf32_operands.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "params.h"

namespace jax_flash::cuda::sm90 {

template <class Cfg>
struct BwdDkdvTf32Mainloop {
  using Element = typename Cfg::Element;
  static constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  static constexpr int kPingThreads = 256;

  typename Cfg::TiledMmaS mma_s;
  typename Cfg::TiledMmaKV mma_kv;
  int ctid;  // consumer thread index, [0, 256)
  int wg;    // consumer warpgroup, 0 or 1

  __device__ __forceinline__ explicit BwdDkdvTf32Mainloop(int consumer_tid) : ctid(consumer_tid), wg(consumer_tid / 128) {}

  __device__ __forceinline__ void turn_wait() const { named_sync(kPingBarrier + wg, kPingThreads); }
  __device__ __forceinline__ void turn_pass() const { named_arrive(kPingBarrier + (wg ^ 1), kPingThreads); }

  // Accumulate this warpgroup's 64 keys of dV and dK / scale over the work
  // tile's steps (w.steps >= 1).
  template <class TAcc>
  __device__ __forceinline__ void run(const BwdDkdvTf32Params<Cfg>& kp, typename Cfg::SharedStorage& ss,
                                      const DkdvTf32Work<Cfg>& w, TAcc& acc_dv, TAcc& acc_dk) {
    const BwdParams& p = kp.p;
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Cfg::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Cfg::SmemLayoutK{});
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Cfg::SmemLayoutQ{});
    Tensor sQt = make_tensor(make_smem_ptr(ss.qt.data()), typename Cfg::SmemLayoutQt{});
    Tensor sdOt = make_tensor(make_smem_ptr(ss.dot.data()), typename Cfg::SmemLayoutQt{});
    // Descriptors sliced at the warp-uniform warpgroup (bwd_mainloop.cuh).
    const int wg = __shfl_sync(0xffffffffu, ctid / 128, 0);
    auto thr_s = mma_s.get_thread_slice(ctid);
    auto wg_s = mma_s.get_thread_slice(wg * 128);
    auto wg_kv = mma_kv.get_thread_slice(wg * 128);
    Tensor tSrK = wg_s.partition_fragment_A(sK);
    Tensor tSrV = wg_s.partition_fragment_A(sV);
    Tensor tSrQ = wg_s.partition_fragment_B(sQ);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tSrdO = wg_s.partition_fragment_B(sdO);
    Tensor tKVrQt = wg_kv.partition_fragment_B(sQt);
    Tensor tKVrdOt = wg_kv.partition_fragment_B(sdOt);
    Tensor tSc = thr_s.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
    Tensor rc = make_tensor(tSc.data(), fwd::acc_rowcol_layout(tSc.layout()));  // (keys, queries) of this thread

    using AccS = decltype(partition_fragment_C(mma_s, Shape<Int<kBlockN>, Int<kBlockM>>{}));
    using FragA = decltype(make_tensor<Element>(fwd::PAsALayoutTf32<kBlockM>{}));
    constexpr int kCols = decltype(size<1>(rc))::value;  // query columns a thread holds
    FragA tP, tdS;
    const int n0 = w.n_block * kBlockN;

    // LSE (log2 units) and D of the query columns this thread holds in step
    // it: loaded once the step's wgmmas are issued, so their latency runs
    // under S^T and dP^T instead of after them (loaded before the issue, they
    // stay live across it and ptxas spills 260 B).
    struct Stats {
      float lse2[kCols], dsum[kCols];
    };
    auto load_stats = [&](int it, Stats& st) {
      const int m0 = w.m_block(it) * kBlockM;
      const int64_t base = (int64_t(w.batch) * p.heads_q + w.head(it)) * p.seqlen_q;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int q = m0 + get<1>(rc(0, c));
        const bool ok = q < p.seqlen_q;
        const float l = ok ? p.lse[base + q] : INFINITY;
        st.lse2[c] = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;  // no key: P = 0
        st.dsum[c] = ok ? kp.dsum[base + q] : 0.f;
      }
    };
    // S^T, dP^T of step it -> P^T in acc_s, dS^T in acc_dp (float).
    auto make_p_ds = [&](int it, const Stats& st, AccS& acc_s, AccS& acc_dp) {
      const int m0 = w.m_block(it) * kBlockM;
      const float* lse2 = st.lse2;
      const float* dsum = st.dsum;
      Tensor s = make_tensor(acc_s.data(), fwd::acc_rowcol_layout(acc_s.layout()));
      Tensor dp = make_tensor(acc_dp.data(), fwd::acc_rowcol_layout(acc_dp.layout()));
      // Top-left causal: key k is seen by queries q >= k.
      const bool mask = p.causal && n0 + kBlockN - 1 > m0;
#pragma unroll
      for (int r = 0; r < size<0>(s); ++r)
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          float pr = exp2f(s(r, c) * kp.scale_log2 - lse2[c]);
          if (mask && n0 + get<0>(rc(r, c)) > m0 + get<1>(rc(r, c))) pr = 0.f;
          s(r, c) = pr;
          dp(r, c) = pr * (dp(r, c) - dsum[c]);
        }
    };
    auto to_frags = [&](AccS const& acc_s, AccS const& acc_dp) {
#pragma unroll
      for (int i = 0; i < size(acc_s); ++i) {
        tP.data()[i] = Element::bitcast(__float_as_uint(round_tf32(acc_s(i))));
        tdS.data()[i] = Element::bitcast(__float_as_uint(round_tf32(acc_dp(i))));
      }
    };

    RingState<Cfg::kStages> q_ring;
    RingState<Cfg::kTStages> qt_ring;
    // S^T, dP^T from the Q / dO stage, which is released once they are done;
    // dV, dK of the previous step from the Q^T / dO^T stage, likewise.
    auto issue_s_dp = [&](AccS& acc_s, AccS& acc_dp) {
      fwd::wgmma_issue<true, false>(mma_s, tSrK, tSrQ(_, _, _, q_ring.index), acc_s);
      fwd::wgmma_issue<true, false>(mma_s, tSrV, tSrdO(_, _, _, q_ring.index), acc_dp);
    };
    auto release_q = [&](AccS& acc_s, AccS& acc_dp) {
      warpgroup_fence_operand(acc_s);
      warpgroup_fence_operand(acc_dp);
      barrier_arrive(ss.q_empty[q_ring.index]);
      q_ring.advance();
    };
    auto issue_dv_dk = [&] {
      fwd::wgmma_issue<false, true>(mma_kv, tP, tKVrdOt(_, _, _, qt_ring.index), acc_dv);
      fwd::wgmma_issue<false, true>(mma_kv, tdS, tKVrQt(_, _, _, qt_ring.index), acc_dk);
    };
    auto release_qt = [&] {
      warpgroup_fence_operand(acc_dv);
      warpgroup_fence_operand(acc_dk);
      barrier_arrive(ss.qt_empty[qt_ring.index]);
      qt_ring.advance();
    };

    barrier_wait(ss.kv_full, 0u);
    // Step 0 has no dV / dK before it: peeled, so the loop's wgmma groups
    // are the same every trip (ptxas serialises every wgmma of the kernel,
    // C7513, when a step's group count depends on a branch).
    {
      barrier_wait(ss.q_full[q_ring.index], q_ring.phase);
      AccS acc_s, acc_dp;
      turn_wait();
      issue_s_dp(acc_s, acc_dp);
      turn_pass();
      Stats st;
      load_stats(0, st);
      warpgroup_wait<0>();
      release_q(acc_s, acc_dp);
      make_p_ds(0, st, acc_s, acc_dp);
      to_frags(acc_s, acc_dp);
    }
    for (int it = 1; it < w.steps; ++it) {
      barrier_wait(ss.q_full[q_ring.index], q_ring.phase);
      AccS acc_s, acc_dp;
      turn_wait();
      issue_s_dp(acc_s, acc_dp);
      barrier_wait(ss.qt_full[qt_ring.index], qt_ring.phase);  // Q^T, dO^T of step it - 1
      issue_dv_dk();
      turn_pass();
      Stats st;
      load_stats(it, st);
      warpgroup_wait<2>();  // S^T(it), dP^T(it)
      release_q(acc_s, acc_dp);
      make_p_ds(it, st, acc_s, acc_dp);
      warpgroup_wait<0>();  // dV, dK of step it - 1
      release_qt();
      to_frags(acc_s, acc_dp);
    }
    // dV, dK of the last step.
    barrier_wait(ss.qt_full[qt_ring.index], qt_ring.phase);
    turn_wait();
    issue_dv_dk();
    turn_pass();
    warpgroup_wait<0>();
    release_qt();
  }
};

}  // namespace jax_flash::cuda::sm90
