// Pieces of the Hopper backwards: the wide-head kernel's smem layouts and
// K/V, Q/dO/LSE/D tile loads (sm90/bwd_wide_kernel.cuh), and the dK/dV
// epilogue it shares with the warp-specialised kernel (sm90/bwd_kernel.cuh).
// Both compute the key-major products (S^T = K Q^T), so a tile of keys x
// queries has keys as rows.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "cuda/common/cp_async_zfill.cuh"  // cp_async4
#include "cuda/common/store_acc.cuh"       // store_acc
#include "cuda/common/utils.cuh"           // load_tile
#include "params.h"

namespace jax_flash::cuda::bwd90 {

using namespace cute;

// 128 B-swizzled, K-major smem tiles and their transposed views.
template <typename Element, int kHeadDim, int kBlockM, int kBlockN, int kStages>
struct BwdSm90SmemLayouts {
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  // Q / dO (BM, D, stage) and the (D, BM, stage) view: (d, m) -> Q(m, d).
  using SmemLayoutQ =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{},
      make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  // K / V (BN, D) and the (D, BN) view.
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
  // A keys x queries tile (P^T, dS^T) stored (BN, BM), queries contiguous
  // (as the S^T accumulator holds it); SmemLayoutdS reads it as (BM, BN).
  using SmemLayoutSt = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kBlockM>>{}));
  using SmemLayoutdS = decltype(composition(
      SmemLayoutSt{}, make_ordered_layout(Shape<Int<kBlockM>, Int<kBlockN>>{}, Step<_2, _1>{})));
};

// K and V rows [n0, n0 + BN) of kv head hkv (rows past Sk zero-filled).
template <typename Element, class GCopy, class GThr, class TK, class TV, class TC>
__device__ __forceinline__ void load_kv_tile(GCopy& gcopy, GThr& gthr, const BwdParams& p, int b, int hkv, int n0,
                                             TK&& sK, TV&& sV, TC const& cK) {
  constexpr int N = decltype(size<0>(sK))::value, D = decltype(size<1>(sK))::value;
  const Element* kp = static_cast<const Element*>(p.k) + b * p.k_batch_stride + int64_t(n0) * p.k_row_stride +
                      hkv * p.k_head_stride;
  const Element* vp = static_cast<const Element*>(p.v) + b * p.v_batch_stride + int64_t(n0) * p.v_row_stride +
                      hkv * p.v_head_stride;
  Tensor gK = make_tensor(make_gmem_ptr(kp), Shape<Int<N>, Int<D>>{}, make_stride(p.k_row_stride, _1{}));
  Tensor gV = make_tensor(make_gmem_ptr(vp), Shape<Int<N>, Int<D>>{}, make_stride(p.v_row_stride, _1{}));
  fwd::load_tile<true, true>(gcopy, gthr.partition_S(gK), gthr.partition_D(sK), cK, p.seqlen_k - n0, D);
  fwd::load_tile<true, true>(gcopy, gthr.partition_S(gV), gthr.partition_D(sV), cK, p.seqlen_k - n0, D);
}

// The LSE and D = rowsum(dO O) entries of query rows [m0, m0 + M) of q head
// h into one stage (rows past Sq: 0): thread t < 2 M loads one of those.
template <int M>
__device__ __forceinline__ void load_q_stats(int t, const BwdParams& p, const float* __restrict__ dsum, int b, int h,
                                             int m0, int Sq, float* lse_st, float* dsum_st) {
  const int64_t row_base = (int64_t(b) * p.heads_q + h) * Sq + m0;
  if (t < 2 * M) {
    const int r = t % M;
    const bool valid = m0 + r < Sq;
    const float* src = t < M ? p.lse : dsum;
    float* dst = t < M ? &lse_st[r] : &dsum_st[r];
    cuda::cp_async4(dst, src + (valid ? row_base + r : 0), valid);
  }
}

// Q and dO rows [m0, m0 + BM) of q head h into one stage (rows past Sq
// zero-filled), with their LSE and D = rowsum(dO O) entries: the copy's
// thread t of gcopy (at least 2 BM threads) loads one of those.
template <typename Element, class GCopy, class GThr, class TQ, class TO, class TC>
__device__ __forceinline__ void load_q_tile(GCopy& gcopy, GThr& gthr, int t, const BwdParams& p,
                                            const float* __restrict__ dsum, int b, int h, int m0, int Sq,
                                            TQ&& sQ, TO&& sdO, TC const& cQ, float* lse_st, float* dsum_st) {
  constexpr int M = decltype(size<0>(sQ))::value, D = decltype(size<1>(sQ))::value;
  const Element* qp = static_cast<const Element*>(p.q) + b * p.q_batch_stride + int64_t(m0) * p.q_row_stride +
                      h * p.q_head_stride;
  const Element* dp = static_cast<const Element*>(p.dout) + b * p.do_batch_stride +
                      int64_t(m0) * p.do_row_stride + h * p.do_head_stride;
  Tensor gQ = make_tensor(make_gmem_ptr(qp), Shape<Int<M>, Int<D>>{}, make_stride(p.q_row_stride, _1{}));
  Tensor gdO = make_tensor(make_gmem_ptr(dp), Shape<Int<M>, Int<D>>{}, make_stride(p.do_row_stride, _1{}));
  fwd::load_tile<true, true>(gcopy, gthr.partition_S(gQ), gthr.partition_D(sQ), cQ, Sq - m0, D);
  fwd::load_tile<true, true>(gcopy, gthr.partition_S(gdO), gthr.partition_D(sdO), cQ, Sq - m0, D);
  load_q_stats<M>(t, p, dsum, b, h, m0, Sq, lse_st, dsum_st);
}

// dK (times the softmax scale) and dV of key rows [n0, n0 + BN), of which
// `rows` (Sk - n0) exist.
template <typename Element, int D, class TA, class TC>
__device__ __forceinline__ void store_dkdv(TA const& acc_dk, TA const& acc_dv, TC const& coords, const BwdParams& p,
                                           int b, int hkv, int n0, int rows, bool pair_ok) {
  Element* dk = static_cast<Element*>(p.dk) + b * p.dk_batch_stride + int64_t(n0) * p.dk_row_stride +
                hkv * p.dk_head_stride;
  Element* dv = static_cast<Element*>(p.dv) + b * p.dv_batch_stride + int64_t(n0) * p.dv_row_stride +
                hkv * p.dv_head_stride;
  bwd::store_acc(acc_dk, coords, dk, p.dk_row_stride, rows, D, p.scale, pair_ok);
  bwd::store_acc(acc_dv, coords, dv, p.dv_row_stride, rows, D, 1.f, pair_ok);
}

}  // namespace jax_flash::cuda::bwd90
