// Hopper (SM90a) dK/dV kernel for plain attention (no variants), atomic dQ
// mode: wgmma tensor cores, no warp specialisation, cp.async loads.
//
// One CTA of 2 warpgroups per (128-key tile, kv head, batch); warpgroup w
// owns key rows [64 w, 64 w + 64), the wgmma M of every product that has
// keys as rows. K and V stay in 128 B-swizzled smem for the whole CTA; the
// CTA loops over the q heads of its kv group and their 64-row query tiles,
// with Q, dO, LSE and D double buffered (loaded one tile ahead). Per tile:
//   S^T  = K Q^T            SS (keys x queries)
//   dP^T = V dO^T           SS, issued right behind S^T
//   P^T  = exp2(S^T scale log2e - lse log2e), dS^T = P^T (dP^T - D)
//   dV  += P^T dO           RS: P^T from registers, dO^T an MN-major view
//   dK  += dS^T Q           RS, likewise
//   dQ   = dS K             SS: dS^T goes through smem (read MN-major as A),
//                           the 2 warpgroups split the head dim; the tile
//                           is staged in smem and added to the workspace
//                           accumulator by bulk async reduce copies (one per
//                           row) issued at the next step, off the critical
//                           path (kDqBulk; else fp32 atomics, the v1 way).
// Computing the key-major products (S^T rather than S) keeps P^T and dS^T in
// the accumulator layout the RS A operand wants, so dV and dK need no smem
// round trip; only dQ does. The preprocess (D = rowsum(dO O), accumulator
// clear) and convert kernels are the SM80 path's.
//
// kMasks: the masks-only variants (window, lengths, query offsets, segment
// ids; cuda::Variant) as in the SM80 masks kernel: the query-tile range
// from the band and lengths, query tiles whose ids cannot meet the key
// tile's skipped, element masks on the tiles that need them only. Atomic
// mode only. Off, the code is the plain kernel's.
//
// kLogits (BwdSm90LogitsTraits, bwd_sm90_logits.cuh: a kMasks traits with
// fwd::kLogitSoftcap / kLogitAlibi bits): soft-cap and ALiBi on top of the
// masks, the SM80 generic backward's math (Variant::logit_log2, dS times
// 1 - tanh^2). Traits without it (plain, masks) compile as before.
//
// Deterministic mode (dq_order != nullptr) is the same kernel with the dQ
// reduces of each query tile put in a fixed order: highest key tile first.
// One counter per (batch, q head, query tile) counts the reduces done; a CTA
// waits for its turn before issuing, and counts its own once the reduce has
// completed. CTAs launch highest key tile first, so whoever a CTA waits for
// is already resident (no deadlock however many tiles).
// Long causal plain attention with few (kv head, batch) pairs (the
// launcher's dq_rotate == kDqLowFirst) orders the other way, lowest key tile
// first: those are the heaviest (they see every query tile below them), and
// launched last, as highest-first needs, they left a tail of long CTAs.
// CTAs then launch lowest key tile first with the pairs interleaved (a
// pair's key tiles launch `pairs` CTAs apart, so the one below is usually
// ahead already), and each walks its query tiles bottom-up, the order of the
// key tile below. Where it loses (benchmarks/NOTES.md "Deterministic causal
// order"): short rows, whose successive key tiles start together and chain
// their first-row waits, and many pairs, whose key tiles spread the Q / dO /
// dQ rows in flight past L2.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/container/array_aligned.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/bwd_kernel.cuh"      // lse_to_log2, preprocess / convert
#include "cuda/bwd_sm90_common.cuh" // smem layouts, tile loads, dK/dV store
#include "cuda/bwd_sm90_logits.cuh" // (kLogits) soft-cap / ALiBi passes
#include "cuda/bwd_sm90_masks.cuh"  // (kMasks) segment scan, mask smem
#include "cuda/kernel_traits.cuh"   // GmemTileCopies
#include "cuda/sm90/fwd_logits.cuh"  // kLogit* bits
#include "cuda/sm90/wgmma.cuh"       // wgmma_issue, PAsALayout
#include "cuda/sm90/bulk_ops.cuh"   // bulk reduce copies, ordering counters
#include "cuda/tile_loader.cuh"     // TileLoader (Q / dO tiles)
#include "cuda/tile_order.h"       // tile_coord (launch order)
#include "cuda/utils.cuh"           // load_tile, acc_rowcol_layout, convert_regs
#include "params.h"

namespace jax_flash::cuda::bwd90 {

using namespace cute;

// dq_rotate value asking for the lowest-key-tile-first order (see the top),
// and where the launcher uses it: causal, at least kLowFirstMinKeyTiles key
// tiles and at most kLowFirstMaxPairs (kv head, batch) pairs.
inline constexpr int kDqLowFirst = -1;
inline constexpr int kLowFirstMinKeyTiles = 64;
inline constexpr int kLowFirstMaxPairs = 64;

// Bulk reduce copies and deterministic mode's counters (sm90/bulk_ops.cuh).
using sm90::add_release;
using sm90::bulk_commit;
using sm90::bulk_reduce_add_f32;
using sm90::bulk_wait_all;
using sm90::bulk_wait_read;
using sm90::fence_async_global;
using sm90::load_acquire;

// kDqBulk: dQ through smem and bulk reduce copies (measured +5-7% over the
// atomics at d128). kEarlyDv: dV += P^T dO is issued as soon as P^T is
// ready, so the dS^T math runs under it. kLateLoads: the next tile's
// cp.async loads are issued behind the S^T / dP^T wgmmas, not before them.
// kBlockM: query rows per step (128 at d64, where 64 leaves each step too
// little work to cover its two CTA barriers). kMasks: masks-only variants.
template <int kHeadDim_, typename Element_, bool kDqBulk_ = true, bool kEarlyDv_ = false,
          bool kLateLoads_ = false, int kBlockM_ = 64, bool kMasks_ = false>
struct BwdSm90Traits {
  using Element = Element_;
  static constexpr bool kMasks = kMasks_;
  static constexpr bool kDqBulk = kDqBulk_;
  static constexpr bool kEarlyDv = kEarlyDv_;
  static constexpr bool kLateLoads = kLateLoads_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per step
  static constexpr int kBlockN = 128;       // keys per CTA: 2 warpgroups x 64
  static constexpr int kNThreads = 256;
  static constexpr int kStages = 2;
  static constexpr int kDqRow = kHeadDim + 4;  // floats per staged dQ row
  static_assert(kHeadDim % 64 == 0);
  static_assert(2 * kBlockM <= kNThreads);  // one thread per LSE / D entry

  // S^T, dP^T (BN, BM): A = K / V (BN, D), B = Q / dO (BM, D), K-major both.
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kHeadDim>>>(),
      Layout<Shape<_2, _1, _1>>{}));
  // dV, dK (BN, D) += P^T / dS^T (regs, BN x BM) times dO / Q seen as (D, BM).
  using TiledMmadKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockM>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_2, _1, _1>>{}));
  // dQ (BM, D) = dS (BM, BN) K (BN, D): both operands MN-major views; the
  // warpgroups split D so each holds a (64, D/2) accumulator.
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim / 2>, Int<kBlockN>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_1, _2, _1>>{}));

  using Layouts = BwdSm90SmemLayouts<Element, kHeadDim, kBlockM, kBlockN, kStages>;
  using SmemLayoutQ = typename Layouts::SmemLayoutQ;
  using SmemLayoutQt = typename Layouts::SmemLayoutQt;
  using SmemLayoutK = typename Layouts::SmemLayoutK;
  using SmemLayoutKt = typename Layouts::SmemLayoutKt;
  using SmemLayoutdSt = typename Layouts::SmemLayoutSt;  // dS^T, read as dS for dQ
  using SmemLayoutdS = typename Layouts::SmemLayoutdS;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutdSt>, 1024> ds;
    // dQ tile for the bulk reduce; rows padded by 16 B against bank conflicts.
    alignas(128) float dq[kDqBulk ? kBlockM * kDqRow : 4];
    float lse[kStages][kBlockM];
    float dsum[kStages][kBlockM];
  };
  // (kMasks) BwdSm90MaskSmem follows SharedStorage.
  using MaskSmem = BwdSm90MaskSmem<kBlockM, kBlockN, kStages>;
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + (kMasks ? int(sizeof(MaskSmem)) : 0);

  using GmemCopyIn = typename fwd::GmemTileCopies<Element, kHeadDim, kNThreads>::In;
  using SmemCopyAtomdS = Copy_Atom<UniversalCopy<uint32_t>, Element>;
};

// Requires head_dim == kHeadDim and 16 B-aligned rows (the launcher checks).
template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
bwd_sm90_dkdv_kernel(const __grid_constant__ BwdParams p, const float* __restrict__ dsum,
                     float* __restrict__ dq_accum, int* __restrict__ dq_order, const int dq_rotate,
                     const bool pair_ok, const int order_group) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  constexpr int M = Traits::kBlockM, N = Traits::kBlockN, D = Traits::kHeadDim;
  using Storage = typename Traits::SharedStorage;
  constexpr bool kMasks = Traits::kMasks;
  constexpr int kLogits = fwd::LogitsOf<Traits>::value;  // (kMasks kernels only)
  static_assert(kLogits == 0 || kMasks);
  constexpr bool kCap = (kLogits & kLogitSoftcap) != 0, kAlibi = (kLogits & kLogitAlibi) != 0;
  constexpr int kTransform = kLogits & (kLogitSoftcap | kLogitAlibi);
  constexpr bool kDropout = (kLogits & fwd::kLogitDropout) != 0;
  // Masks-only kernels search on warp 0 alone, through its window of query
  // tiles (fill_query_window); the logits kernels search on every warp and
  // load each candidate's id ranges.
  constexpr bool kWindow = kMasks && kLogits == 0;

  extern __shared__ __align__(1024) char smem_raw[];
  Storage& smem = *reinterpret_cast<Storage*>(smem_raw);
  [[maybe_unused]] auto& msmem = *reinterpret_cast<typename Traits::MaskSmem*>(smem_raw + sizeof(Storage));
  // (kLogits) LogitSmem after the MaskSmem.
  auto lsmem = [&]() -> auto& {
    if constexpr (kLogits != 0)
      return *reinterpret_cast<typename Traits::LogitSmem*>(smem_raw + sizeof(Storage) + sizeof(msmem));
    else
      return msmem;  // unused
  };

  const int tid = threadIdx.x;
  const int Sq = p.seqlen_q, Sk = p.seqlen_k;
  const int n_blocks = (Sk + N - 1) / N;
  // (kDqLowFirst) launch index = pair + pairs * key tile.
  const bool dq_low_first = !kMasks && dq_order != nullptr && dq_rotate == kDqLowFirst;
  int nb = dq_order ? n_blocks - 1 - int(blockIdx.x) : int(blockIdx.x);
  int hkv = blockIdx.y, b = blockIdx.z;
  if (dq_low_first) {
    const int pairs = int(gridDim.y) * int(gridDim.z);
    const int64_t lin = int64_t(blockIdx.x) + int64_t(n_blocks) * (blockIdx.y + int64_t(gridDim.y) * blockIdx.z);
    nb = int(lin / pairs);
    const int pair = int(lin % pairs);
    hkv = pair % int(gridDim.y);
    b = pair / int(gridDim.y);
  } else if (order_group > 0) {  // (atomic mode, causal) sectioned longest-first: cuda/tile_order.h
    const TileCoord tile = tile_coord(blockIdx.x, blockIdx.y, blockIdx.z, n_blocks, gridDim.y, gridDim.z, false,
                                      order_group);
    nb = tile.tile;
    hkv = tile.head;
    b = tile.batch;
  }
  const int group = p.heads_q / p.heads_kv;
  const int n0 = nb * N;
  // Causal (top-left aligned: key j visible to query i iff j <= i): query
  // tiles wholly above this key tile see none of it.
  int m_begin = p.causal ? n0 / M : 0;
  int m_end = (Sq + M - 1) / M;
  // (kMasks) The band and the lengths bound the query tiles instead. The
  // per-CTA mask values go to shared memory (msmem), read from there in the
  // loop rather than held in registers across it.
  using VarT = std::conditional_t<kMasks, Variant, bwd::NoVariantBwd>;
  [[maybe_unused]] VarT var(p, b, hkv * group);
  [[maybe_unused]] Variant::SegRange k_rng;
  if constexpr (kMasks) {
    var.template query_tiles<M>(n0, n0 + N - 1, m_begin, m_end);
    k_rng = var.k_range(n0, N);
    if (tid == 0) {
      msmem.q_len = var.q_len;
      msmem.kv_len = var.kv_len;
      msmem.offset = var.offset;
      msmem.k_mn = k_rng.mn;
      msmem.k_mx = k_rng.mx;
      msmem.one_id = 0;
      if constexpr (kWindow) msmem.win_base = INT_MIN;
      if constexpr (kLogits != 0) {
        lsmem().qk_mul = kCap ? p.scale / p.softcap : 0.f;
        lsmem().cap_log2 = kCap ? p.softcap * bwd::kLog2e : 0.f;
        if constexpr (kDropout) {
          lsmem().seed[0] = var.seed[0];
          lsmem().seed[1] = var.seed[1];
          lsmem().drop_threshold = var.drop_threshold;
          lsmem().keep_scale = var.keep_scale;
        }
      }
    }
    if (tid < N) msmem.kseg[tid] = var.segments() && n0 + tid < Sk ? int(p.kv_segment_ids[int64_t(b) * Sk + n0 + tid]) : 0;
  }
  int nm = m_end > m_begin ? m_end - m_begin : 0;
  int total = group * nm;

  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQt{});
  Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutQ{});
  Tensor sdOt = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutQt{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
  Tensor sKt = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKt{});
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutK{});
  Tensor sdSt = make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutdSt{});
  Tensor sdS = make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutdS{});

  // ---- gmem -> smem ----
  typename Traits::GmemCopyIn gcopy;
  auto gthr = gcopy.get_thread_slice(tid);
  Tensor cK = gthr.partition_S(make_identity_tensor(Shape<Int<N>, Int<D>>{}));
  load_kv_tile<Element>(gcopy, gthr, p, b, hkv, n0, sK, sV, cK);
  if constexpr (kMasks) {
    if (var.seg_ranges() && m_end > m_begin) {
      narrow_query_tiles<M, Traits::kNThreads>(var, p, b, k_rng, tid, msmem, m_begin, m_end);
      nm = m_end > m_begin ? m_end - m_begin : 0;
      total = group * nm;
    }
    __syncthreads();  // msmem's values
  }
  // Query tile of iteration `it` (per q head of the group). With dq_rotate
  // (deterministic, not causal) CTA nb starts at tile nb * dq_rotate and
  // wraps around, so the CTAs of a key-tile row work on different query tiles
  // at any one time instead of queueing on the same one.
  // Lowest-first order: bottom-up.
  auto m_tile = [&](int it) {
    const int i = it % nm;
    return dq_rotate > 0 ? (i + nb * dq_rotate) % nm : m_begin + (dq_low_first ? nm - 1 - i : i);
  };
  // Q, dO, lse, D of iteration `it` into stage `st` (kMasks with segment
  // ids: the query ids too).
  // Q / dO tiles through the loader's precomputed addresses (tile_loader.cuh;
  // rows past Sq zero-filled); head_dim == D here.
  using QLoader = fwd::TileLoader<Element, typename Traits::SmemLayoutQ, M, D, Traits::kNThreads>;
  const QLoader qload(smem.q.data(), D, tid);
  constexpr uint32_t kDoMinusQ = uint32_t(offsetof(Storage, dout) - offsetof(Storage, q));
  auto issue = [&](int it, int st) {
    const int h = hkv * group + it / nm, m0 = m_tile(it) * M;
    const Element* qp = static_cast<const Element*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride;
    const Element* dp = static_cast<const Element*>(p.dout) + b * p.do_batch_stride + h * p.do_head_stride;
    qload.template load<true>(qp, p.q_row_stride, m0, st, 0u, Sq - m0);
    qload.template load<true>(dp, p.do_row_stride, m0, st, kDoMinusQ, Sq - m0);
    load_q_stats<M>(tid, p, dsum, b, h, m0, Sq, smem.lse[st], smem.dsum[st]);
    if constexpr (kMasks) {
      if (p.q_segment_ids && p.kv_segment_ids && tid < M) {
        const bool valid = m0 + tid < Sq;
        bwd::cp_async4(&msmem.qseg[st][tid], p.q_segment_ids + int64_t(b) * Sq + (valid ? m0 + tid : 0), valid);
      }
    }
    if constexpr (kAlibi) {  // this q head's slope
      if (tid == Traits::kNThreads - 1) bwd::cp_async4(&lsmem().slope[st], p.alibi_slopes + int64_t(b) * p.alibi_batch_stride + h, true);
    }
  };
  // (kMasks, deterministic: no segment ids, the launcher's rule) How many
  // CTAs of higher key tile reduce into query tile mt before this one.
  [[maybe_unused]] auto masks_rank = [&](int mt) {
    if constexpr (kMasks)
      return masks_dq_rank<M, N>(msmem.variant(p, b), nb, n_blocks, mt);
    else
      return 0;
  };
  // (kMasks) The iteration after `i`, past query tiles whose ids cannot meet
  // the key tile's; fl gets its tile's mask flags (tile_flags), and on
  // thread 0 in deterministic mode (masks-only kernels) the rank of its dQ
  // reduce above kTileRankShift.
  [[maybe_unused]] auto next_it = [&](int i, int& fl) {
    ++i;
    if constexpr (kWindow) {
      int base = msmem.win_base, rel = 0;
      uint32_t meet = msmem.win_meet;
      for (; i < total; ++i) {
        rel = m_tile(i) - m_begin;
        if ((rel & ~31) != base) {
          base = rel & ~31;
          meet = fill_query_window<M, N>(msmem.variant(p, b), msmem.k_rng(), m_begin, nm, n0, base, msmem);
        }
        if ((meet >> (rel & 31)) & 1u) break;
      }
      if (i < total) {
        fl = msmem.win_flags[rel & 31];
        if (dq_order && tid == 0) fl |= masks_rank(m_tile(i)) << kTileRankShift;
      }
    } else if constexpr (kMasks) {
      const Variant v = msmem.variant(p, b);
      const Variant::SegRange kr = msmem.k_rng();
      Variant::SegRange qr;
      if (msmem.one_id) {
        qr = kr;  // every tile met holds the key tile's one id
      } else if (v.segments()) {
        for (; i < total; ++i) {
          qr = v.q_range(m_tile(i) * M, M);
          if (!Variant::disjoint(qr, kr)) break;
        }
      }
      if (i < total) fl = tile_flags(v, m_tile(i) * M, M, n0, N, qr, kr);
    }
    return i;
  };
  // (kMasks) Step k's iteration and tile flags are in msmem.ring[k % 4]:
  // step k reads the next one's iteration there (its loads) and, under its
  // first wgmmas, searches the one after (so the id-range loads stay off the
  // critical path); in shared memory rather than registers, which the loop
  // has none to spare for.
  int it = 0;
  [[maybe_unused]] int step = 0;
  // (kMasks) The first two steps' iterations and flags into the ring.
  [[maybe_unused]] auto ring_first = [&](int it0, int f0, int it1, int f1) {
    if (tid == 0) {
      msmem.ring[0][0] = it0;
      msmem.ring[0][1] = f0;
      msmem.ring[1][0] = it1;
      msmem.ring[1][1] = f1;
    }
  };
  if constexpr (kWindow) {
    // Warp 0 searches (its window), everyone reads the first iteration.
    if (tid < 32) {
      int f0 = 0, f1 = 0;
      const int it0 = next_it(-1, f0);
      const int it1 = next_it(it0, f1);
      ring_first(it0, f0, it1, f1);
    }
    __syncthreads();
    it = msmem.ring[0][0];
  } else if constexpr (kMasks) {
    int f0 = 0, f1 = 0;
    it = next_it(-1, f0);
    const int it1 = next_it(it, f1);
    ring_first(it, f0, it1, f1);
  }
  if (it < total) issue(it, 0);
  cp_async_fence();  // group: K, V, first Q tile

  // ---- wgmma partitions ----
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);
  Tensor tSrK = thr_sdp.partition_fragment_A(sK);     // (MMA, MMA_M, MMA_K)
  Tensor tSrV = thr_sdp.partition_fragment_A(sV);
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);     // (MMA, MMA_N, MMA_K, stage)
  Tensor tSrdO = thr_sdp.partition_fragment_B(sdO);
  Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOt);  // (MMA, MMA_N, MMA_K, stage)
  Tensor tdKrQt = thr_dkv.partition_fragment_B(sQt);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);

  Tensor tSc = thr_sdp.partition_C(make_identity_tensor(Shape<Int<N>, Int<M>>{}));
  Tensor tSc_rc = make_tensor(tSc.data(), fwd::acc_rowcol_layout(tSc.layout()));
  // (kMasks) Thread 0's coordinates (compile-time values; masked_probs_t).
  [[maybe_unused]] Tensor tSc0 = mma_sdp.get_thread_slice(0).partition_C(make_identity_tensor(Shape<Int<N>, Int<M>>{}));
  [[maybe_unused]] Tensor tSc0_rc = make_tensor(tSc0.data(), fwd::acc_rowcol_layout(tSc0.layout()));
  Tensor tKVc = thr_dkv.partition_C(make_identity_tensor(Shape<Int<N>, Int<D>>{}));
  Tensor tdQc = thr_dq.partition_C(make_identity_tensor(Shape<Int<M>, Int<D>>{}));

  auto r2s = make_tiled_copy_C(typename Traits::SmemCopyAtomdS{}, mma_sdp);
  auto r2s_thr = r2s.get_thread_slice(tid);
  Tensor tdSsdS = r2s_thr.partition_D(sdSt);

  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<N>, Int<D>>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<N>, Int<D>>{});
  clear(acc_dk);
  clear(acc_dv);

  const float scale_log2 = p.scale * bwd::kLog2e;
  using AccS = decltype(partition_fragment_C(mma_sdp, Shape<Int<N>, Int<M>>{}));
  static_assert(decltype(size<1>(AccS{}))::value == 1 && decltype(size<2>(AccS{}))::value == 1);

  // kDqBulk: the staged dQ tile of the previous step (head, first row).
  int dq_h = -1, dq_m0 = 0;
  auto dq_flush = [&]() {  // threads < M, once the staged tile is visible
    if (tid < M && dq_h >= 0 && dq_m0 + tid < Sq) {
      float* row = dq_accum + ((int64_t(b) * p.heads_q + dq_h) * Sq + dq_m0 + tid) * D;
      bulk_reduce_add_f32(row, &smem.dq[tid * Traits::kDqRow], D * int(sizeof(float)));
    }
    if (tid < M) bulk_commit();
  };
  // Deterministic mode: the counter of the staged tile, and of the tile whose
  // reduce is in flight (to be counted once it completes).
  const int m_tiles = (Sq + M - 1) / M;
  auto order_counter = [&](int h, int m0) { return dq_order + (int64_t(b) * p.heads_q + h) * m_tiles + m0 / M; };
  auto wait_turn = [&]() {  // thread 0, before the barrier that precedes dq_flush
    if (dq_h < 0) return;
    const int mt = dq_m0 / M;
    // How many CTAs reduce into tile mt before this one. Rotated: in the
    // order in which the CTAs reach it, k, k-1, .., 0, then n_blocks-1, ..,
    // k+1, where k is the last CTA starting at or before mt. Else highest key
    // tile first: causal, the highest that sees tile mt is the last whose
    // first query tile (floor(n0 / M)) is <= mt.
    int rank;
    if constexpr (kMasks && kLogits == 0) {
      rank = msmem.ring[(step - 1) & 3][1] >> kTileRankShift;  // the previous step's (masks_rank)
    } else if (dq_low_first) {
      rank = nb;  // every lower key tile sees tile mt too (causal: they start at or above it)
    } else if (dq_rotate > 0) {
      const int k = min(n_blocks - 1, mt / dq_rotate);
      rank = nb <= k ? k - nb : k + n_blocks - nb;
    } else {
      rank = (p.causal ? min(n_blocks - 1, ((mt + 1) * M - 1) / N) : n_blocks - 1) - nb;
    }
    const int* c = order_counter(dq_h, dq_m0);
    [[maybe_unused]] unsigned spins = 0;
    while (load_acquire(c) < rank) {
      // (masks-only kernels: a newer rank rule) a miscounted rank would wait forever:
      // seconds of spinning turn into a launch error instead.
      if constexpr (kMasks && kLogits == 0) {
        if (++spins == (1u << 26)) __trap();
      }
    }
    fence_async_global();  // the counter read before our reduce
  };
  int* in_flight = nullptr;
  auto count_done = [&]() {  // all threads, at a barrier after the flushing threads' wait
    if (tid == 0 && in_flight) add_release(in_flight, 1);
    in_flight = nullptr;
  };

  for (int st = 0; it < total; st ^= 1) {
    const int h = hkv * group + it / nm;
    const int m0 = m_tile(it) * M;
    cp_async_wait<0>();
    cutlass::arch::fence_view_async_shared();  // cp.async / st.shared -> wgmma reads
    if constexpr (Traits::kDqBulk) {
      if (dq_order && tid == 0) wait_turn();
    }
    __syncthreads();  // tile `it` landed; every wgmma of the previous step is done
    if constexpr (Traits::kDqBulk) {
      dq_flush();
      if (dq_order && dq_h >= 0) in_flight = order_counter(dq_h, dq_m0);
    }
    auto loads = [&]() {
      if constexpr (kMasks) {
        const int it_next = msmem.ring[(step + 1) & 3][0];
        if (it_next < total) issue(it_next, st ^ 1);
      } else {
        if (it + 1 < total) issue(it + 1, st ^ 1);
      }
      cp_async_fence();
    };
    if constexpr (!Traits::kLateLoads) loads();

    AccS acc_s, acc_dp;
    fwd::wgmma_issue<true, false>(mma_sdp, tSrK, tSrQ(_, _, _, st), acc_s);
    fwd::wgmma_issue<true, false>(mma_sdp, tSrV, tSrdO(_, _, _, st), acc_dp);
    if constexpr (Traits::kLateLoads) loads();
    // (kMasks) The iteration after next and its flags into the ring. The
    // logits kernels search here, under the S^T / dP^T wgmmas, on every warp
    // (moved as the masks-only kernels' search below, ptxas spilled 40-70 B
    // more in three of their four d128 kernels; not measured).
    if constexpr (kMasks && kLogits != 0) {  // under the wgmmas
      int f = 0;
      const int it_nn = next_it(msmem.ring[(step + 1) & 3][0], f);
      if (tid == 0) {
        msmem.ring[(step + 2) & 3][0] = it_nn;
        msmem.ring[(step + 2) & 3][1] = f;
      }
    }
    // (kDropout) The keep bits, under the S^T and dP^T wgmmas.
    [[maybe_unused]] auto keep_bits = [&]() {
      if constexpr (kDropout) {
        const uint32_t seed[2] = {lsmem().seed[0], lsmem().seed[1]};
        return dropout_bits_t(tSc_rc, seed, lsmem().drop_threshold, b, h, m0, n0);
      } else {
        return 0;
      }
    }();
    warpgroup_wait<1>();
    warpgroup_fence_operand(acc_s);

    // P^T: columns are queries, so lse (and D below) vary along columns.
    Tensor s = make_tensor(acc_s.data(), fwd::acc_rowcol_layout(acc_s.layout()));
    const float* lse_st = smem.lse[st];
    const float* dsum_st = smem.dsum[st];
    // (kLogits) This thread's (key, query) offset from thread 0's
    // coordinates, and the tile's ALiBi bias.
    [[maybe_unused]] const int rb = get<0>(tSc_rc(0, 0)) - get<0>(tSc0_rc(0, 0));
    [[maybe_unused]] const int cb = get<1>(tSc_rc(0, 0)) - get<1>(tSc0_rc(0, 0));
    // (made where used, from smem: no registers held between the passes)
    [[maybe_unused]] auto alibi = [&]() {
      if constexpr (kAlibi)
        return AlibiTile(lsmem().slope[st] * bwd::kLog2e, m0 + msmem.offset, n0, M, N, rb, cb);
      else
        return AlibiTile(0.f, 0, 0, M, N, 0, 0);
    };
    // (kLogits) The masks after P^T (and dS^T: with soft-cap, made together).
    [[maybe_unused]] auto logit_masks = [&](auto&& zero) {
      const int flags = msmem.ring[step & 3][1];
      if (flags & kTileMask)
        masks_t(tSc0_rc, rb, cb, msmem.qseg[st], msmem.kseg, flags & kTileSeg, msmem.variant(p, b).tile_mask(m0, n0),
                zero);
    };
    if constexpr (kTransform != 0) {
      logits_pass1<kTransform>(s, tSc0_rc, cb, lse_st, scale_log2, kCap ? lsmem().qk_mul : 0.f, alibi());
      if constexpr (!kCap) logit_masks([&](int r, int c) { s(r, c) = 0.f; });
      // The tanh pass before the dP^T wait, under the wgmma: ptxas moves
      // register-only math freely across wgmma.wait_group, and scheduled it
      // after the wait (beside the exponentials). A branch that stores the
      // sum of every t to shared memory, never taken (cap_log2 > 0), holds
      // the pass before it (ptxas: 12 B more spill at d128, loop-invariant
      // reloads only).
      if constexpr (kCap) {
        if constexpr (Traits::kTanhFirst) {
          if (lsmem().cap_log2 == 0.f) {
            float sum = 0.f;
#pragma unroll
            for (int i = 0; i < size(acc_s); ++i) sum += acc_s(i);
            lsmem().qk_mul = sum;
          }
        }
      }
    } else if constexpr (kMasks) {
      const int flags = msmem.ring[step & 3][1];
      const bool mask = flags & kTileMask;
      masked_probs_t(s, tSc_rc, tSc0_rc, lse_st, msmem.qseg[st], msmem.kseg, scale_log2, mask,
                     mask && (flags & kTileSeg), [&]() { return msmem.variant(p, b).tile_mask(m0, n0); });
    } else {
      const bool mask = (p.causal && m0 < n0 + N - 1) || n0 + N > Sk || m0 + M > Sq;
#pragma unroll
      for (int c = 0; c < size<1>(s); ++c) {
        const int qc = get<1>(tSc_rc(0, c));
        const float l2 = bwd::lse_to_log2(lse_st[qc]);
#pragma unroll
        for (int r = 0; r < size<0>(s); ++r) {
          float pv = exp2f(s(r, c) * scale_log2 - l2);
          if (mask) {
            const int key = n0 + get<0>(tSc_rc(r, c)), query = m0 + qc;
            const bool keep = key < Sk && query < Sq && (!p.causal || key <= query);
            pv = keep ? pv : 0.f;
          }
          s(r, c) = pv;
        }
      }
    }
    // At 128 query rows the bf16 P^T is made only after dS^T, so that the
    // fp32 P^T, dP^T, dK and dV are the most ever live (255 registers).
    // (kLogits: soft-cap's P^T exists only after dP^T; ALiBi alone spilled
    // with the early conversion, and ptxas serialised the wgmmas: C7519.)
    constexpr bool kConvertPLate = (M > 64 && !Traits::kEarlyDv) || kLogits != 0;
    using FragP = decltype(fwd::convert_regs<Element>(acc_s));
    FragP rP;
    if constexpr (!kConvertPLate) rP = fwd::convert_regs<Element>(acc_s);
    Tensor tdVrP = make_tensor(rP.data(), fwd::PAsALayout<M>{});
    if constexpr (Traits::kEarlyDv) {
      fwd::wgmma_issue<false, true>(mma_dkv, tdVrP, tdVrdOt(_, _, _, st), acc_dv);
      warpgroup_wait<1>();  // dP^T (batches retire in order; dV may still run)
    } else {
      warpgroup_wait<0>();
    }
    warpgroup_fence_operand(acc_dp);
    Tensor ds = make_tensor(acc_dp.data(), fwd::acc_rowcol_layout(acc_dp.layout()));
    if constexpr (kCap) {
      softcap_pass2<kLogits>(s, ds, tSc0_rc, cb, lse_st, dsum_st, lsmem().cap_log2, alibi());
      logit_masks([&](int r, int c) {
        s(r, c) = 0.f;
        ds(r, c) = 0.f;
      });
    } else if constexpr (kDropout) {
      // dS^T = P^T (keep dP^T / (1 - rate) - D); dV takes the dropped P^T.
      constexpr int C = decltype(size<1>(ds))::value;
      const float ks = lsmem().keep_scale;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float dd = dsum_st[get<1>(tSc_rc(0, c))];
#pragma unroll
        for (int r = 0; r < size<0>(ds); ++r) {
          const bool keep = keep_bits(r, c);
          ds(r, c) = s(r, c) * ((keep ? ds(r, c) * ks : 0.f) - dd);
          s(r, c) = keep ? s(r, c) * ks : 0.f;
        }
      }
    } else {
#pragma unroll
      for (int c = 0; c < size<1>(ds); ++c) {
        const float dd = dsum_st[get<1>(tSc_rc(0, c))];
#pragma unroll
        for (int r = 0; r < size<0>(ds); ++r) ds(r, c) = s(r, c) * (ds(r, c) - dd);
      }
    }
    if constexpr (kConvertPLate) rP = fwd::convert_regs<Element>(acc_s);

    // dV += P^T dO, dK += dS^T Q (RS); dS^T also to smem for dQ.
    if constexpr (!Traits::kEarlyDv) fwd::wgmma_issue<false, true>(mma_dkv, tdVrP, tdVrdOt(_, _, _, st), acc_dv);
    Tensor rdS = fwd::convert_regs<Element>(acc_dp);
    Tensor tdKrdS = make_tensor(rdS.data(), fwd::PAsALayout<M>{});
    fwd::wgmma_issue<false, true>(mma_dkv, tdKrdS, tdKrQt(_, _, _, st), acc_dk);
    cute::copy(r2s, r2s_thr.retile_S(rdS), tdSsdS);
    cutlass::arch::fence_view_async_shared();
    // The previous step's dQ reduce has read the staging tile before anyone
    // overwrites it below (deterministic mode: has completed, so it can be
    // counted).
    if constexpr (Traits::kDqBulk) {
      if (tid < M) {
        if (dq_order) {
          bulk_wait_all();
          fence_async_global();
        } else {
          bulk_wait_read();
        }
      }
    }
    __syncthreads();  // both warpgroups' dS^T rows are in smem
    if constexpr (Traits::kDqBulk) {
      if (dq_order) count_done();
    }

    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<M>, Int<D>>{});
    fwd::wgmma_issue<true, false>(mma_dq, tdQrdS, tdQrKt, acc_dq);
    if constexpr (kMasks && kLogits == 0) {
      // Masks-only kernels search under the dQ wgmma: only thread 0 writes
      // the ring, so one warp searches (the other warps skip its ~85
      // instructions a step), and here, where every warp waits on the tensor
      // cores, rather than before the dS^T barrier, where the others waited
      // for it (ncu: barrier stalls +38%).
      if (tid < 32) {
        int f = 0;
        const int it_nn = next_it(msmem.ring[(step + 1) & 3][0], f);
        if (tid == 0) {
          msmem.ring[(step + 2) & 3][0] = it_nn;
          msmem.ring[(step + 2) & 3][1] = f;
        }
      }
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_dv);
    warpgroup_fence_operand(acc_dk);
    warpgroup_fence_operand(acc_dq);

    // dQ (unscaled) into the fp32 accumulator [b, h, row, D].
    if constexpr (Traits::kDqBulk) {
#pragma unroll
      for (int i = 0; i < size(acc_dq); i += 2) {
        const int r = get<0>(tdQc(i)), c = get<1>(tdQc(i));
        *reinterpret_cast<float2*>(&smem.dq[r * Traits::kDqRow + c]) = make_float2(acc_dq(i), acc_dq(i + 1));
      }
      cutlass::arch::fence_view_async_shared();  // st.shared -> bulk copy reads
      dq_h = h;
      dq_m0 = m0;
    } else {
      float* base = dq_accum + ((int64_t(b) * p.heads_q + h) * Sq + m0) * D;
#pragma unroll
      for (int i = 0; i < size(acc_dq); i += 2) {
        const int r = get<0>(tdQc(i)), c = get<1>(tdQc(i));
        if (m0 + r < Sq)
          atomicAdd(reinterpret_cast<float2*>(base + int64_t(r) * D + c), make_float2(acc_dq(i), acc_dq(i + 1)));
      }
    }
    if constexpr (kMasks) {
      it = msmem.ring[(step + 1) & 3][0];
      ++step;
    } else {
      ++it;
    }
  }
  cp_async_wait<0>();  // nothing in flight at exit (no iterations: K, V)
  if constexpr (Traits::kDqBulk) {
    if (dq_order && tid == 0) wait_turn();
    __syncthreads();  // the last staged tile is complete
    dq_flush();
    if (tid < M) {
      bulk_wait_all();
      if (dq_order) fence_async_global();
    }
    if (dq_order) {
      in_flight = dq_h >= 0 ? order_counter(dq_h, dq_m0) : nullptr;
      __syncthreads();
      count_done();
    }
  }

  store_dkdv<Element, D>(acc_dk, acc_dv, tKVc, p, b, hkv, n0, Sk - n0, pair_ok);
#else
#if defined(__CUDA_ARCH__)
  __trap();  // not built for sm_90a: the host never launches this
#endif
#endif
}

}  // namespace jax_flash::cuda::bwd90
