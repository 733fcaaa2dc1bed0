// Kernel arguments and producer of the Hopper float32 dQ kernel: one thread
// claims the work tiles (tile_scheduler.cuh, the forward's) and issues every
// TMA load. Per work tile: Q and dO once (after the consumers released the
// previous tile's), the tile's id beside them, then per key tile, last
// first: K and V into one ring (read by S and dP), K^T into another (read by
// dQ one step later).
#pragma once

#include <cute/tensor.hpp>

#include "cuda/sm90/bwd_dq_tf32_config.cuh"
#include "cuda/sm90/fwd_params.cuh"    // gmem_shape
#include "cuda/sm90/fwd_producer.cuh"  // key_tiles_end
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/tf32_operands.cuh"
#include "cuda/sm90/tile_scheduler.cuh"
#include "params.h"

namespace jax_flash::cuda::sm90 {

template <class Cfg>
struct BwdDqTf32Params {
  typename Cfg::TmaQ tma_q, tma_do;
  typename Cfg::TmaK tma_k, tma_v;
  typename Cfg::TmaKt tma_kt;
  BwdParams p;
  const float* dsum;  // D = rowsum(dO * O), [batch, heads_q, seqlen_q]
  float scale_log2;   // scale * log2(e)
  TileScheduler sched;
};

template <class Cfg>
__device__ __forceinline__ void bwd_dq_tf32_produce(const BwdDqTf32Params<Cfg>& kp, typename Cfg::SharedStorage& ss) {
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, D = Cfg::kHeadDim;
  const BwdParams& p = kp.p;
  const TileScheduler& sched = kp.sched;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Cfg::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Cfg::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Cfg::SmemLayoutK{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.kt.data()), typename Cfg::SmemLayoutKt{});
  Tensor mQ = kp.tma_q.get_tma_tensor(gmem_shape(p.seqlen_q, p.head_dim, p.heads_q, p.batch));
  Tensor mdO = kp.tma_do.get_tma_tensor(gmem_shape(p.seqlen_q, p.head_dim, p.heads_q, p.batch));
  Tensor mK = kp.tma_k.get_tma_tensor(gmem_shape(p.seqlen_k, p.head_dim, p.heads_kv, p.batch));
  Tensor mV = kp.tma_v.get_tma_tensor(gmem_shape(p.seqlen_k, p.head_dim, p.heads_kv, p.batch));
  Tensor mKt = kp.tma_kt.get_tma_tensor(gmem_shape(p.head_dim, tf32_keys_padded(p.seqlen_k), p.heads_kv, p.batch));
  const int group = p.heads_q / p.heads_kv;

  RingState<Cfg::kStages> k_ring, kt_ring;
  k_ring.phase = kt_ring.phase = 1u;  // buffers start free
  uint32_t q_phase = 1u;
  for (int t = sched.first();; t = sched.next(t)) {
    if (t >= sched.total()) {  // tell the consumers: no more work
      barrier_wait(ss.q_empty, q_phase);
      ss.tile_id = -1;
      barrier_arrive(ss.q_full);
      break;
    }
    const TileCoord c = sched.coord(t);
    const int hkv = c.head / group;
    auto q_part = tma_partition(kp.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                group_modes<0, 2>(local_tile(mQ(_, _, c.head, c.batch), Shape<Int<BM>, Int<D>>{},
                                                             make_coord(c.tile, _0{}))));
    auto do_part = tma_partition(kp.tma_do, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sdO),
                                 group_modes<0, 2>(local_tile(mdO(_, _, c.head, c.batch), Shape<Int<BM>, Int<D>>{},
                                                              make_coord(c.tile, _0{}))));
    auto k_part = tma_partition(kp.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                group_modes<0, 2>(local_tile(mK(_, _, hkv, c.batch), Shape<Int<BN>, Int<D>>{},
                                                             make_coord(_, _0{}))));
    auto v_part = tma_partition(kp.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                group_modes<0, 2>(local_tile(mV(_, _, hkv, c.batch), Shape<Int<BN>, Int<D>>{},
                                                             make_coord(_, _0{}))));
    auto kt_part = tma_partition(kp.tma_kt, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sKt),
                                 group_modes<0, 2>(local_tile(mKt(_, _, hkv, c.batch), Shape<Int<D>, Int<BN>>{},
                                                              make_coord(_0{}, _))));
    auto load_kv = [&](int n) {
      barrier_wait(ss.k_empty[k_ring.index], k_ring.phase);
      barrier_expect_bytes(ss.k_full[k_ring.index], 2 * Cfg::kKBytes);
      copy(kp.tma_k.with(ss.k_full[k_ring.index]), get<0>(k_part)(_, n), get<1>(k_part)(_, k_ring.index));
      copy(kp.tma_v.with(ss.k_full[k_ring.index]), get<0>(v_part)(_, n), get<1>(v_part)(_, k_ring.index));
      k_ring.advance();
    };
    auto load_kt = [&](int n) {
      barrier_wait(ss.kt_empty[kt_ring.index], kt_ring.phase);
      barrier_expect_bytes(ss.kt_full[kt_ring.index], Cfg::kKBytes);
      copy(kp.tma_kt.with(ss.kt_full[kt_ring.index]), get<0>(kt_part)(_, n), get<1>(kt_part)(_, kt_ring.index));
      kt_ring.advance();
    };

    const int n_end = key_tiles_end<Cfg>(p, c.tile);
    if (n_end > 0) load_kv(n_end - 1);  // before Q's release wait: it does not touch Q's buffer
    barrier_wait(ss.q_empty, q_phase);
    q_phase ^= 1u;
    ss.tile_id = t;
    barrier_expect_bytes(ss.q_full, 2 * Cfg::kQBytes);
    copy(kp.tma_q.with(ss.q_full), get<0>(q_part), get<1>(q_part));
    copy(kp.tma_do.with(ss.q_full), get<0>(do_part), get<1>(do_part));
    for (int n = n_end - 1; n >= 0; --n) {
      if (n < n_end - 1) load_kv(n);
      load_kt(n);
    }
  }
}

}  // namespace jax_flash::cuda::sm90
