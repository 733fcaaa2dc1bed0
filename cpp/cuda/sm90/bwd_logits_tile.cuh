// Soft-cap, ALiBi and dropout (cuda::Variant::logit_log2; the fwd::kLogit*
// bits) on a keys x queries tile of the Hopper backward, for the
// warp-specialised kernel's kLogits instantiations (sm90/bwd_logits.cuh).
//
// On one keys x queries tile (S^T: rows are keys, columns queries), with
// l2 = lse log2(e) per query, x the raw score, t = tanh(x scale / cap):
//   logit (log2 units) = cap log2(e) t + bias  (soft-cap; else x scale log2(e) + bias)
//   bias               = -slope log2(e) |pos(query) - key|  (ALiBi; else 0)
//   P^T  = exp2(logit - l2),  dS^T = P^T (dP^T - D) (1 - t^2)
// The kernel applies the softmax scale to dK / dQ as in the plain kernel.
// Without soft-cap everything up to P^T is done under the dP^T wgmma (pass
// 1, ALiBi's bias folded into the exp2 argument) and dS^T is the plain one.
// With soft-cap, pass 1 leaves t in the S^T registers (the tanh under the
// wgmma) and pass 2, once dP^T is there, makes P^T and dS^T element by
// element, so t needs no tile of its own. Masks as a separate pass after
// either (masks_t; interleaved, ptxas serialised the wgmmas: C7519).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/common/bwd_rows.cuh"       // lse_to_log2, kLog2e
#include "cuda/common/variants.cuh"       // variant_dropout, dropout_words
#include "cuda/sm90/bwd_masks_tile.cuh"  // masks_t
#include "cuda/sm90/fwd_logits.cuh"      // kLogitSoftcap, kLogitAlibi, kLogitDropout, LogitsOf
#include "params.h"

namespace jax_flash::cuda::bwd90 {

using namespace cute;
using fwd::kLogitAlibi;
using fwd::kLogitSoftcap;

// The logit transform set of a launch (fwd::kLogit* bits, dropout's
// included; 0: none).
__host__ __device__ inline int logits_kind(const FwdParams& p) {
  return (p.softcap > 0.f ? kLogitSoftcap : 0) | (p.alibi_slopes != nullptr ? kLogitAlibi : 0) |
         (variant_dropout(p) ? fwd::kLogitDropout : 0);
}

// ALiBi on one tile: bias(r, c) = -slope |base + rc|, rc = (query - key) of
// thread 0's coordinates (compile-time), base this thread's offset plus the
// tile's. Tiles with every query at or past every key (all off-diagonal
// causal tiles), or before every key, take it as k (base + rc): one FFMA of
// an immediate.
struct AlibiTile {
  float slope, base, k;
  bool one_sided;
  __device__ __forceinline__ AlibiTile(float slope_log2, int64_t pos0, int n0, int M, int N, int rb, int cb)
      : slope(slope_log2), base(float(pos0 - n0 + (cb - rb))) {
    const bool below = pos0 - (n0 + N - 1) >= 0;  // dist >= 0 everywhere
    const bool above = pos0 + (M - 1) - n0 <= 0;  // dist <= 0 everywhere
    one_sided = below || above;
    k = below ? -slope : slope;
  }
};

// The exp2 argument's part other than the score's, at (r, c) given the
// column's l2: -l2 plus the ALiBi bias (kAlibi), on one loop of the tile per
// case (one-sided or not: uniform over the tile, so no branch per element).
// `loop` is called with a functor (r, c, l2) -> argument.
template <bool kAlibi, class TC0, class Loop>
__device__ __forceinline__ void with_bias(TC0 const& tSc0_rc, const AlibiTile& al, Loop&& loop) {
  auto rc = [&](int r, int c) { return float(get<1>(tSc0_rc(r, c)) - get<0>(tSc0_rc(r, c))); };
  if constexpr (!kAlibi) {
    loop([&](int, int, float l2) { return -l2; });
  } else if (al.one_sided) {
    loop([&](int r, int c, float l2) { return fmaf(al.k, rc(r, c), fmaf(al.k, al.base, -l2)); });
  } else {
    loop([&](int r, int c, float l2) { return fmaf(-al.slope, fabsf(al.base + rc(r, c)), -l2); });
  }
}

// Pass 1, under the dP^T wgmma. Soft-cap: s <- t. ALiBi alone: s <- P^T.
// kLse2: lse holds lse log2(e) already (the warp-specialised kernel's stages).
template <int kLogits, bool kLse2 = false, class TS, class TC0>
__device__ __forceinline__ void logits_pass1(TS& s, TC0 const& tSc0_rc, int cb, const float* lse, float scale_log2,
                                             float qk_mul, const AlibiTile& al) {
  constexpr int kRows = decltype(size<0>(s))::value;
  if constexpr ((kLogits & kLogitSoftcap) != 0) {
#pragma unroll
    for (int c = 0; c < size<1>(s); ++c) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) s(r, c) = tanhf(s(r, c) * qk_mul);  // tanh.approx (fast math)
    }
  } else {
    with_bias<true>(tSc0_rc, al, [&](auto&& arg) {
#pragma unroll
      for (int c = 0; c < size<1>(s); ++c) {
        const float lv = lse[cb + get<1>(tSc0_rc(0, c))];
        const float l2 = kLse2 ? lv : bwd::lse_to_log2(lv);
#pragma unroll
        for (int r = 0; r < kRows; ++r) s(r, c) = exp2f(fmaf(s(r, c), scale_log2, arg(r, c, l2)));
      }
    });
  }
}

// Pass 2 with soft-cap, once dP^T is there: s holds t, ds dP^T; s <- P^T,
// ds <- dS^T.
template <int kLogits, bool kLse2 = false, class TS, class TD, class TC0>
__device__ __forceinline__ void softcap_pass2(TS& s, TD& ds, TC0 const& tSc0_rc, int cb, const float* lse,
                                              const float* dsum, float cap_log2, const AlibiTile& al) {
  static_assert((kLogits & kLogitSoftcap) != 0);
  constexpr int kRows = decltype(size<0>(s))::value;
  with_bias<(kLogits & kLogitAlibi) != 0>(tSc0_rc, al, [&](auto&& arg) {
#pragma unroll
    for (int c = 0; c < size<1>(s); ++c) {
      const int qc = cb + get<1>(tSc0_rc(0, c));
      const float l2 = kLse2 ? lse[qc] : bwd::lse_to_log2(lse[qc]), dd = dsum[qc];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float t = s(r, c);
        const float pv = exp2f(fmaf(t, cap_log2, arg(r, c, l2)));
        s(r, c) = pv;
        ds(r, c) = pv * fmaf(-t, t, 1.f) * (ds(r, c) - dd);
      }
    }
  });
}

// Dropout keep bits of this thread's S^T values (keys x queries, row-col
// view: rows r = keys g, g + 8 of the warp's 16; columns c = 2 n + e, query
// 2 t + e of 8-query MMA tile n), 32 columns a word: bit 8 c16 + 2 k + hf of
// word c / 16, where c16 = (c / 4) % 4 is the 16-query block, k = 2 r + c % 2
// and hf = (c / 2) % 2.
template <int C>
struct KeepBitsT {
  static_assert(C % 16 == 0);
  uint32_t word[C / 16];
  __device__ __forceinline__ bool operator()(int r, int c) const {
    return (word[c / 16] >> (8 * ((c / 4) % 4) + 2 * (2 * r + c % 2) + (c / 2) % 2)) & 1u;
  }
};

// A Philox call covers queries {a, a + 8} (a % 16 < 8) x 4 keys (dropout.h);
// here four lanes hold its elements, those of equal t whose g share g / 4.
// Per 16-query block those four lanes need the same four calls (query a =
// 2t or 2t + 1, the keys around g or g + 8): lane j = g % 4 computes call k =
// j (all its blocks' calls first, so that their rounds interleave), packs
// the 8 keep bits of each (bit 8 c16 + 2 w + hf: word w, half hf) into one
// word, and three shuffles hand every lane the packs of the other three
// calls; each lane keeps the bits of word j and moves call k's to 2 k. One
// call per 8 elements, as in the forward; no branches, no lane-dependent
// register indices. All 32 lanes of the warp call it.
template <class TC>
__device__ __forceinline__ auto dropout_bits_t(TC const& tSc_rc, const uint32_t (&seed)[2], uint32_t threshold,
                                               int b, int h, int m0, int n0) {
  constexpr int R = decltype(size<0>(tSc_rc))::value, C = decltype(size<1>(tSc_rc))::value;
  static_assert(R == 2 && C % 16 == 0);
  const int j = (threadIdx.x >> 2) & 3;
  const int key = n0 + get<0>(tSc_rc(0, 0)) + 8 * (j >> 1);  // rows 0 / 1: keys g / g + 8
  KeepBitsT<C> keep;
#pragma unroll
  for (int gi = 0; gi < C / 16; ++gi) {
    Philox4 w[4];
#pragma unroll
    for (int c16 = 0; c16 < 4; ++c16) {
      // This lane's call: the query of column 4 c16 + (j & 1) (a, a % 16 < 8).
      const int query = m0 + get<1>(tSc_rc(0, 16 * gi + 4 * c16)) + (j & 1);
      w[c16] = dropout_words(seed, b, h, query, key);
    }
    uint32_t own = 0;
#pragma unroll
    for (int c16 = 0; c16 < 4; ++c16) {
      const uint32_t x[4] = {w[c16].x, w[c16].y, w[c16].z, w[c16].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        own |= uint32_t((x[i] & 0xFFFFu) >= threshold) << (8 * c16 + 2 * i);
        own |= uint32_t((x[i] >> 16) >= threshold) << (8 * c16 + 2 * i + 1);
      }
    }
    uint32_t bits = 0;
#pragma unroll
    for (int m = 0; m < 4; ++m) {  // the pack of call k = j ^ m
      const uint32_t pack = m == 0 ? own : __shfl_xor_sync(0xffffffffu, own, 4 * m);
      bits |= ((pack >> (2 * j)) & 0x03030303u) << (2 * (j ^ m));
    }
    keep.word[gi] = bits;
  }
  return keep;
}

}  // namespace jax_flash::cuda::bwd90
