// Standalone correctness + speed harness of the Hopper (wgmma) forward.
//   fwd_sm90_harness           cases (float64 CPU reference), then timings
//   fwd_sm90_harness --bench   timings only: sm90 kernel vs today's run_fwd
//   fwd_sm90_harness --masks   masks-only variants kernel (kMasks): variant
//                              cases (variant_ref.h), then d128 8k timings
//                              against plain causal on the sm90 kernel
//   fwd_sm90_harness --logits  soft-cap / ALiBi kernel (kLogits), alone and
//                              with masks: cases (variant_ref.h), then d128
//                              8k timings against plain causal
// Reference, NaN poisoning, tolerance and timing come from fwd_harness.cu
// (included, its main() compiled out); run_case calls g_run_fwd, pointed
// here at the Hopper kernel. Build: make -f Makefile.sm90 (see there).
#define FWD_HARNESS_NO_MAIN
#include "fwd_harness.cu"

#include "cuda/fwd_dispatch.h"

namespace jf = jax_flash::cuda;


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

// The Hopper masks-only variants kernel, head dims padded as above.
static cudaError_t sm90_masks_fwd(const FwdParams& p, cudaStream_t s) {
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return cudaSuccess;
  const bool h = p.dtype == DType::kFloat16;
  if (p.head_dim <= 64)
    return h ? jf::run_fwd_sm90_masks_hdim<DType::kFloat16, 64>(p, s) : jf::run_fwd_sm90_masks_hdim<DType::kBFloat16, 64>(p, s);
  if (p.head_dim <= 128)
    return h ? jf::run_fwd_sm90_masks_hdim<DType::kFloat16, 128>(p, s) : jf::run_fwd_sm90_masks_hdim<DType::kBFloat16, 128>(p, s);
  if (p.head_dim <= 256)
    return h ? jf::run_fwd_sm90_masks_hdim<DType::kFloat16, 256>(p, s) : jf::run_fwd_sm90_masks_hdim<DType::kBFloat16, 256>(p, s);
  return cudaErrorInvalidValue;
}

// The Hopper logits kernel (soft-cap / ALiBi, with or without masks).
static cudaError_t sm90_logits_fwd(const FwdParams& p, cudaStream_t s) {
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return cudaSuccess;
  const bool h = p.dtype == DType::kFloat16;
  if (p.head_dim <= 64)
    return h ? jf::run_fwd_sm90_logits_hdim<DType::kFloat16, 64>(p, s) : jf::run_fwd_sm90_logits_hdim<DType::kBFloat16, 64>(p, s);
  if (p.head_dim <= 128)
    return h ? jf::run_fwd_sm90_logits_hdim<DType::kFloat16, 128>(p, s) : jf::run_fwd_sm90_logits_hdim<DType::kBFloat16, 128>(p, s);
  if (p.head_dim <= 256)
    return h ? jf::run_fwd_sm90_logits_hdim<DType::kFloat16, 256>(p, s) : jf::run_fwd_sm90_logits_hdim<DType::kBFloat16, 256>(p, s);
  return cudaErrorInvalidValue;
}

// The d64 / d128 cases of vref::cases that `keep` selects, each in both
// dtypes, and the d128 ones again at d256.
template <class Keep>
static std::vector<vref::VarCase> base_cases(Keep keep) {
  std::vector<vref::VarCase> v;
  for (const vref::VarCase& c : vref::cases(false)) {
    if (!keep(c) || (c.D != 64 && c.D != 128)) continue;
    for (DType t : {DType::kBFloat16, DType::kFloat16}) {
      vref::VarCase x = c;
      x.dt = t;
      v.push_back(x);
    }
    if (c.D == 128) {
      vref::VarCase x = c;
      x.D = 256;
      v.push_back(x);
    }
  }
  return v;
}

// Soft-cap / ALiBi cases: those of vref::cases without dropout (d64 / d128,
// both dtypes, again at d256), then per head dim 64 / 128 / 256 and dtype
// each transform set with causal / window / lengths / segments / offsets,
// odd sizes, GQA / MQA, empty rows, long rows and far positions.
static std::vector<vref::VarCase> logits_cases() {
  std::vector<vref::VarCase> v = base_cases(
      [](const vref::VarCase& c) { return (c.softcap != 0.f || c.alibi != 0) && c.dropout == 0.f; });
  const DType B = DType::kBFloat16, H = DType::kFloat16;
  auto add = [&](vref::VarCase c) { v.push_back(c); };
  for (int D : {64, 128, 256})
    for (DType t : {B, H}) {
      { vref::VarCase c{"softcap 20 + causal, GQA", 2, 257, 301, 4, 2, D, t}; c.softcap = 20.f; c.causal = true; add(c); }
      { vref::VarCase c{"alibi [Hq] + window 50/20 (two-sided)", 2, 190, 230, 4, 2, D, t}; c.alibi = 1; c.left = 50; c.right = 20; add(c); }
      { vref::VarCase c{"alibi [B,Hq] + causal + offset 100, MQA", 2, 129, 333, 4, 1, D, t}; c.alibi = 2; c.causal = true; c.query_offset = 100; add(c); }
      { vref::VarCase c{"softcap 30 + alibi + lengths + batch offsets", 3, 190, 230, 2, 2, D, t}; c.softcap = 30.f; c.alibi = 1; c.lengths = true; c.batch_offsets = true; c.causal = true; add(c); }
      { vref::VarCase c{"softcap 30 + alibi [B,Hq] + segments + causal", 2, 500, 500, 2, 2, D, t}; c.softcap = 30.f; c.alibi = 2; c.segments = true; c.causal = true; add(c); }
      { vref::VarCase c{"softcap 10 + segments, Sq != Sk", 2, 170, 260, 2, 1, D, t}; c.softcap = 10.f; c.segments = true; add(c); }
      { vref::VarCase c{"softcap 50 + alibi, long, not causal", 1, 1000, 1500, 2, 1, D, t}; c.softcap = 50.f; c.alibi = 1; add(c); }
      { vref::VarCase c{"alibi [Hq], causal Sq > Sk (empty rows)", 2, 333, 129, 2, 2, D, t}; c.alibi = 1; c.causal = true; c.query_offset = -200; add(c); }
      { vref::VarCase c{"alibi + window, Sq 1", 3, 1, 1000, 4, 2, D, t}; c.alibi = 1; c.left = 300; c.right = 100; c.query_offset = 500; add(c); }
      { vref::VarCase c{"alibi [Hq] + offset 3000, not causal", 1, 200, 700, 2, 1, D, t}; c.alibi = 1; c.query_offset = 3000; add(c); }
      { vref::VarCase c{"softcap 15 + alibi [B,Hq] + all masks", 3, 401, 377, 4, 2, D, t}; c.causal = true; c.left = 90; c.lengths = true; c.batch_offsets = true; c.query_offset = 7; c.segments = true; c.softcap = 15.f; c.alibi = 2; add(c); }
      { vref::VarCase c{"softcap 5, Sk 17, offset 5, causal", 2, 129, 17, 2, 1, D, t}; c.causal = true; c.query_offset = 5; c.softcap = 5.f; add(c); }
    }
  // head dims padded onto the 64 / 256 kernels
  { vref::VarCase c{"head dim 40: softcap + causal + window", 2, 97, 131, 2, 1, 40, B}; c.causal = true; c.left = 20; c.softcap = 8.f; add(c); }
  { vref::VarCase c{"head dim 200: alibi + lengths + segments", 2, 150, 180, 2, 1, 200, H}; c.alibi = 1; c.lengths = true; c.segments = true; add(c); }
  return v;
}

// Masks-only variant cases: the masks-only ones of vref::cases (d64 / d128),
// each in both dtypes and again at d256, plus odd sizes, skipping-heavy and
// empty-row cases.
static std::vector<vref::VarCase> masks_cases() {
  std::vector<vref::VarCase> v = base_cases(
      [](const vref::VarCase& c) { return c.softcap == 0.f && c.alibi == 0 && c.dropout == 0.f; });
  const DType B = DType::kBFloat16, H = DType::kFloat16;
  auto add = [&](vref::VarCase c) { v.push_back(c); };
  for (int D : {64, 128, 256}) {
    const DType t = D == 128 ? H : B;
    { vref::VarCase c{"odd: Sq 1, window + lengths", 3, 1, 1000, 4, 2, D, t}; c.left = 17; c.lengths = true; add(c); }
    { vref::VarCase c{"odd: Sk 17, causal + offset 5 + segments", 2, 129, 17, 2, 1, D, t}; c.causal = true; c.query_offset = 5; c.segments = true; add(c); }
    { vref::VarCase c{"causal Sq > Sk (first rows see nothing)", 2, 333, 129, 2, 2, D, t}; c.causal = true; c.query_offset = -200; add(c); }
    { vref::VarCase c{"segments + causal, long (tile skipping)", 1, 2000, 2000, 2, 1, D, t}; c.segments = true; c.causal = true; add(c); }
    { vref::VarCase c{"window 100 both sides + segments, MQA", 2, 700, 650, 8, 1, D, t}; c.left = 100; c.right = 100; c.segments = true; add(c); }
    { vref::VarCase c{"window far right of the keys (empty)", 1, 150, 140, 2, 2, D, t}; c.left = 5; c.right = 10; c.query_offset = 1000; add(c); }
    { vref::VarCase c{"all masks: causal+window+lengths+offsets+segments", 3, 401, 377, 4, 2, D, t}; c.causal = true; c.left = 90; c.lengths = true; c.batch_offsets = true; c.query_offset = 7; c.segments = true; add(c); }
  }
  // head dims padded onto the 64 / 256 kernels
  { vref::VarCase c{"head dim 40: causal + window", 2, 97, 131, 2, 1, 40, B}; c.causal = true; c.left = 20; add(c); }
  { vref::VarCase c{"head dim 200: lengths + segments", 2, 150, 180, 2, 1, 200, H}; c.lengths = true; c.segments = true; add(c); }
  return v;
}

// Masks kernel vs plain causal on the sm90 kernel, d128 seqlen 8k, 16 heads,
// b=1, bf16 (the shape of fwd_harness --variants); the SM80 run_fwd beside
// it (-1 when built with SM80=0).
static void bench_masks(bool logits = false, int d = 128) {
  const int s = 8192, h = 16, b = 1;
  const int64_t n = int64_t(b) * s * h * d;
  void *q, *k, *v, *o; float* lse;
  CK(cudaMalloc(&q, n * 2)); CK(cudaMalloc(&k, n * 2)); CK(cudaMalloc(&v, n * 2)); CK(cudaMalloc(&o, n * 2));
  CK(cudaMalloc(&lse, int64_t(b) * h * s * 4));
  std::vector<uint16_t> hbuf(n);
  for (void* t : {q, k, v}) {
    for (auto& x : hbuf) x = f2h(nrand(), DType::kBFloat16);  // independent q, k, v
    CK(cudaMemcpy(t, hbuf.data(), n * 2, cudaMemcpyHostToDevice));
  }
  vref::VarDev vd;
  std::vector<int32_t> lens(b, s - 100), ids(size_t(b) * s, 1), offs(b, 0);
  const int doc_len[] = {1000, 300, 2500, 700, 1800, 1200, 692};
  std::vector<int32_t> pids(size_t(b) * s);
  double pairs = 0;
  {
    int pos = 0, id = 0;
    for (int L : doc_len) {
      for (int i = 0; i < L && pos < s; ++i) pids[pos++] = id;
      pairs += 0.5 * double(L) * (L + 1);
      ++id;
    }
  }
  const int32_t* d_lens = vd.put(lens);
  const int32_t* d_ids = vd.put(ids);
  const int32_t* d_rng = vd.put(vref::seg_ranges(ids, b, s));
  const int32_t* d_offs = vd.put(offs);
  const int32_t* d_pids = vd.put(pids);
  const int32_t* d_prng = vd.put(vref::seg_ranges(pids, b, s));
  auto base = [&]() {
    FwdParams p;
    p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse;
    p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = int64_t(h) * d;
    p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
    p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = int64_t(s) * h * d;
    p.batch = b; p.seqlen_q = p.seqlen_k = s; p.heads_q = p.heads_kv = h; p.head_dim = d;
    p.scale = float(1.0 / std::sqrt(double(d))); p.causal = true; p.dtype = DType::kBFloat16;
    return p;
  };
  auto time_ms = [&](TuneFn fn, const FwdParams& p) {
    if (fn(p, 0) != cudaSuccess) { cudaGetLastError(); return -1.0; }
    for (int i = 0; i < 3; ++i) CK(fn(p, 0));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    const int iters = 20;
    CK(cudaEventRecord(e0));
    for (int i = 0; i < iters; ++i) CK(fn(p, 0));
    CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    return double(ms) / iters;
  };
  std::vector<float> slopes(h);
  for (int i = 0; i < h; ++i) slopes[i] = float(std::pow(2.0, -8.0 * (i + 1) / h));
  const float* d_slopes = vd.put(slopes);
  struct V { const char* name; FwdParams p; };
  std::vector<V> vs;
  if (logits) {
    { FwdParams p = base(); p.softcap = 30.f; vs.push_back({"softcap 30", p}); }
    { FwdParams p = base(); p.alibi_slopes = d_slopes; vs.push_back({"alibi [Hq]", p}); }
    { FwdParams p = base(); p.softcap = 30.f; p.alibi_slopes = d_slopes; vs.push_back({"softcap 30 + alibi", p}); }
    { FwdParams p = base(); p.softcap = 30.f; p.window_left = 4096; vs.push_back({"softcap 30 + window 4096", p}); }
    { FwdParams p = base(); p.alibi_slopes = d_slopes; p.q_segment_ids = p.kv_segment_ids = d_pids; p.q_segment_ranges = p.kv_segment_ranges = d_prng; vs.push_back({"alibi + packed docs (7)", p}); }
    { FwdParams p = base(); p.causal = false; p.alibi_slopes = d_slopes; vs.push_back({"alibi, not causal (vs causal)", p}); }
    { FwdParams p = base(); p.softcap = 30.f; vs.push_back({"softcap 30 (again: spread)", p}); }
  } else {
  vs.push_back({"plain params (kMasks overhead)", base()});
  { FwdParams p = base(); p.window_left = 1 << 30; vs.push_back({"no-op window", p}); }
  { FwdParams p = base(); p.window_left = 4096; vs.push_back({"window 4096 (fewer tiles)", p}); }
  { FwdParams p = base(); p.q_seqlens = d_lens; p.kv_seqlens = d_lens; vs.push_back({"lengths (s-100)", p}); }
  { FwdParams p = base(); p.q_segment_ids = p.kv_segment_ids = d_ids; p.q_segment_ranges = p.kv_segment_ranges = d_rng; vs.push_back({"segments (one doc)", p}); }
  { FwdParams p = base(); p.query_offsets = d_offs; vs.push_back({"query_offsets (0)", p}); }
  { FwdParams p = base(); p.q_segment_ids = p.kv_segment_ids = d_pids; p.q_segment_ranges = p.kv_segment_ranges = d_prng; vs.push_back({"packed docs (7, 300-2500)", p}); }
  }
  TuneFn fn_var = logits ? &sm90_logits_fwd : &sm90_masks_fwd;
  const double flops = 4.0 * s * double(s) * d * h * b / 2;
  const double ms0 = time_ms(&sm90_fwd, base());
  std::printf("\n== %s variants, d=%d s=%d h=%d b=%d bf16 causal: sm90 %s kernel vs sm90 plain causal "
              "%.3f ms (%.1f TFLOP/s); sm80 = run_fwd (SM80 kernel; -1 = not in this build) ==\n",
              logits ? "soft-cap / ALiBi" : "masks-only", d, s, h, b, logits ? "logits" : "masks", ms0,
              flops / (ms0 / 1e3) / 1e12);
  for (const V& x : vs) {
    const double ms = time_ms(fn_var, x.p);
#ifdef SM90_NO_SM80
    const double ms80 = -1.0;
#else
    const double ms80 = time_ms(&jf::run_fwd, x.p);
#endif
    std::printf("%s d%d %-32s sm90 %.3f ms  x%.3f vs sm90 plain causal  |  sm80 %.3f ms  x%.3f\n",
                logits ? "LBENCH" : "MBENCH", d, x.name, ms, ms / ms0, ms80, ms80 > 0 ? ms80 / ms0 : -1.0);
    if (x.p.q_segment_ids == d_pids)
      std::printf("MBENCH packed docs: real-work rate %.3f of plain causal's (sm90)\n",
                  (4.0 * pairs * d * h * b / ms) / (flops / ms0));
    std::fflush(stdout);
  }
  std::printf("%s plain causal again: %.3f ms\n", logits ? "LBENCH" : "MBENCH", time_ms(&sm90_fwd, base()));
  if (logits) {
    FwdParams p = base();
    p.causal = false;
    std::printf("LBENCH plain not causal (for the alibi not-causal row): %.3f ms\n", time_ms(&sm90_fwd, p));
  }
  vd.free_all();
  cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o); cudaFree(lse);
}

static void bench_sm90() {
  const int tokens = 16384, hidden = 2048;
  std::printf("\n== timings (bf16, batch*seqlen=%d, hidden=%d), TFLOP/s: the sm90 warp-specialised kernel vs "
              "run_fwd (SM80 mma.sync; -1 = not in this build) ==\n", tokens, hidden);
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
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  }
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--logits") {
    const auto vc = logits_cases();
    g_run_var = &sm90_logits_fwd;
    uint64_t seed = 701;
    for (const auto& c : vc) run_var_case(c, seed++);
    std::printf("%d / %zu soft-cap / ALiBi variant cases failed (sm90 logits kernel)\n", g_fail, vc.size());
    bench_masks(true, 128);
    bench_masks(true, 64);
    bench_masks(true, 256);
    return g_fail ? 1 : 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--masks") {
    const auto vc = masks_cases();
    g_run_var = &sm90_masks_fwd;
    uint64_t seed = 101;
    for (const auto& c : vc) run_var_case(c, seed++);
    std::printf("%d / %zu masks-only variant cases failed (sm90 masks kernel)\n", g_fail, vc.size());
    bench_masks();
    return g_fail ? 1 : 0;
  }
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
  bench_sm90();
  return g_fail ? 1 : 0;
}
