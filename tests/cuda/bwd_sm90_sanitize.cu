// Driver for compute-sanitizer (memcheck, racecheck, synccheck) over the
// warp-specialised Hopper backward: small plain cases with odd sizes, causal
// and not, GQA, head dims 64, 128 and 256 (and head dims padded to them),
// atomic and deterministic, and the masks and logits variants (deterministic
// too; with segment ids the masks-only kSegOrder kernels). Inputs are
// random (LSE too: the kernel only needs it finite); outputs are poisoned
// (NaN bytes) first and must come back finite. Correctness against a
// reference is tests/test_cuda_backward.py's job.
//   bash tests/cuda/sanitize_sm90.sh bwd   (builds this and runs the three tools)
//   bwd_sm90_sanitize --profile D [causal]: one FA2-grid backward (16k
//   tokens, hidden 2048) for ncu.
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "cuda/bwd_dispatch.h"
#include "params.h"
#include "sanitize_check.h"

using jax_flash::BwdParams;
using jax_flash::DType;
namespace jf = jax_flash::cuda;

struct Case {
  int b, sq, sk, hq, hkv, d;
  bool causal, deterministic;
  // Masks-only variants (the kMasks kernel): a left window (-1: none),
  // per-batch lengths (sq - 7b, sk - 5b), segment ids in runs of `doc`
  // tokens (0: none).
  int window = -1;
  bool lengths = false;
  int doc = 0;
  // Logit transforms (the kLogits kernels): soft-cap, ALiBi, dropout rate.
  float softcap = 0.f;
  bool alibi = false;
  float dropout = 0.f;
  bool logits() const { return softcap > 0.f || alibi || dropout > 0.f; }
  bool masks() const { return window >= 0 || lengths || doc > 0; }
};

static int run_case(const Case& c, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  const size_t nq = size_t(c.b) * c.sq * c.hq * c.d, nk = size_t(c.b) * c.sk * c.hkv * c.d;
  const size_t nl = size_t(c.b) * c.hq * c.sq;
  auto upload = [&](size_t n, float add, void** dst) {
    std::vector<__nv_bfloat16> h(n);
    for (auto& x : h) x = __float2bfloat16(nd(rng) + add);
    if (cudaMalloc(dst, n * 2) != cudaSuccess) return false;
    return cudaMemcpy(*dst, h.data(), n * 2, cudaMemcpyHostToDevice) == cudaSuccess;
  };
  void *q, *k, *v, *o, *dout, *dq, *dk, *dv, *ws;
  float* lse;
  if (!upload(nq, 0.f, &q) || !upload(nk, 0.f, &k) || !upload(nk, 0.f, &v) || !upload(nq, 0.f, &o) ||
      !upload(nq, 0.f, &dout))
    return 1;
  std::vector<float> hl(nl);
  for (auto& x : hl) x = 3.f + nd(rng);
  CHECK(cudaMalloc(&lse, nl * 4));
  CHECK(cudaMemcpy(lse, hl.data(), nl * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&dq, nq * 2));
  CHECK(cudaMalloc(&dk, nk * 2));
  CHECK(cudaMalloc(&dv, nk * 2));
  CHECK(cudaMemset(dq, 0xFF, nq * 2));
  CHECK(cudaMemset(dk, 0xFF, nk * 2));
  CHECK(cudaMemset(dv, 0xFF, nk * 2));
  BwdParams p;
  p.q = q, p.k = k, p.v = v, p.o = o, p.lse = lse, p.dout = dout, p.dq = dq, p.dk = dk, p.dv = dv;
  p.batch = c.b, p.seqlen_q = c.sq, p.seqlen_k = c.sk, p.heads_q = c.hq, p.heads_kv = c.hkv, p.head_dim = c.d;
  const int64_t qrow = int64_t(c.hq) * c.d, krow = int64_t(c.hkv) * c.d;
  p.q_row_stride = p.o_row_stride = p.do_row_stride = p.dq_row_stride = qrow;
  p.q_head_stride = p.o_head_stride = p.do_head_stride = p.dq_head_stride = c.d;
  p.q_batch_stride = p.o_batch_stride = p.do_batch_stride = p.dq_batch_stride = qrow * c.sq;
  p.k_row_stride = p.v_row_stride = p.dk_row_stride = p.dv_row_stride = krow;
  p.k_head_stride = p.v_head_stride = p.dk_head_stride = p.dv_head_stride = c.d;
  p.k_batch_stride = p.v_batch_stride = p.dk_batch_stride = p.dv_batch_stride = krow * c.sk;
  p.scale = 1.f / std::sqrt(float(c.d));
  p.causal = c.causal;
  p.deterministic = c.deterministic;
  p.dtype = DType::kBFloat16;
  std::vector<void*> owned;
  CHECK(set_options(c, p, owned) ? cudaSuccess : cudaErrorMemoryAllocation);
  // The kernel's head dim: other head dims run zero-padded on it.
  const int kd = c.d <= 64 ? 64 : c.d <= 128 ? 128 : 256;
  const size_t ws_bytes = jf::bwd_dsum_bytes(p) + jf::bwd_accum_bytes(p, kd);  // (order counters: in dq)
  CHECK(cudaMalloc(&ws, ws_bytes));
  p.workspace = ws;
  jf::BwdLaunchFlags flags;
  flags.vec_ok = flags.pair_ok = true;
  // The launcher dispatch_bwd would pick (bwd_launch.cu) for this case.
  const bool drop_sets = c.dropout > 0.f && (c.softcap > 0.f || c.alibi);
  const bool seg_order = c.deterministic && c.doc > 0;
  auto logits_seg_order = [&]() {
    constexpr DType kB = DType::kBFloat16;
    if (kd == 256)
      return drop_sets ? jf::run_bwd_sm90_wide_logits_seg_order_hdim<kB, 256, true>(p, flags, 0)
                       : jf::run_bwd_sm90_wide_logits_seg_order_hdim<kB, 256, false>(p, flags, 0);
    if (kd == 64)
      return drop_sets ? jf::run_bwd_sm90_logits_seg_order_hdim<kB, 64, true>(p, flags, 0)
                       : jf::run_bwd_sm90_logits_seg_order_hdim<kB, 64, false>(p, flags, 0);
    return drop_sets ? jf::run_bwd_sm90_logits_seg_order_hdim<kB, 128, true>(p, flags, 0)
                     : jf::run_bwd_sm90_logits_seg_order_hdim<kB, 128, false>(p, flags, 0);
  };
  const cudaError_t launched =
      c.logits() && seg_order ? logits_seg_order()
      : c.logits() && kd == 256
                  ? (drop_sets ? jf::run_bwd_sm90_wide_logits_hdim<DType::kBFloat16, 256, true>(p, flags, 0)
                               : jf::run_bwd_sm90_wide_logits_hdim<DType::kBFloat16, 256, false>(p, flags, 0))
      : c.logits() && drop_sets
                  ? (kd == 64 ? jf::run_bwd_sm90_logits_dropout_hdim<DType::kBFloat16, 64>(p, flags, 0)
                              : jf::run_bwd_sm90_logits_dropout_hdim<DType::kBFloat16, 128>(p, flags, 0))
      : c.logits()  ? (kd == 64 ? jf::run_bwd_sm90_logits_hdim<DType::kBFloat16, 64>(p, flags, 0)
                              : jf::run_bwd_sm90_logits_hdim<DType::kBFloat16, 128>(p, flags, 0))
      : c.masks() && seg_order
                  ? (kd == 64    ? jf::run_bwd_sm90_masks_seg_order_hdim<DType::kBFloat16, 64>(p, flags, 0)
                     : kd == 128 ? jf::run_bwd_sm90_masks_seg_order_hdim<DType::kBFloat16, 128>(p, flags, 0)
                                 : jf::run_bwd_sm90_wide_masks_seg_order_hdim<DType::kBFloat16, 256>(p, flags, 0))
      : c.masks() ? (kd == 64    ? jf::run_bwd_sm90_masks_hdim<DType::kBFloat16, 64>(p, flags, 0)
                     : kd == 128 ? jf::run_bwd_sm90_masks_hdim<DType::kBFloat16, 128>(p, flags, 0)
                                 : jf::run_bwd_sm90_wide_masks_hdim<DType::kBFloat16, 256>(p, flags, 0))
      : kd == 256 ? jf::run_bwd_sm90_wide_hdim<DType::kBFloat16, 256>(p, flags, 0)
                  : (kd == 64 ? jf::run_bwd_sm90_hdim<DType::kBFloat16, 64>(p, flags, 0)
                              : jf::run_bwd_sm90_hdim<DType::kBFloat16, 128>(p, flags, 0));
  CHECK(launched);
  CHECK(cudaDeviceSynchronize());
  size_t bad = 0;
  for (auto [ptr, n] : {std::pair<void*, size_t>{dq, nq}, {dk, nk}, {dv, nk}}) {
    std::vector<__nv_bfloat16> h(n);
    CHECK(cudaMemcpy(h.data(), ptr, n * 2, cudaMemcpyDeviceToHost));
    for (auto x : h) bad += !std::isfinite(__bfloat162float(x));
  }
  std::printf("b=%d sq=%d sk=%d hq=%d hkv=%d d=%d causal=%d deterministic=%d window=%d lengths=%d doc=%d softcap=%g "
              "alibi=%d dropout=%g: %zu non-finite\n",
              c.b, c.sq, c.sk, c.hq, c.hkv, c.d, int(c.causal), int(c.deterministic), c.window, int(c.lengths), c.doc,
              c.softcap, int(c.alibi), c.dropout, bad);
  for (void* ptr : {q, k, v, o, dout, dq, dk, dv, ws, static_cast<void*>(lse)}) cudaFree(ptr);
  for (void* x : owned) cudaFree(x);
  return bad != 0;
}

int main(int argc, char** argv) {
  std::mt19937 rng(7);
  if (argc > 2 && std::string(argv[1]) == "--profile") {
    const int d = std::atoi(argv[2]);
    const bool causal = argc > 3 && std::atoi(argv[3]) != 0;
    return run_case({1, 16384, 16384, 2048 / d, 2048 / d, d, causal, false}, rng);
  }
  const Case cases[] = {
      {1, 1, 1, 1, 1, 64, false, false},      {2, 129, 200, 4, 2, 64, true, false},
      {1, 300, 131, 2, 1, 128, true, false},  {2, 257, 257, 2, 1, 128, false, false},
      {1, 383, 129, 2, 2, 64, true, true},    {1, 200, 390, 4, 2, 128, false, true},
      {1, 520, 520, 2, 1, 128, true, true},
      // head dim 256 (the wide kernel): GQA causal, odd non-causal, deterministic (ordered dQ adds;
      // the non-causal one rotated)
      {1, 383, 200, 4, 1, 256, true, false},  {2, 129, 257, 2, 2, 256, false, false},
      {1, 300, 131, 2, 1, 256, true, true},   {1, 300, 131, 2, 1, 256, false, true},
      // the masks kernel: window, lengths, segment ids (skipped tiles), deterministic
      {2, 300, 300, 4, 2, 64, true, false, 70, true, 0}, {2, 333, 333, 2, 1, 128, true, false, -1, false, 90},
      {1, 700, 700, 2, 2, 64, false, false, -1, true, 150}, {2, 400, 410, 2, 1, 128, true, true, 100, true, 0},
      // the logits kernels: soft-cap + ALiBi with segment ids, soft-cap alone, dropout with a window
      {2, 333, 300, 4, 2, 64, true, false, -1, false, 90, 20.f, true}, {1, 257, 300, 2, 1, 128, false, false, -1, true, 0, 30.f},
      {2, 300, 300, 2, 2, 128, true, false, 80, false, 0, 0.f, false, 0.2f},
      // d64 soft-cap alone and dropout alone, whose consumers issue in turns (kTurns), with skipped steps
      {2, 333, 300, 4, 2, 64, true, false, -1, false, 90, 30.f}, {1, 300, 310, 2, 1, 64, false, false, 60, true, 0, 0.f, false, 0.1f},
      // the logits kernels in deterministic mode (ordered dQ adds ranked as the masks kernel's): soft-cap +
      // ALiBi causal, d64 soft-cap with lengths (in turns), dropout with a window
      {1, 300, 310, 2, 1, 128, true, true, -1, false, 0, 30.f, true}, {1, 333, 333, 4, 2, 64, true, true, -1, true, 0, 20.f},
      {2, 257, 300, 2, 1, 64, false, true, 80, false, 0, 0.f, false, 0.2f},
      // Head dims zero-padded on the kernel's (96 and 80 on 128, 192 on 256, 40 on 64).
      {2, 300, 131, 4, 2, 96, true, false},  {1, 257, 300, 2, 1, 96, false, true},
      {1, 200, 333, 2, 1, 192, true, false}, {2, 129, 257, 2, 2, 160, false, true},
      {1, 300, 310, 2, 1, 40, true, false, 70, true, 0}, {1, 257, 300, 2, 1, 80, false, true, -1, false, 0, 30.f},
      // deterministic with segment ids (the kSegOrder kernels; ids in order: the visiting CTAs' turns),
      // at 256 (192 padded) on the wide kernel's order keeper too
      {1, 400, 333, 4, 2, 256, true, true, -1, true, 70}, {1, 300, 300, 2, 1, 192, false, true, 90, false, 50},
      {2, 400, 400, 4, 2, 64, true, true, -1, false, 90}, {1, 333, 300, 2, 1, 128, false, true, 70, true, 60},
      // masks-only variants on the wide-head kernel (atomic; 192 padded on 256)
      {2, 333, 300, 4, 2, 256, true, false, 90, true, 0}, {1, 400, 400, 2, 1, 256, true, false, -1, false, 70},
      {1, 300, 333, 2, 2, 192, false, false, 100, false, 50},
      // logits on the wide-head kernel (atomic): soft-cap with segment ids, ALiBi + dropout, all three (224)
      {2, 333, 300, 4, 2, 256, true, false, -1, false, 90, 30.f}, {1, 300, 333, 2, 1, 256, false, false, 70, true, 0, 0.f, true, 0.2f},
      {1, 257, 300, 2, 2, 224, true, false, -1, false, 0, 20.f, true, 0.1f},
      // deterministic with segment ids and a transform set (the kSegOrder logits kernels): soft-cap +
      // ALiBi at 64, dropout + soft-cap at 128, ALiBi at 256, dropout alone at 192 (these ids are in
      // order; test_cuda_variants has recurring ones)
      {2, 300, 333, 4, 2, 64, true, true, -1, false, 70, 20.f, true}, {1, 333, 300, 2, 1, 128, false, true, 90, true, 60, 30.f, false, 0.1f},
      {1, 400, 400, 2, 1, 256, true, true, -1, false, 80, 0.f, true}, {1, 300, 320, 2, 2, 192, false, true, -1, true, 50, 0.f, false, 0.2f},
      // the wide-head kernel in deterministic mode (its order keeper ranks as the masks kernel's):
      // window + lengths, soft-cap + ALiBi causal, ALiBi + dropout (192)
      {2, 333, 300, 4, 2, 256, true, true, 90, true, 0}, {1, 300, 310, 2, 1, 256, true, true, -1, false, 0, 30.f, true},
      {1, 257, 300, 2, 1, 192, false, true, 80, false, 0, 0.f, true, 0.2f},
      // dropout with soft-cap and / or ALiBi (atomic and deterministic)
      {2, 300, 333, 2, 1, 64, true, false, -1, false, 0, 30.f, false, 0.15f},
      {1, 257, 300, 2, 1, 128, false, true, 90, false, 0, 20.f, true, 0.1f},
      {2, 300, 300, 4, 2, 128, true, false, -1, true, 60, 0.f, true, 0.2f},
  };
  int fails = 0;
  for (const Case& c : cases) fails += run_case(c, rng);
  std::printf("%d case(s) failed\n", fails);
  return fails != 0;
}
