// Compile-time shape of the warp-specialised Hopper forward: tiles per head
// dim, shared-memory layouts, the two wgmma tiled MMAs, the TMA copy types
// and the shared storage. Only nvcc (sm_90a units) includes it.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/container/array_aligned.hpp>
#include <cutlass/numeric_types.h>

#include "cuda/sm90/fwd_logits.cuh"
#include "cuda/sm90/fwd_masks.cuh"

namespace jax_flash::cuda::sm90 {

using namespace cute;

// Key-tile width and pipeline depth per head dim. The query tile is 128
// rows: two consumer warpgroups of 64 (the wgmma M) share every K/V stage.
// Registers per consumer thread: O (D/2) + S (BN/2) + P (BN/4) floats'
// worth, under the 240 that setmaxnreg leaves them; shared memory:
// Q + stages x (K + V) under the 227 KB an SM grants one CTA.
// Wider key tiles (d64 192, d128 176, d256 80) measured 0.74-0.99x these
// on the H100 (bf16 and fp16 grid, one run).
// float32 (TF32, 4-byte elements) halves the keys a stage holds at d128.
template <int D, int kBytes = 2> struct FwdTile;
template <> struct FwdTile<64>  { static constexpr int kN = 128, kStages = 3; };  // 16 + 96 KB
template <> struct FwdTile<128> { static constexpr int kN = 128, kStages = 2; };  // 32 + 128 KB
template <> struct FwdTile<256> { static constexpr int kN = 64,  kStages = 2; };  // 64 + 128 KB
template <> struct FwdTile<64, 4>  { static constexpr int kN = 128, kStages = 2; };  // 32 + 128 KB
template <> struct FwdTile<128, 4> { static constexpr int kN = 64,  kStages = 2; };  // 64 + 128 KB

// The TMA type of V's loads: K's, or (kTransposed) that of V^T's boxes.
template <bool kTransposed, class Gmem, class SmemLayout, class Box, class TmaK>
struct FwdTmaV { using type = TmaK; };
template <class Gmem, class SmemLayout, class Box, class TmaK>
struct FwdTmaV<true, Gmem, SmemLayout, Box, TmaK> {
  using type = decltype(make_tma_copy(SM90_TMA_LOAD{}, Gmem{}, SmemLayout{}, Box{}, _1{}));
};

// kMasks: the masks-only variants (fwd_masks.cuh); kLogits (with kMasks):
// the fwd::kLogit* bits of the logit transforms and dropout (fwd_logits.cuh).
// Element: bfloat16_t, half_t, or tfloat32_t for float32 inputs. TF32
// wgmmas read both operands K-major only, so V arrives transposed (the
// launch's prep kernel, fwd_tf32_prep.cuh) and the keys of every group of
// eight permuted to match P's register A operand (PAsALayoutTf32); q, k, v
// and o are float32 in global memory.
template <int kHeadDim_, class Element_, int kWarpgroups = 2, bool kMasks_ = false, int kLogits_ = 0>
struct FwdConfig {
  using Element = Element_;
  static constexpr bool kTf32 = std::is_same_v<Element, cutlass::tfloat32_t>;
  using GmemElement = std::conditional_t<kTf32, float, Element>;
  static_assert(!kTf32 || (kWarpgroups == 2 && kLogits_ == 0), "float32: masks only, two consumer warpgroups");
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kMasks = kMasks_;
  static constexpr int kLogits = kLogits_;
  static_assert(kMasks || kLogits == 0);
  // The logit transform bits (soft-cap, ALiBi) and whether P is dropped.
  static constexpr int kTransform = kLogits & (fwd::kLogitSoftcap | fwd::kLogitAlibi);
  static constexpr bool kDropout = (kLogits & fwd::kLogitDropout) != 0;
  static constexpr int kBlockM = 64 * kWarpgroups;
  static constexpr int kBlockN = FwdTile<kHeadDim, sizeof(Element)>::kN;
  static constexpr int kStages = FwdTile<kHeadDim, sizeof(Element)>::kStages;
  static constexpr int kConsumerWarpgroups = kWarpgroups;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;  // warpgroup 0: the TMA producer
  // setmaxnreg: 64K registers over 384 threads; the producer needs few.
  static constexpr int kProducerRegs = 24, kConsumerRegs = kWarpgroups == 2 ? 240 : 160;
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 65536);
  // O rescaled only when a row's max moves by more than 2^8 (OnlineSoftmax).
  static constexpr bool kLazyRescale = kHeadDim >= 128;

  using WarpgroupsMNK = Layout<Shape<Int<kConsumerWarpgroups>, _1, _1>>;
  // S = Q K^T: A = Q (BM, D), B = K (BN, D), both K-major in smem.
  using TiledMmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(), WarpgroupsMNK{}));
  // O += P V: A = P in registers, B = V^T (D, BN) read MN-major (TF32:
  // K-major, from the transposed copy).
  using MmaOAtom = decltype(GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockN>>,
                                                  GMMA::Major::K, kTf32 ? GMMA::Major::K : GMMA::Major::MN>());
  using TiledMmaO = decltype(make_tiled_mma(MmaOAtom{}, WarpgroupsMNK{}));

  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // V (BN, D, stage) seen as V^T (D, BN, stage): same bytes. TF32: V^T
  // itself, keys contiguous.
  using SmemLayoutVt = std::conditional_t<
      kTf32, decltype(tile_to_shape(SmemAtom{}, Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{})),
      decltype(composition(SmemLayoutKV{},
                           make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})))>;

  // Global q / k / v as TMA sees them: (rows, head_dim, heads, batch) with
  // element strides (BTNH: any row / head / batch strides, unit head_dim).
  using GmemLayout = Layout<Shape<int32_t, int32_t, int32_t, int32_t>, Stride<int64_t, _1, int64_t, int64_t>>;
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<GmemElement const*>(nullptr)), GmemLayout{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQ{},
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutKV{}),
                                       Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  // TF32: V^T's (head_dim, keys) boxes.
  using TmaV = typename FwdTmaV<kTf32, GmemTensor, decltype(take<0, 2>(SmemLayoutVt{})),
                                Shape<Int<kHeadDim>, Int<kBlockN>>, TmaKV>::type;
  // O leaves through shared memory (stmatrix) and a TMA store per
  // warpgroup (64 rows). H100 A/B (with the early Q release, bf16): d128 1k
  // 488 -> 584 TFLOP/s full, 340 -> 402 causal; d64 1k 386 -> 415, 261 ->
  // 295; 16k +1-3%. At d256 Q and the K/V rings leave room for one
  // warpgroup's 64 rows only, so the two take turns with one buffer
  // (kSmemOShared, fwd_epilogue.cuh); its stores from registers had been
  // ~19% of the consumers' stall samples at 1k (ncu).
  // (TF32 writes float32 O from registers: stmatrix moves 16-bit pairs.)
  static constexpr bool kSmemO = !kTf32;
  static constexpr bool kSmemOShared = kSmemO && kHeadDim > 128;
  static_assert(!kSmemOShared || kWarpgroups == 2, "the shared O buffer alternates between two warpgroups");
  static constexpr int kOBuffers = kSmemOShared ? 1 : kWarpgroups;
  // One warpgroup's (64 rows) share of TiledMmaO: the epilogue's stmatrix
  // partition of a 64-row buffer.
  using TiledMmaOWarpgroup = decltype(make_tiled_mma(MmaOAtom{}));
  using SmemLayoutOHalf = decltype(tile_to_shape(SmemAtom{}, Shape<_64, Int<kHeadDim>>{}));
  using GmemTensorOut = decltype(make_tensor(make_gmem_ptr(static_cast<GmemElement*>(nullptr)), GmemLayout{}));
  using TmaO = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensorOut{}, SmemLayoutOHalf{},
                                      Shape<_64, Int<kHeadDim>>{}, _1{}));
  // Bytes one TMA box lands (out-of-bounds rows and columns are zero-filled
  // and counted too).
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * sizeof(Element);

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutVt>, 1024> v;
    cute::array_aligned<Element, kSmemO ? kOBuffers * cute::cosize_v<SmemLayoutOHalf> : 8, 1024> o;  // 64 rows a buffer
    // mbarriers: *_full completes when a TMA box has landed (transaction
    // bytes), *_empty when every consumer thread is done with the buffer.
    alignas(8) uint64_t q_full, q_empty;
    // The work item the producer loaded Q for (-1: none left), published
    // with q_full's phase.
    int tile_id;
    uint64_t k_full[kStages], k_empty[kStages], v_full[kStages], v_empty[kStages];
    // (kMasks) Each K stage's key tile and step flags, and whether the work
    // tile visits any, written by the producer before its full arrival.
    std::conditional_t<kMasks, FwdStageMeta<kStages>, FwdNoStageMeta> meta;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024);
};

}  // namespace jax_flash::cuda::sm90
