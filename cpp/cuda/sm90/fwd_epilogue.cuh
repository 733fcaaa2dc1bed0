// Epilogue of the warp-specialised Hopper forward: the normalised O tile of
// one consumer warpgroup, through shared memory and a TMA store (16-bit O,
// store_o_tma) or from registers (TF32's float32 O: column pairs, rows past
// seqlen_q and columns past head_dim dropped), and its rows' LSE.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/common/utils.cuh"
#include "cuda/sm90/fwd_params.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "params.h"

namespace jax_flash::cuda::sm90 {

using namespace cute;

// acc_o: the normalised accumulator; tOc: its (row, col) in the query tile;
// lse: per accumulator row (rows of the rowcol view). Element: O's type in
// global memory (16-bit, or float for the TF32 kernel).
template <class Element, int kRows, class TO, class TC>
__device__ __forceinline__ void store_o_lse(const FwdParams& p, TO const& acc_o, TC const& tOc, const float (&lse)[kRows],
                                            int row0, int head, int batch, bool with_o = true) {
  Tensor rO = fwd::convert_regs<Element>(acc_o);
  Tensor o = make_tensor(rO.data(), fwd::acc_rowcol_layout(rO.layout()));
  Tensor c = make_tensor(tOc.data(), fwd::acc_rowcol_layout(tOc.layout()));
  static_assert(decltype(size<0>(o))::value == kRows);
  Element* o_base = static_cast<Element*>(p.o) + int64_t(batch) * p.o_batch_stride + int64_t(head) * p.o_head_stride;
#pragma unroll
  for (int r = 0; r < kRows && with_o; ++r) {
    const int row = row0 + get<0>(c(r, 0));
    if (row >= p.seqlen_q) continue;
    Element* o_row = o_base + int64_t(row) * p.o_row_stride;
#pragma unroll
    for (int j = 0; j < size<1>(o); j += 2) {  // (j, j + 1): adjacent columns, adjacent registers
      const int col = get<1>(c(r, j));
      if (col >= p.head_dim) continue;
      if constexpr (sizeof(Element) == 4)
        *reinterpret_cast<float2*>(o_row + col) = make_float2(o(r, j), o(r, j + 1));
      else
        *reinterpret_cast<uint32_t*>(o_row + col) = *reinterpret_cast<const uint32_t*>(&o(r, j));
    }
  }
  // Lanes with column 0 own their rows' LSE.
  if (get<1>(c(0, 0)) == 0) {
    float* lse_row = p.lse + (int64_t(batch) * p.heads_q + head) * int64_t(p.seqlen_q);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = row0 + get<0>(c(r, 0));
      if (row < p.seqlen_q) lse_row[row] = lse[r];
    }
  }
}

// Named barriers of the shared O buffer (Cfg::kSmemOShared): id
// kOBufferBarrier + w completes when warpgroup w may write the buffer (after
// ids 1..2 of the ping-pong and 3..4 of store_o_tma's per-warpgroup sync).
inline constexpr int kOBufferBarrier = 5;

// O of one warpgroup (64 rows) through shared memory and one TMA store (rows
// past seqlen_q and columns past head_dim are clipped by the TMA unit). With
// a buffer per warpgroup, its thread 0 waits for the store of the tile before
// to have read the buffer (bulk async-group) only when it is rewritten, so
// the store overlaps the next tile's mainloop. With one buffer for both
// (kSmemOShared, d256) the warpgroups take turns: each waits for the other's
// hand-over (release_o_buffer), as the ping-pong does for the wgmmas.
template <class Cfg, class TO>
__device__ __forceinline__ void store_o_tma(const typename Cfg::TmaO& tma_o, typename Cfg::SharedStorage& ss, const FwdParams& p,
                                            TO const& acc_o, int wg, int m_block, int head, int batch) {
  using Element = typename Cfg::Element;
  using Half = typename Cfg::SmemLayoutOHalf;
  const int wtid = threadIdx.x % 128;
  const int bar = 1 + Cfg::kConsumerWarpgroups + wg;  // after the ping-pong's: this warpgroup alone
  if constexpr (Cfg::kSmemOShared) {
    static_assert(kOBufferBarrier == 1 + 2 * Cfg::kConsumerWarpgroups);
    named_sync(kOBufferBarrier + wg, 256);  // the other warpgroup's store has read the buffer
  } else {
    if (wtid == 0) tma_store_wait<0>();  // this warpgroup's previous store has read its buffer
    named_sync(bar, 128);
  }
  Tensor sO = make_tensor(make_smem_ptr(ss.o.data() + (Cfg::kSmemOShared ? 0 : wg * cosize_v<Half>)), Half{});
  // stmatrix writes four 8x8 blocks an instruction.
  Tensor rO = fwd::convert_regs<Element>(acc_o);
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, typename Cfg::TiledMmaOWarpgroup{});
  auto r2s_thr = r2s.get_thread_slice(wtid);
  cute::copy(r2s, r2s_thr.retile_S(rO), r2s_thr.partition_D(sO));
  cutlass::arch::fence_view_async_shared();  // generic-proxy writes -> the TMA unit's reads
  named_sync(bar, 128);
  if (wtid == 0) {
    Tensor mO = tma_o.get_tma_tensor(gmem_shape(p.seqlen_q, p.head_dim, p.heads_q, p.batch));
    Tensor gO = local_tile(mO(_, _, head, batch), Shape<_64, Int<Cfg::kHeadDim>>{}, make_coord(Cfg::kConsumerWarpgroups * m_block + wg, _0{}));
    auto part = tma_partition(tma_o, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sO), group_modes<0, 2>(gO));
    copy(tma_o, get<1>(part), get<0>(part));
    tma_store_arrive();
  }
}

// (Cfg::kSmemOShared) Hands the O buffer to the other warpgroup once this
// one's store has read it. The first turn is warpgroup 0's (the kernel's
// opening hand-over from warpgroup 1); warpgroup 0 takes the last one at exit.
template <class Cfg>
__device__ __forceinline__ void release_o_buffer(int wg) {
  if constexpr (Cfg::kSmemOShared) {
    if (threadIdx.x % 128 == 0) tma_store_wait<0>();
    named_arrive(kOBufferBarrier + 1 - wg, 256);
  }
}

}  // namespace jax_flash::cuda::sm90
