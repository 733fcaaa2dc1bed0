// Building blocks of the SM80 (mma.sync) backward: tile configurations,
// swizzled shared-memory layouts, predicated cp.async tile loads, the two
// GEMM shapes (smem x smem, regs x smem) and fragment <-> coordinate helpers.
// Everything lives in jax_flash::cuda::bwd so it never collides with the
// forward's helpers.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "cuda/common/cp_async_zfill.cuh"
#include "cuda/common/store_acc.cuh"  // pack2, store_acc (the Hopper backward's too)
#include "params.h"

namespace jax_flash::cuda::bwd {

using namespace cute;

template <class Element>
using MmaAtomFor = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                      MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>,
                                      MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>>;

// A (Rows x Cols) tile of 16-bit elements, Cols contiguous, XOR-swizzled in
// 16 B chunks. `Transposed` views the same bytes as (Cols x Rows).
template <int Rows, int Cols>
struct SmemTile {
  static constexpr int kRowK = Cols % 64 == 0 ? 64 : 32;
  static constexpr int kSwz = kRowK == 64 ? 3 : 2;
  static_assert(Cols % 32 == 0 && Rows % 8 == 0);
  using Atom = decltype(composition(Swizzle<kSwz, 3, 3>{},
                                    Layout<Shape<_8, Int<kRowK>>, Stride<Int<kRowK>, _1>>{}));
  using Layout = decltype(tile_to_shape(Atom{}, Shape<Int<Rows>, Int<Cols>>{}));
  using Transposed = decltype(composition(
      Layout{}, make_layout(Shape<Int<Cols>, Int<Rows>>{}, GenRowMajor{})));
  static constexpr int kElems = Rows * Cols;
};

// Main (dK/dV) kernel: one CTA per (key tile, kv head, batch). Three tiled
// MMAs: S/dP over (M, N), dK/dV over (N, D), dQ over (M, D).
template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_,
          int kWarpsMSdP, int kWarpsNdKV, int kWarpsMdQ>
struct DkdvConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_, kThreads = kWarps * 32;
  using Atom = MmaAtomFor<Element>;
  using MmaSdP = TiledMMA<Atom, Layout<Shape<Int<kWarpsMSdP>, Int<kWarps / kWarpsMSdP>, _1>>,
                          Tile<Int<16 * kWarpsMSdP>, Int<16 * (kWarps / kWarpsMSdP)>, _16>>;
  using MmadKV = TiledMMA<Atom, Layout<Shape<Int<kWarpsNdKV>, Int<kWarps / kWarpsNdKV>, _1>>,
                          Tile<Int<16 * kWarpsNdKV>, Int<16 * (kWarps / kWarpsNdKV)>, _16>>;
  using MmadQ = TiledMMA<Atom, Layout<Shape<Int<kWarpsMdQ>, Int<kWarps / kWarpsMdQ>, _1>>,
                         Tile<Int<16 * kWarpsMdQ>, Int<16 * (kWarps / kWarpsMdQ)>, _16>>;
  static_assert(kBlockM % (16 * kWarpsMSdP) == 0 && kBlockN % (16 * (kWarps / kWarpsMSdP)) == 0);
  static_assert(kBlockN % (16 * kWarpsNdKV) == 0 && kHeadDim % (16 * (kWarps / kWarpsNdKV)) == 0);
  static_assert(kBlockM % (16 * kWarpsMdQ) == 0 && kHeadDim % (16 * (kWarps / kWarpsMdQ)) == 0);
  using TileQ = SmemTile<kBlockM, kHeadDim>;   // Q and dO, two stages each
  using TileK = SmemTile<kBlockN, kHeadDim>;   // K and V
  using TileP = SmemTile<kBlockM, kBlockN>;    // P and dS
  static constexpr size_t kSmemBytes =
      sizeof(Element) * (4 * TileQ::kElems + 2 * TileK::kElems + 2 * TileP::kElems) +
      sizeof(float) * 4 * kBlockM;
};

// Deterministic dQ kernel: one CTA per (query tile, q head, batch), warps
// stacked along M so that dS stays in registers as the A operand of dS K.
template <class Element_, int kHeadDim_, int kWarps_, int kBlockN_>
struct DqConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_, kWarps = kWarps_, kThreads = kWarps * 32;
  static constexpr int kBlockM = 16 * kWarps, kBlockN = kBlockN_;
  using Atom = MmaAtomFor<Element>;
  using Mma = TiledMMA<Atom, Layout<Shape<Int<kWarps>, _1, _1>>, Tile<Int<16 * kWarps>, _16, _16>>;
  static_assert(kBlockN % 16 == 0 && kHeadDim % 16 == 0);
  using TileQ = SmemTile<kBlockM, kHeadDim>;
  using TileK = SmemTile<kBlockN, kHeadDim>;   // K and V, two stages each
  static constexpr size_t kSmemBytes =
      sizeof(Element) * (2 * TileQ::kElems + 4 * TileK::kElems);
};

// ---------------------------------------------------------------------------
// cp.async with zero fill (common/cp_async_zfill.cuh).

using cuda::cp_async16;
using cuda::cp_async4;
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Load a (Rows x Cols) tile starting at `g` (row stride `row_stride`
// elements) into swizzled smem. Rows >= rows_valid and columns >= cols_valid
// read as zero. vec_ok: the 16 B cp.async path is legal (pointers 16 B
// aligned, strides and head_dim multiples of 8); otherwise element copies.
template <int Rows, int Cols, int Threads, class Element, class SLayout>
__device__ __forceinline__ void load_tile(Element* smem, SLayout const& sl, const Element* g,
                                          int64_t row_stride, int rows_valid, int cols_valid,
                                          bool vec_ok, int tid) {
  constexpr int kChunksPerRow = Cols / 8;
  constexpr int kChunks = Rows * kChunksPerRow;
  constexpr int kIters = (kChunks + Threads - 1) / Threads;
  CUTE_UNROLL
  for (int it = 0; it < kIters; ++it) {
    const int c = tid + it * Threads;
    if (kChunks % Threads == 0 || c < kChunks) {
      const int r = c / kChunksPerRow;
      const int col = (c % kChunksPerRow) * 8;
      Element* dst = smem + sl(r, col);
      if (vec_ok) {
        const bool valid = r < rows_valid && col < cols_valid;
        cp_async16(dst, valid ? g + r * row_stride + col : g, valid);
      } else {
        CUTE_UNROLL
        for (int e = 0; e < 8; ++e) {
          const bool valid = r < rows_valid && col + e < cols_valid;
          dst[e] = valid ? g[r * row_stride + col + e] : Element(0.f);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Fragment layouts.

// Accumulator ((2,2),MMA_M,MMA_N) -> ((2,MMA_M),(2,MMA_N)): rows x cols.
template <class L>
__device__ __forceinline__ constexpr auto rowcol(L const& l) {
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
}

// Accumulator ((2,2),MMA_M,MMA_N) -> A operand ((2,2,2),MMA_M,MMA_N/2) of
// m16n8k16: two neighbouring n8 blocks make one k16 slice.
template <class L>
__device__ __forceinline__ constexpr auto acc_as_a(L const& l) {
  auto d = logical_divide(l, Shape<Underscore, Underscore, _2>{});
  return make_layout(make_layout(get<0>(d), get<2, 0>(d)), get<1>(d), get<2, 1>(d));
}

template <class To, class Engine, class Layout>
__device__ __forceinline__ auto convert_frag(Tensor<Engine, Layout> const& t) {
  Tensor out = make_tensor<To>(t.layout());
  CUTE_UNROLL
  for (int i = 0; i < size(t); ++i) out(i) = static_cast<To>(t(i));
  return out;
}

// ---------------------------------------------------------------------------
// GEMMs. Operands are read slice by slice along K with ldmatrix, the next
// slice loading while the current one multiplies.

template <class Mma, class Acc, class RA, class RB, class SA, class SB, class CA, class CB,
          class TA, class TB>
__device__ __forceinline__ void gemm_ss(Mma& mma, Acc& acc, RA& rA, RB& rB, SA const& sA,
                                        SB const& sB, CA const& cpA, CB const& cpB,
                                        TA const& thrA, TB const& thrB) {
  Tensor rAv = thrA.retile_D(rA);
  Tensor rBv = thrB.retile_D(rB);
  constexpr int K = decltype(size<2>(rA))::value;
  static_assert(decltype(size<2>(rAv))::value == K && decltype(size<2>(rBv))::value == K);
  copy(cpA, sA(_, _, 0), rAv(_, _, 0));
  copy(cpB, sB(_, _, 0), rBv(_, _, 0));
  CUTE_UNROLL
  for (int k = 0; k < K; ++k) {
    if (k + 1 < K) {
      copy(cpA, sA(_, _, k + 1), rAv(_, _, k + 1));
      copy(cpB, sB(_, _, k + 1), rBv(_, _, k + 1));
    }
    cute::gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

template <class Mma, class Acc, class RA, class RB, class SB, class CB, class TB>
__device__ __forceinline__ void gemm_rs(Mma& mma, Acc& acc, RA const& rA, RB& rB, SB const& sB,
                                        CB const& cpB, TB const& thrB) {
  Tensor rBv = thrB.retile_D(rB);
  constexpr int K = decltype(size<2>(rA))::value;
  static_assert(decltype(size<2>(rBv))::value == K);
  copy(cpB, sB(_, _, 0), rBv(_, _, 0));
  CUTE_UNROLL
  for (int k = 0; k < K; ++k) {
    if (k + 1 < K) copy(cpB, sB(_, _, k + 1), rBv(_, _, k + 1));
    cute::gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// Shape-only tensor, to size register fragments without touching swizzles.
template <class Element, int R, int C>
__device__ __forceinline__ auto shape_only() {
  return make_tensor(make_smem_ptr(static_cast<Element*>(nullptr)),
                     make_layout(Shape<Int<R>, Int<C>>{}, GenRowMajor{}));
}

}  // namespace jax_flash::cuda::bwd
