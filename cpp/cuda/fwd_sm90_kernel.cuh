// Hopper (SM90a) forward for the variants (masks-only, soft-cap / ALiBi,
// dropout): wgmma tensor cores, no warp specialisation. Plain attention runs
// the warp-specialised kernel (cpp/cuda/sm90/); the plain (kMasks = false)
// loops of this file were deleted with it, and moving the variants onto that
// kernel is open (benchmarks/NOTES.md). One CTA of kWarpgroups warpgroups (2 by
// default) per 64 x kWarpgroups-row query tile; each warpgroup owns 64 rows
// (the wgmma M). d64/d128 run two such CTAs per SM (kCtasPerSm): the only
// source of softmax / wgmma overlap across warpgroups in this design.
// K and V tiles are double buffered in 128 B-swizzled shared memory and
// loaded one tile ahead with cp.async. S = Q K^T is an SS wgmma (both operands in smem); O += P V is an
// RS wgmma: P stays in registers, the S accumulator converted to 16-bit and
// re-viewed as the A-operand fragment. V is stored (BN, D) like K and read
// through a transposed (MN-major) view as the B operand.
// Key tiles are visited from the last one down, as the SM80 kernel does, so
// the masked tiles (key end, causal diagonal) come first.
// kMasks: the masks-only variants (window, lengths, query offsets, segment
// ids; cuda::Variant) as in the SM80 kMasks kernel: the key-tile range from
// the band and lengths, tiles skipped whose segment-id ranges cannot meet,
// element masks on boundary tiles only. Off, the code is the plain kernel's.
// kLogits (Sm90LogitsTraits, a kMasks traits with kLogits = bits of
// kLogitSoftcap / kLogitAlibi): the masks kernel whose scores are turned
// into logits in log2 units (scale, soft-cap, ALiBi; Variant::logit_log2)
// element by element before the row max, softmax with scale 1. Traits
// without kLogits (plain, masks) compile exactly as before.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/container/array_aligned.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/cp_async_zfill.cuh"
#include "cuda/fwd_kernel.cuh"  // FwdArgs
#include "cuda/tile_loader.cuh"
#include "cuda/mask.cuh"
#include "cuda/softmax.cuh"
#include "cuda/sm90/softmax_step.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "cuda/tile_order.h"
#include "cuda/utils.cuh"
#include "cuda/variants.cuh"
#include "params.h"

namespace jax_flash::cuda::fwd {

// kOverlap: S(j) = Q K(j)^T is issued together with O += P(j+1) V(j+1), and
// the softmax of S(j) runs while that P V wgmma is in flight (the O rescale
// waits for it); otherwise each wgmma is waited on before the softmax.
// kLoadsFirst: the next tiles' cp.async loads are issued before the
// wgmmas of the step (else right behind them).
// kCtasPerSm: the register budget asked of ptxas (__launch_bounds__ min
// blocks). With 2, two CTAs share an SM (<= 128 registers a thread) and the
// warp schedulers overlap one CTA's softmax with the other's wgmmas, which
// the lockstep warpgroups of one CTA cannot do among themselves.
// kWarpgroups: 64 query rows each (BM = 64 x kWarpgroups); with 1, every
// warpgroup on the SM runs free of the others (no CTA barrier shared).
template <int kHeadDim_, int kBlockN_, typename Element_, bool kOverlap_ = true, bool kLoadsFirst_ = true,
          int kCtasPerSm_ = 1, int kWarpgroups_ = 2, bool kMasks_ = false>
struct Sm90Traits {
  using Element = Element_;
  static constexpr bool kMasks = kMasks_;
  static constexpr bool kOverlap = kOverlap_;
  static constexpr bool kLoadsFirst = kLoadsFirst_;
  static constexpr int kCtasPerSm = kCtasPerSm_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpgroups = kWarpgroups_;
  static constexpr int kBlockM = 64 * kWarpgroups;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNThreads = 128 * kWarpgroups;
  static constexpr int kStages = 2;
  // (kMasks) Key tiles a query tile's segment walk keeps as bits in shared
  // memory (MaskScalars::meet / mixed); longer ranges read global memory.
  static constexpr int kWalkWords = 64;
  // O rescaled only when a row's max moves by more than 2^8 (OnlineSoftmax):
  // +1-6% forward at d128 / d256, -2-6% at d64 (spills), H100 A/B in NOTES.
  static constexpr bool kLazyRescale = kHeadDim >= 128;
  // (kMasks, not kOverlap) Interior runs of unmasked key tiles on a step of
  // their own (the masks loop): measured faster at d128; at d64 the extra
  // loop's spills cost more than the runs saved (H100, benchmarks/NOTES.md).
  static constexpr bool kRuns = kHeadDim == 128;
  static_assert(kHeadDim % 64 == 0 && kBlockN % 16 == 0);

  using WarpgroupsMNK = Layout<Shape<Int<kWarpgroups>, _1, _1>>;
  // S = Q K^T: A = Q (BM, D), B = K (BN, D), both K-major in smem.
  using TiledMmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(),
      WarpgroupsMNK{}));
  // O += P V: A = P in registers (K-major), B = V^T (D, BN) read MN-major.
  using TiledMmaO = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      WarpgroupsMNK{}));

  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // V (BN, D, stage) seen as V^T (D, BN, stage): same bytes, (d, n) -> V(n, d).
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{},
      make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> v;
  };
  // (kMasks) Per-CTA mask scalars, kept in shared memory after the tiles
  // and read where used rather than held in registers across the key loop.
  struct MaskScalars {
    int64_t band_hi, band_lo;  // key - row (tile-local) bounds at col0 = 0 (Variant::tile_mask)
    int n_lo;                  // lowest key tile that any row may see (segments: whose ids may meet)
    int seg_hi;                // (segment ranges) highest key tile whose ids may meet the query tile's
    int seg_same;              // (segment ranges) 16-key blocks holding the query tile's single id
    int seg_walk;              // (segment ranges) prev_tile must search ranges tile by tile
    int full_lo, full_hi;      // tiles [full_lo, full_hi] need no band / length mask
    int q_mn, q_mx;            // the query tile's segment-id range
    int kv_len, rows;          // valid keys; valid rows of this query tile
    int walk_bits;             // (segment ranges) prev_tile searches meet / mixed, not the ranges in gmem
    int bits_lo;               // (walk_bits) the key tile of bit 0
    // (segment ids) The ids a boundary tile compares, in shared memory: the
    // query tile's, loaded once, and each K slot's, loaded with K (cp.async).
    // Read from global memory after the S wgmma, their latency was ~9% of the
    // packed-documents forward's stall samples (ncu, NOTES).
    int q_ids[kBlockM];
    int kv_ids[kStages][kBlockN];
    // (walk_bits) Per key tile from bits_lo, set by the prologue's scan of
    // the 16-key ranges: meet, some key's id may equal a row's; mixed, the
    // tile and query tile are not all one id. prev_tile then walks bits, not
    // eight global loads a tile (~9% of the stall samples).
    uint32_t meet[kWalkWords], mixed[kWalkWords];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + (kMasks ? int(sizeof(MaskScalars)) : 0);

  using GmemCopyIn = typename GmemTileCopies<Element, kHeadDim, kNThreads>::In;
  using GmemCopyOut = typename GmemTileCopies<Element, kHeadDim, kNThreads>::Out;
  using SmemCopyAtomO = Copy_Atom<UniversalCopy<uint32_t>, Element>;
};

// Logit transforms of the kLogits kernels (bits); kLogitDropout: the
// dropout keep mask on P (dropout.h), the 1 / (1 - rate) on O at the end.
enum : int { kLogitSoftcap = 1, kLogitAlibi = 2, kLogitDropout = 4 };

// A masks traits (kMasks) plus kLogits: the per-CTA logit scalars follow
// the MaskScalars in shared memory.
template <class MasksTraits, int kLogits_>
struct Sm90LogitsTraits : MasksTraits {
  static_assert(MasksTraits::kMasks && kLogits_ > 0 && kLogits_ <= 7);
  static constexpr int kLogits = kLogits_;
  // Dropout at d128 keeps the eager rescale: the lazy one's vote and branch
  // took its spills from 48 to 102 B (ptxas).
  static constexpr bool kLazyRescale = MasksTraits::kLazyRescale && (kLogits_ & kLogitDropout) == 0;
  struct LogitScalars {
    int64_t pos0;      // absolute position of the query tile's row 0 (row0 + offset)
    float qk_mul;      // soft-cap: scale / cap; else scale * log2(e)
    float cap_log2;    // soft-cap: cap * log2(e)
    float slope_log2;  // ALiBi: slope * log2(e)
    uint32_t seed[2];  // dropout: the Philox key
    uint32_t drop_threshold;
    float keep_scale;  // dropout: 1 / (1 - rate)
    float y_mul;       // ALiBi in distance units (apply_logits): qk_mul (soft-cap: cap_log2) / slope_log2; else 0
  };
  static constexpr int kSmemBytes = MasksTraits::kSmemBytes + int(sizeof(LogitScalars));
};

// A masks traits without interior runs: the masks-only kernel for segment
// ids, whose edge steps (every tile of a document's start or diagonal)
// measured 4-5% slower in the kernel with runs (packed documents, H100 d128).
template <class MasksTraits>
struct Sm90NoRunsTraits : MasksTraits {
  static constexpr bool kRuns = false;
};

// kLogits of a traits; 0 for those without one (plain, masks).
template <class T, class = void>
struct LogitsOf { static constexpr int value = 0; };
template <class T>
struct LogitsOf<T, std::void_t<decltype(T::kLogits)>> { static constexpr int value = T::kLogits; };

// Raw scores of one S tile -> logits in log2 units (Variant::logit_log2):
// s * scale, soft-cap cap * tanh(s * scale / cap), ALiBi
// -slope * |pos(row) - col|, all * log2(e) (soft-cap alone: tanh only, the
// kernel's softmax scale is cap * log2(e)). Masks come after (-inf).
// Per element the distance is this thread's base (one int64 difference a
// tile) plus a compile-time (row - col) of thread 0's coordinates, as in
// apply_variant_mask. Tiles whose keys all lie on one side of every row's
// position (every off-diagonal tile of a causal band) take the bias as one
// FMA of that constant; the others take |distance|.
// ALiBi with slope_log2 >= kAlibiMinSlopeLog2 (LogitScalars::y_mul > 0)
// works in distance units instead: the logit is slope_log2 * (y + shift),
// y = pre(s) * y_mul + (col - pos relative to this thread's base) with the
// compile-time part an FFMA immediate, and shift this thread's base (the
// return value; 0 on tiles that straddle a row's position, whose y holds the
// whole -|distance|). The softmax scale is then slope_log2 (the kernel's
// scale_log2) and the shift goes into its max and exp2 (update<true>): one
// FFMA a score where the log2-unit form took an FFMA, half a bias FFMA and a
// subtraction in the exp2 argument. Distances are exact integers in float
// below 2^24.
constexpr float kAlibiMinSlopeLog2 = 1e-12f;

template <int kLogits, int kBlockM, int kBlockN, class TS, class TC, class TC0, class LS>
__device__ __forceinline__ float apply_logits(TS& acc_s, TC const& tSc, TC0 const& tSc0, const LS* ls, int col0) {
  Tensor s = make_tensor(acc_s.data(), acc_rowcol_layout(acc_s.layout()));
  Tensor c0 = make_tensor(tSc0.data(), acc_rowcol_layout(tSc0.layout()));
  constexpr int kRows = decltype(size<0>(s))::value;
  constexpr bool kCap = (kLogits & kLogitSoftcap) != 0;
  constexpr bool kAlibi = (kLogits & kLogitAlibi) != 0;
  const float qk_mul = ls->qk_mul;
  [[maybe_unused]] const float cap_log2 = kCap ? ls->cap_log2 : 0.f;
  // tanhf: tanh.approx.f32 under --use_fast_math, as in the SM80 kernels.
  auto pre = [&](float x) { return kCap ? tanhf(x * qk_mul) : x; };
  auto logit = [&](float x, float bias) {
    if constexpr (kCap) {
      const float t = pre(x);
      return kAlibi ? fmaf(t, cap_log2, bias) : t;  // (alone: cap_log2 is the softmax scale)
    } else {
      return kAlibi ? fmaf(x, qk_mul, bias) : x * qk_mul;
    }
  };
  if constexpr (!kAlibi) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int j = 0; j < size<1>(s); ++j) s(r, j) = logit(s(r, j), 0.f);
    }
    return 0.f;
  } else {
    const int rb = get<0>(tSc(0)) - get<0>(tSc0(0));
    const int cb = get<1>(tSc(0)) - get<1>(tSc0(0));
    const int64_t pos0 = ls->pos0;
    // pos - col = base + (r - c), (r, c) thread 0's tile coordinates.
    const float base = float(pos0 + (rb - cb) - col0);
    // Every row's position at or past every key of the tile (d >= 0), or
    // before every key (d <= 0): bias = -sign * slope * d, linear in (r - c).
    const bool below = pos0 - (col0 + kBlockN - 1) >= 0;
    const bool above = pos0 + (kBlockM - 1) - col0 <= 0;
    auto rc = [&](int r, int j) { return float(get<0>(c0(r, 0)) - get<1>(c0(r, j))); };  // compile-time
    const float y_mul = ls->y_mul;
    if (y_mul > 0.f) {  // distance units
      if (below) {  // y = pre * y_mul + (c - r), shift -base
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int j = 0; j < size<1>(s); ++j) s(r, j) = fmaf(pre(s(r, j)), y_mul, -rc(r, j));
        }
        return -base;
      }
      if (above) {  // y = pre * y_mul + (r - c), shift base
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int j = 0; j < size<1>(s); ++j) s(r, j) = fmaf(pre(s(r, j)), y_mul, rc(r, j));
        }
        return base;
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int j = 0; j < size<1>(s); ++j) s(r, j) = fmaf(pre(s(r, j)), y_mul, -fabsf(base + rc(r, j)));
      }
      return 0.f;
    }
    const float slope = ls->slope_log2;
    if (below || above) {
      const float k = below ? -slope : slope;
      const float kb = k * base;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int j = 0; j < size<1>(s); ++j) s(r, j) = logit(s(r, j), fmaf(k, rc(r, j), kb));
      }
    } else {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int j = 0; j < size<1>(s); ++j) s(r, j) = logit(s(r, j), -slope * fabsf(base + rc(r, j)));
      }
    }
    return 0.f;
  }
}

// Dropout of P (after the softmax's row sums, which stay undropped): the
// keep bits of this thread's S accumulator values ((2,2,BN/8): column pair,
// rows r / r + 8, 8-column MMA tile) two MMA tiles a Philox call (keep_oct).
// Which bit a value takes comes from thread 0's coordinates (compile-time)
// relative to the group's first value, so the value order is not assumed
// within a tile.
template <class TS, class TC, class TC0, class LS>
__device__ __forceinline__ void apply_dropout(TS& acc_s, TC const& tSc, TC0 const& tSc0, const LS* ls, int batch,
                                              int head, int row0, int col0) {
  static_assert(decltype(size(acc_s))::value % 8 == 0);
  const uint32_t seed[2] = {ls->seed[0], ls->seed[1]};
  const uint32_t threshold = ls->drop_threshold;
#pragma unroll
  for (int i = 0; i < size(acc_s); i += 8) {
    bool k[8];
    keep_oct(seed, batch, head, threshold, row0 + get<0>(tSc(i)), col0 + get<1>(tSc(i)), col0 + get<1>(tSc(i + 4)), k);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int g = i + (j & 4);  // first value of this j's MMA tile
      const int dr = get<0>(tSc0(i + j)) - get<0>(tSc0(g)), dc = get<1>(tSc0(i + j)) - get<1>(tSc0(g));
      if (!k[(j & 4) + (dr >> 3) * 2 + dc]) acc_s(i + j) = 0.f;
    }
  }
}

// Masks-only variants on one boundary S tile (raw scores): the tile-relative
// band / length test where the tile crosses the band or the lengths (band),
// then the segment ids where the tile holds more than one id (seg): a packed
// document's boundary tile off the diagonal takes the ids alone. kv ids are
// read once per column, q ids once per row.
// The per-CTA values come from shared memory (MS: the kernel's
// MaskScalars), not from registers held across the key loop.
// tSc0: thread 0's partition of the tile coordinates (compile-time values);
// this thread's are those plus one (row, col) offset, as a CuTe layout is
// linear in (thread, value). Written that way, every element's test is the
// thread's offset against an immediate; from tSc per element, the compiler
// hoisted 64 coordinate values out of the key loop and spilled them (d64).
template <class TS, class TC, class TC0, class MS>
__device__ __forceinline__ void apply_variant_mask(TS& acc_s, TC const& tSc, TC0 const& tSc0, const MS* ms, int col0,
                                                   const int* kv_ids, bool band, bool seg) {
  Tensor s = make_tensor(acc_s.data(), acc_rowcol_layout(acc_s.layout()));
  Tensor c0 = make_tensor(tSc0.data(), acc_rowcol_layout(tSc0.layout()));
  constexpr int kRows = decltype(size<0>(s))::value;
  const int rb = get<0>(tSc(0)) - get<0>(tSc0(0));  // this thread's offset from thread 0
  const int cb = get<1>(tSc(0)) - get<1>(tSc0(0));
  constexpr int64_t kBig = int64_t(1) << 30;
  if (band) {
    Variant::TileMask tm;
    // Bounds moved onto thread 0's coordinates: (c - r) + (cb - rb), c + cb, r + rb.
    tm.hi = int(max(-kBig, min(kBig, ms->band_hi - col0))) - (cb - rb);
    tm.lo = int(max(-kBig, min(kBig, ms->band_lo - col0))) - (cb - rb);
    tm.cmax = ms->kv_len - col0 - cb;
    tm.rmax = ms->rows - rb;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int j = 0; j < size<1>(s); ++j)
        if (!tm(get<0>(c0(r, 0)), get<1>(c0(r, j)))) s(r, j) = -INFINITY;
    }
  }
  if (seg) {
    int qid[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) qid[r] = ms->q_ids[rb + get<0>(c0(r, 0))];
    // At most eight columns' id loads in flight: the compiler barrier
    // (memory clobber) stops all BN/4 of them (32 at d64) being hoisted
    // together into registers that the 128-register cap does not have.
    constexpr int kChunk = 8;
#pragma unroll
    for (int j0 = 0; j0 < size<1>(s); j0 += kChunk) {
#pragma unroll
      for (int j = j0; j < j0 + kChunk && j < size<1>(s); ++j) {
        const int c = cb + get<1>(c0(0, j));
        if (col0 + c >= ms->kv_len) continue;  // masked above (and maybe past seqlen_k)
        const int kid = kv_ids[c];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          if (kid != qid[r]) s(r, j) = -INFINITY;
      }
      asm volatile("" ::: "memory");
    }
  }
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kCtasPerSm) fwd_sm90_kernel(const __grid_constant__ FwdArgs args) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  using Storage = typename Traits::SharedStorage;

  extern __shared__ __align__(1024) char smem_raw[];
  Storage& smem = *reinterpret_cast<Storage*>(smem_raw);

  const FwdParams& p = args.p;
  const int tid = threadIdx.x;
  const TileCoord tile = tile_coord(blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z, p.causal,
                                    args.order_group);
  const int m_block = tile.tile;
  const int head = tile.head;
  const int batch = tile.batch;
  const int head_kv = head / (p.heads_q / p.heads_kv);
  const int row0 = m_block * kBlockM;
  const int rows_left = p.seqlen_q - row0;
  const int head_dim = p.head_dim;

  // Key tiles visited: from the first (plain: n_blocks - 1; kMasks: n_top)
  // down to n_stop = 0 (kMasks: tiles below the lowest visible one, or
  // skipped, are never returned by prev_tile, which answers -1 when none is
  // left). The plain path keeps its original statements (same PTX).
  constexpr bool kMasks = Traits::kMasks;
  constexpr int kLogits = LogitsOf<Traits>::value;  // (kMasks kernels only)
  static_assert(kMasks, "plain attention runs the warp-specialised kernel (cpp/cuda/sm90/)");
  // Logit transforms (soft-cap / ALiBi bits) and dropout.
  constexpr int kTransform = kLogits & (kLogitSoftcap | kLogitAlibi);
  constexpr bool kDropout = (kLogits & kLogitDropout) != 0;
  [[maybe_unused]] int n_blocks = 0, n_top = -1;
  const int n_stop = 0;
  // (kMasks) The per-CTA values stay in shared memory (MaskScalars): at 128
  // registers a thread (two CTAs per SM) each value held across the key
  // loop spilled a copy address instead.
  using MaskScalars = typename Traits::MaskScalars;
  [[maybe_unused]] MaskScalars* ms = reinterpret_cast<MaskScalars*>(smem_raw + sizeof(Storage));
  if constexpr (kMasks) {
    const Variant var(p, batch, head);
    int lo, hi;
    var.template key_tiles<kBlockN>(row0, row0 + kBlockM - 1, lo, hi);
    n_top = hi;  // stepped down by prev_tile below
    int full_lo = 0, full_hi = -1;
    if (row0 + kBlockM <= var.q_len) {
      // Keys [c0, c0 + BN) unmasked for every row: c0 + BN <= kv_len,
      // c0 + BN - 1 <= last_key(row0), c0 >= first_key(row0 + BM - 1).
      int64_t hi_key = int64_t(var.kv_len) - 1;
      if (var.right() >= 0) hi_key = min(hi_key, var.last_key(row0));
      const int64_t lo_key = var.left() >= 0 ? max(int64_t(0), var.first_key(int64_t(row0) + kBlockM - 1)) : 0;
      if (hi_key >= 0) {
        full_hi = int((hi_key + 1) / kBlockN) - 1;  // last tile ending at or before hi_key
        full_lo = int((lo_key + kBlockN - 1) / kBlockN);
      }
    }
    const Variant::SegRange q_rng = var.q_range(row0, kBlockM);
    // Segment ids with ranges: the whole CTA scans the 16-key blocks of
    // tiles [lo, hi) once (a few per thread) for the tiles whose ids may
    // meet the query tile's: the visited range narrows to them, and when
    // every block there holds the query tile's single id, prev_tile needs
    // no per-tile search (one document, a query tile inside a long one).
    const bool seg_ids = p.q_segment_ids != nullptr && p.kv_segment_ids != nullptr;
    const bool seg_scan = lo < hi && seg_ids && p.q_segment_ranges != nullptr && p.kv_segment_ranges != nullptr;
    const bool walk_bits = seg_scan && hi - lo <= Traits::kWalkWords * 32;
    if (seg_ids) {
      for (int r = tid; r < kBlockM; r += Traits::kNThreads)
        ms->q_ids[r] = row0 + r < p.seqlen_q ? int(p.q_segment_ids[int64_t(batch) * p.seqlen_q + row0 + r]) : 0;
    }
    if (walk_bits) {
      for (int w = tid; w < Traits::kWalkWords; w += Traits::kNThreads) ms->meet[w] = ms->mixed[w] = 0u;
    }
    if (tid == 0) {
      // Variant::tile_mask at col0 = 0 (unbounded sides far outside +-2^30).
      const int64_t base = int64_t(row0) + var.offset;
      ms->band_hi = var.right() >= 0 ? base + var.right() : (int64_t(1) << 40);
      ms->band_lo = var.left() >= 0 ? base - var.left() : -(int64_t(1) << 40);
      ms->kv_len = var.kv_len;
      ms->rows = var.q_len - row0;
      ms->n_lo = seg_scan ? INT32_MAX : lo;
      ms->seg_hi = -1;
      ms->seg_same = 0;
      ms->seg_walk = 0;
      ms->full_lo = full_lo;
      ms->full_hi = full_hi;
      ms->q_mn = q_rng.mn;
      ms->q_mx = q_rng.mx;
      ms->walk_bits = walk_bits;
      ms->bits_lo = lo;
      if constexpr (kLogits != 0) {
        auto* ls = reinterpret_cast<typename Traits::LogitScalars*>(smem_raw + sizeof(Storage) + sizeof(MaskScalars));
        ls->pos0 = int64_t(row0) + var.offset;
        const bool cap = (kLogits & kLogitSoftcap) != 0;
        ls->qk_mul = cap ? p.scale / p.softcap : p.scale * 1.4426950408889634f;
        ls->cap_log2 = cap ? p.softcap * 1.4426950408889634f : 0.f;
        ls->slope_log2 = var.alibi_log2;
        if constexpr ((kLogits & kLogitAlibi) != 0) {
          const float slope_log2 = var.alibi_log2;  // (NaN: not >=)
          ls->y_mul = slope_log2 >= kAlibiMinSlopeLog2 ? (cap ? ls->cap_log2 : ls->qk_mul) / slope_log2 : 0.f;
        }
        ls->seed[0] = var.seed[0];
        ls->seed[1] = var.seed[1];
        ls->drop_threshold = var.drop_threshold;
        ls->keep_scale = var.keep_scale;
      }
    }
    __syncthreads();
    if (seg_scan) {  // uniform over the CTA
      constexpr int kSeg = FwdParams::kSegmentBlock, kPer = kBlockN / kSeg;
      const int nb = (p.seqlen_k + kSeg - 1) / kSeg;
      const int32_t* rng = p.kv_segment_ranges + int64_t(batch) * nb * 2;
      const int b_end = min(hi * kPer, nb);
      int t_lo = INT32_MAX, t_hi = -1, same = 0;
      for (int bb = lo * kPer + tid; bb < b_end; bb += Traits::kNThreads) {
        Variant::SegRange kr;
        kr.mn = rng[2 * bb];
        kr.mx = rng[2 * bb + 1];
        const bool meets = !Variant::disjoint(q_rng, kr);
        if (meets) {
          t_lo = min(t_lo, bb / kPer);
          t_hi = max(t_hi, bb / kPer);
          same += Variant::same_single(q_rng, kr) ? 1 : 0;
        }
        if (walk_bits) {  // a tile meets if one of its blocks does; mixed if one is not all the query's id
          const int t = bb / kPer - lo;
          if (meets) atomicOr(&ms->meet[t >> 5], 1u << (t & 31));
          if (!Variant::same_single(q_rng, kr)) atomicOr(&ms->mixed[t >> 5], 1u << (t & 31));
        }
      }
      if (t_hi >= 0) {
        atomicMin(&ms->n_lo, t_lo);
        atomicMax(&ms->seg_hi, t_hi);
        if (same) atomicAdd(&ms->seg_same, same);
      }
      __syncthreads();
      const int s_lo = ms->n_lo, s_hi = ms->seg_hi;
      n_top = s_hi + 1;  // 0 when no tile meets: nothing visited
      if (tid == 0 && s_hi >= 0) ms->seg_walk = ms->seg_same != min((s_hi + 1) * kPer, nb) - s_lo * kPer;
      __syncthreads();
    }
  } else {
    n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
    if (p.causal) {
      const int last_row = min(row0 + kBlockM, p.seqlen_q);  // exclusive
      n_blocks = min(n_blocks, (last_row + kBlockN - 1) / kBlockN);
    }
  }
  // (kMasks) The next key tile below n to visit, -1 when none: tiles
  // whose segment-id range is disjoint from the query tile's are skipped.
  // seg: the tile found must compare segment ids (its ids and the query
  // tile's are not all one id). Callers look one tile ahead, under a wgmma,
  // and carry the result. The range of a BN-key tile is read with BN/16
  // predicated loads, one tile at a time (#pragma unroll 1): an unrolled
  // search kept 32 loads in flight and spilled.
  [[maybe_unused]] auto prev_tile = [&](int n, bool& seg) {
    --n;
    seg = false;
    if constexpr (kMasks) {
      const int n_lo = ms->n_lo;
      if (p.q_segment_ids != nullptr && p.kv_segment_ids != nullptr) {
        Variant::SegRange q_rng;
        q_rng.mn = ms->q_mn;
        q_rng.mx = ms->q_mx;
        seg = true;  // no ranges: compare ids on every tile
        if (p.q_segment_ranges != nullptr && p.kv_segment_ranges != nullptr && !ms->seg_walk) {
          seg = false;  // every tile in [n_lo, n_top) holds the query tile's one id
        } else if (ms->walk_bits) {  // (set only with ranges)
          // The highest meeting tile at or below n, a word of tiles at a time.
          const int base = ms->bits_lo, t_lo = n_lo - base;
          int t = n - base;
#pragma unroll 1
          while (t >= t_lo) {
            const uint32_t w = ms->meet[t >> 5] & (0xffffffffu >> (31 - (t & 31)));
            if (w != 0u) {
              t = (t & ~31) + 31 - __clz(w);
              break;
            }
            t = (t & ~31) - 1;
          }
          n = t + base;
          seg = t >= t_lo && ((ms->mixed[t >> 5] >> (t & 31)) & 1u) != 0u;
        } else if (p.q_segment_ranges != nullptr && p.kv_segment_ranges != nullptr) {
          constexpr int kSeg = FwdParams::kSegmentBlock;
          const int nb = (p.seqlen_k + kSeg - 1) / kSeg;
          const int32_t* rng = p.kv_segment_ranges + int64_t(batch) * nb * 2;
#pragma unroll 1
          for (; n >= n_lo; --n) {
            Variant::SegRange kr;
            kr.mn = INT32_MAX;
            kr.mx = INT32_MIN;
#pragma unroll
            for (int i = 0; i < kBlockN / kSeg; ++i) {
              const int bb = n * (kBlockN / kSeg) + i;
              if (bb < nb) {
                kr.mn = min(kr.mn, int(rng[2 * bb]));
                kr.mx = max(kr.mx, int(rng[2 * bb + 1]));
              }
            }
            if (!Variant::disjoint(q_rng, kr)) {
              seg = !Variant::same_single(q_rng, kr);
              break;
            }
          }
        }
      }
      if (n < n_lo) n = -1;
    }
    return n;
  };
  [[maybe_unused]] bool seg_first = false;
  if constexpr (kMasks) n_top = prev_tile(n_top, seg_first);
  // (kMasks) Whether tile n needs the band / length test (its ids: seg).
  [[maybe_unused]] auto band_edge = [&](int n) { return n < ms->full_lo || n > ms->full_hi; };

  const Element* q_ptr = static_cast<const Element*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const Element* k_ptr = static_cast<const Element*>(p.k) + batch * p.k_batch_stride + head_kv * p.k_head_stride;
  const Element* v_ptr = static_cast<const Element*>(p.v) + batch * p.v_batch_stride + head_kv * p.v_head_stride;
  Element* o_ptr = static_cast<Element*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride;

  Tensor mQ = make_tensor(make_gmem_ptr(q_ptr), make_shape(p.seqlen_q, Int<kHeadDim>{}), make_stride(p.q_row_stride, _1{}));
  Tensor mK = make_tensor(make_gmem_ptr(k_ptr), make_shape(p.seqlen_k, Int<kHeadDim>{}), make_stride(p.k_row_stride, _1{}));
  Tensor mV = make_tensor(make_gmem_ptr(v_ptr), make_shape(p.seqlen_k, Int<kHeadDim>{}), make_stride(p.v_row_stride, _1{}));
  Tensor mO = make_tensor(make_gmem_ptr(o_ptr), make_shape(p.seqlen_q, Int<kHeadDim>{}), make_stride(p.o_row_stride, _1{}));
  Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, 0));
  Tensor gO = local_tile(mO, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, 0));
  Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));  // (BN, D, n)
  Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));

  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKV{});  // (BN, D, stage)
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutVt{});  // (D, BN, stage)

  // ---- gmem -> smem copies ----
  typename Traits::GmemCopyIn gcopy;
  auto gthr = gcopy.get_thread_slice(tid);
  Tensor tQg = gthr.partition_S(gQ);
  Tensor tQs = gthr.partition_D(sQ);
  Tensor tKg = gthr.partition_S(gK);  // (CPY, CPY_N, CPY_K, n)
  Tensor tKs = gthr.partition_D(sK);  // (CPY, CPY_N, CPY_K, stage)
  Tensor tVg = gthr.partition_S(gV);
  Tensor tVs = gthr.partition_D(sV);
  Tensor tQc = gthr.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tKVc = gthr.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // K / V tiles with every row in range (all but the last key tile): the
  // loader's precomputed addresses (tile_loader.cuh).
  using KVLoader = TileLoader<Element, typename Traits::SmemLayoutKV, kBlockN, kHeadDim, Traits::kNThreads>;
  const KVLoader kv(smem.k.data(), head_dim, tid);
  constexpr uint32_t kVMinusK = uint32_t(offsetof(Storage, v) - offsetof(Storage, k));
  auto load_k = [&](int n, int stage) { kv.template load<false>(k_ptr, p.k_row_stride, int64_t(n) * kBlockN, stage, 0u); };
  auto load_v = [&](int n, int stage) { kv.template load<false>(v_ptr, p.v_row_stride, int64_t(n) * kBlockN, stage, kVMinusK); };
  // (kMasks, segment ids) Key tile n's ids into the id slot of its K slot,
  // in the same cp.async group as K (zero past seqlen_k: masked by kv_len).
  [[maybe_unused]] auto load_ids = [&](int n, int slot) {
    if constexpr (kMasks) {
      static_assert(kBlockN <= Traits::kNThreads);
      if (p.q_segment_ids != nullptr && p.kv_segment_ids != nullptr && tid < kBlockN) {
        const int col = n * kBlockN + tid;
        cp_async4(&ms->kv_ids[slot][tid], p.kv_segment_ids + int64_t(batch) * p.seqlen_k + min(col, p.seqlen_k - 1),
                  col < p.seqlen_k);
      }
    }
  };

  // ---- wgmma partitions ----
  typename Traits::TiledMmaS mma_s;
  typename Traits::TiledMmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_o = mma_o.get_thread_slice(tid);
  Tensor tSrQ = thr_s.partition_fragment_A(sQ);   // smem descriptors (MMA, MMA_M, MMA_K)
  Tensor tSrK = thr_s.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stage)
  Tensor tOrV = thr_o.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage)
  Tensor acc_o = partition_fragment_C(mma_o, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  Tensor tSc = thr_s.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  [[maybe_unused]] Tensor tSc0 = mma_s.get_thread_slice(0).partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor tOc = thr_o.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));

  constexpr int kRows = 2 * decltype(size<1>(acc_o))::value;
  static_assert(kRows == 2);
  OnlineSoftmax<kRows, Traits::kLazyRescale> softmax;
  clear(acc_o);

  [[maybe_unused]] const auto* lsc = [&]() {
    if constexpr (kLogits != 0)
      return reinterpret_cast<const typename Traits::LogitScalars*>(smem_raw + sizeof(Storage) + sizeof(MaskScalars));
    else
      return static_cast<const int*>(nullptr);
  }();
  // (kLogits) Logits in log2 units from apply_logits: softmax scale 1; soft-cap
  // alone leaves tanh(s * scale / cap), its scale cap * log2(e) fused into
  // exp2 as the plain kernel does with the softmax scale (cap > 0).
  const bool pre_scale = kTransform == 0 && !(args.scale_log2 > 0.f);
  // (ALiBi in distance units) the logits are slope_log2 * (y + shift).
  constexpr bool kAlibiShift = (kTransform & kLogitAlibi) != 0;
  float scale_log2;
  if constexpr (kTransform == kLogitSoftcap) scale_log2 = lsc->cap_log2;
  else if constexpr (kAlibiShift) scale_log2 = lsc->y_mul > 0.f ? lsc->slope_log2 : 1.f;
  else scale_log2 = (kTransform != 0 || pre_scale) ? 1.f : args.scale_log2;
  // (Soft-cap alone, bf16) tanh bounds every score to [-1, 1], so a fixed
  // stabiliser replaces the running max (OnlineSoftmax::fix_max): exp2
  // arguments t cap_log2 - (cap_log2 - 24) lie in [24 - 2 cap_log2, 24],
  // inside [-124, 24] while cap_log2 <= 74 (cap <= 51.29: Gemma 2's 50
  // included). Larger caps keep the running max, as does fp16, whose P
  // cannot hold 2^24 (nor 2^-124).
  [[maybe_unused]] bool fixed_max = false;
  if constexpr (kTransform == kLogitSoftcap && std::is_same_v<Element, cutlass::bfloat16_t>) {
    fixed_max = scale_log2 <= 74.f;
    if (fixed_max) softmax.fix_max(1.f - 24.f / scale_log2);
  }

  if constexpr (!Traits::kOverlap) {
    // The masks / logits kernels' loop (kMasks). Two kinds of step: an edge
    // step (a tile of the band's or the lengths' edge, or one whose segment
    // ids must be compared; the next tile found by prev_tile under the P V
    // wgmma) and interior steps (kRuns): a run of consecutive tiles inside
    // [full_lo, full_hi] without segment ids, or whose keys all hold the
    // query tile's one id (run_end), which need no mask, the next tile being
    // n - 1. The interior step is the plain loop's step plus the logit
    // transforms: the per-tile mask tests, id loads and searches are gone
    // from most tiles, and the registers they held are free there.
    int n_block = n_top;
    // Next tile to visit, found one step ahead; seg / seg_next: the
    // segment-id flags of n_block / n_next.
    bool seg_next = false;
    int n_next = prev_tile(n_block, seg_next);
    bool seg = seg_first;
    if (n_block >= n_stop) {
      load_tile<true, true>(gcopy, tQg, tQs, tQc, rows_left, head_dim);
      load_tile<true, true>(gcopy, tKg(_, _, _, n_block), tKs(_, _, _, 0), tKVc, p.seqlen_k - n_block * kBlockN, head_dim);
      load_tile<true, true>(gcopy, tVg(_, _, _, n_block), tVs(_, _, _, 0), tKVc, p.seqlen_k - n_block * kBlockN, head_dim);
      load_ids(n_block, 0);
      cp_async_fence();
    }
    const bool seg_ids = p.q_segment_ids != nullptr && p.kv_segment_ids != nullptr;
    // Interior runs on the kernels where they measured faster on the H100
    // (Traits::kRuns: d128; not soft-cap alone, not dropout; and the masks
    // kernel for segment ids is built without: benchmarks/NOTES.md).
    constexpr bool kRuns = Traits::kRuns && kTransform != kLogitSoftcap && !kDropout;
    // The lowest tile of the interior run starting at tile n (n itself not
    // on the band's edge), or n + 1 when n starts none: without segment ids,
    // or with one id over every visited tile (ranges, no walk), every tile
    // down to full_lo.
    auto run_end = [&](int n) {
      const bool one_id = p.q_segment_ranges != nullptr && p.kv_segment_ranges != nullptr && !ms->seg_walk;
      return !seg_ids || one_id ? max(ms->full_lo, ms->n_lo) : n + 1;
    };
    int stage = 0;
    // One key tile n_blk (K/V in `stage`), loading n_nxt's (if any, with its
    // segment ids when nxt_ids) into the other stage. kEdge: band / seg
    // pick the tile's masks, and n_after / seg_after get the tile after
    // n_nxt.
    auto step = [&](auto edge, int n_blk, int n_nxt, bool nxt_ids, bool band, bool seg_t, int& n_after,
                    bool& seg_after) {
      constexpr bool kEdge = decltype(edge)::value;
      const int col0 = n_blk * kBlockN;
      cp_async_wait<0>();
      cutlass::arch::fence_view_async_shared();  // cp.async writes -> wgmma (async proxy) reads
      __syncthreads();  // K(n), V(n) landed; everyone is done with the other stage
      // Next tile's loads (only the first visited tile can be partial).
      auto loads = [&]() {
        if (n_nxt >= n_stop) {
          load_k(n_nxt, stage ^ 1);
          load_v(n_nxt, stage ^ 1);
          if (kEdge || nxt_ids) load_ids(n_nxt, stage ^ 1);
          cp_async_fence();
        }
      };
      if constexpr (Traits::kLoadsFirst) loads();
      Tensor acc_s = partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{});
      static_assert(decltype(size<1>(acc_s))::value == 1 && decltype(size<2>(acc_s))::value == 1);
      wgmma_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, stage), acc_s);
      if constexpr (!Traits::kLoadsFirst) loads();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_s);

      if (pre_scale) {
#pragma unroll
        for (int i = 0; i < size(acc_s); ++i) acc_s(i) *= args.scale_log2;
      }
      [[maybe_unused]] float shift = 0.f;
      if constexpr (kTransform != 0) shift = apply_logits<kTransform, kBlockM, kBlockN>(acc_s, tSc, tSc0, lsc, col0);
      if constexpr (kEdge) {
        if (band || seg_t) apply_variant_mask(acc_s, tSc, tSc0, ms, col0, ms->kv_ids[stage], band, seg_t);
      }
      if (kTransform == kLogitSoftcap && fixed_max) softmax.update_fixed(acc_s, scale_log2);
      else softmax.template update<kAlibiShift>(acc_s, acc_o, scale_log2, shift);
      if constexpr (kDropout) apply_dropout(acc_s, tSc, tSc0, lsc, batch, head, row0, col0);

      Tensor rP = convert_regs<Element>(acc_s);
      Tensor tOrP = make_tensor(rP.data(), PAsALayout<kBlockN>{});
      wgmma_issue<false, true>(mma_o, tOrP, tOrV(_, _, _, stage), acc_o);
      if constexpr (kEdge) n_after = n_nxt >= n_stop ? prev_tile(n_nxt, seg_after) : n_stop - 1;  // under the P V wgmma
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
      stage ^= 1;
    };
    while (n_block >= n_stop) {
      const bool band = band_edge(n_block);
      const int n_end = kRuns && !band ? run_end(n_block) : n_block + 1;
      if (n_end <= n_block) {
        // Interior run: n_block down to n_end, then the tile prev_tile finds
        // below it (its ids loaded by the run's last step); n_block's loads
        // are in flight, each step issues the next one's.
        bool seg_exit = false;
        const int n_exit = prev_tile(n_end, seg_exit);
        int unused_n;
        bool unused_seg;
#pragma unroll 1
        for (; n_block >= n_end; --n_block) {
          const bool last = n_block == n_end;
          step(std::false_type{}, n_block, last ? n_exit : n_block - 1, last, false, false, unused_n, unused_seg);
        }
        n_block = n_exit;
        seg = seg_exit;
        if (n_block >= n_stop) n_next = prev_tile(n_block, seg_next);
      } else {
        int n_after = n_stop - 1;
        bool seg_after = false;
        step(std::true_type{}, n_block, n_next, true, band, seg, n_after, seg_after);
        n_block = n_next;
        n_next = n_after;
        seg = seg_next;
        seg_next = seg_after;
      }
    }
  } else {
    // The overlapped loop over the visited tiles only (kMasks): tiles may be
    // skipped, so K/V slots alternate per visit (par: the current tile's
    // slot), not per tile index. Same cp.async groups as above, with
    // "K(j-1)" the next visited tile jn, found one visit ahead.
    const int n_first = n_top;
    using AccS = decltype(partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{}));
    using FragP = decltype(make_tensor<Element>(PAsALayout<kBlockN>{}));
    FragP tOrP;
    float corr[kRows];
    // Returns apply_logits' shift (0 without ALiBi).
    auto mask_scale = [&](int col0, bool band, bool seg, int slot, auto& acc_s) {
      if (pre_scale) {
#pragma unroll
        for (int i = 0; i < size(acc_s); ++i) acc_s(i) *= args.scale_log2;
      }
      float shift = 0.f;
      if constexpr (kTransform != 0) shift = apply_logits<kTransform, kBlockM, kBlockN>(acc_s, tSc, tSc0, lsc, col0);
      if (band || seg) apply_variant_mask(acc_s, tSc, tSc0, ms, col0, ms->kv_ids[slot], band, seg);
      return shift;
    };
    int j = n_stop - 1, jn = n_stop - 1;  // second and third visited tiles
    bool seg_j = false, seg_jn = false;
    if (n_first >= n_stop) {
      const int kv_left = p.seqlen_k - n_first * kBlockN;
      load_tile<true, true>(gcopy, tQg, tQs, tQc, rows_left, head_dim);
      load_tile<true, true>(gcopy, tKg(_, _, _, n_first), tKs(_, _, _, 0), tKVc, kv_left, head_dim);
      load_ids(n_first, 0);
      cp_async_fence();
      load_tile<true, true>(gcopy, tVg(_, _, _, n_first), tVs(_, _, _, 0), tKVc, kv_left, head_dim);
      cp_async_fence();
      j = prev_tile(n_first, seg_j);
      cp_async_wait<1>();  // Q, K(n_first)
      cutlass::arch::fence_view_async_shared();
      __syncthreads();
      if (j >= n_stop) {
        load_k(j, 1);
        load_ids(j, 1);
      }
      cp_async_fence();
      AccS acc_s;
      wgmma_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, 0), acc_s);
      if (j >= n_stop) jn = prev_tile(j, seg_jn);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_s);
      const float shift = mask_scale(n_first * kBlockN, band_edge(n_first), seg_first, 0, acc_s);
      if (kTransform == kLogitSoftcap && fixed_max) softmax.update_fixed(acc_s, scale_log2);
      else softmax_step<kAlibiShift>(softmax, acc_s, corr, scale_log2, shift);  // O is still 0: no rescale
      if constexpr (kDropout) apply_dropout(acc_s, tSc, tSc0, lsc, batch, head, row0, n_first * kBlockN);
      Tensor rP = convert_regs<Element>(acc_s);
#pragma unroll
      for (int i = 0; i < size(tOrP); ++i) tOrP(i) = rP(i);
    }
    int par = 1;  // slot of tile j; the previous (and the next) visit use par ^ 1
    while (j >= n_stop) {
      cp_async_wait<0>();  // K(j), V(previous)
      cutlass::arch::fence_view_async_shared();
      __syncthreads();  // every warpgroup is done with K(previous) and V(the one before)
      auto loads = [&]() {
        if (jn >= n_stop) {
          load_k(jn, par ^ 1);
          load_ids(jn, par ^ 1);
        }
        load_v(j, par);
        cp_async_fence();
      };
      if constexpr (Traits::kLoadsFirst) loads();
      AccS acc_s;
      wgmma_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, par), acc_s);
      wgmma_issue<false, true>(mma_o, tOrP, tOrV(_, _, _, par ^ 1), acc_o);
      if constexpr (!Traits::kLoadsFirst) loads();
      bool seg_jnn = false;
      const int jnn = jn >= n_stop ? prev_tile(jn, seg_jnn) : n_stop - 1;  // under both wgmmas
      warpgroup_wait<1>();  // S(j)
      warpgroup_fence_operand(acc_s);
      const float shift = mask_scale(j * kBlockN, band_edge(j), seg_j, par, acc_s);
      bool moved = false;  // (fixed_max: O is never rescaled)
      if (kTransform == kLogitSoftcap && fixed_max) softmax.update_fixed(acc_s, scale_log2);
      else moved = softmax_step<kAlibiShift>(softmax, acc_s, corr, scale_log2, shift);
      if constexpr (kDropout) apply_dropout(acc_s, tSc, tSc0, lsc, batch, head, row0, j * kBlockN);
      warpgroup_wait<0>();  // P V of the previous tile
      warpgroup_fence_operand(acc_o);
      rescale_rows(acc_o, corr, moved);
      Tensor rP = convert_regs<Element>(acc_s);
#pragma unroll
      for (int i = 0; i < size(tOrP); ++i) tOrP(i) = rP(i);
      par ^= 1;
      j = jn;
      jn = jnn;
      seg_j = seg_jn;
      seg_jn = seg_jnn;
    }
    if (n_first >= n_stop) {
      cp_async_wait<0>();  // V(last visited)
      cutlass::arch::fence_view_async_shared();
      __syncthreads();
      wgmma_issue<false, true>(mma_o, tOrP, tOrV(_, _, _, par ^ 1), acc_o);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
    }
  }

  // ---- epilogue ----
  float lse[kRows];
  softmax.finalize(acc_o, lse, scale_log2);
  if constexpr (kDropout) {
    const float keep_scale = lsc->keep_scale;
#pragma unroll
    for (int i = 0; i < size(acc_o); ++i) acc_o(i) *= keep_scale;
  }

  cp_async_wait<0>();
  __syncthreads();  // every warpgroup's wgmmas on sQ are done: O reuses it

  Tensor rO = convert_regs<Element>(acc_o);
  Tensor sO = sQ;
  auto r2s = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, mma_o);
  auto r2s_thr = r2s.get_thread_slice(tid);
  Tensor rO_view = r2s_thr.retile_S(rO);
  Tensor sO_part = r2s_thr.partition_D(sO);
  cute::copy(r2s, rO_view, sO_part);

  // LSE: lane % 4 == 0 owns column 0 of its rows.
  Tensor tOc_rc = make_tensor(tOc.data(), acc_rowcol_layout(tOc.layout()));
  if (get<1>(tOc_rc(0, 0)) == 0) {
    float* lse_row = p.lse + (int64_t(batch) * p.heads_q + head) * int64_t(p.seqlen_q);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = row0 + get<0>(tOc_rc(r, 0));
      if (row < p.seqlen_q) lse_row[row] = lse[r];
    }
  }

  __syncthreads();
  typename Traits::GmemCopyOut gcopy_o;
  auto gthr_o = gcopy_o.get_thread_slice(tid);
  Tensor tOs = gthr_o.partition_S(sO);
  Tensor tOg = gthr_o.partition_D(gO);
  Tensor tOr = make_tensor<Element>(shape(tOg));
  cute::copy(gcopy_o, tOs, tOr);
  Tensor tOcg = gthr_o.partition_D(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  store_tile<true>(gcopy_o, tOr, tOg, tOcg, rows_left, head_dim);
#else
#if defined(__CUDA_ARCH__)
  __trap();  // not built for sm_90a: the host never launches this
#endif
#endif
}

}  // namespace jax_flash::cuda::fwd
