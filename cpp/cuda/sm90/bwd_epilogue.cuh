// The dK / dV epilogue of the Hopper backwards (sm90/bwd_kernel.cuh,
// sm90/bwd_wide_kernel.cuh): the consumers' fp32 accumulators, keys as rows
// (both compute the key-major products, S^T = K Q^T), to the 16-bit
// outputs.
#pragma once

#include <cstdint>

#include "cuda/common/store_acc.cuh"  // store_acc
#include "params.h"

namespace jax_flash::cuda::bwd90 {

// dK (times the softmax scale) and dV of key rows [n0, n0 + BN), of which
// `rows` (Sk - n0) exist.
template <typename Element, int D, class TA, class TC>
__device__ __forceinline__ void store_dkdv(TA const& acc_dk, TA const& acc_dv, TC const& coords, const BwdParams& p,
                                           int b, int hkv, int n0, int rows, bool pair_ok) {
  Element* dk = static_cast<Element*>(p.dk) + b * p.dk_batch_stride + int64_t(n0) * p.dk_row_stride +
                hkv * p.dk_head_stride;
  Element* dv = static_cast<Element*>(p.dv) + b * p.dv_batch_stride + int64_t(n0) * p.dv_row_stride +
                hkv * p.dv_head_stride;
  bwd::store_acc(acc_dk, coords, dk, p.dk_row_stride, rows, D, p.scale, pair_ok);
  bwd::store_acc(acc_dv, coords, dv, p.dv_row_stride, rows, D, 1.f, pair_ok);
}

}  // namespace jax_flash::cuda::bwd90
