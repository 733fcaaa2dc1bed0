// The logit transforms of the Hopper forwards (soft-cap, ALiBi; the
// fwd::kLogit* bits) and dropout of P, applied to one wgmma S accumulator in
// registers. Shared by the warp-specialised forward (sm90/fwd_mainloop.cuh)
// and, for their bits and LogitsOf, the Hopper backwards.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>

#include "cuda/common/utils.cuh"
#include "cuda/common/variants.cuh"
#include "params.h"

namespace jax_flash::cuda::fwd {

// Logit transforms of the kLogits kernels (bits); kLogitDropout: the
// dropout keep mask on P (dropout.h), the 1 / (1 - rate) on O at the end.
enum : int { kLogitSoftcap = 1, kLogitAlibi = 2, kLogitDropout = 4 };

// kLogits of a traits; 0 for those without one (plain, masks).
template <class T, class = void>
struct LogitsOf { static constexpr int value = 0; };
template <class T>
struct LogitsOf<T, std::void_t<decltype(T::kLogits)>> { static constexpr int value = T::kLogits; };

// Raw scores of one S tile -> logits in log2 units (Variant::logit_log2):
// s * scale, soft-cap cap * tanh(s * scale / cap), ALiBi
// -slope * |pos(row) - col|, all * log2(e) (soft-cap alone: tanh only, the
// kernel's softmax scale is cap * log2(e)). Masks come after (-inf).
// Per element the distance is this thread's base (one int64 difference a
// tile) plus a compile-time (row - col) of thread 0's coordinates, as in
// apply_variant_mask. Tiles whose keys all lie on one side of every row's
// position (every off-diagonal tile of a causal band) take the bias as one
// FMA of that constant; the others take |distance|.
// ALiBi with slope_log2 >= kAlibiMinSlopeLog2 (LogitScalars::y_mul > 0)
// works in distance units instead: the logit is slope_log2 * (y + shift),
// y = pre(s) * y_mul + (col - pos relative to this thread's base) with the
// compile-time part an FFMA immediate, and shift this thread's base (the
// return value; 0 on tiles that straddle a row's position, whose y holds the
// whole -|distance|). The softmax scale is then slope_log2 (the kernel's
// scale_log2) and the shift goes into its max and exp2 (update<true>): one
// FFMA a score where the log2-unit form took an FFMA, half a bias FFMA and a
// subtraction in the exp2 argument. Distances are exact integers in float
// below 2^24.
constexpr float kAlibiMinSlopeLog2 = 1e-12f;

template <int kLogits, int kBlockM, int kBlockN, class TS, class TC, class TC0, class LS>
__device__ __forceinline__ float apply_logits(TS& acc_s, TC const& tSc, TC0 const& tSc0, const LS* ls, int col0) {
  Tensor s = make_tensor(acc_s.data(), acc_rowcol_layout(acc_s.layout()));
  Tensor c0 = make_tensor(tSc0.data(), acc_rowcol_layout(tSc0.layout()));
  constexpr int kRows = decltype(size<0>(s))::value;
  constexpr bool kCap = (kLogits & kLogitSoftcap) != 0;
  constexpr bool kAlibi = (kLogits & kLogitAlibi) != 0;
  const float qk_mul = ls->qk_mul;
  [[maybe_unused]] const float cap_log2 = kCap ? ls->cap_log2 : 0.f;
  // tanhf: tanh.approx.f32 under --use_fast_math, as in the SM80 kernels.
  auto pre = [&](float x) { return kCap ? tanhf(x * qk_mul) : x; };
  auto logit = [&](float x, float bias) {
    if constexpr (kCap) {
      const float t = pre(x);
      return kAlibi ? fmaf(t, cap_log2, bias) : t;  // (alone: cap_log2 is the softmax scale)
    } else {
      return kAlibi ? fmaf(x, qk_mul, bias) : x * qk_mul;
    }
  };
  if constexpr (!kAlibi) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int j = 0; j < size<1>(s); ++j) s(r, j) = logit(s(r, j), 0.f);
    }
    return 0.f;
  } else {
    const int rb = get<0>(tSc(0)) - get<0>(tSc0(0));
    const int cb = get<1>(tSc(0)) - get<1>(tSc0(0));
    const int64_t pos0 = ls->pos0;
    // pos - col = base + (r - c), (r, c) thread 0's tile coordinates.
    const float base = float(pos0 + (rb - cb) - col0);
    // Every row's position at or past every key of the tile (d >= 0), or
    // before every key (d <= 0): bias = -sign * slope * d, linear in (r - c).
    const bool below = pos0 - (col0 + kBlockN - 1) >= 0;
    const bool above = pos0 + (kBlockM - 1) - col0 <= 0;
    auto rc = [&](int r, int j) { return float(get<0>(c0(r, 0)) - get<1>(c0(r, j))); };  // compile-time
    const float y_mul = ls->y_mul;
    if (y_mul > 0.f) {  // distance units
      if (below) {  // y = pre * y_mul + (c - r), shift -base
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int j = 0; j < size<1>(s); ++j) s(r, j) = fmaf(pre(s(r, j)), y_mul, -rc(r, j));
        }
        return -base;
      }
      if (above) {  // y = pre * y_mul + (r - c), shift base
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int j = 0; j < size<1>(s); ++j) s(r, j) = fmaf(pre(s(r, j)), y_mul, rc(r, j));
        }
        return base;
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int j = 0; j < size<1>(s); ++j) s(r, j) = fmaf(pre(s(r, j)), y_mul, -fabsf(base + rc(r, j)));
      }
      return 0.f;
    }
    const float slope = ls->slope_log2;
    if (below || above) {
      const float k = below ? -slope : slope;
      const float kb = k * base;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int j = 0; j < size<1>(s); ++j) s(r, j) = logit(s(r, j), fmaf(k, rc(r, j), kb));
      }
    } else {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int j = 0; j < size<1>(s); ++j) s(r, j) = logit(s(r, j), -slope * fabsf(base + rc(r, j)));
      }
    }
    return 0.f;
  }
}

// Dropout of P (after the softmax's row sums, which stay undropped): the
// keep bits of this thread's S accumulator values ((2,2,BN/8): column pair,
// rows r / r + 8, 8-column MMA tile) two MMA tiles a Philox call (keep_oct).
// Which bit a value takes comes from thread 0's coordinates (compile-time)
// relative to the group's first value, so the value order is not assumed
// within a tile.
template <class TS, class TC, class TC0, class LS>
__device__ __forceinline__ void apply_dropout(TS& acc_s, TC const& tSc, TC0 const& tSc0, const LS* ls, int batch,
                                              int head, int row0, int col0) {
  static_assert(decltype(size(acc_s))::value % 8 == 0);
  const uint32_t seed[2] = {ls->seed[0], ls->seed[1]};
  const uint32_t threshold = ls->drop_threshold;
#pragma unroll
  for (int i = 0; i < size(acc_s); i += 8) {
    bool k[8];
    keep_oct(seed, batch, head, threshold, row0 + get<0>(tSc(i)), col0 + get<1>(tSc(i)), col0 + get<1>(tSc(i + 4)), k);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int g = i + (j & 4);  // first value of this j's MMA tile
      const int dr = get<0>(tSc0(i + j)) - get<0>(tSc0(g)), dc = get<1>(tSc0(i + j)) - get<1>(tSc0(g));
      if (!k[(j & 4) + (dr >> 3) * 2 + dc]) acc_s(i + j) = 0.f;
    }
  }
}

// Per work tile values of the transforms, as apply_logits and apply_dropout
// read them (ls->...): from the tile's Variant (its head's ALiBi slope).
struct LogitValues {
  int64_t pos0;      // absolute position of the query tile's row 0 (row0 + offset)
  float qk_mul;      // soft-cap: scale / cap; else scale * log2(e)
  float cap_log2;    // soft-cap: cap * log2(e)
  float slope_log2;  // ALiBi: slope * log2(e)
  uint32_t seed[2];  // dropout: the Philox key
  uint32_t drop_threshold;
  float keep_scale;  // dropout: 1 / (1 - rate)
  float y_mul;       // ALiBi in distance units: qk_mul (soft-cap: cap_log2) / slope_log2; else 0
};

template <int kLogits>
__device__ __forceinline__ LogitValues logit_values(const FwdParams& p, const Variant& var, int row0) {
  LogitValues ls;
  const bool cap = (kLogits & kLogitSoftcap) != 0;
  ls.pos0 = int64_t(row0) + var.offset;
  ls.qk_mul = cap ? p.scale / p.softcap : p.scale * 1.4426950408889634f;
  ls.cap_log2 = cap ? p.softcap * 1.4426950408889634f : 0.f;
  ls.slope_log2 = var.alibi_log2;
  ls.y_mul = 0.f;
  if constexpr ((kLogits & kLogitAlibi) != 0) {
    const float slope_log2 = var.alibi_log2;  // (NaN: not >=)
    if (slope_log2 >= kAlibiMinSlopeLog2) ls.y_mul = (cap ? ls.cap_log2 : ls.qk_mul) / slope_log2;
  }
  ls.seed[0] = var.seed[0];
  ls.seed[1] = var.seed[1];
  ls.drop_threshold = var.drop_threshold;
  ls.keep_scale = var.keep_scale;
  return ls;
}

// The softmax's scale for the logits apply_logits leaves (kTransform: the
// soft-cap / ALiBi bits): soft-cap alone, cap * log2(e) (tanh is left);
// ALiBi in distance units, the slope; other logits are in log2 units (1);
// no transform, the plain scale * log2(e).
template <int kTransform>
__device__ __forceinline__ float logits_softmax_scale(const LogitValues& ls, float scale_log2) {
  if constexpr (kTransform == kLogitSoftcap) return ls.cap_log2;
  else if constexpr ((kTransform & kLogitAlibi) != 0) return ls.y_mul > 0.f ? ls.slope_log2 : 1.f;
  else if constexpr (kTransform != 0) return 1.f;
  else return scale_log2;
}

}  // namespace jax_flash::cuda::fwd
