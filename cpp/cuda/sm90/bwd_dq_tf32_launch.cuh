// Host side of the Hopper float32 dQ kernel: which calls it takes, the
// rounded / transposed operand copies in the workspace, the TMA descriptors,
// the persistent grid. Included only by instantiations/bwd_sm90_dq_hdim*_tf32.cu.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/common/tile_order.h"
#include "cuda/sm90/bwd_dq_tf32_kernel.cuh"
#include "cuda/sm90/fwd_launch.cuh"  // sm_count, tma_ok
#include "cuda/sm90/ready.h"
#include "cuda/sm90/tf32_operands.cuh"
#include "cuda/tf32_dispatch.h"

namespace jax_flash::cuda {

namespace sm90 {

inline bool dq_tf32_rows_ok(const BwdParams& p) {
  auto a16 = [](const void* x) { return (reinterpret_cast<uintptr_t>(x) & 15u) == 0; };
  return tma_ok(p) && a16(p.dout) && a16(p.dq) && p.do_batch_stride % 4 == 0 && p.do_row_stride % 4 == 0 &&
         p.do_head_stride % 4 == 0 && p.dq_row_stride % 2 == 0;
}

template <class Cfg>
cudaError_t launch_bwd_dq_tf32(const BwdParams& p, const float* dsum, void* scratch, cudaStream_t stream) {
  static std::atomic<unsigned long long> ready{0};
  if (!sm90_kernel_ready(&bwd_dq_tf32_kernel<Cfg>, Cfg::kSmemBytes, ready)) return cudaErrorNotSupported;
  if (p.seqlen_k == 0 || !(p.scale > 0.f) || !dq_tf32_rows_ok(p) || p.head_dim > Cfg::kHeadDim)
    return cudaErrorNotSupported;
  const int64_t num_m = (int64_t(p.seqlen_q) + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int64_t total = num_m * p.heads_q * p.batch;
  const int sms = sm_count();
  if (total >= (int64_t(1) << 31) || sms <= 0) return cudaErrorNotSupported;

  const Tf32DqScratch layout(p);
  char* base = static_cast<char*>(scratch);
  int32_t* counter = reinterpret_cast<int32_t*>(base + layout.counter_offset);
  float* k_copy = reinterpret_cast<float*>(base + layout.k_offset);
  float* v_copy = reinterpret_cast<float*>(base + layout.v_offset);
  float* kt_copy = reinterpret_cast<float*>(base + layout.kt_offset);
  const int hd = p.head_dim, keys = tf32_keys_padded(p.seqlen_k);
  Tf32PrepArgs prep;
  prep.x = {static_cast<const float*>(p.k), p.k_batch_stride, p.k_row_stride, p.k_head_stride, k_copy, kt_copy};
  prep.y = {static_cast<const float*>(p.v), p.v_batch_stride, p.v_row_stride, p.v_head_stride, v_copy, nullptr};
  prep.rows = p.seqlen_k;
  prep.heads = p.heads_kv;
  prep.head_dim = hd;
  if (const cudaError_t err = launch_tf32_prep<Cfg::kHeadDim>(prep, p.batch, stream); err != cudaSuccess) return err;

  auto gmem = [&](const void* ptr, int rows, int cols, int heads, int64_t row, int64_t head, int64_t batch) {
    return make_tensor(make_gmem_ptr(static_cast<float const*>(ptr)),
                       make_layout(gmem_shape(rows, cols, heads, p.batch), make_stride(row, _1{}, head, batch)));
  };
  using QBox = Shape<Int<Cfg::kBlockM>, Int<Cfg::kHeadDim>>;
  using KBox = Shape<Int<Cfg::kBlockN>, Int<Cfg::kHeadDim>>;
  BwdDqTf32Params<Cfg> kp;
  kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, gmem(p.q, p.seqlen_q, hd, p.heads_q, p.q_row_stride, p.q_head_stride, p.q_batch_stride),
                           typename Cfg::SmemLayoutQ{}, QBox{}, _1{});
  kp.tma_do = make_tma_copy(SM90_TMA_LOAD{}, gmem(p.dout, p.seqlen_q, hd, p.heads_q, p.do_row_stride, p.do_head_stride, p.do_batch_stride),
                            typename Cfg::SmemLayoutQ{}, QBox{}, _1{});
  const int64_t kh = int64_t(p.seqlen_k) * hd, th = int64_t(hd) * keys;
  kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, gmem(k_copy, p.seqlen_k, hd, p.heads_kv, hd, kh, kh * p.heads_kv),
                           take<0, 2>(typename Cfg::SmemLayoutK{}), KBox{}, _1{});
  kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, gmem(v_copy, p.seqlen_k, hd, p.heads_kv, hd, kh, kh * p.heads_kv),
                           take<0, 2>(typename Cfg::SmemLayoutK{}), KBox{}, _1{});
  kp.tma_kt = make_tma_copy(SM90_TMA_LOAD{}, gmem(kt_copy, hd, keys, p.heads_kv, keys, th, th * p.heads_kv),
                            take<0, 2>(typename Cfg::SmemLayoutKt{}), Shape<Int<Cfg::kHeadDim>, Int<Cfg::kBlockN>>{}, _1{});
  kp.p = p;
  kp.dsum = dsum;
  kp.scale_log2 = p.scale * 1.4426950408889634f;
  kp.sched.num_m = int(num_m);
  kp.sched.heads = p.heads_q;
  kp.sched.batch = p.batch;
  kp.sched.causal = p.causal;
  kp.sched.group = p.causal ? fwd_order_group(int(num_m), p.heads_q, p.batch, p.seqlen_k, Cfg::kHeadDim, p.heads_kv,
                                              int(sizeof(float)), false)
                            : 0;
  kp.sched.counter = counter;
  if (const cudaError_t err = cudaMemsetAsync(counter, 0, sizeof(int32_t), stream); err != cudaSuccess) return err;
  const int grid = int(total < sms ? total : sms);
  bwd_dq_tf32_kernel<Cfg><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(kp);
  return cudaGetLastError();
}

}  // namespace sm90

// dQ of float32 plain attention (full or causal, GQA) on TF32 wgmmas, head
// dims up to kHeadDim (64, 128); `scratch` holds Tf32DqScratch(params).bytes
// past the D rows. cudaErrorNotSupported (the caller then runs the mma.sync
// dQ kernel) off cc 9.0 / sm_90a, for unaligned rows, seqlen_k == 0, a scale
// <= 0, or any option.
template <int kHeadDim>
cudaError_t run_bwd_dq_sm90_tf32_hdim(const BwdParams& params, const float* dsum, void* scratch, cudaStream_t stream) {
  if (!params.plain_mask()) return cudaErrorNotSupported;
  return sm90::launch_bwd_dq_tf32<sm90::BwdDqTf32Config<kHeadDim>>(params, dsum, scratch, stream);
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_BWD_SM90_DQ_TF32(HDIM)                                                   \
  template cudaError_t jax_flash::cuda::run_bwd_dq_sm90_tf32_hdim<HDIM>(const jax_flash::BwdParams&, \
                                                                       const float*, void*, cudaStream_t);
