// JAX_FLASH_HD: a function compiled for both the host and the device (nvcc),
// or a plain inline function where a host compiler builds the file.
#pragma once

#if defined(__CUDACC__)
#define JAX_FLASH_HD __host__ __device__ __forceinline__
#else
#define JAX_FLASH_HD inline
#endif
