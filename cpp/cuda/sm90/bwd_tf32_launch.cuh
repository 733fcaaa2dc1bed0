// Host side of the Hopper float32 (TF32 wgmma) backward: which calls it
// takes, the rounded / transposed operand copies in the workspace
// (tf32_operands.cuh), the TMA descriptors, the dK / dV and dQ launches.
// Included only by instantiations/bwd_sm90_hdim*_tf32.cu.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/common/tile_order.h"
#include "cuda/sm90/bwd_dkdv_tf32_kernel.cuh"
#include "cuda/sm90/bwd_dq_tf32_kernel.cuh"
#include "cuda/sm90/fwd_launch.cuh"  // sm_count, tma_ok
#include "cuda/sm90/ready.h"
#include "cuda/sm90/tf32_operands.cuh"
#include "cuda/tf32_dispatch.h"

namespace jax_flash::cuda {

namespace sm90 {

// q, k, v, o as the forward needs them; dO read by TMA and copied; dq, dk,
// dv written as float pairs.
inline bool bwd_tf32_rows_ok(const BwdParams& p) {
  auto a16 = [](const void* x) { return (reinterpret_cast<uintptr_t>(x) & 15u) == 0; };
  auto a8 = [](const void* x) { return (reinterpret_cast<uintptr_t>(x) & 7u) == 0; };
  return tma_ok(p) && a16(p.dout) && p.do_batch_stride % 4 == 0 && p.do_row_stride % 4 == 0 &&
         p.do_head_stride % 4 == 0 && a8(p.dq) && a8(p.dk) && a8(p.dv) && p.dq_row_stride % 2 == 0 &&
         p.dk_row_stride % 2 == 0 && p.dv_row_stride % 2 == 0 && p.dq_batch_stride % 2 == 0 &&
         p.dk_batch_stride % 2 == 0 && p.dv_batch_stride % 2 == 0 && p.dq_head_stride % 2 == 0 &&
         p.dk_head_stride % 2 == 0 && p.dv_head_stride % 2 == 0;
}

// (rows, cols, heads, batch) float tensor for a TMA descriptor.
inline auto tf32_gmem(const void* ptr, int rows, int cols, int heads, int batch, int64_t row, int64_t head,
                      int64_t batch_stride) {
  return make_tensor(make_gmem_ptr(static_cast<float const*>(ptr)),
                     make_layout(gmem_shape(rows, cols, heads, batch), make_stride(row, _1{}, head, batch_stride)));
}

template <class CfgKV, class CfgQ>
cudaError_t launch_bwd_tf32(const BwdParams& p, float* dsum, void* scratch, cudaStream_t stream) {
  constexpr int D = CfgQ::kHeadDim;
  static std::atomic<unsigned long long> ready_kv{0}, ready_q{0};
  if (!sm90_kernel_ready(&bwd_dkdv_tf32_kernel<CfgKV>, CfgKV::kSmemBytes, ready_kv) ||
      !sm90_kernel_ready(&bwd_dq_tf32_kernel<CfgQ>, CfgQ::kSmemBytes, ready_q))
    return cudaErrorNotSupported;
  if (p.seqlen_k == 0 || p.seqlen_q == 0 || !(p.scale > 0.f) || !bwd_tf32_rows_ok(p) || p.head_dim > D)
    return cudaErrorNotSupported;
  const int64_t num_m = (int64_t(p.seqlen_q) + CfgQ::kBlockM - 1) / CfgQ::kBlockM;
  const int64_t total_q = num_m * p.heads_q * p.batch;
  const int64_t num_n = (int64_t(p.seqlen_k) + CfgKV::kBlockN - 1) / CfgKV::kBlockN;
  const int64_t total_kv = num_n * p.heads_kv * p.batch;
  const int sms = sm_count();
  if (total_q >= (int64_t(1) << 31) || total_kv >= (int64_t(1) << 31) || sms <= 0) return cudaErrorNotSupported;

  const Tf32BwdScratch layout(p);
  char* base = static_cast<char*>(scratch);
  auto region = [&](size_t offset) { return reinterpret_cast<float*>(base + offset); };
  float *k_copy = region(layout.k_offset), *v_copy = region(layout.v_offset), *kt_copy = region(layout.kt_offset);
  float *q_copy = region(layout.q_offset), *do_copy = region(layout.do_offset);
  float *qt_copy = region(layout.qt_offset), *dot_copy = region(layout.dot_offset);
  const int hd = p.head_dim, keys = tf32_keys_padded(p.seqlen_k), rows = tf32_keys_padded(p.seqlen_q);

  Tf32PrepArgs kv;
  kv.x = {static_cast<const float*>(p.k), p.k_batch_stride, p.k_row_stride, p.k_head_stride, k_copy, kt_copy};
  kv.y = {static_cast<const float*>(p.v), p.v_batch_stride, p.v_row_stride, p.v_head_stride, v_copy, nullptr};
  kv.rows = p.seqlen_k;
  kv.heads = p.heads_kv;
  kv.head_dim = hd;
  if (const cudaError_t err = launch_tf32_prep<D>(kv, p.batch, stream); err != cudaSuccess) return err;
  Tf32PrepArgs qd;
  qd.x = {static_cast<const float*>(p.q), p.q_batch_stride, p.q_row_stride, p.q_head_stride, q_copy, qt_copy};
  qd.y = {static_cast<const float*>(p.dout), p.do_batch_stride, p.do_row_stride, p.do_head_stride, do_copy, dot_copy};
  qd.rows = p.seqlen_q;
  qd.heads = p.heads_q;
  qd.head_dim = hd;
  qd.o = static_cast<const float*>(p.o);
  qd.o_batch_stride = p.o_batch_stride;
  qd.o_row_stride = p.o_row_stride;
  qd.o_head_stride = p.o_head_stride;
  qd.dsum = dsum;
  if (const cudaError_t err = launch_tf32_prep<D>(qd, p.batch, stream); err != cudaSuccess) return err;

  const int64_t kh = int64_t(p.seqlen_k) * hd, kth = int64_t(hd) * keys;
  const int64_t qh = int64_t(p.seqlen_q) * hd, qth = int64_t(hd) * rows;
  const float scale_log2 = p.scale * 1.4426950408889634f;

  // dK / dV: one CTA a work tile.
  {
    using Cfg = CfgKV;
    using KBox = Shape<Int<Cfg::kBlockN>, Int<D>>;
    using QBox = Shape<Int<Cfg::kBlockM>, Int<D>>;
    using QtBox = Shape<Int<D>, Int<Cfg::kBlockM>>;
    BwdDkdvTf32Params<Cfg> kp;
    kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, tf32_gmem(k_copy, p.seqlen_k, hd, p.heads_kv, p.batch, hd, kh, kh * p.heads_kv),
                             typename Cfg::SmemLayoutK{}, KBox{}, _1{});
    kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, tf32_gmem(v_copy, p.seqlen_k, hd, p.heads_kv, p.batch, hd, kh, kh * p.heads_kv),
                             typename Cfg::SmemLayoutK{}, KBox{}, _1{});
    kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, tf32_gmem(q_copy, p.seqlen_q, hd, p.heads_q, p.batch, hd, qh, qh * p.heads_q),
                             take<0, 2>(typename Cfg::SmemLayoutQ{}), QBox{}, _1{});
    kp.tma_do = make_tma_copy(SM90_TMA_LOAD{}, tf32_gmem(do_copy, p.seqlen_q, hd, p.heads_q, p.batch, hd, qh, qh * p.heads_q),
                              take<0, 2>(typename Cfg::SmemLayoutQ{}), QBox{}, _1{});
    kp.tma_qt = make_tma_copy(SM90_TMA_LOAD{}, tf32_gmem(qt_copy, hd, rows, p.heads_q, p.batch, rows, qth, qth * p.heads_q),
                              take<0, 2>(typename Cfg::SmemLayoutQt{}), QtBox{}, _1{});
    kp.tma_dot = make_tma_copy(SM90_TMA_LOAD{}, tf32_gmem(dot_copy, hd, rows, p.heads_q, p.batch, rows, qth, qth * p.heads_q),
                               take<0, 2>(typename Cfg::SmemLayoutQt{}), QtBox{}, _1{});
    kp.p = p;
    kp.dsum = dsum;
    kp.scale_log2 = scale_log2;
    kp.num_n = int(num_n);
    bwd_dkdv_tf32_kernel<Cfg><<<int(total_kv), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(kp);
    if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }

  // dQ: persistent, the forward's tile order.
  {
    using Cfg = CfgQ;
    using QBox = Shape<Int<Cfg::kBlockM>, Int<D>>;
    using KBox = Shape<Int<Cfg::kBlockN>, Int<D>>;
    BwdDqTf32Params<Cfg> kp;
    kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, tf32_gmem(p.q, p.seqlen_q, hd, p.heads_q, p.batch, p.q_row_stride, p.q_head_stride, p.q_batch_stride),
                             typename Cfg::SmemLayoutQ{}, QBox{}, _1{});
    kp.tma_do = make_tma_copy(SM90_TMA_LOAD{}, tf32_gmem(p.dout, p.seqlen_q, hd, p.heads_q, p.batch, p.do_row_stride, p.do_head_stride, p.do_batch_stride),
                              typename Cfg::SmemLayoutQ{}, QBox{}, _1{});
    kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, tf32_gmem(k_copy, p.seqlen_k, hd, p.heads_kv, p.batch, hd, kh, kh * p.heads_kv),
                             take<0, 2>(typename Cfg::SmemLayoutK{}), KBox{}, _1{});
    kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, tf32_gmem(v_copy, p.seqlen_k, hd, p.heads_kv, p.batch, hd, kh, kh * p.heads_kv),
                             take<0, 2>(typename Cfg::SmemLayoutK{}), KBox{}, _1{});
    kp.tma_kt = make_tma_copy(SM90_TMA_LOAD{}, tf32_gmem(kt_copy, hd, keys, p.heads_kv, p.batch, keys, kth, kth * p.heads_kv),
                              take<0, 2>(typename Cfg::SmemLayoutKt{}), Shape<Int<D>, Int<Cfg::kBlockN>>{}, _1{});
    kp.p = p;
    kp.dsum = dsum;
    kp.scale_log2 = scale_log2;
    kp.sched.num_m = int(num_m);
    kp.sched.heads = p.heads_q;
    kp.sched.batch = p.batch;
    kp.sched.causal = p.causal;
    kp.sched.group =
        p.causal ? fwd_order_group(int(num_m), p.heads_q, p.batch, p.seqlen_k, D, p.heads_kv, int(sizeof(float)), false) : 0;
    int32_t* counter = reinterpret_cast<int32_t*>(base);  // [0, 256) of the scratch
    kp.sched.counter = counter;
    if (const cudaError_t err = cudaMemsetAsync(counter, 0, sizeof(int32_t), stream); err != cudaSuccess) return err;
    const int grid = int(total_q < sms ? total_q : sms);
    bwd_dq_tf32_kernel<Cfg><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(kp);
    return cudaGetLastError();
  }
}

}  // namespace sm90

// Float32 plain attention's D rows (into `dsum`, made in the dO copy pass),
// dK, dV and dQ (full or causal, GQA) on TF32 wgmmas, head dims up to
// kHeadDim (64, 128); `scratch` holds Tf32BwdScratch(params).bytes.
// cudaErrorNotSupported with nothing launched (the caller then makes D and
// runs the mma.sync kernels) off cc 9.0 / sm_90a, for unaligned rows, empty
// sequences, a scale <= 0, or any option.
template <int kHeadDim>
cudaError_t run_bwd_sm90_tf32_hdim(const BwdParams& params, float* dsum, void* scratch, cudaStream_t stream) {
  if (!params.plain_mask()) return cudaErrorNotSupported;
  return sm90::launch_bwd_tf32<sm90::BwdDkdvTf32Config<kHeadDim>, sm90::BwdDqTf32Config<kHeadDim>>(params, dsum,
                                                                                                  scratch, stream);
}

}  // namespace jax_flash::cuda

#define JAX_FLASH_INSTANTIATE_BWD_SM90_TF32(HDIM)                                                   \
  template cudaError_t jax_flash::cuda::run_bwd_sm90_tf32_hdim<HDIM>(const jax_flash::BwdParams&, \
                                                                    float*, void*, cudaStream_t);
