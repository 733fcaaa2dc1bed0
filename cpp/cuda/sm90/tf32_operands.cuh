// Float32 operands of the TF32 wgmma kernels. TF32 wgmmas read both
// operands K-major and use the top 19 bits of each float as they are
// (truncation), so the operands are rounded to nearest first:
// - the operands a work tile streams (forward: K, V; dQ kernel: K, V, and K
//   as dQ's B; dK / dV kernel: Q, dO, and both as dK's / dV's B): rounded
//   copies, and for the B operand of a product over keys (queries) a rounded
//   copy transposed to (head_dim, rows) with the rows of every group of
//   eight in the accumulator's register order (wgmma.cuh, PAsALayoutTf32);
//   made by tf32_prep_kernel in the call's scratch, once per call;
// - the operands a work tile keeps (forward: Q; dQ kernel: Q, dO): rounded
//   in shared memory by the consumer warpgroup that reads them, once per
//   work tile.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>
#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>

#include "cuda/sm90/pipeline.cuh"  // named_sync
#include "params.h"

namespace jax_flash::cuda::sm90 {

// The TF32 kernels' operands as TMA sees them: float32 (rows, cols, heads,
// batch) with unit column stride; in shared memory, K-major 128 B swizzled.
using Tf32GmemLayout = cute::Layout<cute::Shape<int32_t, int32_t, int32_t, int32_t>,
                                    cute::Stride<int64_t, cute::_1, int64_t, int64_t>>;
using Tf32GmemTensor =
    decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<float const*>(nullptr)), Tf32GmemLayout{}));
using Tf32SmemAtom = cute::GMMA::Layout_K_SW128_Atom<cutlass::tfloat32_t>;

// Rows (keys or queries) of a transposed copy: whole groups of eight (zeros
// past the sequence).
__host__ __device__ inline int tf32_keys_padded(int seqlen_k) { return (seqlen_k + 7) / 8 * 8; }

// Where the copies live in the forward's scratch (bytes from its start):
// the tile counter, then K as [batch, heads_kv, seqlen_k, head_dim], then V^T
// as [batch, heads_kv, head_dim, keys_padded]; each region 256 B aligned.
struct Tf32KvScratch {
  size_t k_offset = 0, vt_offset = 0, bytes = 0;
  explicit Tf32KvScratch(const FwdParams& p) {
    auto up = [](size_t x) { return (x + 255) / 256 * 256; };
    const size_t kv = size_t(p.batch) * size_t(p.heads_kv) * size_t(p.head_dim);
    k_offset = 256;
    vt_offset = k_offset + up(sizeof(float) * kv * size_t(p.seqlen_k));
    bytes = vt_offset + up(sizeof(float) * kv * size_t(tf32_keys_padded(p.seqlen_k)));
  }
};

// The backward kernels' scratch (bytes from its start, past the D rows):
// the dQ kernel's tile counter, then rounded K and V as [batch, heads_kv,
// seqlen_k, head_dim], K^T as [batch, heads_kv, head_dim, keys_padded],
// rounded Q and dO as [batch, heads_q, seqlen_q, head_dim], Q^T and dO^T as
// [batch, heads_q, head_dim, rows_padded]; each region 256 B aligned.
struct Tf32BwdScratch {
  size_t k_offset = 0, v_offset = 0, kt_offset = 0, q_offset = 0, do_offset = 0, qt_offset = 0, dot_offset = 0,
         bytes = 0;
  explicit Tf32BwdScratch(const FwdParams& p) {
    auto up = [](size_t x) { return (x + 255) / 256 * 256; };
    const size_t kv = sizeof(float) * size_t(p.batch) * size_t(p.heads_kv) * size_t(p.head_dim);
    const size_t qo = sizeof(float) * size_t(p.batch) * size_t(p.heads_q) * size_t(p.head_dim);
    k_offset = 256;  // [0, 256): the tile counter
    v_offset = k_offset + up(kv * size_t(p.seqlen_k));
    kt_offset = v_offset + up(kv * size_t(p.seqlen_k));
    q_offset = kt_offset + up(kv * size_t(tf32_keys_padded(p.seqlen_k)));
    do_offset = q_offset + up(qo * size_t(p.seqlen_q));
    qt_offset = do_offset + up(qo * size_t(p.seqlen_q));
    dot_offset = qt_offset + up(qo * size_t(tf32_keys_padded(p.seqlen_q)));
    bytes = dot_offset + up(qo * size_t(tf32_keys_padded(p.seqlen_q)));
  }
};

__device__ __forceinline__ float round_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
}

// Two row-major float32 operands x, y ([batch, rows, heads, head_dim] with
// element strides, rows 16 B aligned) and the copies to make of each, any of
// them absent (nullptr): rounded, [batch, heads, rows, head_dim] contiguous;
// rounded and transposed, [batch, heads, head_dim, rows_padded] with the
// rows of every group of eight in P's register order (position 8a + i holds
// row 8a + (i < 4 ? 2i : 2(i - 4) + 1); zeros past `rows`).
struct Tf32Operand {
  const float* src = nullptr;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
  float* rounded = nullptr;
  float* transposed = nullptr;
};
struct Tf32PrepArgs {
  Tf32Operand x, y;
  int rows = 0, heads = 0, head_dim = 0;
  // (optional) D = rowsum(y * o) of every row into dsum ([batch, heads,
  // rows]): the backward's dO pass makes D too, reading O beside dO.
  const float* o = nullptr;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  float* dsum = nullptr;
};

// One CTA per 32 rows of one (batch, head); head_dim % 4 == 0 and
// head_dim <= kMaxDim.
inline constexpr int kPrepKeys = 32, kPrepThreads = 256;

template <int kMaxDim>
__global__ void __launch_bounds__(kPrepThreads) tf32_prep_kernel(const Tf32PrepArgs a) {
  __shared__ float tile[2][kPrepKeys][kMaxDim + 1];
  __shared__ float dot_part[kPrepKeys][kMaxDim / 4];  // (a.dsum) y . o per 4-column chunk
  const int row0 = blockIdx.x * kPrepKeys, h = blockIdx.y, b = blockIdx.z, hd = a.head_dim;
  const int rows_pad = tf32_keys_padded(a.rows);
  const int64_t bh = int64_t(b) * a.heads + h;
  const int chunks = hd / 4;
  const Tf32Operand* ops[2] = {&a.x, &a.y};
  // Every load of the tile is issued before any store (a thread's chunks
  // sit kPrepThreads apart): one load in flight a thread had held the
  // passes to ~75% of DRAM bandwidth.
  constexpr int kIters = (kPrepKeys * kMaxDim / 4 + kPrepThreads - 1) / kPrepThreads;
  float4 in[2][kIters], ov[kIters];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = threadIdx.x + it * kPrepThreads, r = i / chunks, c = (i % chunks) * 4, row = row0 + r;
    const bool live = i < kPrepKeys * chunks && row < a.rows;
#pragma unroll
    for (int o = 0; o < 2; ++o) {
      const Tf32Operand& op = *ops[o];
      in[o][it] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (live && op.src != nullptr)
        in[o][it] = __ldg(reinterpret_cast<const float4*>(op.src + b * op.batch_stride + h * op.head_stride +
                                                          row * op.row_stride + c));
    }
    ov[it] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (live && a.dsum != nullptr && a.y.src != nullptr)
      ov[it] = __ldg(reinterpret_cast<const float4*>(a.o + b * a.o_batch_stride + h * a.o_head_stride +
                                                     row * a.o_row_stride + c));
  }
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = threadIdx.x + it * kPrepThreads, r = i / chunks, c = (i % chunks) * 4, row = row0 + r;
    if (i >= kPrepKeys * chunks) continue;
#pragma unroll
    for (int o = 0; o < 2; ++o) {
      const Tf32Operand& op = *ops[o];
      if (op.src == nullptr) continue;
      float4 x = in[o][it];
      if (row < a.rows) {
        if (o == 1 && a.dsum != nullptr) {
          const float4 y = ov[it];
          dot_part[r][c / 4] = x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
        }
        x = make_float4(round_tf32(x.x), round_tf32(x.y), round_tf32(x.z), round_tf32(x.w));
        if (op.rounded) *reinterpret_cast<float4*>(op.rounded + (bh * a.rows + row) * hd + c) = x;
      }
      if (op.transposed) {
        tile[o][r][c] = x.x;
        tile[o][r][c + 1] = x.y;
        tile[o][r][c + 2] = x.z;
        tile[o][r][c + 3] = x.w;
      }
    }
  }
  __syncthreads();
  // D: each row's chunks summed in a fixed order (reproducible).
  if (a.dsum != nullptr && threadIdx.x < kPrepKeys && row0 + int(threadIdx.x) < a.rows) {
    float d = 0.f;
    for (int j = 0; j < chunks; ++j) d += dot_part[threadIdx.x][j];
    a.dsum[bh * a.rows + row0 + threadIdx.x] = d;
  }
#pragma unroll
  for (int o = 0; o < 2; ++o) {
    float* out = ops[o]->transposed;
    if (ops[o]->src == nullptr || out == nullptr) continue;
    out += bh * hd * rows_pad;
    for (int i = threadIdx.x; i < kPrepKeys * hd; i += kPrepThreads) {
      const int d = i / kPrepKeys, j = i % kPrepKeys;
      if (row0 + j >= rows_pad) continue;
      const int q = j & 7;
      out[int64_t(d) * rows_pad + row0 + j] = tile[o][(j & ~7) + (q < 4 ? 2 * q : 2 * (q - 4) + 1)][d];
    }
  }
}

template <int kMaxDim>
cudaError_t launch_tf32_prep(const Tf32PrepArgs& a, int batch, cudaStream_t stream) {
  const dim3 grid((tf32_keys_padded(a.rows) + kPrepKeys - 1) / kPrepKeys, a.heads, batch);
  tf32_prep_kernel<kMaxDim><<<grid, kPrepThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

// Round this warpgroup's 64 rows of a (128, D) shared-memory tile to TF32
// in place (the caller fences and syncs the warpgroup). The 128 B swizzle
// moves 16 B chunks: four columns stay together.
template <class Layout, class E>
__device__ __forceinline__ void round_rows_tf32(E* base, int wg, int wtid) {
  using namespace cute;
  constexpr int D = decltype(size<1>(Layout{}))::value, kChunks = 64 * D / 4;
  Tensor t = make_tensor(make_smem_ptr(base), Layout{});
#pragma unroll 4
  for (int i = wtid; i < kChunks; i += 128) {
    float4* ptr = reinterpret_cast<float4*>(&t(64 * wg + i / (D / 4), (i % (D / 4)) * 4));
    const float4 x = *ptr;
    *ptr = make_float4(round_tf32(x.x), round_tf32(x.y), round_tf32(x.z), round_tf32(x.w));
  }
}

// Round this warpgroup's rows of the forward's Q tile, then make the writes
// visible to its wgmmas (async proxy) and wait for the warpgroup. Named
// barrier 1 + warpgroups + wg (the shared-memory O epilogue's, which the
// TF32 kernel does not use).
template <class Cfg>
__device__ __forceinline__ void round_q_tf32(typename Cfg::SharedStorage& ss, int wg, int wtid) {
  round_rows_tf32<typename Cfg::SmemLayoutQ>(ss.q.data(), wg, wtid);
  cutlass::arch::fence_view_async_shared();
  named_sync(1 + Cfg::kConsumerWarpgroups + wg, 128);
}

}  // namespace jax_flash::cuda::sm90
