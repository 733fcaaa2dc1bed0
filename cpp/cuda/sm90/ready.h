// Whether a Hopper (sm_90a) kernel can run on the current device: cc 9.0, an
// sm_90a binary of the kernel in this build, and its shared-memory opt-in
// done. Shared by the wgmma forward and backward launchers.
#pragma once

#include <atomic>

#include <cuda_runtime_api.h>

namespace jax_flash::cuda {

// `state` caches the answer per device (bit 2*dev: checked, 2*dev+1:
// usable); pass one static per kernel. `max_carveout`: ask for all of the
// unified L1/smem as smem, so that several CTAs fit on an SM side by side.
// A failed probe leaves no sticky error.
template <class Kernel>
bool sm90_kernel_ready(Kernel kernel, int smem_bytes, std::atomic<unsigned long long>& state,
                       bool max_carveout = false) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev >= 32) {
    cudaGetLastError();
    return false;
  }
  const unsigned long long checked = 1ull << (2 * dev), usable = 1ull << (2 * dev + 1);
  const unsigned long long s = state.load(std::memory_order_acquire);
  if (s & checked) return (s & usable) != 0;
  bool ok = false;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
      major == 9 && minor == 0) {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.binaryVersion == 90 &&
        attr.ptxVersion == 90) {
      ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) ==
           cudaSuccess;
      if (ok && max_carveout)
        ok = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  int(cudaSharedmemCarveoutMaxShared)) == cudaSuccess;
    }
  }
  cudaGetLastError();
  state.fetch_or(checked | (ok ? usable : 0ull), std::memory_order_acq_rel);
  return ok;
}

}  // namespace jax_flash::cuda
