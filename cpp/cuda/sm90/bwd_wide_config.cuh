// Compile-time shape of the warp-specialised Hopper backward for wide heads
// (head dim 256): tiles, shared-memory layouts, the wgmma tiled MMAs, the
// TMA copy types and the shared storage.
//
// Why not BwdConfig's shape: there each consumer warpgroup owns 64 keys and
// keeps dK and dV (64 x D fp32 each) in registers, 256 a thread at D = 256.
// Here a CTA owns 64 keys and each consumer warpgroup keeps one of dK, dV
// (64 x 256 fp32: 128 registers a thread), so each of them is an RS
// product from the registers its warpgroup already holds:
//   warpgroup 0: S^T = K Q^T (SS) -> P^T -> smem;  dV += P^T dO (RS)
//   warpgroup 1: dP^T = V dO^T (SS); P^T from smem; dS^T = P^T (dP^T - D)
//                -> smem;  dK += dS^T Q (RS)
//   both:        dQ = dS K (SS, after a named barrier), in two 128-column
//                parts (64 columns a warpgroup), staged in the step's dO
//                and Q stages for two writer warps' bulk reduces
// Every wgmma keeps N >= 64: at N = 32 an SS wgmma re-reads the whole
// 64-row A tile per 32 columns and the step becomes bound by smem
// bandwidth. (Before, the two warpgroups split dK's and dV's head dim and
// read P^T / dS^T from smem for SS products: 32 KB more smem reads a step.)
//
// Shared memory (16-bit inputs): K, V 32 KB each; Q and dO two stages each
// (128 KB; a stage is freed once its last wgmma is done and the dQ part
// staged in it has been read); P^T and dS^T double-buffered (32 KB: a
// warpgroup may write the next step's while the other still reads this
// one): 224 KB and the statistics. No room for a dQ buffer of its own,
// hence the stages: a float32 dQ part (64 x 128) is one 16-bit stage.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/container/array_aligned.hpp>
#include <cutlass/numeric_types.h>

#include "cuda/sm90/bwd_logits.cuh"  // BwdLogitSmem
#include "cuda/sm90/bwd_masks.cuh"   // BwdMaskSmem
#include "cuda/sm90/bwd_tma.cuh"
namespace jax_flash::cuda::sm90 {

using namespace cute;

// kMasks: the masks-only variants (bwd_masks.cuh); kLogits (with kMasks):
// soft-cap / ALiBi / dropout, any set of the fwd::kLogit* bits. kSegOrder
// (with kMasks): deterministic mode with segment ids, as BwdConfig's (the
// dQ writers take the skipped steps' turns: bwd_wide_dq.cuh).
template <int kHeadDim_, class Element_, bool kMasks_ = false, int kLogits_ = 0, bool kSegOrder_ = false>
struct BwdWideConfig {
  using Element = Element_;
  static constexpr bool kWide = true;
  static constexpr bool kMasks = kMasks_;
  static constexpr int kLogits = kLogits_;
  static_assert(kLogits == 0 || (kMasks && kLogits > 0 && kLogits <= 7));
  static constexpr bool kSegOrder = kSegOrder_;
  static_assert(!kSegOrder || kMasks);
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim % 128 == 0);
  static constexpr int kBlockM = 64;  // query rows a step
  static constexpr int kBlockN = 64;  // keys a CTA
  static constexpr int kStages = 2;    // Q / LSE / D ring
  static constexpr int kDoStages = 2;  // dO ring
  static constexpr int kConsumerThreads = 256;
  static constexpr int kThreads = 128 + kConsumerThreads;  // warpgroup 0: the producer warp
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 168 * kThreads);

  // S^T or dP^T (BN, BM), one warpgroup each: A = K / V, B = Q / dO, K-major.
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kHeadDim>>>(), Layout<Shape<_1, _1, _1>>{}));
  // dV (warpgroup 0) or dK (warpgroup 1), (BN, D) += P^T / dS^T (BN, BM;
  // registers) times dO / Q seen as (D, BM), MN-major.
  using TiledMmadKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockM>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<_1, _1, _1>>{}));
  // One dQ part (BM, D / kDqParts) = dS (BM, BN) K (BN, D / kDqParts), both
  // MN-major views; the warpgroups split its columns.
  static constexpr int kDqParts = 2;
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim / kDqParts / 2>, Int<kBlockN>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_1, _2, _1>>{}));

  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  template <int kBufs>
  using SmemLayoutRows = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBufs>>{}));
  template <int kBufs>
  using SmemLayoutRowsT = decltype(composition(
      SmemLayoutRows<kBufs>{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kBufs>>{}, Step<_2, _1, _3>{})));
  // Q and dO (BM, D, stage) and their (D, BM, stage) views.
  using SmemLayoutQ = SmemLayoutRows<kStages>;
  using SmemLayoutQt = SmemLayoutRowsT<kStages>;
  using SmemLayoutdO = SmemLayoutRows<kDoStages>;
  using SmemLayoutdOt = SmemLayoutRowsT<kDoStages>;
  // K / V (BN, D) and the (D, BN) view.
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
  // P^T / dS^T (BN, BM, buffer), queries contiguous as the S^T accumulator
  // holds them, and the (BM, BN, buffer) view dQ reads.
  using SmemLayoutSt = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kBlockM>, _2>{}));
  using SmemLayoutdS = decltype(composition(
      SmemLayoutSt{}, make_ordered_layout(Shape<Int<kBlockM>, Int<kBlockN>, _2>{}, Step<_2, _1, _3>{})));

  using Tma = BwdTmaTypes<Element, kBlockM, kBlockN, kHeadDim, SmemLayoutQ, SmemLayoutK>;
  using TmaQ = typename Tma::TmaQ;
  using TmaK = typename Tma::TmaK;

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static_assert(kBlockM % 32 == 0);  // the producer warp's lanes load LSE and D
  // The dQ accumulator's tile (bwd_dq.cuh: its convert kernel), added a
  // part at a time, each part in the order the consumer threads hold it.
  static constexpr int kDqFloats = kBlockM * kHeadDim;
  static constexpr int kDqPartFloats = kDqFloats / kDqParts;
  // A step's dQ parts are staged in its dO and Q stages (bwd_wide_mainloop.cuh).
  static_assert(kDqPartFloats * sizeof(float) == kQBytes && kStages == kDoStages);

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutdO>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutSt>, 1024> pt;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutSt>, 1024> ds;
    alignas(16) float lse2[kStages][kBlockM];
    alignas(16) float dsum[kStages][kBlockM];
    // kv_full: K and V landed (once). full[s]: stage s's Q landed and the
    // producer warp stored its LSE and D; empty[s]: the stage is free again
    // (every consumer thread: warpgroup 0 after P^T, 1 after dK; and a dQ
    // writer once its bulk reduce has read the dQ part staged there).
    // do_full / do_empty: the dO ring (warpgroup 1 after dP^T, 0 after dV;
    // the writer likewise).
    alignas(8) uint64_t kv_full;
    uint64_t full[kStages], empty[kStages];
    uint64_t do_full[kDoStages], do_empty[kDoStages];
    // Where stage s's step stages its float32 dQ part 0 (the dO stage) and
    // part 1 (the Q stage), for the consumers and the dQ writers alike.
    __device__ __forceinline__ float* dq_part(int part, int s) {
      Element* stage = (part == 0 ? dout.data() : q.data()) + s * (kBlockM * kHeadDim);
      return reinterpret_cast<float*>(stage);
    }
    std::conditional_t<kMasks, BwdMaskSmem<kBlockM, kBlockN, kStages>, BwdNoMaskSmem> ms;
    std::conditional_t<kLogits != 0, BwdLogitSmem<kStages>, BwdNoMaskSmem> ls;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024);
};

// Named barriers of the wide backward (0 is __syncthreads): P^T is in
// shared memory (warpgroup 0 arrives, 1 waits); dS^T is (both).
inline constexpr int kBarWideP = 1, kBarWideDs = 2;
// Both consumer warpgroups are done with the step's Q and dO stages (dV and
// dK complete), so the stages may take its dQ parts.
inline constexpr int kBarWideStagesFree = 3;
// A step's dQ is staged, for the writer warp of its parity (warps 1 and 2
// of warpgroup 0, taking the steps in turn: bwd_wide_dq.cuh).
__device__ __forceinline__ constexpr int bwd_wide_dq_staged(int step) { return 4 + (step & 1); }
inline constexpr int kWideDqBarThreads = 256 + 32;

}  // namespace jax_flash::cuda::sm90
