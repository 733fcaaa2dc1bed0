// Compile-time shape of the Hopper float32 (TF32 wgmma) dQ kernel: tiles,
// shared-memory layouts, the wgmma tiled MMAs, the TMA copy types and the
// shared storage. Only nvcc (sm_90a units) includes it.
//
// The kernel has the forward's shape with keys swept per query tile: S = Q
// K^T and dP = dO V^T (both operands K-major, as TF32 wgmmas need), dS = P
// (dP - D) in registers, dQ += dS K with K^T as the B operand (the prep
// kernel's permuted transposed copy, so that dS is read from the
// accumulator in place: wgmma.cuh, PAsALayoutTf32). S and dP are computed
// here again rather than shared with the dK / dV kernel: no atomics, the
// gradients stay bitwise reproducible.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/container/array_aligned.hpp>
#include <cutlass/numeric_types.h>

#include "cuda/sm90/bwd_tf32_roles.cuh"

namespace jax_flash::cuda::sm90 {

using namespace cute;

// Q and dO stay (128 rows: two consumer warpgroups of 64); K, V and K^T
// stream in a two-stage ring. Shared memory: 2 x 128 x D + 2 x 3 x BN x D
// floats (d64: 160 KB; d128, 32-key stages: 224 KB). Registers per consumer
// thread: dQ (D / 2) + S, dP (BN / 2 each) + dS (BN / 2).
template <int kHeadDim_>
struct BwdDqTf32Config : BwdTf32Roles<kHeadDim_, kHeadDim_ == 64 ? 64 : 32> {
  using Roles = BwdTf32Roles<kHeadDim_, kHeadDim_ == 64 ? 64 : 32>;
  using Element = typename Roles::Element;
  using SmemAtom = typename Roles::SmemAtom;
  using GmemTensor = typename Roles::GmemTensor;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128);
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = kHeadDim == 64 ? 64 : 32;
  static constexpr int kStages = 2;
  // S = Q K^T, dP = dO V^T: (BM, BN); dQ += dS K: A = dS in registers, B =
  // K^T (D, BN).
  using TiledMmaS = typename Roles::TiledMmaS;
  using TiledMmaDq = typename Roles::TiledMmaAcc;

  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));  // Q, dO
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));  // K, V
  using SmemLayoutKt = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}));

  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQ{},
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutK{}),
                                      Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TmaKt = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutKt{}),
                                       Shape<Int<kHeadDim>, Int<kBlockN>>{}, _1{}));
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(float);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(float);

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKt>, 1024> kt;
    // q_full: Q and dO landed (the work tile's id beside them, -1: none
    // left); k_full[s]: K and V of stage s; kt_full[s]: its K^T. *_empty:
    // every consumer thread is done with the buffer.
    alignas(8) uint64_t q_full, q_empty;
    int tile_id;
    uint64_t k_full[kStages], k_empty[kStages], kt_full[kStages], kt_empty[kStages];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024);
};

}  // namespace jax_flash::cuda::sm90
