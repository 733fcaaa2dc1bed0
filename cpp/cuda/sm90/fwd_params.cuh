// Kernel arguments of the warp-specialised Hopper forward: the TMA
// descriptors (passed by value, __grid_constant__), the FFI-level params and
// the scheduler's shape.
#pragma once

#include "cuda/sm90/fwd_config.cuh"
#include "cuda/sm90/tile_scheduler.cuh"
#include "params.h"

namespace jax_flash::cuda::sm90 {

template <class Cfg>
struct FwdKernelParams {
  typename Cfg::TmaQ tma_q;
  typename Cfg::TmaKV tma_k;
  typename Cfg::TmaV tma_v;
  typename Cfg::TmaO tma_o;
  FwdParams p;
  float scale_log2;  // scale * log2(e)
  TileScheduler sched;
};

// The TMA's view of q / k / v / o: (rows, head_dim, heads, batch).
__host__ __device__ inline auto gmem_shape(int rows, int head_dim, int heads, int batch) {
  return make_shape(int32_t(rows), int32_t(head_dim), int32_t(heads), int32_t(batch));
}

}  // namespace jax_flash::cuda::sm90
