// Soft-cap, ALiBi and dropout (cuda::Variant's logit transforms; the
// fwd::kLogit* bits) in the warp-specialised Hopper backward, on top of
// the masks-only variants (Cfg::kLogits implies Cfg::kMasks). The per-CTA
// values sit in shared memory; the producer adds each stage's q head's
// ALiBi slope. The tile math is in sm90/bwd_logits_tile.cuh (it
// has the formulas): soft-cap leaves t = tanh in the S^T registers under
// the dP^T wgmma and makes P^T and dS^T together once dP^T is there;
// ALiBi alone folds the bias into the exponent; dropout's keep bits are
// made under the S^T / dP^T wgmmas and dV takes the dropped P^T.
#pragma once

#include <cstdint>

#include "cuda/common/variants.cuh"
#include "cuda/sm90/bwd_logits_tile.cuh"  // logits_pass1, softcap_pass2, dropout_bits_t, AlibiTile
#include "params.h"

namespace jax_flash::cuda::sm90 {

using fwd::kLogitAlibi;
using fwd::kLogitDropout;
using fwd::kLogitSoftcap;

template <int kStages>
struct BwdLogitSmem {
  float qk_mul;            // soft-cap: scale / cap
  float cap_log2;          // soft-cap: cap log2(e)
  float slope[kStages];    // ALiBi: the stage's q head's slope
  uint32_t seed[2];        // dropout: the Philox key
  uint32_t drop_threshold;
  float keep_scale;        // dropout: 1 / (1 - rate)
};

// Thread 0: the per-CTA values (before the setup's __syncthreads).
template <class LogitSmem>
__device__ __forceinline__ void bwd_logits_setup(const BwdParams& p, LogitSmem& ls) {
  ls.qk_mul = p.softcap > 0.f ? p.scale / p.softcap : 0.f;
  ls.cap_log2 = p.softcap > 0.f ? p.softcap * bwd::kLog2e : 0.f;
  if (variant_dropout(p)) {
    ls.seed[0] = p.dropout_seed[0];
    ls.seed[1] = p.dropout_seed[1];
    ls.drop_threshold = dropout_threshold(p.dropout_rate);
    ls.keep_scale = p.dropout_rate < 1.f ? 1.f / (1.f - p.dropout_rate) : 0.f;
  }
}

}  // namespace jax_flash::cuda::sm90
