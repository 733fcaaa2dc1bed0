// Compile-time configuration of the SM80 (mma.sync) forward: tile sizes,
// swizzled shared-memory layouts, MMA and copy atoms.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

namespace jax_flash::cuda::fwd {

using namespace cute;

// Global-memory tile copies: 16 B per thread per copy, consecutive threads
// along a row; cp.async in, vector stores out (load_tile / store_tile,
// common/utils.cuh, partition them).
template <typename Element, int kHeadDim, int kNThreads>
struct GmemTileCopies {
  static constexpr int kRowK = kHeadDim % 128 == 0 ? 128 : (kHeadDim % 64 == 0 ? 64 : 32);
  static constexpr int kThreadsPerRow = kRowK / 8;
  static_assert(kNThreads % kThreadsPerRow == 0);
  using Threads = Layout<Shape<Int<kNThreads / kThreadsPerRow>, Int<kThreadsPerRow>>,
                         Stride<Int<kThreadsPerRow>, _1>>;
  using In = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
                                      Threads{}, Layout<Shape<_1, _8>>{}));
  using Out = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<cute::uint128_t>, Element>{}, Threads{},
                                       Layout<Shape<_1, _8>>{}));
};

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, typename Element_>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static_assert(kHeadDim % 32 == 0 && kBlockN % 16 == 0);
  static_assert(kBlockM % (16 * kNWarps) == 0, "warps stacked along M, 16 rows per MMA");

  // fp32-accumulating tensor-core MMA, warps stacked along M. The N=16
  // permutation lets one ldmatrix.x4 fill a whole k16 x n16 B fragment.
  using MmaAtom = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                     MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>,
                                     MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>>;
  using TiledMma = TiledMMA<MmaAtom, Layout<Shape<Int<kNWarps>, _1, _1>>,
                            Tile<Int<16 * kNWarps>, _16, _16>>;

  // Shared memory: rows of 64 (or 32) 16-bit elements, XOR-swizzled in 16 B
  // chunks so that ldmatrix and the 16 B cp.async stores are conflict free.
  static constexpr int kSmemRowK = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzleB = kSmemRowK == 64 ? 3 : 2;
  using SmemAtom = decltype(composition(
      Swizzle<kSwizzleB, 3, 3>{},
      Layout<Shape<_8, Int<kSmemRowK>>, Stride<Int<kSmemRowK>, _1>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // V seen as (head_dim, kBlockN): the B operand of P V.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutVtPlain = decltype(get_nonswizzle_portion(SmemLayoutVt{}));

  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomT = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomO = Copy_Atom<UniversalCopy<uint32_t>, Element>;

  using GmemCopyIn = typename GmemTileCopies<Element, kHeadDim, kNThreads>::In;
  using GmemCopyOut = typename GmemTileCopies<Element, kHeadDim, kNThreads>::Out;

  static constexpr int kSmemBytes =
      int(sizeof(Element)) * (kBlockM + 2 * kBlockN) * kHeadDim;
};

}  // namespace jax_flash::cuda::fwd
