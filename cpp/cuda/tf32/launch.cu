// Float32 entry points: argument checks, the head-dim rounding onto the
// compiled TF32 kernels (32, 64, 128, 256), whether the Hopper wgmma kernels
// take a call (and their scratch), and the 16 B copy test. No kernels here
// (tf32/instantiations/*_tf32.cu, instantiations/{fwd,bwd}_sm90_hdim*_tf32.cu).
#include <cstdint>
#include <vector>

#include "cuda/common/head_dims.h"
#include "cuda/common/variants.cuh"  // variant_masks_only
#include "cuda/common/poison.h"
#include "cuda/sm90/tf32_operands.cuh"  // Tf32KvScratch
#include "cuda/tf32_dispatch.h"

namespace jax_flash::cuda {

namespace {

template <int D>
constexpr bool tf32_dim_compiled() {
#if defined(JAX_FLASH_NO_TF32)
  return false;
#else
  return head_dim_compiled<D>();  // JAX_FLASH_CUDA_HEAD_DIMS
#endif
}

constexpr int kTf32Dims[] = {32, 64, 128, 256};

bool dim_built(int d) {
  switch (d) {
    case 32: return tf32_dim_compiled<32>();
    case 64: return tf32_dim_compiled<64>();
    case 128: return tf32_dim_compiled<128>();
    case 256: return tf32_dim_compiled<256>();
    default: return false;
  }
}

// Smallest compiled TF32 head dim >= head_dim, or 0.
int round_tf32(int head_dim) {
  for (int d : kTf32Dims)
    if (head_dim >= 1 && head_dim <= d && dim_built(d)) return d;
  return 0;
}

template <class Fn>
cudaError_t with_tf32_dim(int head_dim, Fn&& fn) {
  switch (round_tf32(head_dim)) {
    case 32: if constexpr (tf32_dim_compiled<32>()) return fn(std::integral_constant<int, 32>{}); break;
    case 64: if constexpr (tf32_dim_compiled<64>()) return fn(std::integral_constant<int, 64>{}); break;
    case 128: if constexpr (tf32_dim_compiled<128>()) return fn(std::integral_constant<int, 128>{}); break;
    case 256: if constexpr (tf32_dim_compiled<256>()) return fn(std::integral_constant<int, 256>{}); break;
    default: break;
  }
  return cudaErrorInvalidValue;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// 16 B cp.async is legal when every row starts 16 B aligned and head_dim
// splits into whole 4-float chunks.
bool vec_ok(const FwdParams& p, const void* extra, const int64_t (&extra_strides)[3]) {
  if (p.head_dim % 4 != 0) return false;
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || (extra && !aligned16(extra))) return false;
  const int64_t strides[] = {p.q_batch_stride, p.q_row_stride, p.q_head_stride,
                             p.k_batch_stride, p.k_row_stride, p.k_head_stride,
                             p.v_batch_stride, p.v_row_stride, p.v_head_stride,
                             extra_strides[0], extra_strides[1], extra_strides[2]};
  for (int64_t s : strides)
    if (s % 4 != 0) return false;
  return true;
}

bool sizes_ok(const FwdParams& p) {
  return p.batch >= 0 && p.seqlen_q >= 0 && p.seqlen_k >= 0 && p.heads_q >= 0 && p.heads_kv > 0 &&
         p.heads_q % p.heads_kv == 0 && p.heads_q <= 65535 && p.batch <= 65535;
}

}  // namespace

bool tf32_built() { return !tf32_head_dims().empty(); }

std::vector<int> tf32_head_dims() {
  std::vector<int> out;
  for (int d : kTf32Dims)
    if (dim_built(d)) out.push_back(d);
  return out;
}

bool tf32_supports(int head_dim) { return round_tf32(head_dim) != 0; }

namespace {

// Head dims the Hopper TF32 kernel serves (its instantiations: 64, 128).
bool sm90_tf32_dim(int head_dim) {
#if defined(JAX_FLASH_FWD_SM90)
  // > 32: the Python side sizes the scratch for 33-128 only (a d32 call
  // without the d32 kernel takes the mma.sync d64 kernel).
  const int d = round_tf32(head_dim);
  return head_dim % 4 == 0 && head_dim > 32 && (d == 64 || d == 128);
#else
  (void)head_dim;
  return false;
#endif
}

template <int D>
cudaError_t try_fwd_sm90_tf32(const FwdParams& p, void* scratch, cudaStream_t stream) {
#if defined(JAX_FLASH_FWD_SM90)
  if constexpr (D == 64 || D == 128) return run_fwd_sm90_tf32_hdim<D>(p, scratch, stream);
#endif
  (void)p, (void)scratch, (void)stream;
  return cudaErrorNotSupported;
}

}  // namespace

size_t tf32_fwd_scratch_bytes(const FwdParams& p) {
  if (!sm90_tf32_dim(p.head_dim) || p.batch <= 0 || p.heads_kv <= 0) return 0;
  return sm90::Tf32KvScratch(p).bytes;
}

cudaError_t run_fwd_tf32(const FwdParams& p, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (p.dtype != DType::kFloat32 || !tf32_supports(p.head_dim) || !sizes_ok(p)) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return cudaSuccess;  // nothing to write
  if (!p.q || !p.o || !p.lse || (p.seqlen_k > 0 && (!p.k || !p.v))) return cudaErrorInvalidValue;
  if (const cudaError_t err = poison_fwd_outputs(p, stream); err != cudaSuccess) return err;
  const size_t need = tf32_fwd_scratch_bytes(p);
  if (need > 0 && scratch != nullptr && scratch_bytes >= need && variant_masks_only(p)) {
    const cudaError_t err = with_tf32_dim(p.head_dim, [&](auto d) {
      return try_fwd_sm90_tf32<decltype(d)::value>(p, scratch, stream);
    });
    if (err != cudaErrorNotSupported) return err;
  }
  const int64_t none[3] = {0, 0, 0};
  const bool vec = vec_ok(p, nullptr, none);
  return with_tf32_dim(p.head_dim, [&](auto d) { return run_fwd_tf32_hdim<decltype(d)::value>(p, vec, stream); });
}

namespace {

// The D rows, rounded up to 256 B; the Hopper kernels' scratch follows.
size_t dsum_bytes(const BwdParams& p) {
  return (sizeof(float) * size_t(p.batch) * size_t(p.heads_q) * size_t(p.seqlen_q) + 255) / 256 * 256;
}

// Whether the Hopper TF32 backward kernels may run (built with the
// forward's head dims; they decline unaligned rows at launch).
bool sm90_tf32_bwd(const BwdParams& p) {
#if defined(JAX_FLASH_BWD_SM90)
  return p.plain_mask() && p.seqlen_k > 0 && sm90_tf32_dim(p.head_dim);
#else
  (void)p;
  return false;
#endif
}

}  // namespace

size_t bwd_workspace_bytes_tf32(const BwdParams& p) {
  if (p.batch <= 0 || p.heads_q <= 0 || p.seqlen_q <= 0) return 0;
  if (!sm90_tf32_bwd(p)) return sizeof(float) * size_t(p.batch) * size_t(p.heads_q) * size_t(p.seqlen_q);  // D only
  return dsum_bytes(p) + sm90::Tf32BwdScratch(p).bytes;
}

cudaError_t run_bwd_tf32(const BwdParams& p, cudaStream_t stream) {
  if (p.dtype != DType::kFloat32 || !tf32_supports(p.head_dim) || !sizes_ok(p)) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.heads_q == 0) return cudaSuccess;  // nothing to write
  if (p.seqlen_q > 0 && (!p.q || !p.o || !p.lse || !p.dout || !p.dq || !p.workspace))
    return cudaErrorInvalidValue;
  if (p.seqlen_k > 0 && (!p.k || !p.v || !p.dk || !p.dv)) return cudaErrorInvalidValue;
  if (const cudaError_t err = poison_bwd_outputs(p, stream); err != cudaSuccess) return err;
  const int64_t do_strides[3] = {p.do_batch_stride, p.do_row_stride, p.do_head_stride};
  const bool vec = vec_ok(p, p.dout, do_strides);
  void* sm90_scratch = sm90_tf32_bwd(p) ? static_cast<char*>(p.workspace) + dsum_bytes(p) : nullptr;
  return with_tf32_dim(p.head_dim,
                       [&](auto d) { return run_bwd_tf32_hdim<decltype(d)::value>(p, vec, sm90_scratch, stream); });
}

}  // namespace jax_flash::cuda
