// Compile-time shape of the warp-specialised Hopper backward: tiles per head
// dim, shared-memory layouts, the three wgmma tiled MMAs, the TMA copy types
// and the shared storage. Only nvcc (sm_90a units) includes it.
//
// A CTA owns 128 keys of one kv head (64 per consumer warpgroup, the wgmma
// M of every key-major product) and walks the query tiles of the q heads of
// its group. The key-major products (S^T = K Q^T, dP^T = V dO^T) leave P^T
// and dS^T in the accumulator layout that the register A operand of
// dV += P^T dO and dK += dS^T Q wants; only dS goes through shared memory,
// for dQ = dS K.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/container/array_aligned.hpp>
#include <cutlass/numeric_types.h>

#include "cuda/sm90/bwd_tma.cuh"
#include "cuda/sm90/bwd_logits.cuh"  // BwdLogitSmem
#include "cuda/sm90/bwd_masks.cuh"   // BwdMaskSmem

namespace jax_flash::cuda::sm90 {

using namespace cute;

// Query rows per step. Registers per consumer thread: dK + dV (D/2 each),
// S^T + dP^T (BM/2 each) and dQ (BM D / 256) floats under setmaxnreg's 240:
// d64 takes 128 rows (64-row steps leave too little work per handshake:
// H100 fwd+bwd 0.92-0.97x the 128-row tiles), d128 64.
template <int D> struct BwdTile;
template <> struct BwdTile<64>  { static constexpr int kM = 128; };
template <> struct BwdTile<128> { static constexpr int kM = 64; };

// kMasks: the masks-only variants (bwd_masks.cuh); kLogits (with kMasks):
// soft-cap / ALiBi / dropout, any set of the fwd::kLogit* bits (bwd_logits.cuh).
// Their per-CTA and per-stage values follow the plain storage. kSegOrder
// (with kMasks): deterministic mode with segment ids, its own kernel (the
// CTA keeps the band's query tiles and the steps the ids skip take their
// turn in the dQ order: bwd_dq.cuh), so that the others compile as before.
template <int kHeadDim_, class Element_, bool kMasks_ = false, int kLogits_ = 0, bool kSegOrder_ = false>
struct BwdConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kMasks = kMasks_;
  static constexpr int kLogits = kLogits_;
  static constexpr bool kSegOrder = kSegOrder_;
  static_assert(kLogits == 0 || (kMasks && kLogits > 0 && kLogits <= 7));
  static_assert(!kSegOrder || kMasks);
  static constexpr int kBlockM = BwdTile<kHeadDim>::kM;
  static constexpr int kBlockN = 128;
  static constexpr int kStages = 2;  // Q / dO / LSE / D ring
  // The consumers issue S^T / dP^T in turns (bwd_mainloop.cuh) at d64 where
  // it measured faster (H200, fwd+bwd): plain +2.4-3.7%, soft-cap +2.3%,
  // dropout +6.5%; masks only -0.5%, ALiBi -1%, soft-cap + ALiBi -2%; plain
  // d128 -0.8 to +1.0%.
  static constexpr bool kTurns =
      kBlockM == 128 && (!kMasks || kLogits == fwd::kLogitSoftcap || kLogits == fwd::kLogitDropout);
  static constexpr int kConsumerThreads = 256;
  static constexpr int kThreads = 128 + kConsumerThreads;  // warpgroup 0: TMA producer and dQ writers
  // The pool is what the launch gave the CTA (168 a thread, the most that
  // 384 threads get): setmaxnreg.inc waits until the other warpgroups have
  // freed enough, so asking more in all hangs.
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 168 * kThreads);

  // S^T, dP^T (BN, BM): A = K / V (BN, D), B = Q / dO (BM, D), K-major both.
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kHeadDim>>>(),
      Layout<Shape<_2, _1, _1>>{}));
  // dV, dK (BN, D) += P^T / dS^T (registers) times dO / Q seen as (D, BM).
  using TiledMmadKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockM>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<_2, _1, _1>>{}));
  // dQ (BM, D) = dS (BM, BN) K (BN, D), both operands MN-major views. The
  // warpgroups split the query rows where there are two wgmma Ms of them
  // (kDqSplitM: d64, H100 fwd+bwd +1-3% over splitting its head dim into
  // n32 wgmmas), else the head dim.
  static constexpr bool kDqSplitM = kBlockM == 128;
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<_64, Int<kDqSplitM ? kHeadDim : kHeadDim / 2>, Int<kBlockN>>, GMMA::Major::MN,
                           GMMA::Major::MN>(),
      std::conditional_t<kDqSplitM, Layout<Shape<_2, _1, _1>>, Layout<Shape<_1, _2, _1>>>{}));

  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  // Q / dO (BM, D, stage) and the (D, BM, stage) view.
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  // K / V (BN, D) and the (D, BN) view.
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
  // dS^T (BN, BM, stage), queries contiguous as its accumulator holds it,
  // and the (BM, BN, stage) view dQ reads. Two buffers: a warpgroup may
  // write the next step's while the other's dQ wgmma still reads this one.
  using SmemLayoutdSt = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kBlockM>, Int<kStages>>{}));
  using SmemLayoutdS = decltype(composition(
      SmemLayoutdSt{}, make_ordered_layout(Shape<Int<kBlockM>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));

  using Tma = BwdTmaTypes<Element, kBlockM, kBlockN, kHeadDim, SmemLayoutQ, SmemLayoutK>;
  using TmaQ = typename Tma::TmaQ;
  using TmaK = typename Tma::TmaK;

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static_assert(kBlockM % 32 == 0);  // the producer warp's lanes load LSE and D
  // The dQ tile in the order the consumer threads hold it (bwd_dq.cuh).
  static constexpr int kDqFloats = kBlockM * kHeadDim;
  static constexpr int kDqParts = 1, kDqPartFloats = kDqFloats;  // reduced whole (BwdWideConfig: in parts)
  static constexpr bool kWide = false;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutdSt>, 1024> ds;
    cute::array_aligned<float, kDqFloats, 128> dq;
    alignas(16) float lse2[kStages][kBlockM];
    alignas(16) float dsum[kStages][kBlockM];
    // kv_full: K and V landed (once). full[s]: stage s's Q and dO landed
    // and the producer warp stored its LSE and D; empty[s]: every consumer
    // thread is done with it.
    alignas(8) uint64_t kv_full;
    uint64_t full[kStages], empty[kStages];
    std::conditional_t<kMasks, BwdMaskSmem<kBlockM, kBlockN, kStages>, BwdNoMaskSmem> ms;
    std::conditional_t<kLogits != 0, BwdLogitSmem<kStages>, BwdNoMaskSmem> ls;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024);
};

// Named barriers of the backward (0 is __syncthreads): both consumer
// warpgroups' dS^T halves are in shared memory; the dQ tile of an even step
// is staged (the consumers arrive, the even steps' writer waits); that writer
// has read it (it arrives, the consumers wait); ids + 2: the same two for odd
// steps and the other writer (bwd_dq_full / bwd_dq_empty of a step).
inline constexpr int kBarDsReady = 1, kBarDqFull = 2, kBarDqEmpty = 3;
__device__ __forceinline__ constexpr int bwd_dq_full(int step) { return kBarDqFull + 2 * (step & 1); }
__device__ __forceinline__ constexpr int bwd_dq_empty(int step) { return kBarDqEmpty + 2 * (step & 1); }
inline constexpr int kDqBarThreads = 256 + 32;
// (kTurns) The consumer warpgroups' turns to issue S^T / dP^T: kBarTurn + wg.
inline constexpr int kBarTurn = 6;

}  // namespace jax_flash::cuda::sm90
