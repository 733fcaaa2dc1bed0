// The producers of the warp-specialised Hopper backwards, one warp. Lane 0
// issues the TMA loads: K and V of the CTA's key tile once, then per step
// (q head, query tile) the Q and dO tiles, into a kStages-deep ring (full:
// landed; empty: the consumers let go). Every lane loads some of the step's
// LSE (turned into log2 units) and D entries into the stage and arrives on
// its full barrier: those rows are not padded, so a bulk copy could not
// take them. (kMasks) It also decides each step's mask flags and puts
// them, with the query tile's segment ids where compared, beside the stage.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_tma.hpp>

#include "cuda/common/bwd_rows.cuh"  // lse_to_log2
#include "cuda/sm90/bwd_masks.cuh"
#include "cuda/sm90/bwd_params.cuh"
#include "cuda/sm90/bwd_scheduler.cuh"
#include "cuda/sm90/pipeline.cuh"

namespace jax_flash::cuda::sm90 {

// K and V of the CTA's key tile, once, on kv_full (lane 0 issues).
template <class Cfg, class Work>
__device__ __forceinline__ void bwd_produce_kv(const BwdKernelParams<Cfg>& kp, typename Cfg::SharedStorage& ss,
                                               const Work& w, int lane) {
  constexpr int N = Cfg::kBlockN, D = Cfg::kHeadDim;
  const BwdParams& p = kp.p;
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Cfg::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Cfg::SmemLayoutK{});
  Tensor mK = kp.tma_k.get_tma_tensor(gmem_shape(p.seqlen_k, p.head_dim, p.heads_kv, p.batch));
  Tensor mV = kp.tma_v.get_tma_tensor(gmem_shape(p.seqlen_k, p.head_dim, p.heads_kv, p.batch));
  Tensor gK = local_tile(mK(_, _, w.head_kv, w.batch), Shape<Int<N>, Int<D>>{}, make_coord(w.n_block, _0{}));
  Tensor gV = local_tile(mV(_, _, w.head_kv, w.batch), Shape<Int<N>, Int<D>>{}, make_coord(w.n_block, _0{}));
  auto k_part = tma_partition(kp.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto v_part = tma_partition(kp.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
  if (lane == 0) {
    barrier_expect_bytes(ss.kv_full, 2 * Cfg::kKBytes);
    copy(kp.tma_k.with(ss.kv_full), get<0>(k_part), get<1>(k_part));
    copy(kp.tma_v.with(ss.kv_full), get<0>(v_part), get<1>(v_part));
  }
}

// This lane's LSE (log2 units) and D entries of query tile m of q head h:
// rows lane + 32 j. Rows past seqlen_q, or all when !load, get LSE = +inf
// (P = 0) and D = 0.
template <int M>
__device__ __forceinline__ void bwd_row_stats(const BwdParams& p, const float* dsum_rows, int batch, int h, int m,
                                              int lane, bool load, float* lse2, float* dsum) {
  const int64_t row0 = (int64_t(batch) * p.heads_q + h) * p.seqlen_q + int64_t(m) * M;
  CUTE_UNROLL
  for (int j = 0; j < M / 32; ++j) {
    const int r = lane + 32 * j;
    const bool valid = load && m * M + r < p.seqlen_q;
    lse2[j] = valid ? bwd::lse_to_log2(p.lse[row0 + r]) : INFINITY;
    dsum[j] = valid ? dsum_rows[row0 + r] : 0.f;
  }
}

// (kMasks) The step's values beside its stage: its flags, (ALiBi) the q
// head's slope, (kTileSeg) the query rows' segment ids.
template <class Cfg, int M>
__device__ __forceinline__ void bwd_stage_variant(const BwdParams& p, typename Cfg::SharedStorage& ss, int st, int b,
                                                  int h, int m, int flags, int lane) {
  if (lane == 0) ss.ms.flags[st] = flags;
  if constexpr ((Cfg::kLogits & kLogitAlibi) != 0) {
    if (lane == 0) ss.ls.slope[st] = p.alibi_slopes[int64_t(b) * p.alibi_batch_stride + h];
  }
  if (flags & bwd90::kTileSeg) {
    CUTE_UNROLL
    for (int j = 0; j < M / 32; ++j) {
      const int r = m * M + lane + 32 * j;
      ss.ms.qseg[st][lane + 32 * j] = r < p.seqlen_q ? int(p.q_segment_ids[int64_t(b) * p.seqlen_q + r]) : 0;
    }
  }
}

template <class Cfg, class Work>
__device__ __forceinline__ void bwd_produce(const BwdKernelParams<Cfg>& kp, typename Cfg::SharedStorage& ss,
                                            const Work& w, int lane) {
  constexpr int M = Cfg::kBlockM, D = Cfg::kHeadDim;
  const BwdParams& p = kp.p;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Cfg::SmemLayoutQ{});
  Tensor mQ = kp.tma_q.get_tma_tensor(gmem_shape(p.seqlen_q, p.head_dim, p.heads_q, p.batch));
  Tensor mdO = kp.tma_do.get_tma_tensor(gmem_shape(p.seqlen_q, p.head_dim, p.heads_q, p.batch));
  bwd_produce_kv<Cfg>(kp, ss, w, lane);

  RingState<Cfg::kStages> ring;
  ring.phase = 1u;  // buffers start free
  for (int step = 0; step < w.steps; ++step) {
    const int h = w.head(step), m = w.m_block(step);
    // (kMasks) The step's flags; a step whose ids cannot meet the key
    // tile's loads nothing and only tells the consumers so.
    int flags = 0;
    if constexpr (Cfg::kMasks) flags = bwd_step_flags<M>(p, w.batch, m * M, ss.ms);
    const bool load = !(flags & kStepSkip);
    Tensor gQ = local_tile(mQ(_, _, h, w.batch), Shape<Int<M>, Int<D>>{}, make_coord(m, _0{}));
    Tensor gdO = local_tile(mdO(_, _, h, w.batch), Shape<Int<M>, Int<D>>{}, make_coord(m, _0{}));
    auto q_part = tma_partition(kp.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto do_part = tma_partition(kp.tma_do, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
    // This lane's LSE / D entries first: their latency overlaps the wait.
    constexpr int kPerLane = M / 32;
    float lse2[kPerLane], dsum[kPerLane];
    bwd_row_stats<M>(p, kp.dsum, w.batch, h, m, lane, load, lse2, dsum);
    const int st = ring.index;
    barrier_wait(ss.empty[st], ring.phase);
    if (lane == 0 && load) {
      // The bytes before the copies (and before this lane's arrival below).
      ClusterTransactionBarrier::expect_transaction(&ss.full[st], 2 * Cfg::kQBytes);
      copy(kp.tma_q.with(ss.full[st]), get<0>(q_part), get<1>(q_part)(_, st));
      copy(kp.tma_do.with(ss.full[st]), get<0>(do_part), get<1>(do_part)(_, st));
    }
    CUTE_UNROLL
    for (int j = 0; j < kPerLane; ++j) {
      ss.lse2[st][lane + 32 * j] = lse2[j];
      ss.dsum[st][lane + 32 * j] = dsum[j];
    }
    if constexpr (Cfg::kMasks) bwd_stage_variant<Cfg, M>(p, ss, st, w.batch, h, m, flags, lane);
    barrier_arrive(ss.full[st]);  // release: the stores above
    ring.advance();
  }
}

// The wide-head backward's producer (BwdWideConfig): Q with its LSE and D
// into the kStages ring as above, dO into its own ring (do_full /
// do_empty), which the consumers free after dV, before Q's. (kMasks) A
// skipped step loads neither and only arrives on both rings, its flags
// beside the Q stage.
template <class Cfg, class Work>
__device__ __forceinline__ void bwd_produce_wide(const BwdKernelParams<Cfg>& kp, typename Cfg::SharedStorage& ss,
                                                 const Work& w, int lane) {
  constexpr int M = Cfg::kBlockM, D = Cfg::kHeadDim;
  const BwdParams& p = kp.p;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Cfg::SmemLayoutdO{});
  Tensor mQ = kp.tma_q.get_tma_tensor(gmem_shape(p.seqlen_q, p.head_dim, p.heads_q, p.batch));
  Tensor mdO = kp.tma_do.get_tma_tensor(gmem_shape(p.seqlen_q, p.head_dim, p.heads_q, p.batch));
  bwd_produce_kv<Cfg>(kp, ss, w, lane);

  RingState<Cfg::kStages> ring;
  ring.phase = 1u;  // buffers start free
  RingState<Cfg::kDoStages> do_ring;
  do_ring.phase = 1u;
  for (int step = 0; step < w.steps; ++step) {
    const int h = w.head(step), m = w.m_block(step);
    int flags = 0;
    if constexpr (Cfg::kMasks) flags = bwd_step_flags<M>(p, w.batch, m * M, ss.ms);
    const bool load = !(flags & kStepSkip);
    Tensor gQ = local_tile(mQ(_, _, h, w.batch), Shape<Int<M>, Int<D>>{}, make_coord(m, _0{}));
    Tensor gdO = local_tile(mdO(_, _, h, w.batch), Shape<Int<M>, Int<D>>{}, make_coord(m, _0{}));
    auto q_part = tma_partition(kp.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto do_part = tma_partition(kp.tma_do, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
    float lse2[M / 32], dsum[M / 32];
    bwd_row_stats<M>(p, kp.dsum, w.batch, h, m, lane, load, lse2, dsum);
    const int st = ring.index;
    barrier_wait(ss.empty[st], ring.phase);
    if (lane == 0 && load) {
      ClusterTransactionBarrier::expect_transaction(&ss.full[st], Cfg::kQBytes);
      copy(kp.tma_q.with(ss.full[st]), get<0>(q_part), get<1>(q_part)(_, st));
    }
    CUTE_UNROLL
    for (int j = 0; j < M / 32; ++j) {
      ss.lse2[st][lane + 32 * j] = lse2[j];
      ss.dsum[st][lane + 32 * j] = dsum[j];
    }
    if constexpr (Cfg::kMasks) bwd_stage_variant<Cfg, M>(p, ss, st, w.batch, h, m, flags, lane);
    barrier_arrive(ss.full[st]);  // release: the stores above
    ring.advance();
    if (lane == 0) {
      barrier_wait(ss.do_empty[do_ring.index], do_ring.phase);
      if (load) {
        barrier_expect_bytes(ss.do_full[do_ring.index], Cfg::kQBytes);
        copy(kp.tma_do.with(ss.do_full[do_ring.index]), get<0>(do_part), get<1>(do_part)(_, do_ring.index));
      } else {
        barrier_arrive(ss.do_full[do_ring.index]);  // nothing loaded
      }
    }
    __syncwarp();
    do_ring.advance();
  }
}

}  // namespace jax_flash::cuda::sm90
