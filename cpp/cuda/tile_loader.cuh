// Tiles of rows x head_dim into the Hopper kernels' 128 B-swizzled shared
// memory (GMMA K-major layouts): the forward's K / V tiles, the backward's
// Q / dO tiles. One cp.async per 16 B chunk from addresses made once per
// thread: the shared address of the thread's first chunk plus a compile-time
// offset per (chunk, stage), the global one a row step apart. Chunks past
// head_dim (a head dim run on a wider kernel) or, when checked, past the
// last row are zero-filled by the copy's source size (0: nothing read; the
// address is kept inside the matrix anyway: the row's start, or the tile's
// first row). CuTe's copy instead swizzles a
// 64-bit generic address per chunk, and load_tile adds a predicate and a
// zero-fill branch per chunk: ~20 instructions a chunk, a third of the
// forward loop's at d128 (benchmarks/NOTES.md).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

namespace jax_flash::cuda::fwd {

// Element, SmemLayout (rows, head_dim, stages; a GMMA K-major swizzled
// ComposedLayout), the tile's rows, head dim and the CTA's threads. The
// thread -> chunk map is GmemTileCopies::In's: kThreadsPerRow threads of
// 8 elements cover kRowK columns, kRowsPerPass rows a pass.
template <class Element, class SmemLayout, int kRows, int kHeadDim, int kNThreads>
struct TileLoader {
  static constexpr int kRowK = kHeadDim % 128 == 0 ? 128 : (kHeadDim % 64 == 0 ? 64 : 32);
  static constexpr int kThreadsPerRow = kRowK / 8;
  static constexpr int kRowsPerPass = kNThreads / kThreadsPerRow;
  static constexpr int kM = kRows / kRowsPerPass;  // chunks a thread along the rows
  static constexpr int kK = kHeadDim / kRowK;      // and along head_dim
  static_assert(kRows % kRowsPerPass == 0 && kHeadDim % kRowK == 0);

  // Byte offset of element (row, col, stage): the layout's element offset,
  // then its swizzle, which acts on byte addresses (the buffer is aligned to
  // the swizzle's span, so on offsets alike).
  static constexpr int byte_offset(int row, int col, int stage) {
    using Swz = decltype(SmemLayout{}.layout_a());
    return int(Swz{}(int(SmemLayout{}.layout_b()(row, col, stage)) * int(sizeof(Element))));
  }
  // Chunk (m, k, stage) of every thread sits at one distance from the
  // thread's chunk (0, 0, 0): the rows a pass apart keep the swizzle's row
  // bits, the column step its chunk bits, and a stage is a whole tile.
  static constexpr int chunk_offset(int m, int k, int stage) {
    return byte_offset(m * kRowsPerPass, k * kRowK, stage) - byte_offset(0, 0, 0);
  }
  // A sample at compile time (the swizzle's eight row phases, first and last
  // chunk column, last chunk and stage); tests/cuda/tile_loader_check.cu
  // compares every thread's chunks with CuTe's partition.
  static constexpr bool offsets_uniform_sample() {
    for (int r = 0; r < 8; ++r)
      for (int t : {0, kThreadsPerRow - 1})
        if (byte_offset(r + (kM - 1) * kRowsPerPass, 8 * t + (kK - 1) * kRowK, 1) - byte_offset(r, 8 * t, 0) !=
                chunk_offset(kM - 1, kK - 1, 1) ||
            chunk_offset(kM - 1, kK - 1, 1) != chunk_offset(kM - 1, kK - 1, 0) + chunk_offset(0, 0, 1))
          return false;
    return true;
  }
  static_assert(offsets_uniform_sample(), "smem tile layout: chunk offsets depend on the thread");

  uint32_t smem;    // shared address of the thread's chunk (0, 0) of stage 0 in the base buffer
  int row;          // the thread's first row in a tile
  int col;          // its first chunk's column
  uint32_t col_ok;  // bit k: chunk column k lies inside head_dim

  __device__ __forceinline__ TileLoader(const Element* smem_base, int head_dim, int tid) : col_ok(0u) {
    row = tid / kThreadsPerRow;
    col = 8 * (tid % kThreadsPerRow);
    smem = cute::cast_smem_ptr_to_uint(smem_base) + uint32_t(byte_offset(row, col, 0));
#pragma unroll
    for (int k = 0; k < kK; ++k) col_ok |= uint32_t(col + k * kRowK < head_dim) << k;
  }

  // 16 B: 16 read, or 0: zero-filled.
  __device__ __forceinline__ static void cp_async16(uint32_t smem, const void* gmem, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes));
  }

  // Rows [row0, row0 + kRows) of a matrix at gmem (rows `stride` elements
  // apart) into `stage` (0 or 1) of the buffer smem_delta bytes past the
  // base one. kCheckRows: rows at or past row0 + rows are zero-filled (row0
  // itself must exist); otherwise every row must.
  template <bool kCheckRows>
  __device__ __forceinline__ void load(const Element* gmem, int64_t stride, int64_t row0, int stage,
                                       uint32_t smem_delta, int rows = 0) const {
    const Element* g0 = gmem + row0 * stride;  // row 0 of the tile: in the matrix
    const Element* g = g0 + int64_t(row) * stride;
    const uint32_t s = smem + smem_delta + (stage ? uint32_t(chunk_offset(0, 0, 1)) : 0u);
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int k = 0; k < kK; ++k) {
        const bool col_in = (col_ok >> k) & 1u;
        // A column past head_dim reads from its row's start (per thread, not per step).
        const Element* src = g + int64_t(m) * kRowsPerPass * stride + (col_in ? col + k * kRowK : 0);
        bool ok = col_in;
        if constexpr (kCheckRows) {
          ok = ok && row + m * kRowsPerPass < rows;
          src = ok ? src : g0;
        }
        cp_async16(s + uint32_t(chunk_offset(m, k, 0)), src, ok ? 16u : 0u);
      }
    }
  }
};

}  // namespace jax_flash::cuda::fwd
