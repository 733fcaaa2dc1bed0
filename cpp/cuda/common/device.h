// Queries about the current CUDA device that the launches share.
#pragma once

#include <atomic>

#include <cuda_runtime_api.h>

namespace jax_flash::cuda {

// An attribute of the current device, or 0 if CUDA cannot say.
inline int device_attribute(cudaDeviceAttr attr) {
  int dev = 0, value = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&value, attr, dev) != cudaSuccess)
    return 0;
  return value;
}

// Programmatic dependent launch (compute capability >= 9.0).
inline bool pdl_supported() { return device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9; }

// The current device's SM count (0 if CUDA cannot say), cached per device:
// the persistent grids ask for it on every launch.
inline int sm_count() {
  static std::atomic<int> cached[32] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 32) return 0;
  int n = cached[dev].load(std::memory_order_relaxed);
  if (n == 0 && cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess)
    cached[dev].store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace jax_flash::cuda
