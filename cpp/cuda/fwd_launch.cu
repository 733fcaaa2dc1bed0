// Forward entry points: argument checks, head-dim rounding and dtype
// dispatch onto the instantiations. No CuTe here (the kernels live in
// instantiations/fwd_hdim*_*.cu).
#include <cstdint>
#include <vector>

#include "cuda/common/dtypes.h"
#include "cuda/common/fwd_vector_ok.h"
#include "cuda/common/head_dims.h"
#include "cuda/common/poison.h"
#include "cuda/fwd_dispatch.h"
#include "cuda/launch.h"

namespace jax_flash::cuda {

namespace {

// 16 B vector loads/stores are legal (cuda/common/fwd_vector_ok.h).
bool vector_ok(const FwdParams& p) { return fwd_vector_ok(p); }

template <DType kDType>
cudaError_t dispatch_hdim(const FwdParams& p, bool variants, bool vec, cudaStream_t stream) {
  if (!variants)
    return dispatch_head_dim(p.head_dim, [&](auto d) {
      constexpr int D = decltype(d)::value;
#if defined(JAX_FLASH_FWD_SM90)
      // A head dim between the Hopper kernel's (64 / 128 / 256) runs
      // zero-padded on the next one where that is faster than its own
      // SM80 kernel (run_fwd_hdim tries the Hopper kernel at exactly those).
      constexpr int H = hopper_pad_head_dim<D>();
      if constexpr (H != 0) {
        const cudaError_t err = run_fwd_sm90_hdim<kDType, H>(p, stream);
        if (err != cudaErrorNotSupported) return err;
      }
#endif
      return run_fwd_hdim<kDType, D>(p, stream);
    });
  // Variants, and the element-wise copy path (head_dim % 8 != 0, unaligned
  // rows): the variants kernels, whose vector flag is a run-time value.
  return dispatch_head_dim<true>(p.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
#if defined(JAX_FLASH_FWD_SM90)
    // Options at head dim 32 run zero-padded on the Hopper 64 kernels
    // (hopper_pad_variant_head_dim), as plain d32 does.
    constexpr int H = hopper_pad_variant_head_dim<D>();
    if constexpr (H != 0) {
      if (vec && !p.plain_mask()) {
        const cudaError_t err = run_fwd_sm90_variants_hdim<kDType, H>(p, stream);
        if (err != cudaErrorNotSupported) return err;
      }
    }
#endif
    return run_fwd_var_hdim<kDType, D>(p, vec, stream);
  });
}

}  // namespace

bool supports(DType dtype, int head_dim, bool variants) {
  return dtype_compiled(dtype) && head_dim >= 1 &&
         (variants ? round_variant_head_dim(head_dim) : round_head_dim(head_dim)) != 0;
}

bool fwd_uses_variants(const FwdParams& p) { return !p.plain_mask() || !vector_ok(p); }

bool dtype_built(DType dtype) { return dtype_compiled(dtype); }

std::vector<int> head_dims(bool variants) {
  std::vector<int> out;
  for (int d = 32; d <= 256; d += 32)
    if ((variants ? round_variant_head_dim(d) : round_head_dim(d)) == d) out.push_back(d);
  return out;
}

cudaError_t run_fwd(const FwdParams& p, cudaStream_t stream) {
  const bool variants = fwd_uses_variants(p);
  if (!supports(p.dtype, p.head_dim, variants)) return cudaErrorInvalidValue;
  if (p.batch < 0 || p.seqlen_q < 0 || p.seqlen_k < 0 || p.heads_q < 0 || p.heads_kv <= 0 ||
      p.heads_q % p.heads_kv != 0)
    return cudaErrorInvalidValue;
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return cudaSuccess;  // nothing to write
  if (p.heads_q > 65535 || p.batch > 65535) return cudaErrorInvalidValue;     // grid y / z limits
  if (!p.q || !p.o || !p.lse || (p.seqlen_k > 0 && (!p.k || !p.v))) return cudaErrorInvalidValue;
  if (const cudaError_t err = poison_fwd_outputs(p, stream); err != cudaSuccess) return err;
  const bool vec = vector_ok(p);
  return with_dtype(p.dtype, [&](auto t) { return dispatch_hdim<decltype(t)::value>(p, variants, vec, stream); });
}

}  // namespace jax_flash::cuda
