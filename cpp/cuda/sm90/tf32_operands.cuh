// Float32 operands of the TF32 wgmma forward. TF32 wgmmas read both
// operands K-major and use the top 19 bits of each float as they are
// (truncation), so the operands are rounded to nearest first:
// - K: a rounded copy, and V: a rounded copy transposed to (head_dim, keys)
//   with the keys of every group of eight in P's register order (wgmma.cuh,
//   PAsALayoutTf32); both made by tf32_prep_kv_kernel in the call's scratch,
//   once per call (one read and one write of K and V);
// - Q: rounded in shared memory by the consumer warpgroup that reads it,
//   once per work tile.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "params.h"

namespace jax_flash::cuda::sm90 {

// Keys of the transposed V copy: whole groups of eight (zeros past seqlen_k).
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

__device__ __forceinline__ float round_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
}

// One CTA per 32 keys of one (batch, kv head): K's rows rounded as they are;
// V's through shared memory into V^T rows of 32 permuted keys (position
// 8a + i holds key 8a + (i < 4 ? 2i : 2(i - 4) + 1)). head_dim % 4 == 0 (the
// TMA's 16 B rows) and head_dim <= kMaxDim.
inline constexpr int kPrepKeys = 32, kPrepThreads = 256;

template <int kMaxDim>
__global__ void __launch_bounds__(kPrepThreads) tf32_prep_kv_kernel(const FwdParams p, float* k_out, float* vt_out) {
  __shared__ float sv[kPrepKeys][kMaxDim + 1];
  const int key0 = blockIdx.x * kPrepKeys, h = blockIdx.y, b = blockIdx.z, hd = p.head_dim;
  const int keys_pad = tf32_keys_padded(p.seqlen_k);
  const float* k = static_cast<const float*>(p.k) + b * p.k_batch_stride + h * p.k_head_stride;
  const float* v = static_cast<const float*>(p.v) + b * p.v_batch_stride + h * p.v_head_stride;
  const int64_t bh = int64_t(b) * p.heads_kv + h;
  float* ko = k_out + bh * p.seqlen_k * hd;
  float* vo = vt_out + bh * hd * keys_pad;
  const int chunks = hd / 4;
  for (int i = threadIdx.x; i < kPrepKeys * chunks; i += kPrepThreads) {
    const int r = i / chunks, c = (i % chunks) * 4, key = key0 + r;
    float4 kx = make_float4(0.f, 0.f, 0.f, 0.f), vx = kx;
    if (key < p.seqlen_k) {
      kx = *reinterpret_cast<const float4*>(k + key * p.k_row_stride + c);
      vx = *reinterpret_cast<const float4*>(v + key * p.v_row_stride + c);
      *reinterpret_cast<float4*>(ko + int64_t(key) * hd + c) =
          make_float4(round_tf32(kx.x), round_tf32(kx.y), round_tf32(kx.z), round_tf32(kx.w));
    }
    sv[r][c] = vx.x;
    sv[r][c + 1] = vx.y;
    sv[r][c + 2] = vx.z;
    sv[r][c + 3] = vx.w;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kPrepKeys * hd; i += kPrepThreads) {
    const int d = i / kPrepKeys, j = i % kPrepKeys;
    if (key0 + j >= keys_pad) continue;
    const int q = j & 7;
    const int r = (j & ~7) + (q < 4 ? 2 * q : 2 * (q - 4) + 1);
    vo[int64_t(d) * keys_pad + key0 + j] = round_tf32(sv[r][d]);
  }
}

// Round this warpgroup's 64 rows of the Q tile to TF32 in place, then make
// the writes visible to its wgmmas (async proxy) and wait for the
// warpgroup. Named barrier 1 + warpgroups + wg (the shared-memory O
// epilogue's, which the TF32 kernel does not use).
template <class Cfg>
__device__ __forceinline__ void round_q_tf32(typename Cfg::SharedStorage& ss, int wg, int wtid) {
  using namespace cute;
  constexpr int D = Cfg::kHeadDim, kChunks = 64 * D / 4;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Cfg::SmemLayoutQ{});
#pragma unroll 4
  for (int i = wtid; i < kChunks; i += 128) {
    const int r = 64 * wg + i / (D / 4), c = (i % (D / 4)) * 4;
    // The 128 B swizzle moves 16 B chunks: four columns stay together.
    float4* ptr = reinterpret_cast<float4*>(&sQ(r, c));
    float4 x = *ptr;
    *ptr = make_float4(round_tf32(x.x), round_tf32(x.y), round_tf32(x.z), round_tf32(x.w));
  }
  cutlass::arch::fence_view_async_shared();
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + Cfg::kConsumerWarpgroups + wg) : "memory");
}

}  // namespace jax_flash::cuda::sm90
