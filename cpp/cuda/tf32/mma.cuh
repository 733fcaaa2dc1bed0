// TF32 tensor-core pieces shared by the float32 kernels: the m16n8k8 MMA and
// its operand fragments read from shared memory or from an accumulator.
//
// Fragment ownership (PTX ISA, mma.m16n8k8 .tf32), lane = 4 g + t:
//   A (16 x 8): a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
//   B (8 x 8):  b0 (k = t, n = g), b1 (k = t + 4, n = g)
//   C (16 x 8): c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1)
// An accumulator feeds the next MMA's A operand without a shuffle by
// renaming its k index: A column t holds C column 2t and A column t + 4 holds
// C column 2t + 1, so the B operand reads its rows 2t and 2t + 1 in that MMA
// (b_from_rows). The sum over k does not depend on the order of its terms.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace jax_flash::cuda::tf32 {

// float -> tf32 (round to nearest, ties away: cvt.rna), as a 32-bit pattern.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// d += a * b (m16n8k8, tf32 inputs, float32 accumulation).
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t bits(float x) { return __float_as_uint(x); }

// Shared-memory tiles hold tf32-rounded floats, row-major with a row stride
// S = cols + 4: S = 4 (mod 32) makes every read below bank-conflict free
// (rows g, columns t: banks 4g + t; rows 2t, columns g: banks 8t + g).

// A fragment of rows [m0, m0 + 16), columns [k0, k0 + 8) of tile x.
template <int S>
__device__ __forceinline__ void a_frag(const float* x, int m0, int k0, int g, int t, uint32_t (&a)[4]) {
  const float* r0 = x + (m0 + g) * S + k0 + t;
  const float* r1 = r0 + 8 * S;
  a[0] = bits(r0[0]);
  a[1] = bits(r1[0]);
  a[2] = bits(r0[4]);
  a[3] = bits(r1[4]);
}

// B fragment from a tile stored [n][k] (B^T row-major: K, Q or dO as the
// right operand of a product over the head dim): n in [n0, n0 + 8).
template <int S>
__device__ __forceinline__ void b_frag_nk(const float* y, int n0, int k0, int g, int t, uint32_t (&b)[2]) {
  const float* r = y + (n0 + g) * S + k0 + t;
  b[0] = bits(r[0]);
  b[1] = bits(r[4]);
}

// B fragment from a tile stored [k][n] (V, dO, Q or K as the right operand of
// a product over keys or queries), in the renamed k order of an A operand
// taken from an accumulator (a_from_acc): rows k0 + 2t and k0 + 2t + 1.
template <int S>
__device__ __forceinline__ void b_from_rows(const float* y, int k0, int n0, int g, int t, uint32_t (&b)[2]) {
  const float* r = y + (k0 + 2 * t) * S + n0 + g;
  b[0] = bits(r[0]);
  b[1] = bits(r[S]);
}

// A operand from an accumulator tile c (16 x 8: this MMA's k block), rounded.
__device__ __forceinline__ void a_from_acc(const float (&c)[4], uint32_t (&a)[4]) {
  a[0] = to_tf32(c[0]);
  a[1] = to_tf32(c[2]);
  a[2] = to_tf32(c[1]);
  a[3] = to_tf32(c[3]);
}

// Quad (4 lanes of one row) reductions.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace jax_flash::cuda::tf32
