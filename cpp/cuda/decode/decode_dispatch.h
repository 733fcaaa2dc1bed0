// Declarations of the per-unit decode launchers (decode_hdim<D>_<dtype>.cu
// instantiate them); decode_launch.cu dispatches to them.
#pragma once

#include <cuda_runtime_api.h>

#include "kvcache_params.h"

namespace jax_flash::cuda::decode {

// kPair (D 128 only): two kv heads of 64 read as one (decode_kernel.cuh).
template <class Element, int D, bool kPair>
cudaError_t launch_decode(const KvcacheParams& p, cudaStream_t stream);

}  // namespace jax_flash::cuda::decode
