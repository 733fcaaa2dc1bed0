// Harness of the Hopper (wgmma) backward at head dim 128.
//   bwd_sm90_harness test    d128 correctness cases vs the float64 reference
//                            (bwd_harness.cu's check_shape: atomic mode runs
//                            the sm90 kernel, the deterministic modes the
//                            SM80 split kernels)
//   bwd_sm90_harness bench   bf16 d128, 16k tokens: SM80 atomic vs sm90 (all)
// bwd_harness.cu is included with its run_bwd calls renamed to the hook
// below and its main() renamed away; only the d128 units are linked (no
// bwd_launch.cu), so the workspace size is computed here for D = 128.
#include "harness_no_var_kernels.h"
#define run_bwd run_bwd_hook
#define main bwd_harness_main
#include "bwd_harness.cu"
#undef main
#undef run_bwd

#include "cuda/bwd_dispatch.h"


namespace jax_flash::cuda {

template <DType kDType, int kHeadDim>
cudaError_t run_bwd_sm90_hdim(const BwdParams& params, BwdLaunchFlags flags, cudaStream_t stream);

static bool g_sm90 = true;  // atomic mode on the sm90 kernel (else SM80)
static long g_sm90_runs = 0, g_fallbacks = 0;

size_t bwd_workspace_bytes(const BwdParams& p) {
  if (p.head_dim != 128 || p.batch <= 0 || p.heads_q <= 0 || p.seqlen_q <= 0) return 0;
  return bwd_dsum_bytes(p) + bwd_accum_bytes(p, 128);  // (order counters: in dq's buffer)
}

static bool al(const void* ptr, uintptr_t n) { return (reinterpret_cast<uintptr_t>(ptr) & (n - 1)) == 0; }

cudaError_t run_bwd_hook(const BwdParams& p, cudaStream_t s) {
  if (p.head_dim != 128) return cudaErrorInvalidValue;
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
  if (g_sm90 && !p.deterministic) {
    cudaError_t e = fp16 ? run_bwd_sm90_hdim<DType::kFloat16, 128>(p, f, s)
                         : run_bwd_sm90_hdim<DType::kBFloat16, 128>(p, f, s);
    if (e != cudaErrorNotSupported) {
      ++g_sm90_runs;
      return e;
    }
    ++g_fallbacks;
  }
  return fp16 ? run_bwd_hdim<DType::kFloat16, 128>(p, f, s) : run_bwd_hdim<DType::kBFloat16, 128>(p, f, s);
}

}  // namespace jax_flash::cuda

// bwd_harness.cu's variants bench calls it; not linked here.
cudaError_t jf_bwd_var_general_d128_tile128(const jax_flash::BwdParams&, cudaStream_t) {
  return cudaErrorNotSupported;
}

static int test_d128() {
  struct S0 { int B, Sq, Sk, Hq, Hkv; };
  const S0 shapes[] = {
      {2, 128, 128, 4, 4},   {1, 17, 129, 8, 2},   {2, 129, 17, 3, 1},   {1, 1000, 1000, 2, 1},
      {1, 1, 1000, 8, 2},    {2, 1000, 129, 2, 2}, {1, 257, 1000, 4, 2}, {3, 129, 128, 8, 8},
      {2, 333, 517, 8, 2},   {1, 64, 64, 2, 2},    {1, 640, 384, 4, 1},
  };
  int fails = 0, cases = 0;
  for (const S0& sh : shapes)
    for (int dt = 0; dt < 2; ++dt)
      for (int causal = 0; causal < 2; ++causal) {
        Shape s{sh.B, sh.Sq, sh.Sk, sh.Hq, sh.Hkv, 128, causal != 0, dt ? DType::kBFloat16 : DType::kFloat16, 0};
        fails += check_shape(s, 1234 + cases, true);
        ++cases;
      }
  const Shape extra[] = {
      {1, 130, 100, 2, 2, 128, false, DType::kFloat16, 8},
      {2, 100, 130, 4, 2, 128, true, DType::kBFloat16, 8},
      {1, 0, 50, 2, 1, 128, false, DType::kBFloat16, 0},
      {1, 50, 0, 2, 1, 128, false, DType::kBFloat16, 0},
  };
  for (const Shape& s : extra) {
    fails += check_shape(s, 99 + cases, true);
    ++cases;
  }
  std::printf("%d d128 shapes, %d failures; sm90 launches %ld, fallbacks to SM80 in atomic mode %ld\n", cases, fails,
              jax_flash::cuda::g_sm90_runs, jax_flash::cuda::g_fallbacks);
  return fails == 0 ? 0 : 1;
}

static int bench_d128(const std::vector<int>& seqs) {
  const int D = 128;
  std::printf("bf16 d128, 16k tokens, hidden 2048; backward only (preprocess + dK/dV(+dQ atomics) + dq convert)\n");
  std::printf("%6s %6s %4s %9s %8s %9s %8s %7s\n", "seqlen", "batch", "caus", "sm80_ms", "sm80_TF", "sm90_ms",
              "sm90_TF", "speedup");
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
      auto bwd = [&] { return jax_flash::cuda::run_bwd_hook(bp, 0); };
      jax_flash::cuda::g_sm90 = false;
      const double t80 = time_ms(bwd, 10);
      jax_flash::cuda::g_sm90 = true;
      const long before = jax_flash::cuda::g_fallbacks;
      const double t90 = time_ms(bwd, 10);
      const double flops = 2.5 * 4.0 * double(S) * S * D * H * B / (causal ? 2.0 : 1.0);
      std::printf("%6d %6d %4d %9.3f %8.1f %9.3f %8.1f %7.3f%s\n", S, B, causal, t80, flops / t80 / 1e9, t90,
                  flops / t90 / 1e9, t80 / t90, jax_flash::cuda::g_fallbacks != before ? "  (FELL BACK)" : "");
      std::fflush(stdout);
      free_problem(p);
    }
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "test";
  if (mode == "test") {
    return test_d128();
  }
  if (mode == "bench") {
    std::vector<int> seqs = {1024, 2048, 4096, 8192, 16384};
    return bench_d128(seqs);
  }
  if (mode == "one" && argc >= 9) {
    Shape s{std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]),
            std::atoi(argv[6]), 128, std::atoi(argv[8]) != 0,
            (argc > 9 && std::string(argv[9]) == "fp16") ? DType::kFloat16 : DType::kBFloat16, 0};
    return check_shape(s, 5, true) == 0 ? 0 : 1;
  }
  std::fprintf(stderr, "usage: %s test|bench|one B Sq Sk Hq Hkv 128 causal [fp16|bf16]\n", argv[0]);
  return 2;
}
