// The producer of the warp-specialised Hopper forward: one thread claims the
// work tiles (tile_scheduler.cuh) and issues every TMA load. Per work tile:
// Q once (after the consumers released the previous tile's), with the tile's
// id beside it in shared memory, then K and V of each visited key tile, last
// tile first (the masked ones), into their kStages-deep rings.
// (Cfg::kMasks) fwd_produce_variants: the whole warp walks the key tiles the
// variants leave (fwd_masks.cuh), lane 0 issues the loads.
#pragma once

#include <utility>

#include <cute/tensor.hpp>

#include "cuda/common/variants.cuh"
#include "cuda/sm90/fwd_masks.cuh"
#include "cuda/sm90/fwd_params.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/tf32_operands.cuh"  // tf32_keys_padded

namespace jax_flash::cuda::sm90 {

// Key tiles query tile m_block visits: [0, n_end).
template <class Cfg>
__device__ __forceinline__ int key_tiles_end(const FwdParams& p, int m_block) {
  int keys = p.seqlen_k;
  if (p.causal) keys = min(keys, (m_block + 1) * Cfg::kBlockM);  // top-left: row i sees keys j <= i
  return (keys + Cfg::kBlockN - 1) / Cfg::kBlockN;
}

// The producers' TMA views: built once, then partitioned per work tile
// into (gmem, smem) pairs: Q's tile; K's and V's by key tile and ring stage.
template <class Cfg>
struct FwdLoadViews {
  static constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  using SQ = decltype(make_tensor(make_smem_ptr(static_cast<typename Cfg::Element*>(nullptr)), typename Cfg::SmemLayoutQ{}));
  using SKV = decltype(make_tensor(make_smem_ptr(static_cast<typename Cfg::Element*>(nullptr)), typename Cfg::SmemLayoutKV{}));
  // V's stages as loaded: (BN, D), or TF32's V^T (D, BN).
  using SLayoutV = std::conditional_t<Cfg::kTf32, typename Cfg::SmemLayoutVt, typename Cfg::SmemLayoutKV>;
  using SV = decltype(make_tensor(make_smem_ptr(static_cast<typename Cfg::Element*>(nullptr)), SLayoutV{}));
  SQ sQ;
  SKV sK;
  SV sV;
  decltype(std::declval<typename Cfg::TmaQ const&>().get_tma_tensor(gmem_shape(0, 0, 0, 0))) mQ;
  decltype(std::declval<typename Cfg::TmaKV const&>().get_tma_tensor(gmem_shape(0, 0, 0, 0))) mK;
  decltype(std::declval<typename Cfg::TmaV const&>().get_tma_tensor(gmem_shape(0, 0, 0, 0))) mV;
  int group;

  // TF32: V^T is (head_dim rows, keys padded to whole groups of eight).
  static __device__ __forceinline__ auto v_shape(const FwdParams& p) {
    if constexpr (Cfg::kTf32) return gmem_shape(p.head_dim, tf32_keys_padded(p.seqlen_k), p.heads_kv, p.batch);
    else return gmem_shape(p.seqlen_k, p.head_dim, p.heads_kv, p.batch);
  }

  __device__ __forceinline__ FwdLoadViews(const FwdKernelParams<Cfg>& kp, typename Cfg::SharedStorage& ss)
      : sQ(make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQ{})),
        sK(make_tensor(make_smem_ptr(ss.k.data()), typename Cfg::SmemLayoutKV{})),
        sV(make_tensor(make_smem_ptr(ss.v.data()), SLayoutV{})),
        mQ(kp.tma_q.get_tma_tensor(gmem_shape(kp.p.seqlen_q, kp.p.head_dim, kp.p.heads_q, kp.p.batch))),
        mK(kp.tma_k.get_tma_tensor(gmem_shape(kp.p.seqlen_k, kp.p.head_dim, kp.p.heads_kv, kp.p.batch))),
        mV(kp.tma_v.get_tma_tensor(v_shape(kp.p))),
        group(kp.p.heads_q / kp.p.heads_kv) {}

  __device__ __forceinline__ auto q(const FwdKernelParams<Cfg>& kp, const TileCoord& c) const {
    Tensor gQ = local_tile(mQ(_, _, c.head, c.batch), Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(c.tile, _0{}));
    return tma_partition(kp.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
  }
  __device__ __forceinline__ auto k(const FwdKernelParams<Cfg>& kp, const TileCoord& c) const {
    Tensor gK = local_tile(mK(_, _, c.head / group, c.batch), Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
    return tma_partition(kp.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  }
  __device__ __forceinline__ auto v(const FwdKernelParams<Cfg>& kp, const TileCoord& c) const {
    if constexpr (Cfg::kTf32) {
      Tensor gV = local_tile(mV(_, _, c.head / group, c.batch), Shape<Int<kHeadDim>, Int<kBlockN>>{}, make_coord(_0{}, _));
      return tma_partition(kp.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    } else {
      Tensor gV = local_tile(mV(_, _, c.head / group, c.batch), Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
      return tma_partition(kp.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    }
  }
};

template <class Cfg>
__device__ __forceinline__ void fwd_produce(const FwdKernelParams<Cfg>& kp, typename Cfg::SharedStorage& ss) {
  const FwdParams& p = kp.p;
  const TileScheduler& sched = kp.sched;

  const FwdLoadViews<Cfg> views(kp, ss);

  RingState<Cfg::kStages> k_ring, v_ring;
  k_ring.phase = v_ring.phase = 1u;  // buffers start free
  uint32_t q_phase = 1u;
  for (int t = sched.first();; t = sched.next(t)) {
    if (t >= sched.total()) {  // tell the consumers: no more work
      barrier_wait(ss.q_empty, q_phase);
      ss.tile_id = -1;
      barrier_arrive(ss.q_full);
      break;
    }
    const TileCoord c = sched.coord(t);
    auto q_part = views.q(kp, c);
    auto k_part = views.k(kp, c);
    auto v_part = views.v(kp, c);
    auto& tKg = get<0>(k_part);  // (TMA, key tile)
    auto& tKs = get<1>(k_part);  // (TMA, stage)
    auto& tVg = get<0>(v_part);
    auto& tVs = get<1>(v_part);

    const int n_end = key_tiles_end<Cfg>(p, c.tile);
    // The first K tile before Q's release wait: it does not touch Q's buffer.
    auto load_k = [&](int n) {
      barrier_wait(ss.k_empty[k_ring.index], k_ring.phase);
      barrier_expect_bytes(ss.k_full[k_ring.index], Cfg::kKVBytes);
      copy(kp.tma_k.with(ss.k_full[k_ring.index]), tKg(_, n), tKs(_, k_ring.index));
      k_ring.advance();
    };
    auto load_v = [&](int n) {
      barrier_wait(ss.v_empty[v_ring.index], v_ring.phase);
      barrier_expect_bytes(ss.v_full[v_ring.index], Cfg::kKVBytes);
      copy(kp.tma_v.with(ss.v_full[v_ring.index]), tVg(_, n), tVs(_, v_ring.index));
      v_ring.advance();
    };
    if (n_end > 0) load_k(n_end - 1);
    barrier_wait(ss.q_empty, q_phase);
    q_phase ^= 1u;
    ss.tile_id = t;
    barrier_expect_bytes(ss.q_full, Cfg::kQBytes);
    copy(kp.tma_q.with(ss.q_full), get<0>(q_part), get<1>(q_part));
    for (int n = n_end - 1; n >= 0; --n) {
      if (n < n_end - 1) load_k(n);
      load_v(n);
    }
  }
}


template <class Cfg>
__device__ __forceinline__ void fwd_produce_variants(const FwdKernelParams<Cfg>& kp, typename Cfg::SharedStorage& ss,
                                                     int lane) {
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  const FwdParams& p = kp.p;
  const TileScheduler& sched = kp.sched;

  const FwdLoadViews<Cfg> views(kp, ss);

  RingState<Cfg::kStages> k_ring, v_ring;
  k_ring.phase = v_ring.phase = 1u;  // buffers start free
  uint32_t q_phase = 1u;
  for (int t = sched.first();;) {
    if (t >= sched.total()) {  // tell the consumers: no more work
      barrier_wait(ss.q_empty, q_phase);
      if (lane == 0) {
        ss.tile_id = -1;
        barrier_arrive(ss.q_full);
      }
      break;
    }
    const TileCoord c = sched.coord(t);
    auto q_part = views.q(kp, c);
    auto k_part = views.k(kp, c);
    auto v_part = views.v(kp, c);
    auto& tKg = get<0>(k_part);
    auto& tKs = get<1>(k_part);
    auto& tVg = get<0>(v_part);
    auto& tVs = get<1>(v_part);

    FwdKeyWalk<kBlockM, kBlockN> walk;
    int hi = 0;
    walk.init(Variant(p, c.batch, c.head), c.tile, hi);
    // The tile to load (n, flags) and the one after it (nn, flags_nn): a
    // tile's flags say whether it is the last.
    int flags = 0, flags_nn = 0;
    int n = walk.next(p, c.batch, hi - 1, lane, flags);
    int nn = n >= 0 ? walk.next(p, c.batch, n - 1, lane, flags_nn) : -1;
    auto load_k = [&]() {
      barrier_wait(ss.k_empty[k_ring.index], k_ring.phase);
      if (lane == 0) {
        ss.meta.n[k_ring.index] = n;
        ss.meta.flags[k_ring.index] = flags | (nn < 0 ? kStepLast : 0);
        barrier_expect_bytes(ss.k_full[k_ring.index], Cfg::kKVBytes);  // release: the stores above
        copy(kp.tma_k.with(ss.k_full[k_ring.index]), tKg(_, n), tKs(_, k_ring.index));
      }
      k_ring.advance();
    };
    auto load_v = [&]() {
      barrier_wait(ss.v_empty[v_ring.index], v_ring.phase);
      if (lane == 0) {
        barrier_expect_bytes(ss.v_full[v_ring.index], Cfg::kKVBytes);
        copy(kp.tma_v.with(ss.v_full[v_ring.index]), tVg(_, n), tVs(_, v_ring.index));
      }
      v_ring.advance();
    };
    // The first K tile before Q's release wait: it does not touch Q's buffer.
    if (n >= 0) load_k();
    barrier_wait(ss.q_empty, q_phase);
    q_phase ^= 1u;
    if (lane == 0) {
      ss.tile_id = t;
      ss.meta.visits = n >= 0;
      if (n >= 0) {
        barrier_expect_bytes(ss.q_full, Cfg::kQBytes);
        copy(kp.tma_q.with(ss.q_full), get<0>(q_part), get<1>(q_part));
      } else {
        barrier_arrive(ss.q_full);  // no key for any row: no Q either
      }
    }
    for (bool first = true; n >= 0; first = false) {
      if (!first) load_k();
      load_v();
      n = nn;
      flags = flags_nn;
      nn = n >= 0 ? walk.next(p, c.batch, n - 1, lane, flags_nn) : -1;
    }
    int t_next = 0;
    if (lane == 0) t_next = sched.next(t);
    t = __shfl_sync(0xffffffffu, t_next, 0);
  }
}

}  // namespace jax_flash::cuda::sm90
