// Driver for compute-sanitizer (memcheck, racecheck, synccheck) over the
// warp-specialised Hopper forward: a few small plain cases with odd sizes,
// causal and not, GQA, every kernel head dim (padded 40 too), each with the
// tile counter (dynamic schedule) and one without (fixed stride); then the
// masks and logits variants. Outputs are poisoned (NaN bytes) first and
// must come back finite (an LSE may be -inf where a variant leaves a row no
// key). Correctness against a reference is tests/test_cuda_forward.py's and
// tests/test_cuda_variants.py's job.
//   bash tests/cuda/sanitize_sm90.sh fwd   (builds this and runs the three tools)
//   fwd_sm90_sanitize --profile D [causal]: one FA2-grid launch (16k tokens,
//   hidden 2048) for ncu.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <random>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "cuda/fwd_dispatch.h"
#include "params.h"
#include "sanitize_check.h"

using jax_flash::DType;
using jax_flash::FwdParams;
namespace jf = jax_flash::cuda;

struct Case {
  int b, sq, sk, hq, hkv, d;
  bool causal, counter;
  // Masks-only variants (the kMasks kernels): a left window (-1: none),
  // per-batch lengths (sq - 7b, sk - 5b), segment ids in runs of `doc`
  // tokens (0: none).
  int window = -1;
  bool lengths = false;
  int doc = 0;
  // Logit transforms and dropout (the kLogits kernels).
  float softcap = 0.f;
  bool alibi = false;
  float dropout = 0.f;
  bool logits() const { return softcap > 0.f || alibi || dropout > 0.f; }
  bool masks() const { return window >= 0 || lengths || doc > 0; }
};

static cudaError_t run(const Case& c, const FwdParams& p) {
  constexpr DType bf = DType::kBFloat16;
  if (c.dropout > 0.f && (c.softcap > 0.f || c.alibi)) {  // dropout with a logit transform
    if (p.head_dim <= 64) return jf::run_fwd_sm90_logits_dropout_hdim<bf, 64>(p, 0);
    if (p.head_dim <= 128) return jf::run_fwd_sm90_logits_dropout_hdim<bf, 128>(p, 0);
    return jf::run_fwd_sm90_logits_dropout_hdim<bf, 256>(p, 0);
  }
  if (c.logits()) {
    if (p.head_dim <= 64) return jf::run_fwd_sm90_logits_hdim<bf, 64>(p, 0);
    return jf::run_fwd_sm90_logits_hdim<bf, 128>(p, 0);
  }
  if (c.masks()) {
    if (p.head_dim <= 64) return jf::run_fwd_sm90_masks_hdim<bf, 64>(p, 0);
    if (p.head_dim <= 128) return jf::run_fwd_sm90_masks_hdim<bf, 128>(p, 0);
    return jf::run_fwd_sm90_masks_hdim<bf, 256>(p, 0);
  }
  if (p.head_dim <= 64) return jf::run_fwd_sm90_hdim<bf, 64>(p, 0);
  if (p.head_dim <= 128) return jf::run_fwd_sm90_hdim<bf, 128>(p, 0);
  return jf::run_fwd_sm90_hdim<bf, 256>(p, 0);
}

static int run_case(const Case& c, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  const size_t nq = size_t(c.b) * c.sq * c.hq * c.d, nk = size_t(c.b) * c.sk * c.hkv * c.d;
  std::vector<__nv_bfloat16> hq(nq), hk(nk), hv(nk), ho(nq);
  for (auto& x : hq) x = __float2bfloat16(nd(rng));
  for (auto& x : hk) x = __float2bfloat16(nd(rng));
  for (auto& x : hv) x = __float2bfloat16(nd(rng));
  __nv_bfloat16 *q, *k, *v, *o;
  float* lse;
  int32_t* counter;
  CHECK(cudaMalloc(&q, nq * 2));
  CHECK(cudaMalloc(&k, nk * 2));
  CHECK(cudaMalloc(&v, nk * 2));
  CHECK(cudaMalloc(&o, nq * 2));
  CHECK(cudaMalloc(&lse, size_t(c.b) * c.hq * c.sq * 4));
  CHECK(cudaMalloc(&counter, 4));
  CHECK(cudaMemcpy(q, hq.data(), nq * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(k, hk.data(), nk * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(v, hv.data(), nk * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(o, 0xFF, nq * 2));
  CHECK(cudaMemset(lse, 0xFF, size_t(c.b) * c.hq * c.sq * 4));
  FwdParams p;
  p.q = q, p.k = k, p.v = v, p.o = o, p.lse = lse;
  p.batch = c.b, p.seqlen_q = c.sq, p.seqlen_k = c.sk, p.heads_q = c.hq, p.heads_kv = c.hkv, p.head_dim = c.d;
  p.q_row_stride = p.o_row_stride = int64_t(c.hq) * c.d, p.q_head_stride = p.o_head_stride = c.d;
  p.q_batch_stride = p.o_batch_stride = int64_t(c.sq) * c.hq * c.d;
  p.k_row_stride = p.v_row_stride = int64_t(c.hkv) * c.d, p.k_head_stride = p.v_head_stride = c.d;
  p.k_batch_stride = p.v_batch_stride = int64_t(c.sk) * c.hkv * c.d;
  p.scale = 1.f / std::sqrt(float(c.d));
  p.causal = c.causal;
  p.dtype = DType::kBFloat16;
  p.tile_counter = c.counter ? counter : nullptr;
  std::vector<void*> owned;
  CHECK(set_options(c, p, owned) ? cudaSuccess : cudaErrorMemoryAllocation);
  CHECK(run(c, p));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(ho.data(), o, nq * 2, cudaMemcpyDeviceToHost));
  std::vector<float> hl(size_t(c.b) * c.hq * c.sq);
  CHECK(cudaMemcpy(hl.data(), lse, hl.size() * 4, cudaMemcpyDeviceToHost));
  // Every output written (the poison gone): O finite; LSE finite, or -inf
  // for a row that sees no key (variants).
  size_t bad = 0;
  for (auto x : ho) bad += !std::isfinite(__bfloat162float(x));
  for (float x : hl) bad += !(std::isfinite(x) || (c.masks() && x == -INFINITY));
  std::printf("b=%d sq=%d sk=%d hq=%d hkv=%d d=%d causal=%d counter=%d window=%d lengths=%d doc=%d softcap=%g "
              "alibi=%d dropout=%g: %zu unwritten or non-finite\n",
              c.b, c.sq, c.sk, c.hq, c.hkv, c.d, int(c.causal), int(c.counter), c.window, int(c.lengths), c.doc,
              c.softcap, int(c.alibi), c.dropout, bad);
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(lse), cudaFree(counter);
  for (void* x : owned) cudaFree(x);
  return bad != 0;
}

int main(int argc, char** argv) {
  std::mt19937 rng(7);
  if (argc > 2 && std::string(argv[1]) == "--profile") {
    const int d = std::atoi(argv[2]);
    const bool causal = argc > 3 && std::atoi(argv[3]) != 0;
    return run_case({1, 16384, 16384, 2048 / d, 2048 / d, d, causal, true}, rng);
  }
  const Case cases[] = {
      {1, 1, 1, 1, 1, 64, false, true},     {2, 129, 200, 4, 2, 64, true, true},  {1, 300, 131, 2, 1, 128, true, true},
      {1, 17, 1000, 2, 2, 256, false, true}, {2, 257, 257, 2, 1, 128, false, false}, {1, 383, 129, 2, 2, 40, true, true},
      {1, 640, 640, 3, 1, 256, true, true},
      // d64 on three warpgroups (192-row tiles): causal warpgroups skip key
      // tiles, the last tiles' past-the-end warpgroups all of them
      {2, 1031, 2049, 4, 2, 64, true, true}, {1, 1024, 1024, 2, 2, 64, false, true},
      // d256 with more work tiles (160) than CTAs: the warpgroups hand the
      // shared O buffer over across tiles
      {4, 1000, 130, 5, 1, 256, false, true},
      // the masks kernels: window + lengths (batch 1 with 7 fewer rows; an
      // empty batch), segment ids (skipped tiles; 33 key tiles, past one
      // 32-tile walk round), d256
      {2, 300, 300, 4, 2, 64, true, true, 70, true, 0},  {2, 7, 300, 2, 1, 128, false, true, -1, true, 0},
      {2, 333, 333, 2, 1, 128, true, true, -1, false, 90}, {1, 4200, 4200, 1, 1, 128, false, true, -1, false, 4100},
      {1, 700, 700, 2, 2, 256, true, true, 100, true, 150},
      // the logits kernels: soft-cap + ALiBi with segment ids, soft-cap alone, dropout with a window
      {2, 333, 300, 4, 2, 64, true, true, -1, false, 90, 20.f, true}, {1, 257, 300, 2, 1, 128, false, true, -1, true, 0, 30.f},
      {2, 300, 300, 2, 2, 128, true, true, 80, false, 0, 0.f, false, 0.2f},
      // dropout with soft-cap and / or ALiBi: d64 soft-cap, d128 ALiBi with segment ids, d256 both
      {2, 333, 300, 4, 2, 64, true, true, -1, false, 0, 30.f, false, 0.15f},
      {1, 257, 300, 2, 1, 128, false, true, 70, false, 60, 0.f, true, 0.1f},
      {1, 300, 333, 2, 2, 256, true, true, -1, true, 0, 20.f, true, 0.2f},
  };
  int fails = 0;
  for (const Case& c : cases) fails += run_case(c, rng);
  std::printf("%d case(s) failed\n", fails);
  return fails != 0;
}
