// Consumer mainloop of the Hopper float32 dQ kernel: one warpgroup, 64
// query rows, every key tile of the work tile (last first). The forward's
// overlaps: S(n) and dP(n) are issued together with dQ += dS(n+1) K(n+1)
// and dS(n) is made while that product runs; the two consumer warpgroups
// issue their wgmmas in turn (ping-pong), so one's element-wise work runs
// under the other's products.
#pragma once

#include <cute/tensor.hpp>

#include "cuda/common/mask.cuh"
#include "cuda/common/utils.cuh"
#include "cuda/sm90/bwd_dq_tf32_config.cuh"
#include "cuda/sm90/fwd_mainloop.cuh"  // kPingBarrier
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/tf32_operands.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "params.h"

namespace jax_flash::cuda::sm90 {

template <class Cfg>
struct BwdDqTf32Mainloop {
  using Element = typename Cfg::Element;
  static constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  static constexpr int kPingThreads = 256;

  typename Cfg::TiledMmaS mma_s;
  typename Cfg::TiledMmaDq mma_dq;
  int ctid;  // consumer thread index, [0, 256)
  int wg;    // consumer warpgroup, 0 or 1
  RingState<Cfg::kStages> k_ring, kt_ring;

  __device__ __forceinline__ explicit BwdDqTf32Mainloop(int consumer_tid) : ctid(consumer_tid), wg(consumer_tid / 128) {}

  __device__ __forceinline__ void turn_wait() const { named_sync(kPingBarrier + wg, kPingThreads); }
  __device__ __forceinline__ void turn_pass() const { named_arrive(kPingBarrier + (wg ^ 1), kPingThreads); }

  // Accumulate this warpgroup's rows of dQ / scale for query tile m_block
  // over key tiles [0, n_end), n_end >= 1. lse2 / dsum: the thread's two
  // rows' LSE (log2 units; +inf past seqlen_q) and D.
  template <class TDq>
  __device__ __forceinline__ void run(const BwdParams& p, float scale_log2, typename Cfg::SharedStorage& ss, int m_block,
                                      int n_end, const float (&lse2)[2], const float (&dsum)[2], TDq& acc_dq) {
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Cfg::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Cfg::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Cfg::SmemLayoutK{});
    Tensor sKt = make_tensor(make_smem_ptr(ss.kt.data()), typename Cfg::SmemLayoutKt{});
    auto thr_s = mma_s.get_thread_slice(ctid);
    auto thr_dq = mma_dq.get_thread_slice(ctid);
    Tensor tSrQ = thr_s.partition_fragment_A(sQ);
    Tensor tSrdO = thr_s.partition_fragment_A(sdO);
    Tensor tSrK = thr_s.partition_fragment_B(sK);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tSrV = thr_s.partition_fragment_B(sV);
    Tensor tDqrKt = thr_dq.partition_fragment_B(sKt);
    Tensor tSc = thr_s.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));

    const int row0 = m_block * kBlockM;
    const int wg_row0 = row0 + 64 * wg;
    using AccS = decltype(partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{}));
    using FragDs = decltype(make_tensor<Element>(fwd::PAsALayoutTf32<kBlockN>{}));
    FragDs tDs;

    // S, dP of key tile n -> dS in acc_s (float): P = exp2(S scale_log2 -
    // lse2) (0 where masked), dS = P (dP - D).
    auto make_ds = [&](int n, AccS& acc_s, AccS const& acc_dp) {
      const int col0 = n * kBlockN;
      if (fwd::tile_needs_mask<64, kBlockN>(wg_row0, col0, p.seqlen_k, p.causal))
        fwd::apply_mask(acc_s, tSc, row0, col0, p.seqlen_k, p.causal);
      Tensor s = make_tensor(acc_s.data(), fwd::acc_rowcol_layout(acc_s.layout()));
      Tensor dp = make_tensor(acc_dp.data(), fwd::acc_rowcol_layout(acc_dp.layout()));
#pragma unroll
      for (int r = 0; r < size<0>(s); ++r)
#pragma unroll
        for (int c = 0; c < size<1>(s); ++c) {
          const float pr = exp2f(s(r, c) * scale_log2 - lse2[r]);
          s(r, c) = pr * (dp(r, c) - dsum[r]);
        }
    };
    auto to_frag = [&](AccS const& acc_s) {
#pragma unroll
      for (int i = 0; i < size(acc_s); ++i) tDs.data()[i] = Element::bitcast(__float_as_uint(round_tf32(acc_s(i))));
    };

    // S(n), dP(n) from the K / V stage; once they are done, the stage (and
    // after the tile's last, Q and dO) is released.
    auto issue_s_dp = [&](AccS& acc_s, AccS& acc_dp) {
      fwd::wgmma_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, k_ring.index), acc_s);
      fwd::wgmma_issue<true, false>(mma_s, tSrdO, tSrV(_, _, _, k_ring.index), acc_dp);
    };
    auto release_kv = [&](int n, AccS& acc_s, AccS& acc_dp) {
      warpgroup_fence_operand(acc_s);
      warpgroup_fence_operand(acc_dp);
      barrier_arrive(ss.k_empty[k_ring.index]);
      k_ring.advance();
      if (n == 0) barrier_arrive(ss.q_empty);
    };

    // First (last-index) key tile: S and dP alone.
    int n = n_end - 1;
    {
      barrier_wait(ss.k_full[k_ring.index], k_ring.phase);
      AccS acc_s, acc_dp;
      turn_wait();
      issue_s_dp(acc_s, acc_dp);
      turn_pass();
      warpgroup_wait<0>();
      release_kv(n, acc_s, acc_dp);
      make_ds(n, acc_s, acc_dp);
      to_frag(acc_s);
    }
    for (--n; n >= 0; --n) {
      barrier_wait(ss.k_full[k_ring.index], k_ring.phase);
      AccS acc_s, acc_dp;
      turn_wait();
      issue_s_dp(acc_s, acc_dp);
      barrier_wait(ss.kt_full[kt_ring.index], kt_ring.phase);  // K^T(n + 1)
      fwd::wgmma_issue<false, true>(mma_dq, tDs, tDqrKt(_, _, _, kt_ring.index), acc_dq);
      turn_pass();
      warpgroup_wait<1>();  // S(n), dP(n)
      release_kv(n, acc_s, acc_dp);
      make_ds(n, acc_s, acc_dp);
      warpgroup_wait<0>();  // dQ += dS(n + 1) K(n + 1)
      warpgroup_fence_operand(acc_dq);
      barrier_arrive(ss.kt_empty[kt_ring.index]);
      kt_ring.advance();
      to_frag(acc_s);
    }
    // dQ += dS(0) K(0).
    barrier_wait(ss.kt_full[kt_ring.index], kt_ring.phase);
    turn_wait();
    fwd::wgmma_issue<false, true>(mma_dq, tDs, tDqrKt(_, _, _, kt_ring.index), acc_dq);
    turn_pass();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_dq);
    barrier_arrive(ss.kt_empty[kt_ring.index]);
    kt_ring.advance();
  }
};

}  // namespace jax_flash::cuda::sm90
