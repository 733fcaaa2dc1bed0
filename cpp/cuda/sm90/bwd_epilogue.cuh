// The consumer warpgroups' part of the Hopper backward kernels
// (sm90/bwd_kernel.cuh, both configurations): run the mainloop over the
// CTA's steps, then the dK / dV epilogue, the fp32 accumulators (keys as
// rows: both compute the key-major products, S^T = K Q^T) to the 16-bit
// outputs.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/common/store_acc.cuh"  // store_acc
#include "params.h"

namespace jax_flash::cuda::bwd90 {

// The first of key rows [n0, n0 + BN) of dK / dV.
template <typename Element>
__device__ __forceinline__ Element* dk_rows(const BwdParams& p, int b, int hkv, int n0) {
  return static_cast<Element*>(p.dk) + b * p.dk_batch_stride + int64_t(n0) * p.dk_row_stride + hkv * p.dk_head_stride;
}
template <typename Element>
__device__ __forceinline__ Element* dv_rows(const BwdParams& p, int b, int hkv, int n0) {
  return static_cast<Element*>(p.dv) + b * p.dv_batch_stride + int64_t(n0) * p.dv_row_stride + hkv * p.dv_head_stride;
}

// dK (times the softmax scale) and dV of key rows [n0, n0 + BN), of which
// `rows` (Sk - n0) exist; the columns past head_dim (a head dim run
// zero-padded on a wider kernel) are dropped.
template <typename Element, class TA, class TC>
__device__ __forceinline__ void store_dkdv(TA const& acc_dk, TA const& acc_dv, TC const& coords, const BwdParams& p,
                                           int b, int hkv, int n0, int rows, bool pair_ok) {
  Element* dk = dk_rows<Element>(p, b, hkv, n0);
  Element* dv = dv_rows<Element>(p, b, hkv, n0);
  bwd::store_acc(acc_dk, coords, dk, p.dk_row_stride, rows, p.head_dim, p.scale, pair_ok);
  bwd::store_acc(acc_dv, coords, dv, p.dv_row_stride, rows, p.head_dim, 1.f, pair_ok);
}

}  // namespace jax_flash::cuda::bwd90

namespace jax_flash::cuda::sm90 {

using namespace cute;

// Consumer thread ct (0..255) of a CTA: Mainloop's steps, then its dK / dV.
// Cfg::kWide: each warpgroup holds one of them (dV warpgroup 0, dK 1).
template <class Mainloop, class KernelParams, class Storage, class Work>
__device__ __forceinline__ void bwd_consume(const KernelParams& kp, Storage& ss, const Work& w, int ct) {
  using Cfg = typename Mainloop::Config;
  using Element = typename Cfg::Element;
  constexpr int N = Cfg::kBlockN, D = Cfg::kHeadDim;
  Mainloop mainloop(ct);
  if constexpr (Cfg::kWide) {
    typename Mainloop::AccKV acc;
    clear(acc);
    mainloop.run(kp, ss, w, acc);
    Tensor tKVc =
        mainloop.mma_dkv.get_thread_slice(ct % 128).partition_C(make_identity_tensor(Shape<Int<N>, Int<D>>{}));
    const BwdParams& p = kp.p;
    const int n0 = w.n_block * N;
    if (ct < 128)
      bwd::store_acc(acc, tKVc, bwd90::dv_rows<Element>(p, w.batch, w.head_kv, n0), p.dv_row_stride,
                     p.seqlen_k - n0, p.head_dim, 1.f, kp.pair_ok);
    else
      bwd::store_acc(acc, tKVc, bwd90::dk_rows<Element>(p, w.batch, w.head_kv, n0), p.dk_row_stride,
                     p.seqlen_k - n0, p.head_dim, p.scale, kp.pair_ok);
  } else {
    typename Mainloop::AccKV acc_dk, acc_dv;
    clear(acc_dk);
    clear(acc_dv);
    mainloop.run(kp, ss, w, acc_dk, acc_dv);
    Tensor tKVc = mainloop.mma_dkv.get_thread_slice(ct).partition_C(make_identity_tensor(Shape<Int<N>, Int<D>>{}));
    const int n0 = w.n_block * N;
    bwd90::store_dkdv<Element>(acc_dk, acc_dv, tKVc, kp.p, w.batch, w.head_kv, n0, kp.p.seqlen_k - n0,
                                  kp.pair_ok);
  }
}

}  // namespace jax_flash::cuda::sm90
