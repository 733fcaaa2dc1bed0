// Small device helpers of the CUDA forward: quad reductions, accumulator
// layout views, register type conversion, warp-level GEMMs over shared
// memory, and predicated gmem <-> smem tile copies.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

namespace jax_flash::cuda::fwd {

using namespace cute;

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// The four lanes of a quad own the same accumulator rows (SM80 m16n8 C
// layout: lane/4 picks the row, lane%4 the column pair).
template <typename Op>
__device__ __forceinline__ float quad_allreduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffffu, x, 2));
  x = op(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return x;
}

// SM80 MMA accumulator ((2,2), MMA_M, MMA_N) seen as a matrix
// (rows = (2, MMA_M), cols = (2, MMA_N)). Value mode (2,2) = (col pair, row +8).
// SM90 GMMA accumulator ((2,2,N/8), MMA_M, MMA_N): value mode (col pair,
// row +8, n8 block); the same quad ownership of rows, so the same view
// (rows = (2, MMA_M), cols = (2, N/8, MMA_N)).
template <class Layout>
__device__ __forceinline__ constexpr auto acc_rowcol_layout(Layout const& l) {
  static_assert(decltype(rank(l))::value == 3);
  if constexpr (decltype(rank<0>(l))::value == 3) {
    static_assert(decltype(size<0, 0>(l))::value == 2 && decltype(size<0, 1>(l))::value == 2);
    return make_layout(make_layout(get<0, 1>(l), get<1>(l)),
                       make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l)));
  } else {
    static_assert(decltype(size<0>(l))::value == 4);
    return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
  }
}

// Accumulator of S = Q K^T, ((2,2), MMA_M, MMA_N), reinterpreted as the
// A operand of the m16n8k16 MMA, ((2,2,2), MMA_M, MMA_N / 2): two adjacent
// n8 accumulator tiles are exactly one k16 A fragment.
template <class Layout>
__device__ __forceinline__ constexpr auto acc_as_a_layout(Layout const& l) {
  static_assert(decltype(size<2>(l))::value % 2 == 0);
  auto d = logical_divide(l, Shape<Underscore, Underscore, _2>{});  // ((2,2), M, (2, N/2))
  return make_layout(make_layout(get<0>(d), get<2, 0>(d)), get<1>(d), get<2, 1>(d));
}

// Owning register copy of `t` converted to To (vectorised cvt where possible).
template <typename To, class Engine, class Layout>
__device__ __forceinline__ auto convert_regs(Tensor<Engine, Layout> const& t) {
  using From = typename Engine::value_type;
  constexpr int N = decltype(size(t))::value;
  cutlass::NumericArrayConverter<To, From, N> conv;
  Tensor out = make_tensor<To>(t.layout());
  *reinterpret_cast<cutlass::Array<To, N>*>(out.data()) =
      conv(*reinterpret_cast<cutlass::Array<From, N> const*>(t.data()));
  return out;
}

// acc += A * B with both operands in shared memory; the ldmatrix of k-slice
// i+1 is issued before the MMAs of slice i.
template <class TiledMma, class TC, class TA, class TB, class SA, class SB, class CopyA, class CopyB>
__device__ __forceinline__ void gemm_smem_smem(TC& acc, TA& rA, TB& rB, SA const& sA, SB const& sB,
                                               TiledMma const& mma, CopyA const& copy_a,
                                               CopyB const& copy_b, int tid) {
  auto thr_a = copy_a.get_thread_slice(tid);
  auto thr_b = copy_b.get_thread_slice(tid);
  Tensor rA_view = thr_a.retile_D(rA);
  Tensor rB_view = thr_b.retile_D(rB);
  constexpr int K = decltype(size<2>(rA))::value;
  cute::copy(copy_a, sA(_, _, 0), rA_view(_, _, 0));
  cute::copy(copy_b, sB(_, _, 0), rB_view(_, _, 0));
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (k + 1 < K) {
      cute::copy(copy_a, sA(_, _, k + 1), rA_view(_, _, k + 1));
      cute::copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    }
    cute::gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// acc += A * B with A already in registers and B in shared memory.
template <class TiledMma, class TC, class TA, class TB, class SB, class CopyB>
__device__ __forceinline__ void gemm_reg_smem(TC& acc, TA const& rA, TB& rB, SB const& sB,
                                              TiledMma const& mma, CopyB const& copy_b, int tid) {
  auto thr_b = copy_b.get_thread_slice(tid);
  Tensor rB_view = thr_b.retile_D(rB);
  constexpr int K = decltype(size<2>(rA))::value;
  cute::copy(copy_b, sB(_, _, 0), rB_view(_, _, 0));
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (k + 1 < K) cute::copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    cute::gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// Tile gmem -> smem. src/dst/coord are partitions (CPY, CPY_ROW, CPY_COL) of
// one gmem tiled copy whose atom moves 8 contiguous 16-bit elements (16 B).
// Rows >= max_row (checked only if kCheckRows) and columns >= max_col are zero-filled in smem and never
// read. kVec: every 8-element chunk is 16 B aligned in gmem and head_dim is
// a multiple of 8, so a chunk is either wholly in or wholly out -> cp.async.
// Otherwise a scalar path copies element by element (synchronously).
template <bool kVec, bool kCheckRows, class TiledCopy, class S, class D, class C>
__device__ __forceinline__ void load_tile(TiledCopy const& tc, S const& src, D&& dst, C const& coord,
                                          int max_row, int max_col) {
  using Element = typename std::remove_reference_t<D>::value_type;
  static_assert(decltype(size<0>(dst))::value == 8);
#pragma unroll
  for (int m = 0; m < size<1>(dst); ++m) {
    const bool row_ok = !kCheckRows || get<0>(coord(0, m, 0)) < max_row;
#pragma unroll
    for (int k = 0; k < size<2>(dst); ++k) {
      if constexpr (kVec) {
        if (row_ok && get<1>(coord(0, m, k)) < max_col) {
          cute::copy(tc, src(_, m, k), dst(_, m, k));
        } else {
          *reinterpret_cast<uint4*>(&dst(0, m, k)) = make_uint4(0u, 0u, 0u, 0u);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          Element v = Element(0.f);
          if (row_ok && get<1>(coord(i, m, k)) < max_col) v = src(i, m, k);
          dst(i, m, k) = v;
        }
      }
    }
  }
}

// Registers -> gmem with the same predication as load_tile.
template <bool kVec, class TiledCopy, class S, class D, class C>
__device__ __forceinline__ void store_tile(TiledCopy const& tc, S const& src, D&& dst, C const& coord,
                                           int max_row, int max_col) {
#pragma unroll
  for (int m = 0; m < size<1>(src); ++m) {
    const bool row_ok = get<0>(coord(0, m, 0)) < max_row;
    if (!row_ok) continue;
#pragma unroll
    for (int k = 0; k < size<2>(src); ++k) {
      if constexpr (kVec) {
        if (get<1>(coord(0, m, k)) < max_col) cute::copy(tc, src(_, m, k), dst(_, m, k));
      } else {
#pragma unroll
        for (int i = 0; i < size<0>(src); ++i) {
          if (get<1>(coord(i, m, k)) < max_col) dst(i, m, k) = src(i, m, k);
        }
      }
    }
  }
}

}  // namespace jax_flash::cuda::fwd
