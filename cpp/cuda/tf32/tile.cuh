// Global float32 rows -> a padded shared-memory tile (tile row stride
// cols + 4, see mma.cuh), rounded to tf32 once in place so that the MMA
// loops read operands as they are. Rows past the sequence end and columns
// past head_dim are zero-filled.
#pragma once

#include <cstdint>

#include "cuda/common/cp_async_zfill.cuh"
#include "cuda/tf32/mma.cuh"

namespace jax_flash::cuda::tf32 {

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// A tile of kRows x kCols floats; kThreads threads share the copies, each
// taking 4-float chunks c = tid, tid + kThreads, ...
template <int kRows, int kCols, int kThreads>
struct Tile {
  static constexpr int kStride = kCols + 4;
  static constexpr int kFloats = kRows * kStride;
  static constexpr int kChunksPerRow = kCols / 4;
  static constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kCols % 32 == 0, "tile widths are multiples of 32 floats");

  // vec: 16 B cp.async (rows 16 B aligned, head_dim % 4 == 0); else plain
  // loads (stored rounded already). Valid rows: < rows; columns: < cols.
  static __device__ __forceinline__ void load(float* s, const float* g, int64_t row_stride, int rows,
                                              int cols, bool vec, int tid) {
    if (vec) {
#pragma unroll 4
      for (int c = tid; c < kChunks; c += kThreads) {
        const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 4;
        const bool valid = r < rows && col < cols;
        cp_async16(s + r * kStride + col, valid ? g + int64_t(r) * row_stride + col : g, valid);
      }
    } else {
      for (int c = tid; c < kChunks; c += kThreads) {
        const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 4;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool valid = r < rows && col + e < cols;
          s[r * kStride + col + e] =
              valid ? __uint_as_float(to_tf32(g[int64_t(r) * row_stride + col + e])) : 0.f;
        }
      }
    }
  }

  // After this thread's copies landed (cp.async.wait): round the chunks it
  // copied itself; a __syncthreads must follow before other threads read.
  static __device__ __forceinline__ void round(float* s, int tid) {
#pragma unroll 4
    for (int c = tid; c < kChunks; c += kThreads) {
      const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 4;
      float4* p = reinterpret_cast<float4*>(s + r * kStride + col);
      float4 v = *p;
      v.x = __uint_as_float(to_tf32(v.x));
      v.y = __uint_as_float(to_tf32(v.y));
      v.z = __uint_as_float(to_tf32(v.z));
      v.w = __uint_as_float(to_tf32(v.w));
      *p = v;
    }
  }
};

}  // namespace jax_flash::cuda::tf32
