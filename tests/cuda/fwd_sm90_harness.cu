// Standalone correctness + speed harness of the Hopper (wgmma) forward.
//   fwd_sm90_harness           cases (float64 CPU reference), then timings
//   fwd_sm90_harness --bench   timings only: sm90 kernel vs today's run_fwd
// Reference, NaN poisoning, tolerance and timing come from fwd_harness.cu
// (included, its main() compiled out); run_case calls g_run_fwd, pointed
// here at the Hopper kernel. Build: make -f Makefile.sm90 (see there).
#define FWD_HARNESS_NO_MAIN
#include "fwd_harness.cu"

#include "cuda/fwd_dispatch.h"

namespace jf = jax_flash::cuda;

// sm90_alt/*.cu: alternative configurations (bf16), registered by their
// units; "late" = loads issued behind the wgmmas, "ov" = overlapped loop,
// "noov" = each wgmma waited on, "2cta" = two CTAs per SM (128 registers).
#include "sm90_alt/alt.h"
std::vector<Sm90Alt>& sm90_alts() {
  static std::vector<Sm90Alt> alts;
  return alts;
}

// The Hopper forward for one (dtype, head dim <= 256): the kernel head dim
// is 64, 128 or 256 (columns past head_dim are zero-padded, as run_fwd does).
static cudaError_t sm90_fwd(const FwdParams& p, cudaStream_t s) {
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return cudaSuccess;
  const bool h = p.dtype == DType::kFloat16;
  if (p.head_dim <= 64)
    return h ? jf::run_fwd_sm90_hdim<DType::kFloat16, 64>(p, s) : jf::run_fwd_sm90_hdim<DType::kBFloat16, 64>(p, s);
  if (p.head_dim <= 128)
    return h ? jf::run_fwd_sm90_hdim<DType::kFloat16, 128>(p, s) : jf::run_fwd_sm90_hdim<DType::kBFloat16, 128>(p, s);
  if (p.head_dim <= 256)
    return h ? jf::run_fwd_sm90_hdim<DType::kFloat16, 256>(p, s) : jf::run_fwd_sm90_hdim<DType::kBFloat16, 256>(p, s);
  return cudaErrorInvalidValue;
}

static void bench_sm90() {
  const int tokens = 16384, hidden = 2048;
  std::printf("\n== timings (bf16, batch*seqlen=%d, hidden=%d), TFLOP/s: sm90 wgmma (default config) vs run_fwd "
              "(SM80 mma.sync; -1 = not in this build), then alternatives ==\n", tokens, hidden);
  std::vector<Sm90Alt> alts = sm90_alts();
  std::sort(alts.begin(), alts.end(), [](const Sm90Alt& x, const Sm90Alt& y) {
    return std::string(x.name) < std::string(y.name);
  });
  for (int d : {128, 64, 256}) {
    for (int s : {512, 1024, 2048, 4096, 8192, 16384}) {
      for (bool causal : {false, true}) {
        const int b = tokens / s, h = hidden / d;
        const double tn = time_config(&sm90_fwd, b, s, h, d, causal, DType::kBFloat16);
#ifdef SM90_NO_SM80  // built without the SM80 units (Makefile.sm90 SM80=0)
        const double to = -1.0;
#else
        const double to = time_config(&jf::run_fwd, b, s, h, d, causal, DType::kBFloat16);
#endif
        std::printf("BENCH d=%3d seqlen=%5d b=%d h=%2d causal=%d  sm90 %.1f TFLOP/s  sm80 %.1f TFLOP/s  x%.3f", d, s, b,
                    h, int(causal), tn, to, tn / to);
        for (const Sm90Alt& a : alts)
          if (a.d == d) std::printf("  | %s %.1f", a.name, time_config(a.fn, b, s, h, d, causal, DType::kBFloat16));
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  }
}

int main(int argc, char** argv) {
  const bool only_bench = argc > 1 && std::string(argv[1]) == "--bench";
  const DType B = DType::kBFloat16, H = DType::kFloat16;
  std::vector<Case> cases;
  if (!only_bench) {
    const int sl[] = {1, 17, 128, 129, 1000};
    for (int d : {128, 64, 256})
      for (DType t : {B, H})
        for (bool causal : {false, true}) {
          for (int sq : sl)
            for (int sk : sl) cases.push_back({1, sq, sk, 1, 1, d, causal, t});
          cases.push_back({1, 4097, 4097, 1, 1, d, causal, t});
          cases.push_back({1, 4097, 129, 1, 1, d, causal, t});
          cases.push_back({1, 129, 4097, 1, 1, d, causal, t});
          // GQA (8q / 2kv) and MQA (8q / 1kv), batch 2, Sq != Sk both ways
          for (int hkv : {2, 1}) {
            cases.push_back({2, 257, 301, 8, hkv, d, causal, t});
            cases.push_back({2, 301, 257, 8, hkv, d, causal, t});
          }
        }
    // head dims padded onto the 64 / 128 kernels
    for (int d : {40, 120, 200})
      for (bool causal : {false, true}) cases.push_back({2, 200, 333, 4, 2, d, causal, B});
  }
  g_run_fwd = &sm90_fwd;
  for (const Case& c : cases) run_case(c);
  std::printf("%d / %zu cases failed\n", g_fail, cases.size());
  if (!only_bench) {
    // alternative configurations (bf16, Sq and Sk <= 1000 cases of their head dim)
    for (const Sm90Alt& a : sm90_alts()) {
      int n = 0;
      g_run_fwd = a.fn;
      std::printf("-- alternative: d%d %s --\n", a.d, a.name);
      for (const Case& c : cases)
        if (c.d == a.d && c.dt == B && c.sq <= 1000 && c.sk <= 1000) { run_case(c); ++n; }
      std::printf("%d failed so far (%d cases of this alternative)\n", g_fail, n);
    }
  }
  bench_sm90();
  return g_fail ? 1 : 0;
}
