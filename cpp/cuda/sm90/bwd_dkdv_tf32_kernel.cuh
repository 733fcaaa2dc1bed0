// The Hopper float32 (TF32 wgmma) dK / dV kernel of plain attention (full
// or causal, GQA): warpgroup 0 holds the two TMA producers
// (bwd_dkdv_tf32_producer.cuh), warpgroups 1 and 2 are consumers of 64 keys
// each (bwd_dkdv_tf32_mainloop.cuh), one CTA a work tile. dK = scale * acc
// and dV are written from registers; a key tile no query meets (causal,
// seqlen_k > seqlen_q) writes zeros.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/common/utils.cuh"
#include "cuda/sm90/bwd_dkdv_tf32_mainloop.cuh"
#include "cuda/sm90/bwd_dkdv_tf32_producer.cuh"
#include "cuda/sm90/pipeline.cuh"

namespace jax_flash::cuda::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) bwd_dkdv_tf32_kernel(const __grid_constant__ BwdDkdvTf32Params<Cfg> kp) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Storage = typename Cfg::SharedStorage;
  extern __shared__ __align__(1024) char smem_raw[];
  Storage& ss = *reinterpret_cast<Storage*>(smem_raw);
  const int tid = threadIdx.x;
  const int warpgroup = tid / 128;
  const DkdvTf32Work<Cfg> w(kp);

  if (tid == 0) {
    prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_do.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_qt.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_dot.get_tma_descriptor());
    barrier_init(ss.kv_full, 1);
#pragma unroll
    for (int s = 0; s < Cfg::kStages; ++s) {
      barrier_init(ss.q_full[s], 1);
      barrier_init(ss.q_empty[s], Cfg::kConsumerThreads);
    }
#pragma unroll
    for (int s = 0; s < Cfg::kTStages; ++s) {
      barrier_init(ss.qt_full[s], 1);
      barrier_init(ss.qt_empty[s], Cfg::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (w.steps > 0 && (tid == 0 || tid == 32)) bwd_dkdv_tf32_produce<Cfg>(kp, ss, w, tid / 32);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
  const BwdParams& p = kp.p;
  BwdDkdvTf32Mainloop<Cfg> mainloop(tid - 128);
  const int wg = mainloop.wg;

  Tensor acc_dv = partition_fragment_C(mainloop.mma_kv, Shape<Int<Cfg::kBlockN>, Int<Cfg::kHeadDim>>{});
  Tensor acc_dk = partition_fragment_C(mainloop.mma_kv, Shape<Int<Cfg::kBlockN>, Int<Cfg::kHeadDim>>{});
  clear(acc_dv);
  clear(acc_dk);
  if (w.steps > 0) {
    // Warpgroup 0 of the consumers issues first; the last hand-over is
    // balanced below.
    if (wg == 1) named_arrive(kPingBarrier + 0, BwdDkdvTf32Mainloop<Cfg>::kPingThreads);
    mainloop.run(kp, ss, w, acc_dv, acc_dk);
    if (wg == 0) named_sync(kPingBarrier + 0, BwdDkdvTf32Mainloop<Cfg>::kPingThreads);
  }

  // dV and dK = scale * acc, float pairs (adjacent columns, adjacent registers).
  auto thr_kv = mainloop.mma_kv.get_thread_slice(mainloop.ctid);
  Tensor tc = thr_kv.partition_C(make_identity_tensor(Shape<Int<Cfg::kBlockN>, Int<Cfg::kHeadDim>>{}));
  Tensor c = make_tensor(tc.data(), fwd::acc_rowcol_layout(tc.layout()));
  Tensor dv = make_tensor(acc_dv.data(), fwd::acc_rowcol_layout(acc_dv.layout()));
  Tensor dk = make_tensor(acc_dk.data(), fwd::acc_rowcol_layout(acc_dk.layout()));
  const int n0 = w.n_block * Cfg::kBlockN;
  float* dk_base = static_cast<float*>(p.dk) + int64_t(w.batch) * p.dk_batch_stride + int64_t(w.hkv) * p.dk_head_stride;
  float* dv_base = static_cast<float*>(p.dv) + int64_t(w.batch) * p.dv_batch_stride + int64_t(w.hkv) * p.dv_head_stride;
#pragma unroll
  for (int r = 0; r < size<0>(dv); ++r) {
    const int key = n0 + get<0>(c(r, 0));
    if (key >= p.seqlen_k) continue;
    float* dk_row = dk_base + int64_t(key) * p.dk_row_stride;
    float* dv_row = dv_base + int64_t(key) * p.dv_row_stride;
#pragma unroll
    for (int j = 0; j < size<1>(dv); j += 2) {
      const int col = get<1>(c(r, j));
      if (col >= p.head_dim) continue;
      *reinterpret_cast<float2*>(dk_row + col) = make_float2(dk(r, j) * p.scale, dk(r, j + 1) * p.scale);
      *reinterpret_cast<float2*>(dv_row + col) = make_float2(dv(r, j), dv(r, j + 1));
    }
  }
#else
#if defined(__CUDA_ARCH__)
  __trap();  // not built for sm_90a: the host never launches this
#endif
#endif
}

}  // namespace jax_flash::cuda::sm90
