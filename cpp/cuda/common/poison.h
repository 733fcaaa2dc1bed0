// Test aid: with JAX_FLASH_POISON_OUTPUTS=1 in the environment (read once a
// process) the CUDA entry points fill their outputs with NaN bytes (0xFF)
// before launching, on the same stream, so any element a kernel fails to
// write shows as NaN in the tests instead of stale memory that may look right.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime_api.h>

#include "kvcache_params.h"
#include "params.h"

namespace jax_flash::cuda {

inline bool poison_outputs_enabled() {
  static const bool on = [] {
    const char* s = std::getenv("JAX_FLASH_POISON_OUTPUTS");
    return s != nullptr && std::strcmp(s, "0") != 0 && s[0] != '\0';
  }();
  return on;
}

// The bytes spanned by a [batch, rows, heads, head_dim] tensor with these
// element strides (non-negative; the last stride is 1).
inline size_t strided_span_bytes(int batch, int rows, int heads, int head_dim, int64_t batch_stride,
                                 int64_t row_stride, int64_t head_stride, size_t element_bytes) {
  if (batch <= 0 || rows <= 0 || heads <= 0 || head_dim <= 0) return 0;
  const int64_t last = int64_t(batch - 1) * batch_stride + int64_t(rows - 1) * row_stride +
                       int64_t(heads - 1) * head_stride + head_dim;
  return size_t(last) * element_bytes;
}

inline cudaError_t poison(void* ptr, size_t bytes, cudaStream_t stream) {
  if (ptr == nullptr || bytes == 0) return cudaSuccess;
  return cudaMemsetAsync(ptr, 0xFF, bytes, stream);
}

inline size_t element_bytes(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// o and lse of a forward, when poisoning is on.
inline cudaError_t poison_fwd_outputs(const FwdParams& p, cudaStream_t stream) {
  if (!poison_outputs_enabled()) return cudaSuccess;
  cudaError_t err = poison(p.o, strided_span_bytes(p.batch, p.seqlen_q, p.heads_q, p.head_dim, p.o_batch_stride,
                                                   p.o_row_stride, p.o_head_stride, element_bytes(p.dtype)), stream);
  if (err == cudaSuccess) err = poison(p.lse, size_t(p.batch) * p.heads_q * p.seqlen_q * sizeof(float), stream);
  return err;
}

// dq, dk and dv of a backward, when poisoning is on.
inline cudaError_t poison_bwd_outputs(const BwdParams& p, cudaStream_t stream) {
  if (!poison_outputs_enabled()) return cudaSuccess;
  const size_t e = element_bytes(p.dtype);
  cudaError_t err = poison(p.dq, strided_span_bytes(p.batch, p.seqlen_q, p.heads_q, p.head_dim, p.dq_batch_stride,
                                                    p.dq_row_stride, p.dq_head_stride, e), stream);
  if (err == cudaSuccess)
    err = poison(p.dk, strided_span_bytes(p.batch, p.seqlen_k, p.heads_kv, p.head_dim, p.dk_batch_stride,
                                          p.dk_row_stride, p.dk_head_stride, e), stream);
  if (err == cudaSuccess)
    err = poison(p.dv, strided_span_bytes(p.batch, p.seqlen_k, p.heads_kv, p.head_dim, p.dv_batch_stride,
                                          p.dv_row_stride, p.dv_head_stride, e), stream);
  return err;
}

// o and lse of a KV-cache call, and the `partial_floats` of split partials
// from p.o_partial on (kvcache_workspace_floats), when poisoning is on.
inline cudaError_t poison_kvcache_outputs(const KvcacheParams& p, size_t partial_floats, cudaStream_t stream) {
  if (!poison_outputs_enabled()) return cudaSuccess;
  const size_t rows = size_t(p.batch) * p.seqlen_q * p.heads_q;
  cudaError_t err = poison(p.o, rows * p.head_dim * element_bytes(p.dtype), stream);
  if (err == cudaSuccess) err = poison(p.lse, rows * sizeof(float), stream);
  if (err == cudaSuccess) err = poison(p.o_partial, partial_floats * sizeof(float), stream);
  return err;
}

}  // namespace jax_flash::cuda
