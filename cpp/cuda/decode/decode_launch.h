// Host entry points of the split-KV decode kernels (attention_with_kvcache on
// CUDA). Included by the FFI layer; implemented in cpp/cuda/decode/*.cu.
#pragma once

#include <cstddef>
#include <vector>

#include <cuda_runtime_api.h>

#include "kvcache_params.h"

namespace jax_flash::cuda {

// Whether a decode kernel exists for this dtype and head dim in this build
// (head dims 64, 128, 256; JAX_FLASH_CUDA_HEAD_DIMS / _DTYPES may drop some).
bool kvcache_supports(DType dtype, int head_dim);

// The smallest page a paged cache may have on CUDA: 1024 / head_dim rows, the
// row step of the split kernel's copies, which an earlier per-thread page walk
// could not cross twice. The paged kernel now looks every key's page up on
// its own (a row table), so nothing in it needs the bound any more; smaller
// pages stay refused because no GPU test has run them yet.
constexpr int kvcache_min_page_size(int head_dim) { return 128 * 8 / head_dim; }

// The decode head dims of this build, ascending.
std::vector<int> kvcache_head_dims();

// Float32 scratch the launch needs (params.o_partial + params.lse_partial):
// nothing for one split.
size_t kvcache_workspace_floats(const KvcacheParams& params);

// Enqueue the split-KV kernel (which also appends k_new / v_new when set)
// and, for more than one split, the combine kernel on `stream`. No
// synchronisation. `workspace` holds kvcache_workspace_floats(params) floats.
cudaError_t run_kvcache(KvcacheParams params, float* workspace, cudaStream_t stream);

}  // namespace jax_flash::cuda
