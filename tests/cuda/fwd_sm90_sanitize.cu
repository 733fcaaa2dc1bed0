// Driver for compute-sanitizer (memcheck, racecheck, synccheck) over the
// warp-specialised Hopper forward: a few small plain cases with odd sizes,
// causal and not, GQA, every kernel head dim (padded 40 too), each with the
// tile counter (dynamic schedule) and one without (fixed stride). Outputs are
// poisoned (NaN bytes) first and must come back finite. Correctness against
// a reference is tests/test_cuda_forward.py's job.
//   bash tests/cuda/sanitize_sm90.sh fwd   (builds this and runs the three tools)
//   fwd_sm90_sanitize --profile D [causal]: one FA2-grid launch (16k tokens,
//   hidden 2048) for ncu.
#include <cmath>
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
};

static cudaError_t run(const FwdParams& p) {
  if (p.head_dim <= 64) return jf::run_fwd_sm90_hdim<DType::kBFloat16, 64>(p, 0);
  if (p.head_dim <= 128) return jf::run_fwd_sm90_hdim<DType::kBFloat16, 128>(p, 0);
  return jf::run_fwd_sm90_hdim<DType::kBFloat16, 256>(p, 0);
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
  CHECK(run(p));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(ho.data(), o, nq * 2, cudaMemcpyDeviceToHost));
  std::vector<float> hl(size_t(c.b) * c.hq * c.sq);
  CHECK(cudaMemcpy(hl.data(), lse, hl.size() * 4, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (auto x : ho) bad += !std::isfinite(__bfloat162float(x));
  for (float x : hl) bad += !std::isfinite(x);
  std::printf("b=%d sq=%d sk=%d hq=%d hkv=%d d=%d causal=%d counter=%d: %zu non-finite\n", c.b, c.sq, c.sk, c.hq, c.hkv,
              c.d, int(c.causal), int(c.counter), bad);
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(lse), cudaFree(counter);
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
  };
  int fails = 0;
  for (const Case& c : cases) fails += run_case(c, rng);
  std::printf("%d case(s) failed\n", fails);
  return fails != 0;
}
