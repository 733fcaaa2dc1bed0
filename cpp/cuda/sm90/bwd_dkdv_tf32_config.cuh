// Compile-time shape of the Hopper float32 (TF32 wgmma) dK / dV kernel:
// tiles, shared-memory layouts, the wgmma tiled MMAs, the TMA copy types and
// the shared storage. Only nvcc (sm_90a units) includes it.
//
// A CTA owns 128 keys of one kv head (64 per consumer warpgroup, the wgmma
// M), K and V resident, and sweeps the query tiles of the q heads of its
// group: S^T = K Q^T and dP^T = V dO^T (SS, K-major), P^T and dS^T in
// registers feed dV += P^T dO and dK += dS^T Q in place (RS; the B operands
// are the prep kernel's permuted transposed copies dO^T and Q^T, wgmma.cuh
// PAsALayoutTf32). Q / dO (read by S^T, dP^T) and Q^T / dO^T (read by dV,
// dK one step later) stream in two rings.
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

// Query rows a step and ring depths (Q / dO, Q^T / dO^T). Shared memory: K,
// V (2 x 128 x D) + (stages + t_stages) x 2 x BM x D floats: d64 64 + 128 KB,
// d128 128 + 96 KB (Q^T / dO^T single: their loads start when the step that
// read the previous ones ends, under the next step's S^T and dP^T).
// Registers per consumer thread: dK + dV (D) + S^T, dP^T (BM / 2 each).
template <int D> struct BwdDkdvTf32Tile;
template <> struct BwdDkdvTf32Tile<64>  { static constexpr int kM = 64, kStages = 2, kTStages = 2; };
template <> struct BwdDkdvTf32Tile<128> { static constexpr int kM = 32, kStages = 2, kTStages = 1; };

template <int kHeadDim_>
struct BwdDkdvTf32Config : BwdTf32Roles<kHeadDim_, BwdDkdvTf32Tile<kHeadDim_>::kM> {
  using Roles = BwdTf32Roles<kHeadDim_, BwdDkdvTf32Tile<kHeadDim_>::kM>;
  using Element = typename Roles::Element;
  using SmemAtom = typename Roles::SmemAtom;
  using GmemTensor = typename Roles::GmemTensor;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = 128;  // keys a CTA
  static constexpr int kBlockM = BwdDkdvTf32Tile<kHeadDim>::kM;
  static constexpr int kStages = BwdDkdvTf32Tile<kHeadDim>::kStages;
  static constexpr int kTStages = BwdDkdvTf32Tile<kHeadDim>::kTStages;
  // S^T = K Q^T, dP^T = V dO^T: (BN, BM); dV += P^T dO, dK += dS^T Q: (BN,
  // D), A in registers, B = dO^T / Q^T (D, BM).
  using TiledMmaS = typename Roles::TiledMmaS;
  using TiledMmaKV = typename Roles::TiledMmaAcc;

  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));  // K, V
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));  // Q, dO
  using SmemLayoutQt = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kHeadDim>, Int<kBlockM>, Int<kTStages>>{}));  // Q^T, dO^T

  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutK{},
                                      Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQ{}),
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaQt = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQt{}),
                                       Shape<Int<kHeadDim>, Int<kBlockM>>{}, _1{}));
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(float);
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(float);

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQt>, 1024> qt;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQt>, 1024> dot;
    // kv_full: K and V landed; q_full[s]: Q and dO of stage s; qt_full[s]:
    // its Q^T and dO^T; *_empty: every consumer thread is done with it.
    alignas(8) uint64_t kv_full;
    uint64_t q_full[kStages], q_empty[kStages], qt_full[kTStages], qt_empty[kTStages];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024);
};

}  // namespace jax_flash::cuda::sm90
