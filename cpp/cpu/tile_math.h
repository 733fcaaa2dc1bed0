// Small dense building blocks for the CPU kernels: dtype conversion, a
// vectorisable exp2, and a register-blocked tile matrix product. Plain C++
// written so that -O3 vectorises it for the ISA of the including translation
// unit. The kernels are compiled once per ISA (attention_cpu_dispatch.cc picks
// one at run time), so everything lives in the namespace JF_ISA_NS that the
// including file defines: no inline function is shared between ISAs.
#pragma once

#ifndef JF_ISA_NS
#error "define JF_ISA_NS before including tile_math.h"
#endif

#include <cstdint>
#include <cstring>
#include <limits>

#include "params.h"

namespace jax_flash::cpu::JF_ISA_NS {

struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };

inline float to_float(float x) { return x; }
inline float to_float(bf16 x) {
  uint32_t u = uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float to_float(f16 x) {
  // IEEE half -> float, including subnormals, inf and NaN.
  uint32_t h = x.bits;
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: value = man * 2^-24
    float f = float(man) * 5.9604644775390625e-8f;
    std::memcpy(&u, &f, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <class T> T from_float(float x);
template <> inline float from_float<float>(float x) { return x; }
template <> inline bf16 from_float<bf16>(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bf16{uint16_t(u >> 16)};
}
template <> inline f16 from_float<f16>(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{uint16_t(sign | 0x7e00u)};
  if (a >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00u)};  // rounds to >= 65520: inf
  if (a < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    float f;
    std::memcpy(&f, &a, 4);
    // Scale so that one half-ulp of the subnormal range is one unit, then
    // round to nearest even through the float adder.
    float r = f * 16777216.f + 0.5f;  // 2^24
    uint32_t m = uint32_t(r);
    if (float(m) == r && (m & 1u)) m -= 1;  // exact tie: to even
    return f16{uint16_t(sign | m)};
  }
  uint32_t rounded = a + 0x0fffu + ((a >> 13) & 1u);
  return f16{uint16_t(sign | ((rounded - 0x38000000u) >> 13))};
}

// exp2 for x <= 128 with about 2 ulp error; returns exactly 0 for x < -126
// (which includes -inf, so masked logits vanish). Branch-free so that loops
// calling it vectorise.
inline float fast_exp2(float x) {
  float xc = x < -126.f ? -126.f : (x > 127.f ? 127.f : x);
  float n = __builtin_floorf(xc + 0.5f);
  float f = xc - n;  // in [-0.5, 0.5]
  // Minimax-style polynomial of 2^f on [-0.5, 0.5] (Taylor coefficients of
  // exp(f ln2) are accurate to float precision at degree 6 here).
  float p = 1.5403530393381609e-4f;
  p = p * f + 1.3333558146428443e-3f;
  p = p * f + 9.6181291076284772e-3f;
  p = p * f + 5.5504108664821580e-2f;
  p = p * f + 2.4022650695910071e-1f;
  p = p * f + 6.9314718055994531e-1f;
  p = p * f + 1.0f;
  int32_t e = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, 4);
  float r = p * scale;
  return x < -126.f ? 0.f : r;
}

// C[M x N] (+)= A[M x K] * B[K x N], float32. A is read through strides
// (a(m, k) = a[m * sam + k * sak]) so transposed operands cost nothing;
// B and C are row-major. N must be a multiple of kTileN (buffers are padded).
constexpr int kTileN = 16;

// The native vector of the ISA this file is compiled for: GCC/Clang lower
// wider generic vectors poorly, so a kTileN-wide row is NV native vectors.
#if defined(__AVX512F__)
constexpr int kVecWidth = 16;
#elif defined(__AVX__)
constexpr int kVecWidth = 8;
#else
constexpr int kVecWidth = 4;
#endif
typedef float vecf __attribute__((vector_size(kVecWidth * sizeof(float))));
constexpr int kVecsPerTile = kTileN / kVecWidth;

__attribute__((always_inline)) inline vecf loadv(const float* p) {
  vecf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
__attribute__((always_inline)) inline void storev(float* p, vecf v) {
  std::memcpy(p, &v, sizeof(v));
}

// MR rows x kTileN columns of C kept in registers over the whole K loop.
template <int MR>
__attribute__((always_inline)) inline void micro_kernel(int K, const float* __restrict a,
                                                        int64_t sam, int64_t sak,
                                                        const float* __restrict b, int64_t ldb,
                                                        float* __restrict c, int64_t ldc,
                                                        bool accumulate) {
  constexpr int NV = kVecsPerTile;
  vecf acc[MR][NV];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v)
      acc[m][v] = accumulate ? loadv(c + m * ldc + v * kVecWidth) : vecf{};
  for (int k = 0; k < K; ++k) {
    vecf bk[NV];
    for (int v = 0; v < NV; ++v) bk[v] = loadv(b + k * ldb + v * kVecWidth);
    const float* ak = a + k * sak;
    for (int m = 0; m < MR; ++m) {
      const float av = ak[m * sam];
      for (int v = 0; v < NV; ++v) acc[m][v] += av * bk[v];
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) storev(c + m * ldc + v * kVecWidth, acc[m][v]);
}

inline void gemm(int M, int N, int K, const float* a, int64_t sam, int64_t sak,
                 const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  constexpr int MR = 6;
  for (int n0 = 0; n0 < N; n0 += kTileN) {
    int m0 = 0;
    for (; m0 + MR <= M; m0 += MR)
      micro_kernel<MR>(K, a + m0 * sam, sam, sak, b + n0, ldb, c + m0 * ldc + n0, ldc, accumulate);
    const float* ar = a + m0 * sam;
    float* cr = c + m0 * ldc + n0;
    switch (M - m0) {
      case 5: micro_kernel<5>(K, ar, sam, sak, b + n0, ldb, cr, ldc, accumulate); break;
      case 4: micro_kernel<4>(K, ar, sam, sak, b + n0, ldb, cr, ldc, accumulate); break;
      case 3: micro_kernel<3>(K, ar, sam, sak, b + n0, ldb, cr, ldc, accumulate); break;
      case 2: micro_kernel<2>(K, ar, sam, sak, b + n0, ldb, cr, ldc, accumulate); break;
      case 1: micro_kernel<1>(K, ar, sam, sak, b + n0, ldb, cr, ldc, accumulate); break;
      default: break;
    }
  }
}

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

}  // namespace jax_flash::cpu::JF_ISA_NS
