// Consumer mainloop of the warp-specialised Hopper forward: one warpgroup,
// 64 query rows, every key tile of the work tile (last first); for the
// variants (run_variants), the key tiles the producer chose.
//
// Q is released to the producer right after the tile's last S wgmma, so the
// next tile's Q load runs under the last P V and the epilogue (H100: part
// of the +5-20% at 1k tokens with the shared-memory epilogue).
// Two overlaps hide the softmax behind the tensor cores:
// - within the warpgroup, S(n) = Q K(n)^T is issued together with
//   O += P(n+1) V(n+1), and the softmax of S(n) runs while that P V is in
//   flight (O's rescale waits for it);
// - across the consumer warpgroups, named barriers let them issue their
//   wgmmas in turn (ping-pong; a rotation of three at d64), so one's softmax
//   runs under the others' matrix products.
#pragma once

#include <cute/tensor.hpp>

#include "cuda/common/mask.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/common/tile_order.h"
#include "cuda/common/variants.cuh"
#include "cuda/sm90/fwd_config.cuh"
#include "cuda/sm90/fwd_logits.cuh"
#include "cuda/sm90/fwd_masks.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/softmax_step.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "params.h"

namespace jax_flash::cuda::sm90 {

// Named barrier ids of the ping-pong (0 is __syncthreads).
inline constexpr int kPingBarrier = 1;

template <class Cfg>
struct FwdMainloop {
  using Element = typename Cfg::Element;
  static constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  static constexpr int kWarpgroups = Cfg::kConsumerWarpgroups;
  static constexpr int kPingThreads = 256;  // a warpgroup's sync + its predecessor's arrive

  typename Cfg::TiledMmaS mma_s;
  typename Cfg::TiledMmaO mma_o;
  int ctid;  // consumer thread index, [0, kConsumerThreads)
  int wg;    // consumer warpgroup, 0 or 1
  RingState<Cfg::kStages> k_ring, v_ring;

  // wg through a shuffle: warp-uniform to the compiler, so the smem
  // descriptors sliced at it stay uniform registers (bwd_mainloop.cuh).
  __device__ __forceinline__ explicit FwdMainloop(int consumer_tid)
      : ctid(consumer_tid), wg(__shfl_sync(0xffffffffu, consumer_tid / 128, 0)) {}

  // Ping-pong: wait for this warpgroup's turn to issue / hand it over.
  __device__ __forceinline__ void turn_wait() const { named_sync(kPingBarrier + wg, kPingThreads); }
  __device__ __forceinline__ void turn_pass() const {
    named_arrive(kPingBarrier + (wg + 1 == kWarpgroups ? 0 : wg + 1), kPingThreads);
  }

  // Accumulate this warpgroup's rows of query tile m_block into acc_o
  // (unnormalised) and the softmax state, over key tiles [0, n_end), n_end >= 1.
  template <class TO, class TS>
  __device__ __forceinline__ void run(const FwdParams& p, float scale_log2, typename Cfg::SharedStorage& ss, int m_block,
                                      int n_end, TO& acc_o, TS& softmax) {
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Cfg::SmemLayoutKV{});
    Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename Cfg::SmemLayoutVt{});
    auto thr_s = mma_s.get_thread_slice(ctid);
    auto wg_s = mma_s.get_thread_slice(wg * 128);
    auto wg_o = mma_o.get_thread_slice(wg * 128);
    Tensor tSrQ = wg_s.partition_fragment_A(sQ);   // smem descriptors
    Tensor tSrK = wg_s.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stage)
    Tensor tOrV = wg_o.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tSc = thr_s.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));

    constexpr int kRows = 2;
    const int row0 = m_block * kBlockM;          // the tile's (tSc is tile-relative)
    const int wg_row0 = row0 + 64 * wg;          // this warpgroup's first row
    auto mask = [&](int n, auto& acc_s) {
      const int col0 = n * kBlockN;
      if (fwd::tile_needs_mask<64, kBlockN>(wg_row0, col0, p.seqlen_k, p.causal))
        fwd::apply_mask(acc_s, tSc, row0, col0, p.seqlen_k, p.causal);
    };
    using AccS = decltype(partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{}));
    using FragP = decltype(make_tensor<Element>(fwd::PAsALayoutOf<Element, kBlockN>{}));
    FragP tOrP;
    float corr[kRows];

    // Key tiles this warpgroup's rows see: causal rows stop short of the
    // tile's last ones, and rows past seqlen_q see none (three warpgroups'
    // 192-row tiles leave 1k rows a 64-row last tile). The key tiles it
    // skips it only keeps its ping-pong turns for and releases, once they
    // have landed (an early arrival would count towards the stage's
    // previous fill). Key tiles as tall as the query tile (d64 with two
    // warpgroups, d128) leave nothing to skip but a partial last tile's rows.
    int n = n_end - 1;
    if constexpr (kBlockN < kBlockM) {
      int wg_end = n_end;
      if (wg_row0 >= p.seqlen_q) wg_end = 0;
      else if (p.causal) wg_end = min(n_end, (min(p.seqlen_k, wg_row0 + 64) + kBlockN - 1) / kBlockN);
      for (; n >= wg_end; --n) {
        turn_wait();
        turn_pass();
        barrier_wait(ss.k_full[k_ring.index], k_ring.phase);
        barrier_arrive(ss.k_empty[k_ring.index]);
        k_ring.advance();
        barrier_wait(ss.v_full[v_ring.index], v_ring.phase);
        barrier_arrive(ss.v_empty[v_ring.index]);
        v_ring.advance();
      }
      if (wg_end == 0) {  // no row: Q unread, one more turn (that of P(0) V(0))
        barrier_arrive(ss.q_empty);
        turn_wait();
        turn_pass();
        return;
      }
    }

    // First (last-index) key tile: S alone.
    {
      barrier_wait(ss.k_full[k_ring.index], k_ring.phase);
      AccS acc_s;
      turn_wait();
      fwd::wgmma_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, k_ring.index), acc_s);
      turn_pass();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_s);
      barrier_arrive(ss.k_empty[k_ring.index]);
      k_ring.advance();
      if (n == 0) barrier_arrive(ss.q_empty);  // the tile's last S: Q is free (tile_id read)
      mask(n, acc_s);
      fwd::softmax_step(softmax, acc_s, corr, scale_log2);  // O is still 0: no rescale
      Tensor rP = fwd::convert_regs<Element>(acc_s);
#pragma unroll
      for (int i = 0; i < size(tOrP); ++i) tOrP.data()[i] = rP(i);  // storage order
    }
    for (--n; n >= 0; --n) {
      barrier_wait(ss.k_full[k_ring.index], k_ring.phase);
      AccS acc_s;
      turn_wait();
      fwd::wgmma_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, k_ring.index), acc_s);
      barrier_wait(ss.v_full[v_ring.index], v_ring.phase);  // V(n + 1)
      fwd::wgmma_issue<false, true>(mma_o, tOrP, tOrV(_, _, _, v_ring.index), acc_o);
      turn_pass();
      warpgroup_wait<1>();  // S(n)
      warpgroup_fence_operand(acc_s);
      barrier_arrive(ss.k_empty[k_ring.index]);
      k_ring.advance();
      if (n == 0) barrier_arrive(ss.q_empty);
      mask(n, acc_s);
      const bool moved = fwd::softmax_step(softmax, acc_s, corr, scale_log2);
      // P(n + 1) V(n + 1), waited for below the exponentials (their row sums).
      fwd::warpgroup_wait_after<0>(softmax.row_sum);
      warpgroup_fence_operand(acc_o);
      barrier_arrive(ss.v_empty[v_ring.index]);
      v_ring.advance();
      fwd::rescale_rows(acc_o, corr, moved);
      Tensor rP = fwd::convert_regs<Element>(acc_s);
#pragma unroll
      for (int i = 0; i < size(tOrP); ++i) tOrP.data()[i] = rP(i);  // storage order
    }
    // P(0) V(0).
    barrier_wait(ss.v_full[v_ring.index], v_ring.phase);
    turn_wait();
    fwd::wgmma_issue<false, true>(mma_o, tOrP, tOrV(_, _, _, v_ring.index), acc_o);
    turn_pass();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_o);
    barrier_arrive(ss.v_empty[v_ring.index]);
    v_ring.advance();
  }
  // (Cfg::kMasks) The variants' loop: the same overlaps over the key tiles
  // the producer chose, each read from beside its K stage with its step
  // flags (fwd_masks.cuh) until the one flagged last. Per tile: the logit
  // transforms (Cfg::kLogits soft-cap / ALiBi bits; fwd_logits.cuh), the
  // masks of a flagged step, the softmax (scale: the logits' one; soft-cap
  // with a fixed max where fixed_max), dropout of P. The work tile visits at
  // least one key tile.
  template <class TO, class TS>
  __device__ __forceinline__ void run_variants(const FwdParams& p, typename Cfg::SharedStorage& ss, const TileCoord& c,
                                               const Variant& var, float scale_log2, const fwd::LogitValues& ls,
                                               bool fixed_max, TO& acc_o, TS& softmax) {
    constexpr int kTransform = Cfg::kTransform;
    constexpr bool kDropout = Cfg::kDropout;
    constexpr bool kAlibiShift = (kTransform & fwd::kLogitAlibi) != 0;
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Cfg::SmemLayoutKV{});
    Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename Cfg::SmemLayoutVt{});
    auto thr_s = mma_s.get_thread_slice(ctid);
    auto wg_s = mma_s.get_thread_slice(wg * 128);
    auto wg_o = mma_o.get_thread_slice(wg * 128);
    Tensor tSrQ = wg_s.partition_fragment_A(sQ);
    Tensor tSrK = wg_s.partition_fragment_B(sK);
    Tensor tOrV = wg_o.partition_fragment_B(sVt);
    Tensor tSc = thr_s.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    Tensor tSc0 = mma_s.get_thread_slice(0).partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));

    constexpr int kRows = 2;
    const int row0 = c.tile * kBlockM;
    FwdTileMasks<kBlockN> masks;
    masks.init(p, var, c.batch, row0, tSc, tSc0);
    using AccS = decltype(partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{}));
    using FragP = decltype(make_tensor<Element>(fwd::PAsALayoutOf<Element, kBlockN>{}));
    FragP tOrP;
    float corr[kRows];
    // Logits and masks of tile n; returns apply_logits' shift.
    auto logits_masks = [&](int n, int flags, AccS& acc_s) {
      float shift = 0.f;
      if constexpr (kTransform != 0) shift = fwd::apply_logits<kTransform, kBlockM, kBlockN>(acc_s, tSc, tSc0, &ls, n * kBlockN);
      if (flags & (kStepBand | kStepSeg)) masks.apply(p, acc_s, tSc, tSc0, row0, n * kBlockN, flags);
      return shift;
    };
    // The softmax step and dropout; whether O needs the rescale by corr.
    auto softmax_drop = [&](int n, AccS& acc_s, float shift) {
      bool moved = false;
      if (kTransform == fwd::kLogitSoftcap && fixed_max) softmax.update_fixed(acc_s, scale_log2);
      else moved = fwd::softmax_step<kAlibiShift>(softmax, acc_s, corr, scale_log2, shift);
      if constexpr (kDropout) fwd::apply_dropout(acc_s, tSc, tSc0, &ls, c.batch, c.head, row0, n * kBlockN);
      return moved;
    };

    // First key tile: S alone.
    barrier_wait(ss.k_full[k_ring.index], k_ring.phase);
    asm volatile("" ::: "memory");  // the stage's meta is read after the wait
    int n = ss.meta.n[k_ring.index], flags = ss.meta.flags[k_ring.index];
    {
      AccS acc_s;
      turn_wait();
      fwd::wgmma_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, k_ring.index), acc_s);
      turn_pass();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_s);
      barrier_arrive(ss.k_empty[k_ring.index]);
      k_ring.advance();
      if (flags & kStepLast) barrier_arrive(ss.q_empty);
      const float shift = logits_masks(n, flags, acc_s);
      softmax_drop(n, acc_s, shift);  // O is still 0: no rescale
      Tensor rP = fwd::convert_regs<Element>(acc_s);
#pragma unroll
      for (int i = 0; i < size(tOrP); ++i) tOrP.data()[i] = rP(i);  // storage order
    }
    while (!(flags & kStepLast)) {
      barrier_wait(ss.k_full[k_ring.index], k_ring.phase);
      asm volatile("" ::: "memory");
      n = ss.meta.n[k_ring.index];
      flags = ss.meta.flags[k_ring.index];
      AccS acc_s;
      turn_wait();
      fwd::wgmma_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, k_ring.index), acc_s);
      barrier_wait(ss.v_full[v_ring.index], v_ring.phase);  // V of the previous tile
      fwd::wgmma_issue<false, true>(mma_o, tOrP, tOrV(_, _, _, v_ring.index), acc_o);
      turn_pass();
      warpgroup_wait<1>();  // S(n)
      warpgroup_fence_operand(acc_s);
      barrier_arrive(ss.k_empty[k_ring.index]);
      k_ring.advance();
      if (flags & kStepLast) barrier_arrive(ss.q_empty);
      const float shift = logits_masks(n, flags, acc_s);
      const bool moved = softmax_drop(n, acc_s, shift);
      warpgroup_wait<0>();  // the previous tile's P V
      warpgroup_fence_operand(acc_o);
      barrier_arrive(ss.v_empty[v_ring.index]);
      v_ring.advance();
      fwd::rescale_rows(acc_o, corr, moved);
      Tensor rP = fwd::convert_regs<Element>(acc_s);
#pragma unroll
      for (int i = 0; i < size(tOrP); ++i) tOrP.data()[i] = rP(i);  // storage order
    }
    // The last tile's P V.
    barrier_wait(ss.v_full[v_ring.index], v_ring.phase);
    turn_wait();
    fwd::wgmma_issue<false, true>(mma_o, tOrP, tOrV(_, _, _, v_ring.index), acc_o);
    turn_pass();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_o);
    barrier_arrive(ss.v_empty[v_ring.index]);
    v_ring.advance();
  }
};

}  // namespace jax_flash::cuda::sm90
