// What the compute-sanitizer drivers share: CHECK(expr), which on a CUDA
// error prints it with the place and returns 1 from the calling function;
// device copies of host vectors; segment ids with their 16-block ranges.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_runtime_api.h>

#include "params.h"

#define CHECK(x)                                                                           \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

// Device copy of host words (freed by the caller).
template <class T>
static T* upload_vec(const std::vector<T>& h) {
  void* d = nullptr;
  if (cudaMalloc(&d, h.size() * sizeof(T)) != cudaSuccess ||
      cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
    return nullptr;
  return static_cast<T*>(d);
}

// Device copy of a host int32 vector (freed by the caller).
static int32_t* upload_ints(const std::vector<int32_t>& h) {
  void* d = nullptr;
  if (cudaMalloc(&d, h.size() * 4) != cudaSuccess ||
      cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice) != cudaSuccess)
    return nullptr;
  return static_cast<int32_t*>(d);
}

// Segment ids in runs of doc tokens and their per-16-block [min, max].
static void segments(int b, int s, int doc, std::vector<int32_t>& ids, std::vector<int32_t>& ranges) {
  constexpr int kB = jax_flash::FwdParams::kSegmentBlock;
  const int nblk = (s + kB - 1) / kB;
  ids.assign(size_t(b) * s, 0);
  ranges.assign(size_t(b) * nblk * 2, 0);
  for (int bb = 0; bb < b; ++bb) {
    for (int i = 0; i < s; ++i) ids[size_t(bb) * s + i] = (i + 37 * bb) / doc;
    for (int k = 0; k < nblk; ++k) {
      ranges[(size_t(bb) * nblk + k) * 2] = ids[size_t(bb) * s + k * kB];
      ranges[(size_t(bb) * nblk + k) * 2 + 1] = ids[size_t(bb) * s + std::min(s, (k + 1) * kB) - 1];
    }
  }
}
