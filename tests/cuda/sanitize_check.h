// CHECK(expr) for the compute-sanitizer drivers: on a CUDA error, print it
// with the place and return 1 from the calling function.
#pragma once

#include <cstdio>

#include <cuda_runtime_api.h>

#define CHECK(x)                                                                           \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)
