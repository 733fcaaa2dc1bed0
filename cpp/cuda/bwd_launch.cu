// Backward entry points: argument checks, workspace size, head-dim rounding
// and dtype dispatch onto the instantiations. No CuTe here (the kernels live
// in instantiations/bwd_hdim*_*.cu).
#include <cstdint>

#include "cuda/bwd_dispatch.h"
#include "cuda/common/dtypes.h"
#include "cuda/common/head_dims.h"
#include "cuda/common/poison.h"
#include "cuda/common/variants.cuh"  // variant_masks_only, variant_dropout_with_transform
#include "cuda/launch.h"

namespace jax_flash::cuda {

namespace {

// From this padded head dim up, atomic mode also runs the atomic-free kernel
// pair: the fused kernel's dK, dV and dQ accumulators spill at 256, and the
// pair measured 20-25% faster there.
constexpr int kSplitFromHeadDim = 256;

bool aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

BwdLaunchFlags launch_flags(const BwdParams& p) {
  BwdLaunchFlags f;
  bool vec = p.head_dim % 8 == 0 && aligned(p.q, 16) && aligned(p.k, 16) && aligned(p.v, 16) &&
             aligned(p.dout, 16);
  const int64_t in_strides[] = {p.q_batch_stride,  p.q_row_stride,  p.q_head_stride,
                                p.k_batch_stride,  p.k_row_stride,  p.k_head_stride,
                                p.v_batch_stride,  p.v_row_stride,  p.v_head_stride,
                                p.do_batch_stride, p.do_row_stride, p.do_head_stride};
  for (int64_t s : in_strides) vec = vec && s % 8 == 0;
  bool pair = p.head_dim % 2 == 0 && aligned(p.dq, 4) && aligned(p.dk, 4) && aligned(p.dv, 4);
  const int64_t out_strides[] = {p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride,
                                 p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride,
                                 p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride};
  for (int64_t s : out_strides) pair = pair && s % 2 == 0;
  f.vec_ok = vec;
  f.pair_ok = pair;
  return f;
}

// At the largest head dims the atomic-free pair (dK/dV kernel + dQ kernel)
// is faster than dQ atomics (the fused kernel runs out of registers): atomic
// mode runs it too (its workspace need is a subset of atomic mode's), except
// where the Hopper wide-head kernel takes over at 256 (plain attention,
// head_dim 256 exactly, aligned inputs, cc 9.0, sm_90a build): atomic mode
// 1.25-1.44x the pair (benchmarks/NOTES.md "Hopper backward d256");
// deterministic mode its dK/dV without dQ plus the pair's dQ kernel.
template <int D>
BwdParams for_kernel(const BwdParams& p) {
  BwdParams q = p;
  if (D >= kSplitFromHeadDim) q.deterministic = true;
  return q;
}

// The Hopper kernel head dim that serves a call whose SM80 kernel is D: D
// itself at 64 / 128 / 256, else the one it runs zero-padded on
// (hopper_pad_head_dim; with options hopper_pad_variant_head_dim), or 0.
template <int D, bool kVariants = false>
constexpr int hopper_bwd_head_dim() {
#if defined(JAX_FLASH_BWD_SM90)
  if constexpr (D == 64 || D == 128 || D == 256) {
    return D;
  } else {
    return kVariants ? hopper_pad_variant_head_dim<D>() : hopper_pad_head_dim<D>();
  }
#else
  return 0;
#endif
}

template <DType kDType>
cudaError_t dispatch_bwd(const BwdParams& p, BwdLaunchFlags f, cudaStream_t s) {
  if (p.plain_mask())
    return dispatch_head_dim(p.head_dim, [&](auto d) {
      constexpr int D = decltype(d)::value;
#if defined(JAX_FLASH_BWD_SM90)
      // 64 / 128 exactly: run_bwd_hdim tries the Hopper kernel itself.
      constexpr int H = hopper_bwd_head_dim<D>();
      if constexpr (H == 256) {
        const cudaError_t err = run_bwd_sm90_wide_hdim<kDType, H>(p, f, s);
        if (err != cudaErrorNotSupported) return err;
      } else if constexpr (H != 0 && H != D) {
        const cudaError_t err = run_bwd_sm90_hdim<kDType, H>(p, f, s);
        if (err != cudaErrorNotSupported) return err;
      }
#endif
      return run_bwd_hdim<kDType, D>(for_kernel<D>(p), f, s);
    });
  // The variants. On Hopper (90a builds, head dims padded to 64 / 128 / 256,
  // d32 too: hopper_bwd_head_dim; aligned) the wgmma kernels take
  // them all: the masks-only ones and soft-cap / ALiBi / dropout in any set,
  // deterministic mode with segment ids on the kSegOrder instantiations;
  // else (or NotSupported) the SM80 ones.
  const bool masks = variant_masks_only(p);
  const bool seg_order = p.deterministic && p.segment_ids();
  const bool drop_sets = variant_dropout_with_transform(p);
  return dispatch_head_dim<true>(p.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
#if defined(JAX_FLASH_BWD_SM90)
    constexpr int H = hopper_bwd_head_dim<D, true>();
    if constexpr (H == 64 || H == 128) {
      cudaError_t err;
      if (masks)
        err = seg_order ? run_bwd_sm90_masks_seg_order_hdim<kDType, H>(p, f, s)
                        : run_bwd_sm90_masks_hdim<kDType, H>(p, f, s);
      else if (seg_order)
        err = drop_sets ? run_bwd_sm90_logits_seg_order_hdim<kDType, H, true>(p, f, s)
                        : run_bwd_sm90_logits_seg_order_hdim<kDType, H, false>(p, f, s);
      else  // (soft-cap / ALiBi without dropout, or dropout alone; else NotSupported)
        err = drop_sets ? run_bwd_sm90_logits_dropout_hdim<kDType, H>(p, f, s)
                        : run_bwd_sm90_logits_hdim<kDType, H>(p, f, s);
      if (err != cudaErrorNotSupported) return err;
    } else if constexpr (H == 256) {
      cudaError_t err;
      if (masks)
        err = seg_order ? run_bwd_sm90_wide_masks_seg_order_hdim<kDType, H>(p, f, s)
                        : run_bwd_sm90_wide_masks_hdim<kDType, H>(p, f, s);
      else if (seg_order)
        err = drop_sets ? run_bwd_sm90_wide_logits_seg_order_hdim<kDType, H, true>(p, f, s)
                        : run_bwd_sm90_wide_logits_seg_order_hdim<kDType, H, false>(p, f, s);
      else
        err = drop_sets ? run_bwd_sm90_wide_logits_hdim<kDType, H, true>(p, f, s)
                        : run_bwd_sm90_wide_logits_hdim<kDType, H, false>(p, f, s);
      if (err != cudaErrorNotSupported) return err;
    }
#endif
    return masks ? run_bwd_varm_hdim<kDType, D>(for_kernel<D>(p), f, s)
                 : run_bwd_var_hdim<kDType, D>(for_kernel<D>(p), f, s);
  });
}

// The head dim of the kernel that will run (the variants kernels exist for
// fewer head dims), or 0.
int kernel_head_dim(const BwdParams& p) {
  return p.plain_mask() ? round_head_dim(p.head_dim) : round_variant_head_dim(p.head_dim);
}

// The dQ accumulator's head dim: the widest kernel that may run, i.e. the
// Hopper one where the call's head dim runs padded on it.
int accum_head_dim(const BwdParams& p) {
  const int d = kernel_head_dim(p);
  int h = 0;
  if (p.plain_mask())
    dispatch_head_dim(p.head_dim, [&](auto k) {
      h = hopper_bwd_head_dim<decltype(k)::value>();
      return cudaSuccess;
    });
  else
    dispatch_head_dim<true>(p.head_dim, [&](auto k) {
      h = hopper_bwd_head_dim<decltype(k)::value, true>();
      return cudaSuccess;
    });
  return h > d ? h : d;
}

}  // namespace

size_t bwd_workspace_bytes(const BwdParams& p) {
  const int d = accum_head_dim(p);
  if (d == 0 || p.batch <= 0 || p.heads_q <= 0 || p.seqlen_q <= 0) return 0;
  return bwd_dsum_bytes(p) + bwd_accum_bytes(p, d);  // (the order counters live in dq: bwd_dispatch.h)
}

cudaError_t run_bwd(const BwdParams& p, cudaStream_t stream) {
  if (!dtype_compiled(p.dtype)) return cudaErrorInvalidValue;
  if (p.head_dim < 1 || p.head_dim > 256 || kernel_head_dim(p) == 0) return cudaErrorInvalidValue;
  if (p.batch < 0 || p.seqlen_q < 0 || p.seqlen_k < 0 || p.heads_q < 0 || p.heads_kv <= 0 ||
      p.heads_q % p.heads_kv != 0)
    return cudaErrorInvalidValue;
  if (p.batch == 0 || p.heads_q == 0) return cudaSuccess;  // nothing to write
  if (p.heads_q > 65535 || p.batch > 65535) return cudaErrorInvalidValue;  // grid y / z limits
  if (p.seqlen_q > 0 && (!p.q || !p.o || !p.lse || !p.dout || !p.dq || !p.workspace))
    return cudaErrorInvalidValue;
  if (p.seqlen_k > 0 && (!p.k || !p.v || !p.dk || !p.dv)) return cudaErrorInvalidValue;
  if (const cudaError_t err = poison_bwd_outputs(p, stream); err != cudaSuccess) return err;
  const BwdLaunchFlags f = launch_flags(p);
  return with_dtype(p.dtype, [&](auto t) { return dispatch_bwd<decltype(t)::value>(p, f, stream); });
}

}  // namespace jax_flash::cuda
