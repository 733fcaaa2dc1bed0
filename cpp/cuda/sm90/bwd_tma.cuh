// The TMA copy types of the Hopper backwards (BwdConfig, BwdWideConfig):
// Q / dO tiles (BM, D) and K / V tiles (BN, D) of the [batch, seqlen, head,
// head dim] inputs, into the configs' swizzled shared-memory layouts.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>

namespace jax_flash::cuda::sm90 {

using namespace cute;

template <class Element, int kBlockM, int kBlockN, int kHeadDim, class SmemLayoutQ, class SmemLayoutK>
struct BwdTmaTypes {
  using GmemLayout = Layout<Shape<int32_t, int32_t, int32_t, int32_t>, Stride<int64_t, _1, int64_t, int64_t>>;
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayout{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQ{}),
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutK{},
                                      Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
};

}  // namespace jax_flash::cuda::sm90
