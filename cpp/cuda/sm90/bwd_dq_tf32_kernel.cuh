// The Hopper float32 (TF32 wgmma) dQ kernel of plain attention (full or
// causal, GQA): warpgroup 0 the TMA producer (bwd_dq_tf32_producer.cuh),
// warpgroups 1 and 2 consumers of 64 query rows each
// (bwd_dq_tf32_mainloop.cuh), a persistent grid over the forward's tile
// order. Per work tile the consumers round their rows of Q and dO to TF32
// in shared memory, read their rows' LSE and D, sweep the key tiles and
// write dQ = scale * acc from registers.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/common/utils.cuh"
#include "cuda/sm90/bwd_dq_tf32_mainloop.cuh"
#include "cuda/sm90/bwd_dq_tf32_producer.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/tf32_operands.cuh"

namespace jax_flash::cuda::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) bwd_dq_tf32_kernel(const __grid_constant__ BwdDqTf32Params<Cfg> kp) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Storage = typename Cfg::SharedStorage;
  extern __shared__ __align__(1024) char smem_raw[];
  Storage& ss = *reinterpret_cast<Storage*>(smem_raw);
  const int tid = threadIdx.x;
  const int warpgroup = tid / 128;

  if (tid == 0) {
    prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_do.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_kt.get_tma_descriptor());
    barrier_init(ss.q_full, 1);
    barrier_init(ss.q_empty, Cfg::kConsumerThreads);
#pragma unroll
    for (int s = 0; s < Cfg::kStages; ++s) {
      barrier_init(ss.k_full[s], 1);
      barrier_init(ss.kt_full[s], 1);
      barrier_init(ss.k_empty[s], Cfg::kConsumerThreads);
      barrier_init(ss.kt_empty[s], Cfg::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (tid == 0) bwd_dq_tf32_produce<Cfg>(kp, ss);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
  const BwdParams& p = kp.p;
  BwdDqTf32Mainloop<Cfg> mainloop(tid - 128);
  const int wg = mainloop.wg, wtid = mainloop.ctid % 128;
  // Warpgroup 0 of the consumers issues first.
  if (wg == 1) named_arrive(kPingBarrier + 0, BwdDqTf32Mainloop<Cfg>::kPingThreads);

  auto thr_dq = mainloop.mma_dq.get_thread_slice(mainloop.ctid);
  Tensor tDqc = thr_dq.partition_C(make_identity_tensor(Shape<Int<Cfg::kBlockM>, Int<Cfg::kHeadDim>>{}));
  Tensor dq_rc = make_tensor(tDqc.data(), fwd::acc_rowcol_layout(tDqc.layout()));
  uint32_t q_phase = 0;
  for (;;) {
    barrier_wait(ss.q_full, q_phase);  // Q and dO of the next work tile, or the end
    q_phase ^= 1u;
    const int t = ss.tile_id;
    if (t < 0) break;
    const TileCoord c = kp.sched.coord(t);
    const int row0 = c.tile * Cfg::kBlockM;
    round_rows_tf32<typename Cfg::SmemLayoutQ>(ss.q.data(), wg, wtid);
    round_rows_tf32<typename Cfg::SmemLayoutQ>(ss.dout.data(), wg, wtid);
    cutlass::arch::fence_view_async_shared();
    named_sync(1 + Cfg::kConsumerWarpgroups + wg, 128);  // this warpgroup's rows are rounded

    // This thread's two rows (the accumulator's row pair g, g + 8).
    const int64_t rows_base = (int64_t(c.batch) * p.heads_q + c.head) * p.seqlen_q;
    float lse2[2], dsum[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + get<0>(dq_rc(r, 0));
      const bool ok = row < p.seqlen_q;
      const float l = ok ? p.lse[rows_base + row] : INFINITY;
      lse2[r] = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;  // no key: P = 0
      dsum[r] = ok ? kp.dsum[rows_base + row] : 0.f;
    }
    Tensor acc_dq = partition_fragment_C(mainloop.mma_dq, Shape<Int<Cfg::kBlockM>, Int<Cfg::kHeadDim>>{});
    clear(acc_dq);
    mainloop.run(p, kp.scale_log2, ss, c.tile, key_tiles_end<Cfg>(p, c.tile), lse2, dsum, acc_dq);

    // dQ = scale * acc, float pairs (adjacent columns, adjacent registers).
    Tensor dq = make_tensor(acc_dq.data(), fwd::acc_rowcol_layout(acc_dq.layout()));
    float* dq_base = static_cast<float*>(p.dq) + int64_t(c.batch) * p.dq_batch_stride + int64_t(c.head) * p.dq_head_stride;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + get<0>(dq_rc(r, 0));
      if (row >= p.seqlen_q) continue;
      float* out = dq_base + int64_t(row) * p.dq_row_stride;
#pragma unroll
      for (int j = 0; j < size<1>(dq); j += 2) {
        const int col = get<1>(dq_rc(r, j));
        if (col < p.head_dim) *reinterpret_cast<float2*>(out + col) = make_float2(dq(r, j) * p.scale, dq(r, j + 1) * p.scale);
      }
    }
  }
  // Balance the ping-pong: the last warpgroup's last hand-over to the first.
  if (wg == 0) named_sync(kPingBarrier + 0, BwdDqTf32Mainloop<Cfg>::kPingThreads);
#else
#if defined(__CUDA_ARCH__)
  __trap();  // not built for sm_90a: the host never launches this
#endif
#endif
}

}  // namespace jax_flash::cuda::sm90
