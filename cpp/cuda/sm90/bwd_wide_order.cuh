// The dQ order keeper of the wide-head Hopper backward in deterministic
// mode: warp 1 of warpgroup 0. The consumers add dQ from registers
// (bwd_wide_mainloop.cuh); the CTAs adding into one dQ tile must do so in
// a fixed order (BwdWork::dq_rank). Per step this warp waits until the
// tile's counter shows every CTA ranked before its own, lets the consumers
// add (kBarWideDqGo), waits for their adds (kBarWideDqDone) and counts
// them. (Done by the consumers themselves, each warp's spin on the counter
// and the wait for its adds to land before the release measured 5-12%
// slower than the two-kernel order it replaces; here neither is on them.)
// (kMasks) The CTA walks its band's query tiles and ranks by masks_dq_rank,
// as the d64 / d128 writers do. Without segment ids no step of the band is
// skipped (bwd_step_flags); with them (kSegOrder) a skipped step takes its
// turn, adding nothing, or with sorted ids (masks_dq_rank_sorted) none
// (`seg`: SegOrder, bwd_masks_setup).
#pragma once

#include <climits>
#include <cstdint>

#include "cuda/sm90/bulk_ops.cuh"  // wait_count, add_release
#include "cuda/sm90/bwd_masks.cuh"  // bwd_step_flags, kStepSkip, dq_order_rank
#include "cuda/sm90/bwd_params.cuh"
#include "cuda/sm90/bwd_wide_config.cuh"
#include "cuda/sm90/pipeline.cuh"  // named_sync, named_arrive

namespace jax_flash::cuda::sm90 {

template <class Cfg, class Work>
__device__ __forceinline__ void bwd_order_wide_dq(const BwdKernelParams<Cfg>& kp,
                                                  const typename Cfg::SharedStorage& ss,
                                                  const Work& w, int lane, int seg) {
  constexpr int M = Cfg::kBlockM;
  // (kMasks) masks_dq_rank's walk: the highest key tile that visits the
  // last ranked query tile, and that tile.
  int run_last = w.n_block, run_m = INT_MAX;
  auto at = w.cursor();
  for (int step = 0; step < w.steps; ++step, at.advance()) {
    const int m = at.m_block();
    // (kSegOrder) A step the ids skip: the consumers skip it too; with
    // sorted ids it takes no turn, else its turn adds nothing.
    [[maybe_unused]] bool skip = false;
    if constexpr (Cfg::kSegOrder) {
      skip = (bwd_step_flags<M>(kp.p, w.batch, m * M, ss.ms) & kStepSkip) != 0;
      if (skip && seg != kSegBandTurns) continue;
    }
    int* counter = kp.dq_counter(w.batch, at.head, m);
    if (lane == 0) wait_count(counter, dq_order_rank<Cfg>(kp.p, ss.ms, w, m, seg, run_last, run_m));
    __syncwarp();
    if (!skip) {
      named_arrive(kBarWideDqGo, kWideDqBarThreads);
      // The consumers' adds, ordered before their arrival (bar.arrive
      // releases, bar.sync acquires), then one release covering them all.
      named_sync(kBarWideDqDone, kWideDqBarThreads);
    }
    if (lane == 0) add_release(counter, 1);
  }
}

}  // namespace jax_flash::cuda::sm90
