// Deterministic mode of the Hopper backward kernels: the dQ adds into one
// query tile go in a fixed order of key tiles, kept by one int counter per
// (batch, q head, kBwdOrderRows query rows) in the workspace
// (bwd_dispatch.h): a CTA spins until the counter reaches its rank, adds its
// dQ, and once the adds are complete bumps the counter with release order.
#pragma once

#include <cuda_runtime_api.h>

#include "params.h"

namespace jax_flash::cuda::bwd90 {

__device__ __forceinline__ int load_acquire(const int* ptr) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ void add_release(int* ptr, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(ptr), "r"(v) : "memory");
}
// Orders generic-proxy accesses (the counter) with the async proxy's (bulk
// reduce copies) on global memory.
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// Deterministic mode, not causal: the stride between the first query tiles
// of successive key-tile CTAs (the kernel's dq_rotate), or 0 for none. A CTA
// then may wait for one of lower key tile, which launches after it; so only
// when a whole row of key tiles fits on half the SMs, which leaves room for
// it to become resident (else the plain highest-first order, whose waits all
// point at CTAs launched earlier).
inline int order_rotation(const BwdParams& p, int block_m, int block_n) {
  if (p.causal) return 0;
  const int n_blocks = (p.seqlen_k + block_n - 1) / block_n;
  const int m_tiles = (p.seqlen_q + block_m - 1) / block_m;
  if (n_blocks < 2 || n_blocks > m_tiles) return 0;
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return 0;
  return 2 * n_blocks <= sms ? m_tiles / n_blocks : 0;
}

}  // namespace jax_flash::cuda::bwd90
