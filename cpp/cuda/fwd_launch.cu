// Forward entry points: argument checks, head-dim rounding and dtype
// dispatch onto the instantiations. No CuTe here (the kernels live in
// instantiations/fwd_hdim*_*.cu).
#include <cstdint>
#include <vector>

#include "cuda/dtypes.h"
#include "cuda/fwd_dispatch.h"
#include "cuda/head_dims.h"
#include "cuda/launch.h"
#include "cuda/poison.h"

namespace jax_flash::cuda {

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// 16 B vector loads/stores are legal when every row start is 16 B aligned and
// head_dim splits into whole 8-element chunks.
bool vector_ok(const FwdParams& p) {
  if (p.head_dim % 8 != 0) return false;
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.o)) return false;
  const int64_t strides[] = {p.q_batch_stride, p.q_row_stride, p.q_head_stride,
                             p.k_batch_stride, p.k_row_stride, p.k_head_stride,
                             p.v_batch_stride, p.v_row_stride, p.v_head_stride,
                             p.o_batch_stride, p.o_row_stride, p.o_head_stride};
  for (int64_t s : strides)
    if (s % 8 != 0) return false;
  return true;
}

template <DType kDType>
cudaError_t dispatch_hdim(const FwdParams& p, bool vec, cudaStream_t stream) {
  if (p.plain_mask() && vec)
    return dispatch_head_dim(p.head_dim, [&](auto d) {
      return run_fwd_hdim<kDType, decltype(d)::value>(p, stream);
    });
  // Variants, and the element-wise copy path (head_dim % 8 != 0, unaligned
  // rows): the variants kernels, whose vector flag is a run-time value.
  return dispatch_head_dim<true>(p.head_dim, [&](auto d) {
    return run_fwd_var_hdim<kDType, decltype(d)::value>(p, vec, stream);
  });
}

}  // namespace

bool supports(DType dtype, int head_dim, bool variants) {
  return dtype_compiled(dtype) && head_dim >= 1 &&
         (variants ? round_variant_head_dim(head_dim) : round_head_dim(head_dim)) != 0;
}

bool dtype_built(DType dtype) { return dtype_compiled(dtype); }

std::vector<int> head_dims(bool variants) {
  std::vector<int> out;
  for (int d = 32; d <= 256; d += 32)
    if ((variants ? round_variant_head_dim(d) : round_head_dim(d)) == d) out.push_back(d);
  return out;
}

cudaError_t run_fwd(const FwdParams& p, cudaStream_t stream) {
  if (!supports(p.dtype, p.head_dim, !p.plain_mask())) return cudaErrorInvalidValue;
  if (p.batch < 0 || p.seqlen_q < 0 || p.seqlen_k < 0 || p.heads_q < 0 || p.heads_kv <= 0 ||
      p.heads_q % p.heads_kv != 0)
    return cudaErrorInvalidValue;
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return cudaSuccess;  // nothing to write
  if (p.heads_q > 65535 || p.batch > 65535) return cudaErrorInvalidValue;     // grid y / z limits
  if (!p.q || !p.o || !p.lse || (p.seqlen_k > 0 && (!p.k || !p.v))) return cudaErrorInvalidValue;
  if (poison_outputs_enabled()) {
    const size_t elem = p.dtype == DType::kFloat32 ? 4 : 2;
    cudaError_t err = poison(p.o, strided_span_bytes(p.batch, p.seqlen_q, p.heads_q, p.head_dim, p.o_batch_stride,
                                                     p.o_row_stride, p.o_head_stride, elem), stream);
    if (err == cudaSuccess) err = poison(p.lse, size_t(p.batch) * p.heads_q * p.seqlen_q * sizeof(float), stream);
    if (err != cudaSuccess) return err;
  }
  const bool vec = vector_ok(p);
  return with_dtype(p.dtype, [&](auto t) { return dispatch_hdim<decltype(t)::value>(p, vec, stream); });
}

}  // namespace jax_flash::cuda
