// Harness of the Hopper (wgmma) wide-head backward at head dim 256
// (sm90/bwd_wide_kernel.cuh).
//   bwd_sm90_wide_harness test    d256 correctness cases vs the float64
//                                 reference (bwd_harness.cu's check_shape:
//                                 atomic mode runs the sm90 kernel, the
//                                 deterministic modes its dK/dV-only form
//                                 and the SM80 dQ kernel)
//   bwd_sm90_wide_harness bench   bf16 d256, 16k tokens, hidden 2048: SM80
//                                 atomic backward vs sm90, the sm90 forward,
//                                 and fwd+bwd TFLOP/s for both backwards
//   bwd_sm90_wide_harness one B Sq Sk Hq Hkv causal [fp16|bf16]   one case
// bwd_harness.cu is included with its run_bwd calls renamed to the hook
// below and its main() renamed away; only the d256 units are linked.
#include "harness_no_var_kernels.h"
#define run_bwd run_bwd_hook
#define main bwd_harness_main
#include "bwd_harness.cu"
#undef main
#undef run_bwd

#include "cuda/bwd_dispatch.h"
#include "cuda/fwd_dispatch.h"

// bwd_sm90_wide_alt_*.cu
cudaError_t bwd_sm90_d256_nosplit(const jax_flash::BwdParams& p, jax_flash::cuda::BwdLaunchFlags f, cudaStream_t s);
cudaError_t bwd_sm90_d256_nostagger(const jax_flash::BwdParams& p, jax_flash::cuda::BwdLaunchFlags f, cudaStream_t s);
cudaError_t bwd_sm90_d256_loads0(const jax_flash::BwdParams& p, jax_flash::cuda::BwdLaunchFlags f, cudaStream_t s);
cudaError_t bwd_sm90_d256_nodq(const jax_flash::BwdParams& p, jax_flash::cuda::BwdLaunchFlags f, cudaStream_t s);
cudaError_t bwd_sm90_d256_v4(const jax_flash::BwdParams& p, jax_flash::cuda::BwdLaunchFlags f, cudaStream_t s);
static const char* const kAltNames[] = {"default", "nosplit", "nostagger", "loads0", "nodq", "v4"};
constexpr int kNumAlts = 6;

namespace jax_flash::cuda {

static bool g_sm90 = true;
static int g_alt = 0;  // index into kAltNames  // atomic mode on the sm90 kernel (else SM80)
static long g_sm90_runs = 0, g_fallbacks = 0;
constexpr int kD = 256;

size_t bwd_workspace_bytes(const BwdParams& p) {
  if (p.head_dim != kD || p.batch <= 0 || p.heads_q <= 0 || p.seqlen_q <= 0) return 0;
  return bwd_dsum_bytes(p) + bwd_accum_bytes(p, kD);
}

static bool al(const void* ptr, uintptr_t n) { return (reinterpret_cast<uintptr_t>(ptr) & (n - 1)) == 0; }

cudaError_t run_bwd_hook(const BwdParams& p, cudaStream_t s) {
  if (p.head_dim != kD) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.heads_q == 0) return cudaSuccess;
  BwdLaunchFlags f;
  f.vec_ok = al(p.q, 16) && al(p.k, 16) && al(p.v, 16) && al(p.dout, 16);
  for (int64_t x : {p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.k_batch_stride, p.k_row_stride,
                    p.k_head_stride, p.v_batch_stride, p.v_row_stride, p.v_head_stride, p.do_batch_stride,
                    p.do_row_stride, p.do_head_stride})
    f.vec_ok = f.vec_ok && x % 8 == 0;
  f.pair_ok = al(p.dq, 4) && al(p.dk, 4) && al(p.dv, 4);
  for (int64_t x : {p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, p.dk_batch_stride, p.dk_row_stride,
                    p.dk_head_stride, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride})
    f.pair_ok = f.pair_ok && x % 2 == 0;
  const bool fp16 = p.dtype == DType::kFloat16;
  if (g_sm90) {
    cudaError_t e = p.deterministic ? (fp16 ? run_bwd_sm90_wide_hdim<DType::kFloat16, kD>(p, f, s)
                                            : run_bwd_sm90_wide_hdim<DType::kBFloat16, kD>(p, f, s))
                    : g_alt == 1 ? bwd_sm90_d256_nosplit(p, f, s)
                    : g_alt == 2 ? bwd_sm90_d256_nostagger(p, f, s)
                    : g_alt == 3 ? bwd_sm90_d256_loads0(p, f, s)
                    : g_alt == 4 ? bwd_sm90_d256_nodq(p, f, s)
                    : g_alt == 5 ? bwd_sm90_d256_v4(p, f, s)
                    : fp16    ? run_bwd_sm90_wide_hdim<DType::kFloat16, kD>(p, f, s)
                              : run_bwd_sm90_wide_hdim<DType::kBFloat16, kD>(p, f, s);
    if (e != cudaErrorNotSupported) {
      ++g_sm90_runs;
      return e;
    }
    ++g_fallbacks;
  }
  return fp16 ? run_bwd_hdim<DType::kFloat16, kD>(p, f, s) : run_bwd_hdim<DType::kBFloat16, kD>(p, f, s);
}

}  // namespace jax_flash::cuda

// bwd_harness.cu's variants bench calls it; not linked here.
cudaError_t jf_bwd_var_general_d128_tile128(const jax_flash::BwdParams&, cudaStream_t) {
  return cudaErrorNotSupported;
}

static int test_d256() {
  constexpr int D = jax_flash::cuda::kD;
  struct S0 { int B, Sq, Sk, Hq, Hkv; };
  const S0 shapes[] = {
      {2, 128, 128, 4, 4},  {1, 17, 129, 8, 2},  {2, 129, 17, 3, 1},   {1, 1000, 1000, 2, 1},
      {1, 1, 1000, 8, 2},   {2, 1000, 129, 2, 2}, {1, 257, 1000, 4, 2}, {3, 129, 128, 8, 8},
      {2, 333, 517, 8, 2},  {1, 64, 64, 2, 2},    {1, 640, 384, 4, 1},  {1, 97, 61, 2, 2},
      {1, 1, 1, 2, 1},      {1, 65, 63, 4, 2},
  };
  int fails = 0, cases = 0;
  for (const S0& sh : shapes)
    for (int dt = 0; dt < 2; ++dt)
      for (int causal = 0; causal < 2; ++causal) {
        Shape s{sh.B, sh.Sq, sh.Sk, sh.Hq, sh.Hkv, D, causal != 0, dt ? DType::kBFloat16 : DType::kFloat16, 0};
        fails += check_shape(s, 1234 + cases, true);
        ++cases;
      }
  const Shape extra[] = {
      {1, 130, 100, 2, 2, D, false, DType::kFloat16, 8},   // padded rows (stride 264: still 16 B aligned)
      {2, 100, 130, 4, 2, D, true, DType::kBFloat16, 8},
      {1, 0, 50, 2, 1, D, false, DType::kBFloat16, 0},
      {1, 50, 0, 2, 1, D, false, DType::kBFloat16, 0},
  };
  for (const Shape& s : extra) {
    fails += check_shape(s, 99 + cases, true);
    ++cases;
  }
  std::printf("d256: %d shapes, %d failures; sm90 launches %ld, fallbacks to SM80 %ld\n", cases,
              fails, jax_flash::cuda::g_sm90_runs, jax_flash::cuda::g_fallbacks);
  return fails == 0 ? 0 : 1;
}

static int bench_d256(const std::vector<int>& seqs) {
  constexpr int D = jax_flash::cuda::kD;
  std::printf("bf16 d256, 16k tokens, hidden 2048 (8 heads); kernel times (events, 10 reps)\n");
  std::printf("bwd = preprocess + dK/dV(+dQ atomics) + dQ convert; fwd = sm90 forward; TF = TFLOP/s\n");
  std::printf("sm80 = SM80 fused atomic kernel; pair = SM80 atomic-free pair (what run_bwd ran at d256);\n"
              "sm90 = default (dQ in two half batches before dK, loads by warpgroup 1 behind its dP\n"
              "wgmma, staggered step order); TF of the alternatives (each the default with one\n"
              "change): nosplit (one dQ batch after dK), nostag (every CTA from step 0), lds0 (loads\n"
              "by all threads at the step top), nodq (no dQ atomics: timing only, dQ wrong), v4\n"
              "(16 B dQ atomics);\n"
              "det = deterministic mode (sm90 dK/dV without dQ + the pair's dQ kernel), det/at its\n"
              "time over sm90's; fb = fwd+bwd TF with the pair / sm90 / det\n");
  std::printf("%6s %5s %4s %8s %8s %8s %8s %8s %7s %7s %7s %7s %7s %7s %8s %8s %8s %8s %8s %8s %7s %8s\n", "seqlen",
              "batch", "caus", "sm80_TF", "pair_ms", "pair_TF", "sm90_ms", "sm90_TF", "x_pair", "nspl_TF", "nostag",
              "lds0_TF", "nodq_TF", "v4_TF", "fwd_ms", "fwd_TF", "fb_pair", "fb_sm90", "det_ms", "det_TF", "det/at",
              "fb_det");
  for (int S : seqs)
    for (int causal = 0; causal < 2; ++causal) {
      const int H = 2048 / D, B = 16384 / S;
      Shape s{B, S, S, H, H, D, causal != 0, DType::kBFloat16, 0};
      DevProblem p = alloc_problem(s);
      std::vector<uint16_t> h(p.nq);
      std::mt19937 rng(1);
      std::normal_distribution<float> nd(0.f, 1.f);
      for (auto& x : h) x = f2h(nd(rng), s.dt);
      for (auto* ptr : {p.q, p.k, p.v, p.o, p.dout}) CK(cudaMemcpy(ptr, h.data(), p.nq * 2, cudaMemcpyHostToDevice));
      std::vector<float> lse(size_t(B) * H * S, std::log(float(S)) + 3.f);
      CK(cudaMemcpy(p.lse, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice));
      BwdParams bp = make_params(p, false);
      auto bwd = [&]() { return jax_flash::cuda::run_bwd_hook(bp, 0); };
      jax_flash::cuda::g_sm90 = false;
      const double t80 = time_ms(bwd, 10);
      jax_flash::cuda::g_sm90 = true;
      const long before = jax_flash::cuda::g_fallbacks;
      const double t90 = time_ms(bwd, 10);
      double talt[kNumAlts] = {t90};
      for (int a = 1; a < kNumAlts; ++a) {
        jax_flash::cuda::g_alt = a;
        talt[a] = time_ms(bwd, 10);
      }
      jax_flash::cuda::g_alt = 0;
      // The production SM80 d256 backward: atomic mode runs the atomic-free
      // pair there (bwd_launch.cu, kSplitFromHeadDim).
      BwdParams bpd = make_params(p, true);
      jax_flash::cuda::g_sm90 = false;
      const double tpair = time_ms([&]() { return jax_flash::cuda::run_bwd_hook(bpd, 0); }, 10);
      jax_flash::cuda::g_sm90 = true;
      const double tdet = time_ms([&]() { return jax_flash::cuda::run_bwd_hook(bpd, 0); }, 10);
      // Forward on the same buffers (writes o and lse; the backward above
      // has already run on them).
      jax_flash::FwdParams fp;
      fp.q = p.q; fp.k = p.k; fp.v = p.v; fp.o = p.o; fp.lse = p.lse;
      fp.q_batch_stride = fp.o_batch_stride = bp.q_batch_stride;
      fp.q_row_stride = fp.o_row_stride = bp.q_row_stride;
      fp.q_head_stride = fp.o_head_stride = bp.q_head_stride;
      fp.k_batch_stride = fp.v_batch_stride = bp.k_batch_stride;
      fp.k_row_stride = fp.v_row_stride = bp.k_row_stride;
      fp.k_head_stride = fp.v_head_stride = bp.k_head_stride;
      fp.batch = B; fp.seqlen_q = fp.seqlen_k = S; fp.heads_q = fp.heads_kv = H; fp.head_dim = D;
      fp.scale = bp.scale; fp.causal = causal != 0; fp.dtype = DType::kBFloat16;
      auto fwd = [&]() { return jax_flash::cuda::run_fwd_sm90_hdim<DType::kBFloat16, D>(fp, 0); };
      const double tf = time_ms(fwd, 10);
      const double fflops = 4.0 * double(S) * S * D * H * B / (causal ? 2.0 : 1.0);
      const double bflops = 2.5 * fflops;
      std::printf("%6d %5d %4d %8.1f %8.3f %8.1f %8.3f %8.1f %7.3f %7.1f %7.1f %7.1f %7.1f %7.1f %8.3f %8.1f %8.1f %8.1f "
                  "%8.3f %8.1f %7.3f %8.1f%s\n", S,
                  B, causal, bflops / t80 / 1e9, tpair, bflops / tpair / 1e9, t90, bflops / t90 / 1e9, tpair / t90,
                  bflops / talt[1] / 1e9, bflops / talt[2] / 1e9, bflops / talt[3] / 1e9, bflops / talt[4] / 1e9,
                  bflops / talt[5] / 1e9, tf,
                  fflops / tf / 1e9,
                  (fflops + bflops) / (tf + tpair) / 1e9, (fflops + bflops) / (tf + t90) / 1e9, tdet,
                  bflops / tdet / 1e9, tdet / t90, (fflops + bflops) / (tf + tdet) / 1e9,
                  jax_flash::cuda::g_fallbacks != before ? "  (FELL BACK)" : "");
      std::fflush(stdout);
      free_problem(p);
    }
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "test";
  if (mode == "test") {
    for (int a = 0; a < kNumAlts; ++a)
      if (argc > 2 && std::string(argv[2]) == kAltNames[a]) jax_flash::cuda::g_alt = a;
    std::printf("configuration: %s\n", kAltNames[jax_flash::cuda::g_alt]);
    return test_d256();
  }
  if (mode == "bench") return bench_d256({1024, 2048, 4096, 8192, 16384});
  if (mode == "one" && argc >= 8) {
    Shape s{std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]),
            std::atoi(argv[6]), jax_flash::cuda::kD, std::atoi(argv[7]) != 0,
            (argc > 8 && std::string(argv[8]) == "fp16") ? DType::kFloat16 : DType::kBFloat16, 0};
    const int f = check_shape(s, 5, true);
    std::printf("sm90 launches %ld, fallbacks %ld\n", jax_flash::cuda::g_sm90_runs, jax_flash::cuda::g_fallbacks);
    return f == 0 ? 0 : 1;
  }
  std::fprintf(stderr, "usage: %s test|bench|one B Sq Sk Hq Hkv causal [fp16|bf16]\n", argv[0]);
  return 2;
}
