// Kernel arguments of the warp-specialised Hopper backward: the TMA
// descriptors (by value, __grid_constant__), the FFI-level params, the
// workspace the pre-pass filled and the launch order.
#pragma once

#include "cuda/bwd_dispatch.h"  // kBwdOrderRows
#include "cuda/sm90/bwd_config.cuh"
#include "cuda/sm90/fwd_params.cuh"  // gmem_shape
#include "params.h"

namespace jax_flash::cuda::sm90 {

template <class Cfg>
struct BwdKernelParams {
  typename Cfg::TmaQ tma_q, tma_do;
  typename Cfg::TmaK tma_k, tma_v;
  BwdParams p;
  // D = rowsum(dO O) per query row [batch, q head, row] (the pre-pass),
  // and the float32 dQ accumulator: rows padded per (batch, q head) to
  // rows_pad, a multiple of the query tile, each tile stored in the order
  // the consumer threads hold it (bwd_dq.cuh).
  const float* dsum;
  float* dq_accum;
  int rows_pad;
  float scale_log2;   // scale * log2(e)
  int order_group;    // causal: tile_order.h's sectioned longest-first; 0 head-major
  // Deterministic mode: one counter per (batch, q head, kBwdOrderRows query
  // rows) of the dQ adds done, at the start of dq's buffer (the convert
  // kernel overwrites them; bwd_dispatch.h), and the query-tile rotation
  // (BwdWork).
  int* dq_order;
  int order_rows;     // counters per (batch, q head)
  int rotate;
  bool pair_ok;       // 4 B stores legal for dk, dv

  // Query tile m_block's rows of the float32 dQ accumulator.
  __device__ __forceinline__ float* dq_tile(int batch, int head, int m_block) const {
    return dq_accum + ((int64_t(batch) * p.heads_q + head) * rows_pad + int64_t(m_block) * Cfg::kBlockM) * Cfg::kHeadDim;
  }
  // (deterministic) The counter of query tile m_block's dQ adds.
  __device__ __forceinline__ int* dq_counter(int batch, int head, int m_block) const {
    return dq_order + (int64_t(batch) * p.heads_q + head) * order_rows + m_block * Cfg::kBlockM / kBwdOrderRows;
  }
};

}  // namespace jax_flash::cuda::sm90
