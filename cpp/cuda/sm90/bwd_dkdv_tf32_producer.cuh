// Kernel arguments, work split and producers of the Hopper float32 dK / dV
// kernel. One CTA a work tile (128 keys of one kv head), launched lowest key
// tile first (the causal tiles with the most query tiles first). Two
// producer threads: warp 0's loads K and V once, then Q and dO of every step
// into their ring; warp 1's loads Q^T and dO^T into theirs, so neither
// ring's loads wait for the other's release.
#pragma once

#include <cute/tensor.hpp>

#include "cuda/sm90/bwd_dkdv_tf32_config.cuh"
#include "cuda/sm90/fwd_params.cuh"  // gmem_shape
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/tf32_operands.cuh"
#include "params.h"

namespace jax_flash::cuda::sm90 {

template <class Cfg>
struct BwdDkdvTf32Params {
  typename Cfg::TmaK tma_k, tma_v;
  typename Cfg::TmaQ tma_q, tma_do;
  typename Cfg::TmaQt tma_qt, tma_dot;
  BwdParams p;
  const float* dsum;  // D = rowsum(dO * O), [batch, heads_q, seqlen_q]
  float scale_log2;   // scale * log2(e)
  int num_n;          // key tiles a kv head
};

// The work tile of this CTA and its steps: every query tile the key tile
// meets (top-left causal: queries >= its first key), for each q head of the
// kv head's group.
template <class Cfg>
struct DkdvTf32Work {
  int n_block, hkv, batch, group, m_begin, nm, steps;
  __device__ __forceinline__ explicit DkdvTf32Work(const BwdDkdvTf32Params<Cfg>& kp) {
    const BwdParams& p = kp.p;
    const int id = int(blockIdx.x);
    n_block = id % kp.num_n;
    hkv = (id / kp.num_n) % p.heads_kv;
    batch = id / kp.num_n / p.heads_kv;
    group = p.heads_q / p.heads_kv;
    const int num_m = (p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
    m_begin = p.causal ? n_block * Cfg::kBlockN / Cfg::kBlockM : 0;
    nm = num_m > m_begin ? num_m - m_begin : 0;
    steps = group * nm;
  }
  __device__ __forceinline__ int head(int it) const { return hkv * group + it / nm; }
  __device__ __forceinline__ int m_block(int it) const { return m_begin + it % nm; }
};

// role 0: K, V and the Q / dO ring; role 1: the Q^T / dO^T ring.
template <class Cfg>
__device__ __forceinline__ void bwd_dkdv_tf32_produce(const BwdDkdvTf32Params<Cfg>& kp, typename Cfg::SharedStorage& ss,
                                                      const DkdvTf32Work<Cfg>& w, int role) {
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, D = Cfg::kHeadDim;
  const BwdParams& p = kp.p;
  if (role == 0) {
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Cfg::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Cfg::SmemLayoutK{});
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Cfg::SmemLayoutQ{});
    Tensor mK = kp.tma_k.get_tma_tensor(gmem_shape(p.seqlen_k, p.head_dim, p.heads_kv, p.batch));
    Tensor mV = kp.tma_v.get_tma_tensor(gmem_shape(p.seqlen_k, p.head_dim, p.heads_kv, p.batch));
    Tensor mQ = kp.tma_q.get_tma_tensor(gmem_shape(p.seqlen_q, p.head_dim, p.heads_q, p.batch));
    Tensor mdO = kp.tma_do.get_tma_tensor(gmem_shape(p.seqlen_q, p.head_dim, p.heads_q, p.batch));
    auto k_part = tma_partition(kp.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                group_modes<0, 2>(local_tile(mK(_, _, w.hkv, w.batch), Shape<Int<BN>, Int<D>>{},
                                                             make_coord(w.n_block, _0{}))));
    auto v_part = tma_partition(kp.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                group_modes<0, 2>(local_tile(mV(_, _, w.hkv, w.batch), Shape<Int<BN>, Int<D>>{},
                                                             make_coord(w.n_block, _0{}))));
    barrier_expect_bytes(ss.kv_full, 2 * Cfg::kKBytes);
    copy(kp.tma_k.with(ss.kv_full), get<0>(k_part), get<1>(k_part));
    copy(kp.tma_v.with(ss.kv_full), get<0>(v_part), get<1>(v_part));
    RingState<Cfg::kStages> ring;
    ring.phase = 1u;  // buffers start free
    for (int it = 0; it < w.steps; ++it) {
      const int h = w.head(it), m = w.m_block(it);
      auto q_part = tma_partition(kp.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                  group_modes<0, 2>(local_tile(mQ(_, _, h, w.batch), Shape<Int<BM>, Int<D>>{},
                                                               make_coord(m, _0{}))));
      auto do_part = tma_partition(kp.tma_do, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sdO),
                                   group_modes<0, 2>(local_tile(mdO(_, _, h, w.batch), Shape<Int<BM>, Int<D>>{},
                                                                make_coord(m, _0{}))));
      barrier_wait(ss.q_empty[ring.index], ring.phase);
      barrier_expect_bytes(ss.q_full[ring.index], 2 * Cfg::kQBytes);
      copy(kp.tma_q.with(ss.q_full[ring.index]), get<0>(q_part), get<1>(q_part)(_, ring.index));
      copy(kp.tma_do.with(ss.q_full[ring.index]), get<0>(do_part), get<1>(do_part)(_, ring.index));
      ring.advance();
    }
  } else {
    Tensor sQt = make_tensor(make_smem_ptr(ss.qt.data()), typename Cfg::SmemLayoutQt{});
    Tensor sdOt = make_tensor(make_smem_ptr(ss.dot.data()), typename Cfg::SmemLayoutQt{});
    const int rows_pad = tf32_keys_padded(p.seqlen_q);
    Tensor mQt = kp.tma_qt.get_tma_tensor(gmem_shape(p.head_dim, rows_pad, p.heads_q, p.batch));
    Tensor mdOt = kp.tma_dot.get_tma_tensor(gmem_shape(p.head_dim, rows_pad, p.heads_q, p.batch));
    RingState<Cfg::kTStages> ring;
    ring.phase = 1u;
    for (int it = 0; it < w.steps; ++it) {
      const int h = w.head(it), m = w.m_block(it);
      auto qt_part = tma_partition(kp.tma_qt, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQt),
                                   group_modes<0, 2>(local_tile(mQt(_, _, h, w.batch), Shape<Int<D>, Int<BM>>{},
                                                                make_coord(_0{}, m))));
      auto dot_part = tma_partition(kp.tma_dot, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sdOt),
                                    group_modes<0, 2>(local_tile(mdOt(_, _, h, w.batch), Shape<Int<D>, Int<BM>>{},
                                                                 make_coord(_0{}, m))));
      barrier_wait(ss.qt_empty[ring.index], ring.phase);
      barrier_expect_bytes(ss.qt_full[ring.index], 2 * Cfg::kQBytes);
      copy(kp.tma_qt.with(ss.qt_full[ring.index]), get<0>(qt_part), get<1>(qt_part)(_, ring.index));
      copy(kp.tma_dot.with(ss.qt_full[ring.index]), get<0>(dot_part), get<1>(dot_part)(_, ring.index));
      ring.advance();
    }
  }
}

}  // namespace jax_flash::cuda::sm90
