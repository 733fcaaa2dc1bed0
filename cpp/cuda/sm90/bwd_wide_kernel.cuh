// The warp-specialised Hopper (sm_90a) backward for wide heads (head dim
// 256), plain attention (full or causal, GQA, any sequence lengths): the
// shape is in bwd_wide_config.cuh.
// - Warpgroup 0 gives up registers (setmaxnreg); its warp 0 is the
//   producer (bwd_produce_wide).
// - Warpgroups 1 and 2 are the consumers (bwd_wide_mainloop.cuh), each with
//   half the head dim of dK and dV; they store dK and dV at the end.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/sm90/bwd_epilogue.cuh"  // bwd_consume
#include "cuda/sm90/bwd_params.cuh"
#include "cuda/sm90/bwd_producer.cuh"
#include "cuda/sm90/bwd_scheduler.cuh"
#include "cuda/sm90/bwd_wide_config.cuh"
#include "cuda/sm90/bwd_wide_mainloop.cuh"
#include "cuda/sm90/pipeline.cuh"

namespace jax_flash::cuda::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) bwd_wide_kernel(const __grid_constant__ BwdKernelParams<Cfg> kp) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Storage = typename Cfg::SharedStorage;
  constexpr int N = Cfg::kBlockN;
  extern __shared__ __align__(1024) char smem_raw[];
  Storage& ss = *reinterpret_cast<Storage*>(smem_raw);
  const int tid = threadIdx.x;
  const int warpgroup = tid / 128;

  if (tid == 0) {
    prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_do.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    barrier_init(ss.kv_full, 1);
#pragma unroll
    for (int s = 0; s < Cfg::kStages; ++s) {
      barrier_init(ss.full[s], 32);  // the producer warp's lanes
      barrier_init(ss.empty[s], Cfg::kConsumerThreads);
    }
#pragma unroll
    for (int s = 0; s < Cfg::kDoStages; ++s) {
      barrier_init(ss.do_full[s], 1);
      barrier_init(ss.do_empty[s], Cfg::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  const BwdWork<Cfg::kBlockM, N> w(kp.p, kp.order_group, kp.rotate);

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (tid / 32 == 0) bwd_produce_wide<Cfg>(kp, ss, w, tid % 32);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
  bwd_consume<BwdWideMainloop<Cfg>>(kp, ss, w, tid - 128);
#else
#if defined(__CUDA_ARCH__)
  __trap();  // not built for sm_90a: the host never launches this
#endif
#endif
}

}  // namespace jax_flash::cuda::sm90
