// Epilogue of the warp-specialised Hopper forward: the normalised O tile of
// one consumer warpgroup, written from registers (column pairs, rows past
// seqlen_q and columns past head_dim dropped), and its rows' LSE.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/common/utils.cuh"
#include "cuda/sm90/fwd_params.cuh"
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

// O of one warpgroup (64 rows) through its half of the O buffer and one TMA
// store (rows past seqlen_q and columns past head_dim are clipped by the
// TMA unit). The warpgroup's thread 0 issues the store and, before the
// buffer is rewritten for the next tile, waits for the store to have read it
// (bulk async-group), so the store overlaps the next tile's mainloop.
template <class Cfg, class TO, class TC>
__device__ __forceinline__ void store_o_tma(const typename Cfg::TmaO& tma_o, typename Cfg::SharedStorage& ss, const FwdParams& p,
                                            TO const& acc_o, TC const& tOc, int wg, int m_block, int head, int batch) {
  using Element = typename Cfg::Element;
  const int wtid = threadIdx.x % 128;
  const int bar = 1 + Cfg::kConsumerWarpgroups + wg;  // after the ping-pong's: this warpgroup alone
  if (wtid == 0) tma_store_wait<0>();  // the previous tile's store has read the buffer
  asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory");
  // Both halves as one (BM, D) tensor for the accumulator's partition;
  // stmatrix writes four 8x8 blocks an instruction.
  Tensor sO_tile = make_tensor(make_smem_ptr(ss.o.data()),
                               tile_to_shape(typename Cfg::SmemLayoutOHalf{}, Shape<Int<Cfg::kBlockM>, Int<Cfg::kHeadDim>>{}));
  Tensor rO = fwd::convert_regs<Element>(acc_o);
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, typename Cfg::TiledMmaO{});
  auto r2s_thr = r2s.get_thread_slice(threadIdx.x - 128);
  cute::copy(r2s, r2s_thr.retile_S(rO), r2s_thr.partition_D(sO_tile));
  Tensor sO = make_tensor(make_smem_ptr(ss.o.data() + wg * cosize_v<typename Cfg::SmemLayoutOHalf>),
                          typename Cfg::SmemLayoutOHalf{});
  cutlass::arch::fence_view_async_shared();  // generic-proxy writes -> the TMA unit's reads
  asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory");
  if (wtid == 0) {
    Tensor mO = tma_o.get_tma_tensor(gmem_shape(p.seqlen_q, p.head_dim, p.heads_q, p.batch));
    Tensor gO = local_tile(mO(_, _, head, batch), Shape<_64, Int<Cfg::kHeadDim>>{}, make_coord(Cfg::kConsumerWarpgroups * m_block + wg, _0{}));
    auto part = tma_partition(tma_o, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sO), group_modes<0, 2>(gO));
    copy(tma_o, get<1>(part), get<0>(part));
    tma_store_arrive();
  }
}

}  // namespace jax_flash::cuda::sm90
