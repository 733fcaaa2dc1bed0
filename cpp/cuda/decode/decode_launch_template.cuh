// Launch of the split-KV kernel for one (dtype, head dim): picks the row
// tiling from the GQA group size x seqlen_q. Included by one
// decode_hdim<D>_<dtype>.cu unit each, so builds parallelise.
#pragma once

#include <atomic>

#include <cuda_runtime_api.h>

#include "cuda/common/device.h"  // device_attribute
#include "cuda/decode/decode_kernel.cuh"
#include "kvcache_params.h"

namespace jax_flash::cuda::decode {

// Row warps for a group of `rows` query rows (jax_flash/kvcache.py mirrors it).
inline int warps_m(int rows) { return rows <= 16 ? 1 : (rows <= 32 ? 2 : 4); }

// `static`: every unit keeps its own once-per-device record (its kernels'
// host stubs are local to it).
template <class Cfg, bool kPaged, bool kPair, bool kLogits>
static cudaError_t launch_cfg(const KvcacheParams& p, cudaStream_t stream) {
  static std::atomic<unsigned long long> done_mask{0};
  auto kernel = decode_kernel<Cfg, kPaged, kPair, kLogits>;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const unsigned long long bit = dev < 64 ? (1ull << dev) : 0ull;
  if (bit == 0 || !(done_mask.load(std::memory_order_acquire) & bit)) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmem);
    if (err != cudaSuccess) return err;
    // Two or more CTAs of ~100 KB an SM need the full shared-memory carveout.
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
    if (err != cudaSuccess) return err;
    done_mask.fetch_or(bit, std::memory_order_acq_rel);
  }
  const int rows = p.group_size() * p.seqlen_q;
  const int m_blocks = (rows + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const long long gy = (long long)m_blocks * p.heads_kv;
  if (gy > 65535 || p.batch > 65535) return cudaErrorInvalidConfiguration;
  dim3 grid(p.num_splits, unsigned(gy), p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmem, stream>>>(p);
  return cudaGetLastError();
}

template <class Element, int D, int Stages, bool kPaged, bool kPair, bool kLogits>
static cudaError_t launch_rows(const KvcacheParams& p, cudaStream_t stream) {
  if constexpr (kPair) {  // paired heads: one 16-row tile (pairs_heads' rule)
    return launch_cfg<DecodeConfig<Element, D, 1, Stages>, kPaged, true, kLogits>(p, stream);
  } else {
    switch (warps_m(p.group_size() * p.seqlen_q)) {
      case 1: return launch_cfg<DecodeConfig<Element, D, 1, Stages>, kPaged, false, kLogits>(p, stream);
      case 2: return launch_cfg<DecodeConfig<Element, D, 2, Stages>, kPaged, false, kLogits>(p, stream);
      default: return launch_cfg<DecodeConfig<Element, D, 4, Stages>, kPaged, false, kLogits>(p, stream);
    }
  }
}

// Paged and contiguous caches get their own kernels (the page walk stays out
// of the contiguous one).
template <class Element, int D, int Stages, bool kPair, bool kLogits>
static cudaError_t launch_paging(const KvcacheParams& p, cudaStream_t stream) {
  return p.paged() ? launch_rows<Element, D, Stages, true, kPair, kLogits>(p, stream)
                   : launch_rows<Element, D, Stages, false, kPair, kLogits>(p, stream);
}

// Soft-cap / ALiBi get their own kernels at d 64 / 128: their score math
// stays out of the plain kernel (H200: 16 queries +6-8%, one query -1 to
// +3%). d 256 keeps one kernel for both: its plain kernel read 1.5-2% slower
// (one query, 32k cache, three A/B rounds).
template <class Element, int D, int Stages, bool kPair>
static cudaError_t launch_logits(const KvcacheParams& p, cudaStream_t stream) {
  if constexpr (D == 256) {
    return launch_paging<Element, D, Stages, kPair, true>(p, stream);
  } else {
    return p.softcap > 0.f || p.alibi_slopes != nullptr ? launch_paging<Element, D, Stages, kPair, true>(p, stream)
                                                         : launch_paging<Element, D, Stages, kPair, false>(p, stream);
  }
}

// kPair (D 128): p describes the paired view of d 64 heads (heads_kv halved,
// head_dim doubled).
template <class Element, int D, bool kPair>
cudaError_t launch_decode(const KvcacheParams& p, cudaStream_t stream) {
  if constexpr (D == 256) {
    // A third 64 KB stage where it fits: one CTA an SM, so the stages are all
    // the loads it has in flight.
    constexpr int kSmem3 = DecodeConfig<Element, D, 4, 3>::kSmem;
    if (device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin) >= kSmem3)
      return launch_logits<Element, D, 3, kPair>(p, stream);
  }
  return launch_logits<Element, D, DecodeConfig<Element, D, 1>::kStages, kPair>(p, stream);
}

}  // namespace jax_flash::cuda::decode

#define JAX_FLASH_DECODE_INSTANTIATE(Element, D, kPair)                            \
  template cudaError_t jax_flash::cuda::decode::launch_decode<Element, D, kPair>( \
      const jax_flash::KvcacheParams&, cudaStream_t);
