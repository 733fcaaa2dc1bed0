// The dQ writers of the wide-head Hopper backward: warps 1 and 2 of
// warpgroup 0, taking the steps in turn (`parity`). The consumers stage a
// step's two dQ parts in its dO and Q stages (bwd_wide_mainloop.cuh; both
// rings advance every step, so the step's stages are those of its parity);
// the writer adds them to the float32 accumulator with one bulk reduce each
// and, once the copies have read them, arrives on the stages' empty
// barriers (which count it beside the consumer threads; a step the ids skip
// stages nothing, and consumer thread 0 arrives in its place).
// Deterministic mode: the add waits until every CTA ranked before this one
// (dq_order_rank) has counted its own and is counted once complete, as the
// d64 / d128 writers do (bwd_dq.cuh); without masks the rank-0 CTA stores
// its tile, so the accumulator needs no clearing. (Kept by one warp that
// let the consumers add from registers, the order had cost 4-7%.)
// (kMasks) The CTA walks its band's query tiles. A step the ids skip stages
// nothing; with segment ids in deterministic mode (kSegOrder) it still
// takes its turn, adding nothing, unless the ids are sorted
// (masks_dq_rank_sorted; `seg`: SegOrder, bwd_masks_setup).
#pragma once

#include <climits>
#include <cstdint>

#include "cuda/sm90/bulk_ops.cuh"
#include "cuda/sm90/bwd_masks.cuh"  // bwd_step_flags, kStepSkip, dq_order_rank
#include "cuda/sm90/bwd_params.cuh"
#include "cuda/sm90/bwd_wide_config.cuh"
#include "cuda/sm90/pipeline.cuh"

namespace jax_flash::cuda::sm90 {

template <class Cfg, class Work>
__device__ __forceinline__ void bwd_write_wide_dq(const BwdKernelParams<Cfg>& kp, typename Cfg::SharedStorage& ss,
                                                  const Work& w, int lane, int parity, [[maybe_unused]] int seg) {
  constexpr int M = Cfg::kBlockM;
  constexpr int kPartBytes = Cfg::kDqPartFloats * int(sizeof(float));
  static_assert(Cfg::kStages == 2 && Cfg::kDoStages == 2);  // a step's stages: its parity's
  const float* part0 = ss.dq_part(0, parity);
  const float* part1 = ss.dq_part(1, parity);
  // (kMasks, deterministic) masks_dq_rank's walk: the highest key tile that
  // visits the last ranked query tile, and that tile.
  int run_last = w.n_block, run_m = INT_MAX;
  for (int step = parity; step < w.steps; step += 2) {
    const int h = w.head(step), m = w.m_block(step);
    bool skip = false;
    if constexpr (Cfg::kMasks) skip = (bwd_step_flags<M>(kp.p, w.batch, m * M, ss.ms) & kStepSkip) != 0;
    if constexpr (Cfg::kSegOrder) {
      if (skip && seg != kSegBandTurns) continue;  // not a visitor: no turn
    } else {
      if (skip) continue;
    }
    int* counter = kp.dq_order == nullptr ? nullptr : kp.dq_counter(w.batch, h, m);
    bool first = false;
    if (lane == 0 && counter != nullptr) {
      const int rank = dq_order_rank<Cfg>(kp.p, ss.ms, w, m, seg, run_last, run_m);
      first = !Cfg::kMasks && rank == 0;
      wait_turn(counter, rank);
    }
    if (!skip) {
      named_sync(bwd_wide_dq_staged(step), kWideDqBarThreads);
      if (lane == 0) {
        float* dst = kp.dq_tile(w.batch, h, m);
        if (first) {
          bulk_store(dst, part0, kPartBytes);
          bulk_store(dst + Cfg::kDqPartFloats, part1, kPartBytes);
        } else {
          bulk_reduce_add_f32(dst, part0, kPartBytes);
          bulk_reduce_add_f32(dst + Cfg::kDqPartFloats, part1, kPartBytes);
        }
        bulk_commit();
        bulk_wait_read();
        barrier_arrive(ss.do_empty[parity]);  // the staged parts read: the stages are free
        barrier_arrive(ss.empty[parity]);
      }
      __syncwarp();
    }
    if (lane == 0 && counter != nullptr) count_landed(counter);
  }
  if (lane == 0) bulk_wait_all();
}

}  // namespace jax_flash::cuda::sm90
