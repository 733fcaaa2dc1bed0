// Host entry points of the float32 (TF32 tensor core) CUDA kernels
// (cpp/cuda/tf32/): included by the FFI layer; implemented in .cu files that
// only nvcc compiles. Built for head dims 32, 64, 128 and 256 (others run
// zero-padded on the next one) unless JAX_FLASH_CUDA_DTYPES leaves tf32 out.
#pragma once

#include <cstddef>
#include <vector>

#include <cuda_runtime_api.h>

#include "params.h"

namespace jax_flash::cuda {

// Whether the build has any float32 kernel, and their head dims (ascending).
bool tf32_built();
std::vector<int> tf32_head_dims();
bool tf32_supports(int head_dim);

// Enqueue the float32 forward / backward on `stream` (no synchronisation).
// cudaErrorInvalidValue for sizes or head dims these kernels do not take.
// The forward's scratch (tf32_fwd_scratch_bytes of it) lets plain attention
// and the masks-only variants at head dims 33-128 (multiples of 4) run the
// Hopper TF32 wgmma kernel on an H100; with less, or elsewhere, or with
// soft-cap, ALiBi or dropout, the mma.sync kernels run.
size_t tf32_fwd_scratch_bytes(const FwdParams& params);
cudaError_t run_fwd_tf32(const FwdParams& params, void* scratch, size_t scratch_bytes, cudaStream_t stream);
size_t bwd_workspace_bytes_tf32(const BwdParams& params);
cudaError_t run_bwd_tf32(const BwdParams& params, cudaStream_t stream);

// Per head dim (tf32/instantiations/*_tf32.cu); vec: 16 B copies legal.
template <int kHeadDim>
cudaError_t run_fwd_tf32_hdim(const FwdParams& params, bool vec, cudaStream_t stream);
// Hopper TF32 wgmma forward (fwd_sm90_hdim*_tf32.cu, sm_90a builds): plain
// attention and the masks-only variants; cudaErrorNotSupported when it
// cannot run here.
template <int kHeadDim>
cudaError_t run_fwd_sm90_tf32_hdim(const FwdParams& params, void* scratch, cudaStream_t stream);
// sm90_scratch: non-null where the Hopper TF32 backward may run (plain
// attention, head dims 33-128; Tf32BwdScratch bytes past the D rows).
template <int kHeadDim>
cudaError_t run_bwd_tf32_hdim(const BwdParams& params, bool vec, void* sm90_scratch, cudaStream_t stream);
// Hopper TF32 wgmma backward, dK / dV and dQ kernels (bwd_sm90_hdim*_tf32.cu,
// sm_90a builds): writes the D rows into dsum first; cudaErrorNotSupported
// (nothing launched) when it cannot run here.
template <int kHeadDim>
cudaError_t run_bwd_sm90_tf32_hdim(const BwdParams& params, float* dsum, void* scratch, cudaStream_t stream);

}  // namespace jax_flash::cuda
