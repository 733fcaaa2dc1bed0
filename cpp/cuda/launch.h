// Host entry points of the CUDA kernels. Included by the FFI layer (host
// C++); implemented in .cu files that only nvcc compiles.
#pragma once

#include <cstddef>
#include <vector>

#include <cuda_runtime_api.h>

#include "params.h"

namespace jax_flash::cuda {

// Head dims with a compiled kernel; other head dims <= 256 run on the next
// larger one (zero-padded inside the kernel, invisible to the caller).
// `variants`: the kernels for anything beyond plain causal/full attention,
// built for fewer head dims (cuda/common/head_dims.h).
bool supports(DType dtype, int head_dim, bool variants);

// Whether the forward runs on the variants kernels: options beyond plain
// causal / full attention, or rows it cannot move in 16-byte vectors (head
// dims off the 8-element grid, unaligned rows), which those kernels copy
// element-wise.
bool fwd_uses_variants(const FwdParams& params);

// Whether this build has kernels for the 16-bit dtype (JAX_FLASH_CUDA_DTYPES).
bool dtype_built(DType dtype);

// The head dims with compiled plain (or variants) kernels, ascending.
std::vector<int> head_dims(bool variants);

// Enqueue the forward on `stream`. No synchronisation. Returns the launch
// error, or cudaErrorInvalidValue for an unsupported dtype / head dim.
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream);

// Bytes of device scratch the backward needs (params.workspace).
size_t bwd_workspace_bytes(const BwdParams& params);

// Enqueue the backward (preprocess, main kernel(s), dq conversion) on `stream`.
cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream);

}  // namespace jax_flash::cuda
