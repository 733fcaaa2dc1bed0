// The backward's row passes, shared by the SM80 (sm80/) and Hopper (sm90/)
// backwards: D = rowsum(dO * O) before the main kernel (clearing the fp32
// dQ accumulator on the way), dq = scale * accumulator after it, and their
// launchers; also the LSE in log2 units that every main kernel reads.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "params.h"

namespace jax_flash::cuda::bwd {

constexpr float kLog2e = 1.4426950408889634f;

// The LSE in log2 units; a row that saw no key (lse -inf) gets +inf, so its
// P = exp2(s - lse2) is 0.
__device__ __forceinline__ float lse_to_log2(float l) {
  return l == -INFINITY ? INFINITY : l * kLog2e;
}

// The CUTLASS element type of a 16-bit dtype.
template <DType kDType>
using ElementOf =
    std::conditional_t<kDType == DType::kFloat16, cutlass::half_t, cutlass::bfloat16_t>;

// Row r of the flattened (batch, head, query) rows as (batch, head, query).
struct RowIndex {
  int b, h, i;
};
__device__ __forceinline__ RowIndex split_row(const BwdParams& p, int64_t r) {
  const int64_t bh = r / p.seqlen_q;
  return {int(bh / p.heads_q), int(bh % p.heads_q), int(r % p.seqlen_q)};
}

// Flat buffers cleared by the whole grid, 16 bytes a store: the Hopper
// kernels' padded, tile-staged dQ accumulator and their deterministic-mode
// counters, cleared here instead of by memsets of their own (one pass over
// memory and two launches fewer before the main kernel).
struct FlatClear {
  float4* ptr[2] = {nullptr, nullptr};
  int64_t count[2] = {0, 0};  // float4s
  __device__ __forceinline__ void run() const {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    CUTE_UNROLL
    for (int b = 0; b < 2; ++b)
      for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < count[b]; k += stride)
        ptr[b][k] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
};

// ---------------------------------------------------------------------------
// One warp per (batch, head, query row).
template <class Element>
__global__ void __launch_bounds__(256)
bwd_preprocess_kernel(const BwdParams p, float* __restrict__ dsum, float* __restrict__ dq_accum,
                      int accum_dim, FlatClear clear) {
  const int lane = threadIdx.x % 32;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t nwarps = int64_t(gridDim.x) * blockDim.x / 32;
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  const Element* o = static_cast<const Element*>(p.o);
  const Element* dout = static_cast<const Element*>(p.dout);
  for (int64_t r = warp; r < rows; r += nwarps) {
    const auto [b, h, i] = split_row(p, r);
    const Element* orow = o + b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride;
    const Element* drow = dout + b * p.do_batch_stride + i * p.do_row_stride + h * p.do_head_stride;
    float acc = 0.f;
    for (int e = lane; e < p.head_dim; e += 32) acc += float(orow[e]) * float(drow[e]);
    CUTE_UNROLL
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) dsum[r] = acc;
    if (dq_accum != nullptr) {
      float4* row = reinterpret_cast<float4*>(dq_accum + r * accum_dim);
      for (int e = lane; e < accum_dim / 4; e += 32) row[e] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  clear.run();
}

// One warp per (batch, head, query row): dq = scale * accumulator.
template <class Element>
__global__ void __launch_bounds__(256)
bwd_dq_convert_kernel(const BwdParams p, const float* __restrict__ dq_accum, int accum_dim) {
  const int lane = threadIdx.x % 32;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t nwarps = int64_t(gridDim.x) * blockDim.x / 32;
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  Element* dq = static_cast<Element*>(p.dq);
  for (int64_t r = warp; r < rows; r += nwarps) {
    const auto [b, h, i] = split_row(p, r);
    Element* out = dq + b * p.dq_batch_stride + i * p.dq_row_stride + h * p.dq_head_stride;
    const float* in = dq_accum + r * accum_dim;
    for (int e = lane; e < p.head_dim; e += 32) out[e] = Element(in[e] * p.scale);
  }
}

// The same two with 16-byte accesses, for head dims that are a multiple of 8
// and 16-byte aligned rows (what JAX passes): 8 lanes per row, 8 elements a
// lane per step, 4 rows per warp. One warp per row with 2-byte loads keeps
// too few bytes in flight to use HBM's bandwidth; at d64 1k these two kernels
// are a visible part of the backward.
constexpr int kRowLanes = 8;
constexpr int kRowVec = 8;  // elements per 16-byte access (16-bit dtypes)

// 8-lane row groups in the whole grid: the grid-stride step, in rows.
__device__ __forceinline__ int64_t vec_row_groups() {
  return int64_t(gridDim.x) * blockDim.x / kRowLanes;
}

template <class Element>
__global__ void __launch_bounds__(256)
bwd_preprocess_vec_kernel(const BwdParams p, float* __restrict__ dsum, float* __restrict__ dq_accum,
                          int accum_dim, FlatClear clear) {
  static_assert(sizeof(Element) * kRowVec == 16);
  const int sub = threadIdx.x % kRowLanes;
  const int64_t group = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kRowLanes;
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  const int64_t groups = vec_row_groups();
  const int64_t first_of_warp = group - (threadIdx.x % 32) / kRowLanes;
  const Element* o = static_cast<const Element*>(p.o);
  const Element* dout = static_cast<const Element*>(p.dout);
  // The loop runs on the warp's first row, so all 32 lanes reach the shuffles.
  for (int64_t base = first_of_warp; base < rows; base += groups) {
    const int64_t r = base + (group - first_of_warp);
    const bool active = r < rows;
    float acc = 0.f;
    if (active) {
      const auto [b, h, i] = split_row(p, r);
      const Element* orow = o + b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride;
      const Element* drow = dout + b * p.do_batch_stride + i * p.do_row_stride + h * p.do_head_stride;
      for (int e = sub * kRowVec; e < p.head_dim; e += kRowLanes * kRowVec) {
        const uint4 ov = *reinterpret_cast<const uint4*>(orow + e);
        const uint4 dv = *reinterpret_cast<const uint4*>(drow + e);
        const Element* oe = reinterpret_cast<const Element*>(&ov);
        const Element* de = reinterpret_cast<const Element*>(&dv);
        CUTE_UNROLL
        for (int j = 0; j < kRowVec; ++j) acc += float(oe[j]) * float(de[j]);
      }
    }
    CUTE_UNROLL
    for (int off = kRowLanes / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (!active) continue;
    if (sub == 0) dsum[r] = acc;
    if (dq_accum != nullptr) {
      float4* row = reinterpret_cast<float4*>(dq_accum + r * accum_dim);
      for (int e = sub; e < accum_dim / 4; e += kRowLanes) row[e] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  clear.run();
}

template <class Element>
__global__ void __launch_bounds__(256)
bwd_dq_convert_vec_kernel(const BwdParams p, const float* __restrict__ dq_accum, int accum_dim) {
  static_assert(sizeof(Element) * kRowVec == 16);
  const int sub = threadIdx.x % kRowLanes;
  const int64_t group = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kRowLanes;
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  Element* dq = static_cast<Element*>(p.dq);
  for (int64_t r = group; r < rows; r += vec_row_groups()) {
    const auto [b, h, i] = split_row(p, r);
    Element* out = dq + b * p.dq_batch_stride + i * p.dq_row_stride + h * p.dq_head_stride;
    const float* in = dq_accum + r * accum_dim;
    for (int e = sub * kRowVec; e < p.head_dim; e += kRowLanes * kRowVec) {
      const float4 lo = *reinterpret_cast<const float4*>(in + e);
      const float4 hi = *reinterpret_cast<const float4*>(in + e + 4);
      const float f[kRowVec] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      uint4 packed;
      Element* pe = reinterpret_cast<Element*>(&packed);
      CUTE_UNROLL
      for (int j = 0; j < kRowVec; ++j) pe[j] = Element(f[j] * p.scale);
      *reinterpret_cast<uint4*>(out + e) = packed;
    }
  }
}

// ---------------------------------------------------------------------------
// Host side.

// Blocks of 256 threads for the row kernels, grid-stride beyond the cap:
// scalar kernels take one warp a row (8 rows a block), the vector ones
// kRowLanes lanes (32 rows a block).
inline int rows_grid(int64_t rows, int rows_per_block = 256 / 32) {
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  return int(blocks < 65536 * 16 ? blocks : 65536 * 16);
}

// Whether 16-byte accesses to a tensor's rows are legal: head dim a multiple
// of 8, base and every stride 16-byte aligned.
inline bool rows_vec_ok(const void* base, int head_dim, int64_t batch_stride, int64_t row_stride,
                        int64_t head_stride) {
  return head_dim % kRowVec == 0 && (reinterpret_cast<uintptr_t>(base) & 15) == 0 &&
         batch_stride % kRowVec == 0 && row_stride % kRowVec == 0 && head_stride % kRowVec == 0;
}

// D = rowsum(dO * O) into dsum; clears accum (accum_dim floats a row) unless
// null, and the flat buffer `clear` (16-byte aligned, a multiple of 16 bytes).
template <class Element>
static void launch_preprocess(const BwdParams& p, float* dsum, float* accum, int accum_dim,
                              cudaStream_t stream, FlatClear clear = {}) {
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  if (rows <= 0) return;
  if (rows_vec_ok(p.o, p.head_dim, p.o_batch_stride, p.o_row_stride, p.o_head_stride) &&
      rows_vec_ok(p.dout, p.head_dim, p.do_batch_stride, p.do_row_stride, p.do_head_stride))
    bwd_preprocess_vec_kernel<Element>
        <<<rows_grid(rows, 256 / kRowLanes), 256, 0, stream>>>(p, dsum, accum, accum_dim, clear);
  else
    bwd_preprocess_kernel<Element><<<rows_grid(rows), 256, 0, stream>>>(p, dsum, accum, accum_dim, clear);
}

// dq = scale * accum.
template <class Element>
static void launch_dq_convert(const BwdParams& p, const float* accum, int accum_dim, cudaStream_t stream) {
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  if (rows <= 0) return;
  if (rows_vec_ok(p.dq, p.head_dim, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride))
    bwd_dq_convert_vec_kernel<Element><<<rows_grid(rows, 256 / kRowLanes), 256, 0, stream>>>(p, accum, accum_dim);
  else
    bwd_dq_convert_kernel<Element><<<rows_grid(rows), 256, 0, stream>>>(p, accum, accum_dim);
}

}  // namespace jax_flash::cuda::bwd
