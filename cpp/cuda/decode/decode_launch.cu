// attention_with_kvcache on CUDA: the combine kernel that merges split
// partials, and the dispatch on dtype and head dim. (The split kernel itself
// appends new k/v rows.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/common/device.h"  // device_attribute
#include "cuda/common/dtypes.h"
#include "cuda/common/poison.h"
#include "cuda/decode/decode_dispatch.h"
#include "cuda/decode/decode_launch.h"
#include "cuda/decode/decode_ptx.cuh"

#if defined(JAX_FLASH_DECODE_HDIMS_SELECTED)
#ifdef JAX_FLASH_DECODE_HDIM_64
#define JAX_FLASH_DECODE_HAS_64 1
#else
#define JAX_FLASH_DECODE_HAS_64 0
#endif
#ifdef JAX_FLASH_DECODE_HDIM_128
#define JAX_FLASH_DECODE_HAS_128 1
#else
#define JAX_FLASH_DECODE_HAS_128 0
#endif
#ifdef JAX_FLASH_DECODE_HDIM_256
#define JAX_FLASH_DECODE_HAS_256 1
#else
#define JAX_FLASH_DECODE_HAS_256 0
#endif
#define JAX_FLASH_DECODE_HAS(d) JAX_FLASH_DECODE_HAS_##d
#endif

namespace jax_flash::cuda {
namespace decode {
namespace {

// One CTA (4 warps) a query row: lse = logsumexp of the splits' lse, o their
// lse-weighted sum (partials are normalised), in float32. The CTA starts once
// the split grid has drained, so its time is mostly memory round trips: the
// first kFirst splits of each warp are loaded at once with the lse values
// (a lane a split), before any of them is needed; later splits, every 4th a
// warp, keep several loads in flight (a warp walking 32 splits one load at a
// time was latency bound: ~20 us at batch 1, 128k).
template <class Element, int D>
__global__ void __launch_bounds__(128) combine_kernel(const KvcacheParams p) {
  constexpr int kPer = D / 32, kWarps = 4, kFirst = 4;
  static_assert(kFirst * kWarps <= 32, "the first splits' lse sit in lanes");
  __shared__ float red[kWarps][D];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the split kernel: wait until it
  // has finished and its partials are visible.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  const int64_t row = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int S = p.num_splits;
  const float* lse_p = p.lse_partial + row;
  const float* o_p = p.o_partial + row * D + lane * kPer;
  float x[kFirst][kPer];
#pragma unroll
  for (int k = 0; k < kFirst; ++k) {
    const int s = warp + k * kWarps;
#pragma unroll
    for (int e = 0; e < kPer; e += 2) {
      const float2 v = s < S ? *reinterpret_cast<const float2*>(o_p + s * rows * D + e) : make_float2(0.f, 0.f);
      x[k][e] = v.x;
      x[k][e + 1] = v.y;
    }
  }
  const float ls = lane < S ? lse_p[lane * rows] : -INFINITY;  // split `lane`'s lse
  float mx = ls;
  for (int s = lane + 32; s < S; s += 32) mx = fmaxf(mx, lse_p[s * rows]);
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.f;
  if (mx != -INFINITY) {
    sum = __expf(ls - mx);  // an absent split: 0
    for (int s = lane + 32; s < S; s += 32) sum += __expf(lse_p[s * rows] - mx);
  }
  for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float lse = sum > 0.f ? mx + __logf(sum) : -INFINITY;
  float out[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) out[e] = 0.f;
  if (sum > 0.f) {
#pragma unroll
    for (int k = 0; k < kFirst; ++k) {
      const int s = warp + k * kWarps;
      const float w = __expf(__shfl_sync(0xffffffffu, ls, s) - lse);  // empty split: 0
#pragma unroll
      for (int e = 0; e < kPer; ++e) out[e] += w * x[k][e];
    }
#pragma unroll 4
    for (int s = warp + kFirst * kWarps; s < S; s += kWarps) {
      const float w = __expf(lse_p[s * rows] - lse);
      const float* src = o_p + s * rows * D;
#pragma unroll
      for (int e = 0; e < kPer; e += 2) {
        const float2 v = *reinterpret_cast<const float2*>(src + e);
        out[e] += w * v.x;
        out[e + 1] += w * v.y;
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kPer; ++e) red[warp][lane * kPer + e] = out[e];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int e = 0; e < kPer; ++e)
    out[e] = red[0][lane * kPer + e] + red[1][lane * kPer + e] + red[2][lane * kPer + e] +
             red[3][lane * kPer + e];
  // row = (b * heads_q + h) * seqlen_q + i; o is [b, i, h, d].
  const int i = int(row % p.seqlen_q);
  const int64_t bh = row / p.seqlen_q;
  const int h = int(bh % p.heads_q), b = int(bh / p.heads_q);
  Element* dst = static_cast<Element*>(p.o) + ((int64_t(b) * p.seqlen_q + i) * p.heads_q + h) * D +
                 lane * kPer;
#pragma unroll
  for (int e = 0; e < kPer; e += 2)
    *reinterpret_cast<uint32_t*>(dst + e) = pack2<Element>(out[e], out[e + 1]);
  if (lane == 0) p.lse[row] = lse;
}

// The decode head dims of this build (CMake JAX_FLASH_CUDA_DECODE_HEAD_DIMS).
template <int D>
constexpr bool decode_hdim_compiled() {
#if defined(JAX_FLASH_DECODE_HDIMS_SELECTED)
  return (D == 64 && JAX_FLASH_DECODE_HAS(64)) || (D == 128 && JAX_FLASH_DECODE_HAS(128)) ||
         (D == 256 && JAX_FLASH_DECODE_HAS(256));
#else
  return D == 64 || D == 128 || D == 256;
#endif
}

template <DType t>
using ElementOf = std::conditional_t<t == DType::kBFloat16, __nv_bfloat16, __half>;

// Paired heads (decode_kernel.cuh): two d 64 kv heads run as one of 128
// when the kv heads pair up and the pair's rows fit one 16-row tile (H100,
// one query: +3.5%; pairing d 128 heads on the d 256 kernel gained nothing,
// see benchmarks/NOTES.md, Open questions, Decode). The caller checks that
// the build has the d 128 kernel. jax_flash/kvcache.py _pairs_heads mirrors it.
inline bool pairs_heads(const KvcacheParams& p) {
  return p.head_dim == 64 && p.heads_kv % 2 == 0 && 2 * p.group_size() * p.seqlen_q <= 16;
}

// The split kernel for p: the paired d 128 view where pairs_heads, else D's own.
template <class Element, int D>
cudaError_t launch_split(const KvcacheParams& p, cudaStream_t stream) {
  if constexpr (D == 64 && decode_hdim_compiled<128>()) {
    if (pairs_heads(p)) {
      KvcacheParams pair = p;
      pair.heads_kv = p.heads_kv / 2;
      pair.head_dim = 128;
      return launch_decode<Element, 128, true>(pair, stream);
    }
  }
  return launch_decode<Element, D, false>(p, stream);
}

template <class Element, int D>
cudaError_t run_typed(const KvcacheParams& p, cudaStream_t stream) {
  if constexpr (!decode_hdim_compiled<D>()) {
    return cudaErrorInvalidValue;
  } else {
    cudaError_t err = launch_split<Element, D>(p, stream);
    if (err != cudaSuccess || p.num_splits == 1) return err;
    const int64_t blocks = int64_t(p.batch) * p.heads_q * p.seqlen_q;  // a CTA a row
    if (blocks > INT32_MAX) return cudaErrorInvalidConfiguration;
    // Programmatic dependent launch (sm_90+): the combine grid is staged
    // while the split kernel drains, hiding a launch gap of a few us.
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(blocks));
    cfg.blockDim = dim3(128);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl_supported() ? 1 : 0;
    err = cudaLaunchKernelEx(&cfg, combine_kernel<Element, D>, p);
    if (err != cudaSuccess && cfg.numAttrs) {  // e.g. a capture that refuses it
      (void)cudaGetLastError();
      cfg.numAttrs = 0;
      err = cudaLaunchKernelEx(&cfg, combine_kernel<Element, D>, p);
    }
    return err;
  }
}

}  // namespace
}  // namespace decode

bool kvcache_supports(DType dtype, int head_dim) {
  if (!dtype_compiled(dtype)) return false;
  switch (head_dim) {
    case 64: return decode::decode_hdim_compiled<64>();
    case 128: return decode::decode_hdim_compiled<128>();
    case 256: return decode::decode_hdim_compiled<256>();
    default: return false;
  }
}

std::vector<int> kvcache_head_dims() {
  std::vector<int> out;
  if (decode::decode_hdim_compiled<64>()) out.push_back(64);
  if (decode::decode_hdim_compiled<128>()) out.push_back(128);
  if (decode::decode_hdim_compiled<256>()) out.push_back(256);
  return out;
}

size_t kvcache_workspace_floats(const KvcacheParams& p) {
  if (p.num_splits <= 1) return 0;
  return size_t(p.num_splits) * p.batch * p.heads_q * p.seqlen_q * (p.head_dim + 1);
}

cudaError_t run_kvcache(KvcacheParams p, float* workspace, cudaStream_t stream) {
  if (!kvcache_supports(p.dtype, p.head_dim)) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.seqlen_q == 0) return cudaSuccess;
  if (p.num_splits > 1) {
    p.o_partial = workspace;
    p.lse_partial =
        workspace + size_t(p.num_splits) * p.batch * p.heads_q * p.seqlen_q * p.head_dim;
  }
  if (const cudaError_t err = poison_kvcache_outputs(p, kvcache_workspace_floats(p), stream); err != cudaSuccess)
    return err;
  return with_dtype(p.dtype, [&](auto t) -> cudaError_t {
    using Element = decode::ElementOf<decltype(t)::value>;
    switch (p.head_dim) {
      case 64: return decode::run_typed<Element, 64>(p, stream);
      case 128: return decode::run_typed<Element, 128>(p, stream);
      default: return decode::run_typed<Element, 256>(p, stream);
    }
  });
}

}  // namespace jax_flash::cuda
