// dQ of the warp-specialised Hopper backward. Each step the consumers stage
// their float32 dQ tile in shared memory and one of two writer warps (they
// take the steps in turn) adds the whole tile to the workspace accumulator
// with one bulk reduce copy, off the consumers' path. The tile is stored in
// the order the consumer threads hold it (float4 i of thread t at
// (i * 256 + t) * 4): conflict-free stores, and one contiguous run of the
// accumulator per tile. A convert
// kernel reads it back the same way and writes dq = scale * dQ.
#pragma once

#include <climits>
#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/common/store_acc.cuh"  // store_acc
#include "cuda/sm90/bulk_ops.cuh"
#include "cuda/sm90/bwd_masks.cuh"
#include "cuda/sm90/bwd_params.cuh"
#include "cuda/sm90/pipeline.cuh"

namespace jax_flash::cuda::sm90 {

// Consumer thread ct's dQ accumulator fragment into (or out of) the staged
// order.
template <int kThreads, class Acc>
__device__ __forceinline__ void dq_to_staged(const Acc& acc, float* staged, int ct) {
  static_assert(decltype(size(acc))::value % 4 == 0);
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 4)
    *reinterpret_cast<float4*>(staged + (i / 4 * kThreads + ct) * 4) = make_float4(acc(i), acc(i + 1), acc(i + 2), acc(i + 3));
}
template <int kThreads, class Acc>
__device__ __forceinline__ void dq_from_staged(Acc& acc, const float* staged, int ct) {
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 4) {
    const float4 v = *reinterpret_cast<const float4*>(staged + (i / 4 * kThreads + ct) * 4);
    acc(i) = v.x;
    acc(i + 1) = v.y;
    acc(i + 2) = v.z;
    acc(i + 3) = v.w;
  }
}

// The writer warps (all 32 lanes take the barriers, lane 0 issues): two,
// taking the steps in turn (`parity`: this warp's steps are those of that
// parity), each with its own pair of named barriers (bwd_dq_full /
// bwd_dq_empty of its steps). Per step: wait for the staged tile, reduce it
// into the accumulator, and hand the buffer back once the copy has read it
// (not after the last step: the consumers wait for every hand-back but the
// first buffer's).
// Deterministic mode: the add waits until every CTA ranked before this one
// (BwdWork::dq_rank) has counted its own, and is counted once complete, so
// the float32 sums run in one order whatever the timing. Without masks
// every query tile has a rank-0 CTA, which stores its tile instead of
// adding it, so the accumulator needs no clearing first (launch_bwd_ws).
// The wait for completion before the count is why there are two writers:
// one warp alone could not take the next tile before the last add had
// landed, and its wait, poll and add then set the pace of every step.
// BwdConfig::kSegOrder (deterministic, segment ids): the CTA walks the
// band's query tiles, and a step the ids skip still takes its turn in the
// tile's order (masks_dq_rank counts every CTA of the band), adding nothing;
// unless the batch's ids are sorted (`seg`: SegOrder, bwd_masks_setup), when
// the rank counts the visiting CTAs alone (masks_dq_rank_sorted) and a
// skipped step takes no turn. That kernel finds its rank before the tile is
// staged, the others after (their instruction streams stay as measured).
template <class Cfg, class Work>
__device__ __forceinline__ void bwd_write_dq(const BwdKernelParams<Cfg>& kp, typename Cfg::SharedStorage& ss,
                                             const Work& w, int lane, int parity, int seg) {
  constexpr int M = Cfg::kBlockM;
  const int bar_full = bwd_dq_full(parity), bar_empty = bwd_dq_empty(parity);
  // (kMasks, deterministic) masks_dq_rank's walk: the highest key tile that
  // visits the last ranked query tile, and that tile.
  int run_last = w.n_block, run_m = INT_MAX;
  for (int step = parity; step < w.steps; step += 2) {
    const int h = w.head(step), m = w.m_block(step);
    // (kMasks) A step the producer skipped (bwd_masks.cuh) stages nothing;
    // the writer works that out as the producer did, and the consumers
    // still take the handshake.
    bool skip = false;
    if constexpr (Cfg::kMasks) skip = (bwd_step_flags<M>(kp.p, w.batch, m * M, ss.ms) & kStepSkip) != 0;
    [[maybe_unused]] int turn = 0;
    if constexpr (Cfg::kSegOrder) {
      // The rank is found while the consumers still make the tile: the
      // sorted walk reads the ids' ranges from global memory, a latency the
      // chain of adds would otherwise pay at every link.
      if (lane == 0 && kp.dq_order != nullptr && !(skip && seg != kSegBandTurns))
        turn = dq_order_rank<Cfg>(kp.p, ss.ms, w, m, seg, run_last, run_m);
    }
    named_sync(bar_full, kDqBarThreads);
    if (skip) {
      if (step + 1 < w.steps) named_arrive(bar_empty, kDqBarThreads);
      if constexpr (!Cfg::kSegOrder) {
        continue;
      } else if (seg != kSegBandTurns) {
        continue;  // not a visitor: no turn
      }
    }
    int* counter = kp.dq_order == nullptr ? nullptr : kp.dq_counter(w.batch, h, m);
    if (lane == 0) {
      bool first = false;
      if (counter != nullptr) {
        int rank;
        if constexpr (Cfg::kSegOrder)
          rank = turn;  // (found above)
        else
          rank = dq_order_rank<Cfg>(kp.p, ss.ms, w, m, seg, run_last, run_m);
        first = !Cfg::kMasks && rank == 0;
        wait_turn(counter, rank);
      }
      if (!skip) {
        float* dst = kp.dq_tile(w.batch, h, m);
        if (first)
          bulk_store(dst, ss.dq.data(), Cfg::kDqFloats * int(sizeof(float)));
        else
          bulk_reduce_add_f32(dst, ss.dq.data(), Cfg::kDqFloats * int(sizeof(float)));
        bulk_commit();
        bulk_wait_read();
      }
    }
    __syncwarp();
    if (!skip && step + 1 < w.steps) named_arrive(bar_empty, kDqBarThreads);
    if (lane == 0 && counter != nullptr) count_landed(counter);
  }
  if (lane == 0) bulk_wait_all();
}

// dq = scale * accumulator: one CTA of 256 threads per (query tile, q head,
// batch), thread t reading what consumer thread t staged, a part (of
// D / kDqParts columns: the wide kernel adds its tiles in two) at a time.
// vec_ok (dq rows 16-byte aligned): the part goes through a row-major
// shared tile and leaves in 16-byte stores, two whole rows a warp. (Stored
// straight from the accumulator layout, 4-byte pairs over 8 rows an
// instruction, it had run at ~60% of DRAM bandwidth: ncu, d128 1k.)
// Columns past head_dim (a head dim zero-padded on this kernel) are dropped.
template <class Cfg>
__global__ void __launch_bounds__(256) bwd_dq_convert_kernel(const BwdParams p, const float* __restrict__ dq_accum,
                                                             int rows_pad, bool pair_ok, bool vec_ok) {
  using Element = typename Cfg::Element;
  constexpr int M = Cfg::kBlockM, D = Cfg::kHeadDim, kCols = D / Cfg::kDqParts;
  // Rows padded by 16 bytes: the pair stores of a warp (8 rows x 4 lanes)
  // and the vector loads fall in distinct banks.
  constexpr int kStride = kCols + 8, kRowChunks = kCols / 8;
  __shared__ alignas(16) Element tile[M * kStride];
  const int ct = threadIdx.x;
  const int m0 = blockIdx.x * M, h = blockIdx.y, b = blockIdx.z;
  typename Cfg::TiledMmadQ mma_dq;
  auto thr = mma_dq.get_thread_slice(ct);
  Tensor coords = thr.partition_C(make_identity_tensor(Shape<Int<M>, Int<kCols>>{}));
  const int64_t row = (int64_t(b) * p.heads_q + h) * rows_pad + m0;
  const int rows = p.seqlen_q - m0;
  Element* dq = static_cast<Element*>(p.dq) + b * p.dq_batch_stride + int64_t(m0) * p.dq_row_stride + h * p.dq_head_stride;
  CUTE_UNROLL
  for (int part = 0; part < Cfg::kDqParts; ++part) {
    const int cols = p.head_dim - part * kCols;  // of this part's kCols (uniform: no barrier skipped)
    if (cols <= 0) break;
    Tensor acc = partition_fragment_C(mma_dq, Shape<Int<M>, Int<kCols>>{});
    dq_from_staged<256>(acc, dq_accum + row * D + part * Cfg::kDqPartFloats, ct);
    if (!vec_ok) {
      bwd::store_acc(acc, coords, dq + part * kCols, p.dq_row_stride, rows, cols, p.scale, pair_ok);
      continue;
    }
    if (part > 0) __syncthreads();  // the previous part's tile has been read
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2)
      *reinterpret_cast<uint32_t*>(tile + get<0>(coords(i)) * kStride + get<1>(coords(i))) =
          bwd::pack2<Element>(acc(i) * p.scale, acc(i + 1) * p.scale);
    __syncthreads();
    CUTE_UNROLL
    for (int idx = ct; idx < M * kRowChunks; idx += 256) {
      const int r = idx / kRowChunks, c = (idx % kRowChunks) * 8;
      if (r < rows && c < cols)  // (vec_ok: head_dim is whole 8-element chunks)
        *reinterpret_cast<uint4*>(dq + int64_t(r) * p.dq_row_stride + part * kCols + c) =
            *reinterpret_cast<const uint4*>(tile + r * kStride + c);
    }
  }
}

}  // namespace jax_flash::cuda::sm90
