// wgmma helpers shared by the Hopper kernels (forward and backward): one
// batch of wgmmas over all k16 slices, and the S accumulator seen as the
// register A operand of the next wgmma.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/mma_sm90.hpp>

namespace jax_flash::cuda::fwd {

using namespace cute;

// The wgmma accumulator of S, ((2,2,BN/8), 1, 1) compact, converted to
// 16-bit and seen as the RS A operand ((2,2,2), 1, BN/16): per k16 slice the
// A fragment is (col pair, row +8, col +8), i.e. two adjacent n8 blocks of
// the accumulator (the wgmma C and A register layouts agree per n8 block).
template <int kBlockN>
using PAsALayout = Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBlockN / 16>>,
                          Stride<Stride<_1, _2, _4>, _0, _8>>;

// TF32 (m64nNk8): an A fragment holds (row, k) = (g, t), (g + 8, t),
// (g, t + 4), (g + 8, t + 4), the accumulator's n8 block (g, 2t),
// (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). Read in place with the two
// value bits swapped, A's k = t holds key 2t and k = t + 4 key 2t + 1: the
// B operand's keys must come in that order within every group of eight
// (0, 2, 4, 6, 1, 3, 5, 7), which the transposed V copy provides. The sum
// over k does not care about its order.
template <int kBlockN>
using PAsALayoutTf32 = Layout<Shape<Shape<_2, _2>, _1, Int<kBlockN / 8>>, Stride<Stride<_2, _1>, _0, _4>>;

// The register A operand P of O += P V, per element type; its storage is the
// S accumulator's, element for element.
template <class Element, int kBlockN>
using PAsALayoutOf = std::conditional_t<sizeof(Element) == 4, PAsALayoutTf32<kBlockN>, PAsALayout<kBlockN>>;

// Issue acc (+)= A B over all k16 slices as one wgmma batch (not waited on).
// kRegA: A is a register fragment (RS), else smem descriptors (SS).
template <bool kZeroInit, bool kRegA, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void wgmma_issue(TiledMma& mma, TA& tA, TB const& tB, TC& acc) {
  if constexpr (kRegA) warpgroup_fence_operand(tA);
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tA); ++k) {
    cute::gemm(mma, tA(_, _, k), tB(_, _, k), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(acc);
  if constexpr (kRegA) warpgroup_fence_operand(tA);
}

// wgmma.wait_group N placed after the element-wise work that produces `deps`
// (values every element of that work feeds, e.g. the softmax row sums).
// ptxas schedules a plain wait as early as it may, above independent
// arithmetic: the softmax of S(n), written between wait<1> and wait<0>, ran
// after this warpgroup's own P(n+1) V(n+1) instead of under it. A
// warp-uniform branch on the deps puts the wait in a later block, which
// ptxas does not hoist; both arms wait, so the condition only orders (the
// PTX comment in one arm keeps the compiler from merging them).
template <int N, int K>
__device__ __forceinline__ void warpgroup_wait_after(float const (&deps)[K]) {
  float dep = deps[0];
#pragma unroll
  for (int i = 1; i < K; ++i) dep += deps[i];
  if (__any_sync(0xffffffffu, __float_as_uint(dep) == 0x7fc00001u)) {
    asm volatile("wgmma.wait_group.sync.aligned %0; // after\n" ::"n"(N) : "memory");
  } else {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
  }
}

}  // namespace jax_flash::cuda::fwd
