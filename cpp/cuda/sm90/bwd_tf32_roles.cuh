// What the two Hopper float32 (TF32 wgmma) backward kernels share: the warp
// roles (warpgroup 0 the TMA producer, two consumer warpgroups) and the
// shape of their two products. Each consumer warpgroup owns 64 rows of the
// tile its CTA keeps (queries in the dQ kernel, keys in the dK / dV kernel)
// and meets kStream rows of the other side a step:
// - the score-like product (64 x kStream over the head dim), both operands
//   K-major in shared memory;
// - the accumulated product (64 x D over the kStream rows), its A operand
//   the first's accumulator in registers (wgmma.cuh, PAsALayoutTf32), its B
//   a permuted transposed copy (tf32_operands.cuh).
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/numeric_types.h>

#include "cuda/sm90/tf32_operands.cuh"

namespace jax_flash::cuda::sm90 {

template <int kHeadDim_, int kStream>
struct BwdTf32Roles {
  using Element = cutlass::tfloat32_t;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kThreads = 128 + kConsumerThreads;  // warpgroup 0: the TMA producer
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;

  using WarpgroupsMNK = cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>;
  using TiledMmaS = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<kStream>, cute::Int<kHeadDim>>>(),
      WarpgroupsMNK{}));
  using TiledMmaAcc = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<kHeadDim>, cute::Int<kStream>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::K>(),
      WarpgroupsMNK{}));
  using SmemAtom = Tf32SmemAtom;
  using GmemTensor = Tf32GmemTensor;
};

}  // namespace jax_flash::cuda::sm90
