// The warp-specialised Hopper (sm_90a) forward for plain attention (full or
// causal, GQA, any sequence lengths) and, with Cfg::kMasks / kLogits, the
// variants (fwd_masks.cuh, fwd_logits.cuh): FlashAttention-3's shape.
// - Warpgroup 0 is the producer: it gives up registers (setmaxnreg) and one
//   thread issues the TMA loads of Q, K and V (fwd_producer.cuh); with the
//   variants, its first warp walks the key tiles they leave.
// - Warpgroups 1 and 2 are consumers, 64 query rows each of a 128-row tile:
//   wgmma, online softmax, epilogue (fwd_mainloop.cuh, fwd_epilogue.cuh).
// - The grid is persistent: one CTA per SM walks the work tiles
//   (tile_scheduler.cuh); K/V rings run on across tiles, so the next tile's
//   loads overlap this one's epilogue.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/common/softmax.cuh"
#include "cuda/common/variants.cuh"
#include "cuda/sm90/fwd_epilogue.cuh"
#include "cuda/sm90/fwd_mainloop.cuh"
#include "cuda/sm90/fwd_params.cuh"
#include "cuda/sm90/fwd_producer.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/tf32_operands.cuh"

namespace jax_flash::cuda::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) fwd_ws_kernel(const __grid_constant__ FwdKernelParams<Cfg> kp) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Cfg::Element;
  using Storage = typename Cfg::SharedStorage;
  extern __shared__ __align__(1024) char smem_raw[];
  Storage& ss = *reinterpret_cast<Storage*>(smem_raw);
  const int tid = threadIdx.x;
  const int warpgroup = tid / 128;

  if (tid == 0) {
    prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    if constexpr (Cfg::kSmemO) prefetch_tma_descriptor(kp.tma_o.get_tma_descriptor());
    barrier_init(ss.q_full, 1);
    barrier_init(ss.q_empty, Cfg::kConsumerThreads);
#pragma unroll
    for (int s = 0; s < Cfg::kStages; ++s) {
      barrier_init(ss.k_full[s], 1);
      barrier_init(ss.v_full[s], 1);
      barrier_init(ss.k_empty[s], Cfg::kConsumerThreads);
      barrier_init(ss.v_empty[s], Cfg::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if constexpr (Cfg::kMasks) {
      if (tid < 32) fwd_produce_variants<Cfg>(kp, ss, tid);
    } else {
      if (tid == 0) fwd_produce<Cfg>(kp, ss);
    }
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
  const FwdParams& p = kp.p;
  const TileScheduler& sched = kp.sched;
  FwdMainloop<Cfg> mainloop(tid - 128);
  // Warpgroup 0 of the consumers issues first.
  if (mainloop.wg == Cfg::kConsumerWarpgroups - 1) named_arrive(kPingBarrier + 0, FwdMainloop<Cfg>::kPingThreads);
  // (kSmemOShared) ... and writes the shared O buffer first.
  if (Cfg::kSmemOShared && mainloop.wg == 1) named_arrive(kOBufferBarrier + 0, 256);

  auto thr_o = mainloop.mma_o.get_thread_slice(mainloop.ctid);
  Tensor tOc = thr_o.partition_C(make_identity_tensor(Shape<Int<Cfg::kBlockM>, Int<Cfg::kHeadDim>>{}));
  uint32_t q_phase = 0;
  for (;;) {
    barrier_wait(ss.q_full, q_phase);  // Q of the next work tile, or the end
    q_phase ^= 1u;
    const int t = ss.tile_id;
    if (t < 0) break;
    const TileCoord c = sched.coord(t);
    if constexpr (Cfg::kTf32) round_q_tf32<Cfg>(ss, mainloop.wg, mainloop.ctid % 128);
    Tensor acc_o = partition_fragment_C(mainloop.mma_o, Shape<Int<Cfg::kBlockM>, Int<Cfg::kHeadDim>>{});
    clear(acc_o);
    fwd::OnlineSoftmax<2, Cfg::kLazyRescale> softmax;
    float lse[2];
    if constexpr (Cfg::kMasks) {
      constexpr int kTransform = Cfg::kTransform;
      const Variant var(p, c.batch, c.head);
      const fwd::LogitValues ls = fwd::logit_values<Cfg::kLogits>(p, var, c.tile * Cfg::kBlockM);
      const float scale_log2 = fwd::logits_softmax_scale<kTransform>(ls, kp.scale_log2);
      // (Soft-cap alone, bf16) tanh bounds every score to [-1, 1], so a fixed
      // stabiliser replaces the running max (OnlineSoftmax::fix_max): exp2
      // arguments lie in [24 - 2 cap_log2, 24], inside [-124, 24] while
      // cap_log2 <= 74 (cap <= 51.29). Larger caps, and fp16 (whose P cannot
      // hold 2^24), keep the running max.
      bool fixed_max = false;
      if constexpr (kTransform == fwd::kLogitSoftcap && std::is_same_v<Element, cutlass::bfloat16_t>) {
        fixed_max = scale_log2 <= 74.f;
        if (fixed_max) softmax.fix_max(1.f - 24.f / scale_log2);
      }
      if (ss.meta.visits) {
        mainloop.run_variants(p, ss, c, var, scale_log2, ls, fixed_max, acc_o, softmax);  // releases Q
      } else {
        barrier_arrive(ss.q_empty);  // no row sees a key: O = 0, LSE = -inf
      }
      softmax.finalize(acc_o, lse, scale_log2);
      if constexpr (Cfg::kDropout) {
#pragma unroll
        for (int i = 0; i < size(acc_o); ++i) acc_o(i) *= ls.keep_scale;
      }
    } else {
      const int n_end = key_tiles_end<Cfg>(p, c.tile);
      mainloop.run(p, kp.scale_log2, ss, c.tile, n_end, acc_o, softmax);  // releases Q
      softmax.finalize(acc_o, lse, kp.scale_log2);
    }
    if constexpr (Cfg::kSmemO) {
      store_o_tma<Cfg>(kp.tma_o, ss, p, acc_o, mainloop.wg, c.tile, c.head, c.batch);
      release_o_buffer<Cfg>(mainloop.wg);
    }
    store_o_lse<typename Cfg::GmemElement>(p, acc_o, tOc, lse, c.tile * Cfg::kBlockM, c.head, c.batch, !Cfg::kSmemO);
  }
  // The last TMA store must have read shared memory before the CTA exits.
  if (Cfg::kSmemO && threadIdx.x % 128 == 0) tma_store_wait<0>();
  // Balance the ping-pong: the last warpgroup's last hand-over to the first.
  if (mainloop.wg == 0) named_sync(kPingBarrier + 0, FwdMainloop<Cfg>::kPingThreads);
  // ... and warpgroup 1's last hand-over of the shared O buffer.
  if (Cfg::kSmemOShared && mainloop.wg == 0) named_sync(kOBufferBarrier + 0, 256);
#else
#if defined(__CUDA_ARCH__)
  __trap();  // not built for sm_90a: the host never launches this
#endif
#endif
}

}  // namespace jax_flash::cuda::sm90
