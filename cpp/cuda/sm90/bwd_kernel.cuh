// The warp-specialised Hopper (sm_90a) backward for plain attention (full
// or causal, GQA, any sequence lengths), the masks-only variants
// (Cfg::kMasks, bwd_masks.cuh) and the logit transforms on top of them
// (Cfg::kLogits, bwd_logits.cuh), atomic-free within a CTA and with dQ
// reduced by whole tiles: FlashAttention-3's shape. The kernel assigns the
// warp roles:
// - Warpgroup 0 gives up registers (setmaxnreg). Its warp 0 is the
//   producer (bwd_producer.cuh); its warps 1 and 2 are the dQ writers,
//   taking the steps in turn (bwd_dq.cuh).
// - Warpgroups 1 and 2 are the consumers, 64 keys each of the CTA's 128
//   (bwd_mainloop.cuh); they store dK and dV at the end.
// Cfg::kWide (BwdWideConfig, head dim 256): the consumers share 64 keys, one
// keeping dV and the other dK (bwd_wide_mainloop.cuh), and stage dQ in the
// step's Q and dO stages; warp 0 is the producer (bwd_produce_wide, with its
// own dO ring), warps 1 and 2 the dQ writers (bwd_wide_dq.cuh).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/sm90/bwd_epilogue.cuh"  // bwd_consume
#include "cuda/sm90/bwd_dq.cuh"
#include "cuda/sm90/bwd_mainloop.cuh"
#include "cuda/sm90/bwd_masks.cuh"
#include "cuda/sm90/bwd_params.cuh"
#include "cuda/sm90/bwd_producer.cuh"
#include "cuda/sm90/bwd_scheduler.cuh"
#include "cuda/sm90/bwd_wide_mainloop.cuh"
#include "cuda/sm90/bwd_wide_dq.cuh"
#include "cuda/sm90/pipeline.cuh"

namespace jax_flash::cuda::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) bwd_ws_kernel(const __grid_constant__ BwdKernelParams<Cfg> kp) {
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
      barrier_init(ss.empty[s], Cfg::kConsumerThreads + (Cfg::kWide ? 1 : 0));  // (kWide: + the dQ writer)
    }
    if constexpr (Cfg::kWide) {
#pragma unroll
      for (int s = 0; s < Cfg::kDoStages; ++s) {
        barrier_init(ss.do_full[s], 1);
        barrier_init(ss.do_empty[s], Cfg::kConsumerThreads + 1);
      }
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  BwdWork<Cfg::kBlockM, N> w(kp.p, kp.order_group, kp.rotate);
  [[maybe_unused]] int seg_order = kSegBandTurns;  // (kSegOrder) how the dQ order ranks
  if constexpr (Cfg::kMasks) {  // every thread: the band's query tiles, the per-CTA values
    int m_begin = 0, m_end = 0;
    if constexpr (Cfg::kLogits != 0) {
      if (tid == 0) bwd_logits_setup(kp.p, ss.ls);
    }
    seg_order = bwd_masks_setup<Cfg::kBlockM, N, Cfg::kThreads, Cfg::kSegOrder>(kp.p, w.batch, w.first_head,
                                                                                 w.n_block * N, tid, ss.ms, m_begin,
                                                                                 m_end);
    w.set_query_tiles(m_begin, m_end, kp.p.heads_q / kp.p.heads_kv);
  }

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    const int warp = tid / 32;
    if constexpr (Cfg::kWide) {
      if (warp == 0) bwd_produce_wide<Cfg>(kp, ss, w, tid % 32);
      if (warp == 1 || warp == 2) bwd_write_wide_dq<Cfg>(kp, ss, w, tid % 32, warp - 1, seg_order);
    } else {
      if (warp == 0) bwd_produce<Cfg>(kp, ss, w, tid % 32);
      if (warp == 1 || warp == 2) bwd_write_dq<Cfg>(kp, ss, w, tid % 32, warp - 1, seg_order);
    }
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
  if constexpr (Cfg::kWide)
    bwd_consume<BwdWideMainloop<Cfg>>(kp, ss, w, tid - 128);
  else
    bwd_consume<BwdMainloop<Cfg>>(kp, ss, w, tid - 128);
#else
#if defined(__CUDA_ARCH__)
  __trap();  // not built for sm_90a: the host never launches this
#endif
#endif
}

}  // namespace jax_flash::cuda::sm90
