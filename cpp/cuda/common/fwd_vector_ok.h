// Whether every row of a forward's q, k, v and o may be moved in 16-byte
// vectors (cp.async, TMA): 16 B aligned base pointers and strides, and
// head_dim in whole 8-element (16-bit) chunks. Host code, shared by the
// forward launchers.
#pragma once

#include <cstdint>

#include "params.h"

namespace jax_flash::cuda {

inline bool fwd_vector_ok(const FwdParams& p) {
  auto a16 = [](const void* x) { return (reinterpret_cast<uintptr_t>(x) & 15u) == 0; };
  if (p.head_dim % 8 != 0 || !a16(p.q) || !a16(p.k) || !a16(p.v) || !a16(p.o)) return false;
  const int64_t strides[] = {p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.k_batch_stride,
                             p.k_row_stride,   p.k_head_stride, p.v_batch_stride, p.v_row_stride,
                             p.v_head_stride,  p.o_batch_stride, p.o_row_stride, p.o_head_stride};
  for (int64_t s : strides)
    if (s % 8 != 0) return false;
  return true;
}

}  // namespace jax_flash::cuda
