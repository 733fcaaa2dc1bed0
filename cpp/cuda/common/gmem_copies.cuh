// The gmem tiled copies that load_tile / store_tile (common/utils.cuh)
// partition; kept apart from the SM80 forward's traits because a Hopper
// kernel (sm90/bwd_wide_*) uses them too.
#pragma once

#include <cute/tensor.hpp>

namespace jax_flash::cuda::fwd {

using namespace cute;

// Global-memory tile copies, shared by the SM80 and Hopper kernels: 16 B per
// thread per copy, consecutive threads along a row; cp.async in, vector
// stores out.
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

}  // namespace jax_flash::cuda::fwd
