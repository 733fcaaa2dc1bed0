// Standalone harness for the CUDA backward (no JAX, no forward kernel).
//
//   bwd_harness test      correctness matrix vs a float64 CPU reference,
//                         atomic and deterministic modes, determinism check
//   bwd_harness small     one small causal GQA odd-seqlen case (sanitizers)
//   bwd_harness bench     TFLOP/s at 16k tokens, hidden 2048, bf16
//   bwd_harness variants [small]   variant cases (variant_ref.h), both
//                         modes, then variant-vs-plain timings (unless small)
//
// O and LSE inputs come from the CPU reference (float64, then rounded), so the
// backward is checked on its own. Outputs and workspace are poisoned with NaN
// bytes before every run. Tolerance, FA style: the kernel's max error against
// float64 must be within 3x that of a naive low-precision computation (the
// same math with every intermediate rounded to the input dtype) plus a small
// floor.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/bwd_dispatch.h"  // run_bwd_var_hdim (bench: the SM80 generic kernel)
#include "cuda/launch.h"
#include "params.h"
#include "variant_ref.h"

using jax_flash::BwdParams;
using jax_flash::DType;

#define CK(x)                                                                             \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)

// ---------------------------------------------------------------------------
// 16-bit conversions on the host.
static uint16_t f2h(float f, DType dt) {
  if (dt == DType::kBFloat16) {
    __nv_bfloat16 b = __float2bfloat16_rn(f);
    uint16_t r;
    std::memcpy(&r, &b, 2);
    return r;
  }
  __half h = __float2half_rn(f);
  uint16_t r;
  std::memcpy(&r, &h, 2);
  return r;
}
static float h2f(uint16_t u, DType dt) {
  if (dt == DType::kBFloat16) {
    __nv_bfloat16 b;
    std::memcpy(&b, &u, 2);
    return __bfloat162float(b);
  }
  __half h;
  std::memcpy(&h, &u, 2);
  return __half2float(h);
}
static double rnd(double x, DType dt) { return h2f(f2h(float(x), dt), dt); }

struct Shape {
  int B, Sq, Sk, Hq, Hkv, D;
  bool causal;
  DType dt;
  int head_pad = 0;  // extra elements between heads (non-packed strides)
};

// Dense BTNH with head stride D + head_pad.
struct Layout4 {
  int64_t bs, rs, hs;
  int64_t size;
};
static Layout4 make_layout4(int S, int H, int D, int pad) {
  Layout4 l;
  l.hs = D + pad;
  l.rs = int64_t(H) * l.hs;
  l.bs = int64_t(S) * l.rs;
  l.size = 0;
  return l;
}

// Reference forward + backward. Inputs are the rounded input values (float).
// lowp: round every intermediate to the dtype (naive low-precision attention).
struct RefOut {
  std::vector<double> o, lse, dq, dk, dv;  // o/dq: [B,Sq,Hq,D], dk/dv: [B,Sk,Hkv,D], lse [B,Hq,Sq]
};
static RefOut reference(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                        const std::vector<float>& v, const std::vector<float>& dout, bool lowp) {
  const int B = s.B, Sq = s.Sq, Sk = s.Sk, Hq = s.Hq, Hkv = s.Hkv, D = s.D, G = Hq / Hkv;
  const double scale = 1.0 / std::sqrt(double(D));
  auto R = [&](double x) { return lowp ? rnd(x, s.dt) : x; };
  RefOut r;
  r.o.assign(size_t(B) * Sq * Hq * D, 0.0);
  r.lse.assign(size_t(B) * Hq * Sq, 0.0);
  r.dq.assign(size_t(B) * Sq * Hq * D, 0.0);
  std::vector<double> dk_h(size_t(B) * Hq * Sk * D, 0.0), dv_h(size_t(B) * Hq * Sk * D, 0.0);
  auto qi = [&](int b, int i, int h, int d) { return ((size_t(b) * Sq + i) * Hq + h) * D + d; };
  auto ki = [&](int b, int j, int h, int d) { return ((size_t(b) * Sk + j) * Hkv + h) * D + d; };
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h) {
      const int hk = h / G;
      std::vector<double> P(size_t(Sq) * Sk), dS(size_t(Sq) * Sk);
      for (int i = 0; i < Sq; ++i) {
        double mx = -INFINITY;
        for (int j = 0; j < Sk; ++j) {
          double acc = 0;
          for (int d = 0; d < D; ++d) acc += double(q[qi(b, i, h, d)]) * k[ki(b, j, hk, d)];
          double sc = (s.causal && j > i) ? -INFINITY : R(R(acc) * scale);
          P[size_t(i) * Sk + j] = sc;
          mx = std::max(mx, sc);
        }
        double sum = 0;
        for (int j = 0; j < Sk; ++j) {
          double& p = P[size_t(i) * Sk + j];
          p = (mx == -INFINITY) ? 0.0 : std::exp(p - mx);
          sum += p;
        }
        r.lse[(size_t(b) * Hq + h) * Sq + i] = sum > 0 ? mx + std::log(sum) : -INFINITY;
        for (int j = 0; j < Sk; ++j) {
          double& p = P[size_t(i) * Sk + j];
          p = sum > 0 ? R(p / sum) : 0.0;
        }
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (int j = 0; j < Sk; ++j) acc += P[size_t(i) * Sk + j] * v[ki(b, j, hk, d)];
          r.o[qi(b, i, h, d)] = R(acc);
        }
        // backward for row i
        double Di = 0;
        for (int d = 0; d < D; ++d) Di += double(dout[qi(b, i, h, d)]) * r.o[qi(b, i, h, d)];
        if (lowp) Di = double(float(Di));
        for (int j = 0; j < Sk; ++j) {
          double dp = 0;
          for (int d = 0; d < D; ++d) dp += double(dout[qi(b, i, h, d)]) * v[ki(b, j, hk, d)];
          dp = R(dp);
          dS[size_t(i) * Sk + j] = R(P[size_t(i) * Sk + j] * (dp - Di));
        }
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (int j = 0; j < Sk; ++j) acc += dS[size_t(i) * Sk + j] * k[ki(b, j, hk, d)];
          r.dq[qi(b, i, h, d)] = R(acc * scale);
        }
      }
      double* dkh = &dk_h[(size_t(b) * Hq + h) * Sk * D];
      double* dvh = &dv_h[(size_t(b) * Hq + h) * Sk * D];
      for (int i = 0; i < Sq; ++i)
        for (int j = 0; j < Sk; ++j) {
          const double ds = dS[size_t(i) * Sk + j], p = P[size_t(i) * Sk + j];
          if (ds == 0 && p == 0) continue;
          for (int d = 0; d < D; ++d) {
            dkh[size_t(j) * D + d] += ds * q[qi(b, i, h, d)];
            dvh[size_t(j) * D + d] += p * dout[qi(b, i, h, d)];
          }
        }
    }
  r.dk.assign(size_t(B) * Sk * Hkv * D, 0.0);
  r.dv.assign(size_t(B) * Sk * Hkv * D, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int j = 0; j < Sk; ++j)
        for (int d = 0; d < D; ++d) {
          const size_t src = ((size_t(b) * Hq + h) * Sk + j) * D + d;
          const size_t dst = ki(b, j, h / G, d);
          r.dk[dst] += R(dk_h[src] * scale);
          r.dv[dst] += R(dv_h[src]);
        }
  if (lowp)
    for (auto* t : {&r.dk, &r.dv})
      for (auto& x : *t) x = rnd(x, s.dt);
  return r;
}

// ---------------------------------------------------------------------------
struct DevProblem {
  Shape s;
  Layout4 lq, lk;
  uint16_t *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float* lse;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  size_t nq, nk;  // element counts incl. padding
};

static void upload(uint16_t* dst, const std::vector<float>& src, const Shape& s, const Layout4& l,
                   int S, int H, size_t n) {
  std::vector<uint16_t> h(n, f2h(0.f, s.dt));
  for (int b = 0; b < s.B; ++b)
    for (int i = 0; i < S; ++i)
      for (int hh = 0; hh < H; ++hh)
        for (int d = 0; d < s.D; ++d)
          h[b * l.bs + i * l.rs + hh * l.hs + d] =
              f2h(src[((size_t(b) * S + i) * H + hh) * s.D + d], s.dt);
  CK(cudaMemcpy(dst, h.data(), n * 2, cudaMemcpyHostToDevice));
}
static std::vector<double> download(const uint16_t* src, const Shape& s, const Layout4& l, int S,
                                    int H, size_t n) {
  std::vector<uint16_t> h(n);
  CK(cudaMemcpy(h.data(), src, n * 2, cudaMemcpyDeviceToHost));
  std::vector<double> out(size_t(s.B) * S * H * s.D);
  for (int b = 0; b < s.B; ++b)
    for (int i = 0; i < S; ++i)
      for (int hh = 0; hh < H; ++hh)
        for (int d = 0; d < s.D; ++d)
          out[((size_t(b) * S + i) * H + hh) * s.D + d] =
              h2f(h[b * l.bs + i * l.rs + hh * l.hs + d], s.dt);
  return out;
}

static BwdParams make_params(DevProblem& p, bool deterministic) {
  const Shape& s = p.s;
  BwdParams b;
  b.q = p.q; b.k = p.k; b.v = p.v; b.o = p.o; b.lse = p.lse;
  b.dout = p.dout; b.dq = p.dq; b.dk = p.dk; b.dv = p.dv;
  b.q_batch_stride = b.o_batch_stride = b.do_batch_stride = b.dq_batch_stride = p.lq.bs;
  b.q_row_stride = b.o_row_stride = b.do_row_stride = b.dq_row_stride = p.lq.rs;
  b.q_head_stride = b.o_head_stride = b.do_head_stride = b.dq_head_stride = p.lq.hs;
  b.k_batch_stride = b.v_batch_stride = b.dk_batch_stride = b.dv_batch_stride = p.lk.bs;
  b.k_row_stride = b.v_row_stride = b.dk_row_stride = b.dv_row_stride = p.lk.rs;
  b.k_head_stride = b.v_head_stride = b.dk_head_stride = b.dv_head_stride = p.lk.hs;
  b.batch = s.B; b.seqlen_q = s.Sq; b.seqlen_k = s.Sk; b.heads_q = s.Hq; b.heads_kv = s.Hkv;
  b.head_dim = s.D;
  b.scale = float(1.0 / std::sqrt(double(s.D)));
  b.causal = s.causal;
  b.dtype = s.dt;
  b.deterministic = deterministic;
  b.workspace = p.ws;
  return b;
}

static DevProblem alloc_problem(const Shape& s) {
  DevProblem p;
  p.s = s;
  p.lq = make_layout4(s.Sq, s.Hq, s.D, s.head_pad);
  p.lk = make_layout4(s.Sk, s.Hkv, s.D, s.head_pad);
  p.nq = size_t(s.B) * p.lq.bs + 8;
  p.nk = size_t(s.B) * p.lk.bs + 8;
  for (auto** ptr : {&p.q, &p.o, &p.dout, &p.dq}) CK(cudaMalloc(ptr, p.nq * 2));
  for (auto** ptr : {&p.k, &p.v, &p.dk, &p.dv}) CK(cudaMalloc(ptr, p.nk * 2));
  CK(cudaMalloc(&p.lse, sizeof(float) * (size_t(s.B) * s.Hq * s.Sq + 1)));
  BwdParams a = make_params(p, false), d = make_params(p, true);
  p.ws_bytes = std::max(jax_flash::cuda::bwd_workspace_bytes(a), jax_flash::cuda::bwd_workspace_bytes(d));
  CK(cudaMalloc(&p.ws, p.ws_bytes + 256));
  return p;
}
static void free_problem(DevProblem& p) {
  for (void* ptr : {(void*)p.q, (void*)p.k, (void*)p.v, (void*)p.o, (void*)p.dout, (void*)p.dq,
                    (void*)p.dk, (void*)p.dv, (void*)p.lse, p.ws})
    CK(cudaFree(ptr));
}
static void poison(DevProblem& p) {
  CK(cudaMemset(p.dq, 0xFF, p.nq * 2));
  CK(cudaMemset(p.dk, 0xFF, p.nk * 2));
  CK(cudaMemset(p.dv, 0xFF, p.nk * 2));
  CK(cudaMemset(p.ws, 0xFF, p.ws_bytes));
}

static double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::fabs(x));
  return m;
}
// NaN-aware max |a - b|.
static double max_err(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(a[i] - b[i]);
    if (!(e == e)) return INFINITY;
    m = std::max(m, e);
  }
  return m;
}

static const char* dtname(DType d) { return d == DType::kBFloat16 ? "bf16" : "fp16"; }

// Run one shape in both modes; returns the number of failures.
static int check_shape(const Shape& s, uint64_t seed, bool verbose) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto gen = [&](size_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = float(rnd(nd(rng), s.dt));
    return x;
  };
  const size_t nq = size_t(s.B) * s.Sq * s.Hq * s.D, nk = size_t(s.B) * s.Sk * s.Hkv * s.D;
  auto q = gen(nq), k = gen(nk), v = gen(nk), dout = gen(nq);
  RefOut ref = reference(s, q, k, v, dout, false);
  RefOut naive = reference(s, q, k, v, dout, true);

  DevProblem p = alloc_problem(s);
  upload(p.q, q, s, p.lq, s.Sq, s.Hq, p.nq);
  upload(p.k, k, s, p.lk, s.Sk, s.Hkv, p.nk);
  upload(p.v, v, s, p.lk, s.Sk, s.Hkv, p.nk);
  upload(p.dout, dout, s, p.lq, s.Sq, s.Hq, p.nq);
  std::vector<float> of(ref.o.begin(), ref.o.end());
  upload(p.o, of, s, p.lq, s.Sq, s.Hq, p.nq);
  std::vector<float> lsef(ref.lse.begin(), ref.lse.end());
  CK(cudaMemcpy(p.lse, lsef.data(), lsef.size() * 4, cudaMemcpyHostToDevice));

  int fails = 0;
  std::vector<uint16_t> det_first[3];
  for (int mode = 0; mode < 3; ++mode) {  // atomic, deterministic, deterministic again
    const bool det = mode > 0;
    poison(p);
    BwdParams bp = make_params(p, det);
    CK(jax_flash::cuda::run_bwd(bp, 0));
    CK(cudaDeviceSynchronize());
    if (mode == 2) {
      bool same = true;
      const uint16_t* outs[3] = {p.dq, p.dk, p.dv};
      const size_t ns[3] = {p.nq, p.nk, p.nk};
      for (int t = 0; t < 3; ++t) {
        std::vector<uint16_t> h(ns[t]);
        CK(cudaMemcpy(h.data(), outs[t], ns[t] * 2, cudaMemcpyDeviceToHost));
        same = same && h == det_first[t];
      }
      if (!same) {
        std::printf("FAIL determinism B=%d Sq=%d Sk=%d Hq=%d Hkv=%d D=%d %s causal=%d\n", s.B, s.Sq,
                    s.Sk, s.Hq, s.Hkv, s.D, dtname(s.dt), s.causal);
        ++fails;
      }
      continue;
    }
    auto dq = download(p.dq, s, p.lq, s.Sq, s.Hq, p.nq);
    auto dk = download(p.dk, s, p.lk, s.Sk, s.Hkv, p.nk);
    auto dv = download(p.dv, s, p.lk, s.Sk, s.Hkv, p.nk);
    if (mode == 1) {
      const uint16_t* outs[3] = {p.dq, p.dk, p.dv};
      const size_t ns[3] = {p.nq, p.nk, p.nk};
      for (int t = 0; t < 3; ++t) {
        det_first[t].resize(ns[t]);
        CK(cudaMemcpy(det_first[t].data(), outs[t], ns[t] * 2, cudaMemcpyDeviceToHost));
      }
    }
    const char* names[3] = {"dq", "dk", "dv"};
    const std::vector<double>* got[3] = {&dq, &dk, &dv};
    const std::vector<double>* want[3] = {&ref.dq, &ref.dk, &ref.dv};
    const std::vector<double>* nv[3] = {&naive.dq, &naive.dk, &naive.dv};
    for (int t = 0; t < 3; ++t) {
      const double ek = max_err(*got[t], *want[t]);
      const double en = max_err(*nv[t], *want[t]);
      const double tol = 3.0 * en + 1e-4 * max_abs(*want[t]) + 1e-6;
      const bool ok = ek <= tol;
      if (!ok || verbose)
        std::printf("%s %s %s B=%d Sq=%d Sk=%d Hq=%d Hkv=%d D=%d %s causal=%d pad=%d: "
                    "err %.3e naive %.3e tol %.3e max|ref| %.3e\n",
                    ok ? "ok  " : "FAIL", det ? "det" : "atomic", names[t], s.B, s.Sq, s.Sk, s.Hq,
                    s.Hkv, s.D, dtname(s.dt), s.causal, s.head_pad, ek, en, tol, max_abs(*want[t]));
      fails += !ok;
    }
  }
  free_problem(p);
  return fails;
}

static int run_tests() {
  const int dims[] = {32, 40, 64, 80, 96, 128, 160, 192, 224, 256};
  struct S0 { int B, Sq, Sk, Hq, Hkv; };
  const S0 shapes[] = {
      {2, 128, 128, 4, 4},   {1, 17, 129, 8, 2},   {2, 129, 17, 3, 1},   {1, 1000, 1000, 2, 1},
      {1, 1, 1000, 8, 2},    {2, 1000, 129, 2, 2}, {1, 257, 1000, 4, 2}, {3, 129, 128, 8, 8},
  };
  const int nshapes = sizeof(shapes) / sizeof(shapes[0]);
  int fails = 0, cases = 0, idx = 0;
  for (int D : dims)
    for (int dt = 0; dt < 2; ++dt)
      for (int causal = 0; causal < 2; ++causal) {
        const S0& sh = shapes[idx % nshapes];
        ++idx;
        Shape s{sh.B, sh.Sq, sh.Sk, sh.Hq, sh.Hkv, D, causal != 0,
                dt ? DType::kBFloat16 : DType::kFloat16, 0};
        fails += check_shape(s, 1234 + idx, true);
        ++cases;
      }
  // Odd head dims (scalar load / store paths) and padded head strides.
  const Shape extra[] = {
      {2, 33, 77, 4, 2, 36, true, DType::kBFloat16, 0},
      {1, 65, 40, 2, 1, 33, false, DType::kFloat16, 0},
      {2, 100, 130, 4, 2, 64, true, DType::kBFloat16, 8},
      {1, 130, 100, 2, 2, 128, false, DType::kFloat16, 8},
      {1, 0, 50, 2, 1, 64, false, DType::kBFloat16, 0},
      {1, 50, 0, 2, 1, 64, false, DType::kBFloat16, 0},
  };
  for (const Shape& s : extra) {
    fails += check_shape(s, 99 + cases, true);
    ++cases;
  }
  std::printf("%d shapes, %d failures\n", cases, fails);
  return fails == 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------
// Variant cases: O and LSE from the float64 reference, dq/dk/dv of both modes
// against float64 (tolerance from the naive low-precision reference), exact
// zeros for padded query rows (dq) and masked-out keys (dk, dv), determinism.
static int check_variant(const vref::VarCase& c, uint64_t seed) {
  Shape s{c.B, c.Sq, c.Sk, c.Hq, c.Hkv, c.D, c.causal, c.dt, 0};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto gen = [&](size_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = float(rnd(nd(rng), s.dt));
    return x;
  };
  const size_t nq = size_t(s.B) * s.Sq * s.Hq * s.D, nk = size_t(s.B) * s.Sk * s.Hkv * s.D;
  auto q = gen(nq), k = gen(nk), v = gen(nk), dout = gen(nq);
  const vref::VarHost vh = vref::make_host(c, seed * 7 + 1);
  const vref::Ref ref = vref::reference(c, vh, q, k, v, dout, nullptr, true);
  const vref::Ref naive = vref::reference(c, vh, q, k, v, dout, &rnd, true);

  DevProblem p = alloc_problem(s);
  upload(p.q, q, s, p.lq, s.Sq, s.Hq, p.nq);
  upload(p.k, k, s, p.lk, s.Sk, s.Hkv, p.nk);
  upload(p.v, v, s, p.lk, s.Sk, s.Hkv, p.nk);
  upload(p.dout, dout, s, p.lq, s.Sq, s.Hq, p.nq);
  std::vector<float> of(ref.o.begin(), ref.o.end());
  upload(p.o, of, s, p.lq, s.Sq, s.Hq, p.nq);
  std::vector<float> lsef(ref.lse.begin(), ref.lse.end());
  CK(cudaMemcpy(p.lse, lsef.data(), lsef.size() * 4, cudaMemcpyHostToDevice));
  vref::VarDev vd;
  BwdParams base = make_params(p, false);
  vref::fill_params(base, c, vh, vd);

  int fails = 0;
  std::vector<uint16_t> det_first[3];
  for (int mode = 0; mode < 3; ++mode) {
    const bool det = mode > 0;
    poison(p);
    BwdParams bp = base;
    bp.deterministic = det;
    CK(jax_flash::cuda::run_bwd(bp, 0));
    CK(cudaDeviceSynchronize());
    const uint16_t* outs[3] = {p.dq, p.dk, p.dv};
    const size_t ns[3] = {p.nq, p.nk, p.nk};
    if (mode == 2) {
      bool same = true;
      for (int t = 0; t < 3; ++t) {
        std::vector<uint16_t> hb(ns[t]);
        CK(cudaMemcpy(hb.data(), outs[t], ns[t] * 2, cudaMemcpyDeviceToHost));
        same = same && hb == det_first[t];
      }
      if (!same) { std::printf("FAIL VAR determinism %s\n", c.name); ++fails; }
      continue;
    }
    if (mode == 1)
      for (int t = 0; t < 3; ++t) {
        det_first[t].resize(ns[t]);
        CK(cudaMemcpy(det_first[t].data(), outs[t], ns[t] * 2, cudaMemcpyDeviceToHost));
      }
    auto dq = download(p.dq, s, p.lq, s.Sq, s.Hq, p.nq);
    auto dk = download(p.dk, s, p.lk, s.Sk, s.Hkv, p.nk);
    auto dv = download(p.dv, s, p.lk, s.Sk, s.Hkv, p.nk);
    // Exact zeros: dq of padded rows, dk/dv of keys >= kv_len.
    int64_t nonzero = 0;
    for (int b = 0; b < s.B; ++b) {
      for (int i = 0; i < s.Sq; ++i)
        if (ref.row_padded[size_t(b) * s.Sq + i])
          for (int h = 0; h < s.Hq; ++h)
            for (int d = 0; d < s.D; ++d) nonzero += dq[((size_t(b) * s.Sq + i) * s.Hq + h) * s.D + d] != 0.0;
      if (!vh.kv_len.empty())
        for (int j = vh.kv_len[b]; j < s.Sk; ++j)
          for (int h = 0; h < s.Hkv; ++h)
            for (int d = 0; d < s.D; ++d) {
              const size_t ix = ((size_t(b) * s.Sk + j) * s.Hkv + h) * s.D + d;
              nonzero += (dk[ix] != 0.0) + (dv[ix] != 0.0);
            }
    }
    const char* names[3] = {"dq", "dk", "dv"};
    const std::vector<double>* got[3] = {&dq, &dk, &dv};
    const std::vector<double>* want[3] = {&ref.dq, &ref.dk, &ref.dv};
    const std::vector<double>* nv[3] = {&naive.dq, &naive.dk, &naive.dv};
    for (int t = 0; t < 3; ++t) {
      const double ek = max_err(*got[t], *want[t]);
      const double en = max_err(*nv[t], *want[t]);
      const double tol = 3.0 * en + 1e-4 * max_abs(*want[t]) + 1e-6;
      const bool ok = ek <= tol && (t > 0 || nonzero == 0);
      std::printf("%s VAR %-6s %s %-52s %s D=%d B=%d Sq=%d Sk=%d Hq=%d Hkv=%d: err %.3e naive %.3e ratio %.2f max|ref| %.3e nonzero_pad %lld\n",
                  ok ? "ok  " : "FAIL", det ? "det" : "atomic", names[t], c.name, dtname(s.dt), s.D, s.B,
                  s.Sq, s.Sk, s.Hq, s.Hkv, ek, en, en > 0 ? ek / en : 0.0, max_abs(*want[t]),
                  (long long)nonzero);
      fails += !ok;
    }
  }
  vd.free_all();
  free_problem(p);
  return fails;
}

// bwd_alt.cu: the generic variants kernels on the plain dK/dV tile (d128 bf16).
cudaError_t jf_bwd_var_general_d128_tile128(const jax_flash::BwdParams& p, cudaStream_t s);

// Mean ms of `reps` calls of fn (returning cudaError_t) after one warm-up
// (the sm90 harnesses, which include this file, time with it too).
template <class Fn>
static float time_ms(Fn&& fn, int reps = 5) {
  CK(fn());
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  for (int r = 0; r < reps; ++r) CK(fn());
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float t;
  CK(cudaEventElapsedTime(&t, e0, e1));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return t / reps;
}

// A causal self-attention timing problem (Sq == Sk, Hq == Hkv): q, k, v, o,
// dout one random tensor, LSE a constant.
static DevProblem bench_problem(const Shape& s, unsigned seed) {
  DevProblem p = alloc_problem(s);
  std::vector<uint16_t> hb(p.nq);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : hb) x = f2h(nd(rng), s.dt);
  for (auto* ptr : {p.q, p.k, p.v, p.o, p.dout}) CK(cudaMemcpy(ptr, hb.data(), p.nq * 2, cudaMemcpyHostToDevice));
  std::vector<float> lse(size_t(s.B) * s.Hq * s.Sq, std::log(float(s.Sq)) + 3.f);
  CK(cudaMemcpy(p.lse, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice));
  return p;
}


// Backward (atomic and deterministic) of the variants kernels vs plain causal.
static void bench_variants() {
  const int S = 8192, D = 128, H = 16, B = 1;
  Shape s{B, S, S, H, H, D, true, DType::kBFloat16, 0};
  DevProblem p = bench_problem(s, 1);
  vref::VarDev vd;
  std::vector<int32_t> lens(B, S - 100), ids(size_t(B) * S, 1), offs(B, 0);
  const int32_t* d_lens = vd.put(lens);
  const int32_t* d_ids = vd.put(ids);
  const int32_t* d_rng = vd.put(vref::seg_ranges(ids, B, S));
  const int32_t* d_offs = vd.put(offs);
  const float* d_slopes = vd.put(std::vector<float>(H, 0.01f));
  const uint32_t* d_seed = vd.put(std::vector<uint32_t>{1u, 2u});
  // Packed documents of mixed lengths (not tile aligned), causal inside each.
  const int doc_len[] = {1000, 300, 2500, 700, 1800, 1200, 692};
  std::vector<int32_t> pids(size_t(B) * S);
  double pairs = 0;
  {
    int pos = 0, id = 0;
    for (int L : doc_len) {
      for (int i = 0; i < L && pos < S; ++i) pids[pos++] = id;
      pairs += 0.5 * double(L) * (L + 1);
      ++id;
    }
  }
  const int32_t* d_pids = vd.put(pids);
  const int32_t* d_prng = vd.put(vref::seg_ranges(pids, B, S));
  const char* names[] = {"plain causal", "variants kernel, no-op window", "window 4096", "softcap 30",
                         "alibi", "lengths (s-100)", "segments (one doc)", "query_offsets (0)", "dropout 0.1",
                         "packed docs (7, 300-2500)", "softcap 30 + alibi", "softcap 30 + window 4096"};
  double base_ms[2] = {0, 0};
  for (int vi = 0; vi < 12; ++vi)
    for (int det = 0; det < 2; ++det) {
      BwdParams bp = make_params(p, det != 0);
      switch (vi) {
        case 1: bp.window_left = 1 << 30; break;
        case 2: bp.window_left = 4096; break;
        case 3: bp.softcap = 30.f; break;
        case 4: bp.alibi_slopes = d_slopes; break;
        case 5: bp.q_seqlens = bp.kv_seqlens = d_lens; break;
        case 6: bp.q_segment_ids = bp.kv_segment_ids = d_ids; bp.q_segment_ranges = bp.kv_segment_ranges = d_rng; break;
        case 7: bp.query_offsets = d_offs; break;
        case 8: bp.dropout_rate = 0.1f; bp.dropout_seed = d_seed; break;
        case 9: bp.q_segment_ids = bp.kv_segment_ids = d_pids; bp.q_segment_ranges = bp.kv_segment_ranges = d_prng; break;
        case 10: bp.softcap = 30.f; bp.alibi_slopes = d_slopes; break;
        case 11: bp.softcap = 30.f; bp.window_left = 4096; break;
        default: break;
      }
      const float t = time_ms([&] { return jax_flash::cuda::run_bwd(bp, 0); });
      if (vi == 0) base_ms[det] = t;
      std::printf("VBENCH bwd d=%d s=%d h=%d causal %-6s %-30s %.3f ms  x%.3f vs plain\n", D, S, H,
                  det ? "det" : "atomic", names[vi], t, t / base_ms[det]);
      if (!det && (vi == 3 || vi == 4 || vi == 8 || vi == 10 || vi == 11)) {
        // The SM80 generic variants kernel, which ran these before the Hopper
        // logits kernels (run_bwd dispatches those on cc 9.0 in 90a builds).
        const float t3 = time_ms([&] {
          return jax_flash::cuda::run_bwd_var_hdim<DType::kBFloat16, 128>(bp, jax_flash::cuda::BwdLaunchFlags{true, true}, 0);
        });
        std::printf("VBENCH bwd d=%d s=%d h=%d causal %-6s %-30s %.3f ms  x%.3f vs plain (SM80 generic variants kernel)\n",
                    D, S, H, "atomic", names[vi], t3, t3 / base_ms[det]);
      }
      if (vi == 3 || vi == 4 || vi == 8) {
        // Same options on the alternative tile (harness-only kernel).
        const float t2 = time_ms([&] { return jf_bwd_var_general_d128_tile128(bp, 0); });
        std::printf("VBENCH bwd d=%d s=%d h=%d causal %-6s %-30s %.3f ms  x%.3f vs plain (alt: general kernel, 64x128 dK/dV tile)\n",
                    D, S, H, det ? "det" : "atomic", names[vi], t2, t2 / base_ms[det]);
      }
      if (vi == 9)
        std::printf("VBENCH bwd packed docs %s: real-work rate = %.3f of plain causal\n",
                    det ? "det" : "atomic", (pairs / t) / (0.5 * double(S) * S / base_ms[det]));
      std::fflush(stdout);
    }
  vd.free_all();
  free_problem(p);
}

// Soft-cap / ALiBi / dropout backward at head dim 64 (8k, 16 heads, causal, bf16,
// atomic) vs plain causal, with the Hopper alternative tile.
static void bench_logits_d64() {
  const int S = 8192, D = 64, H = 16, B = 1;
  Shape s{B, S, S, H, H, D, true, DType::kBFloat16, 0};
  DevProblem p = bench_problem(s, 2);
  vref::VarDev vd;
  const float* d_slopes = vd.put(std::vector<float>(H, 0.01f));
  const uint32_t* d_seed = vd.put(std::vector<uint32_t>{1u, 2u});
  const char* names[] = {"plain causal", "softcap 30", "alibi", "softcap 30 + alibi", "dropout 0.1"};
  float base = 0.f;
  for (int vi = 0; vi < 5; ++vi) {
    BwdParams bp = make_params(p, false);
    if (vi == 1 || vi == 3) bp.softcap = 30.f;
    if (vi == 2 || vi == 3) bp.alibi_slopes = d_slopes;
    if (vi == 4) {
      bp.dropout_rate = 0.1f;
      bp.dropout_seed = d_seed;
    }
    const float t = time_ms([&] { return jax_flash::cuda::run_bwd(bp, 0); });
    if (vi == 0) base = t;
    std::printf("VBENCH bwd d=%d s=%d h=%d causal atomic %-30s %.3f ms  x%.3f vs plain\n", D, S, H, names[vi], t, t / base);
    if (vi > 0) {
      const float t3 = time_ms([&] {
        return jax_flash::cuda::run_bwd_var_hdim<DType::kBFloat16, 64>(bp, jax_flash::cuda::BwdLaunchFlags{true, true}, 0);
      });
      std::printf("VBENCH bwd d=%d s=%d h=%d causal atomic %-30s %.3f ms  x%.3f vs plain (SM80 generic variants kernel)\n",
                  D, S, H, names[vi], t3, t3 / base);
    }
    std::fflush(stdout);
  }
  vd.free_all();
  free_problem(p);
}

static int run_variants(bool small) {
  int fails = 0;
  uint64_t seed = 100;
  const auto vc = vref::cases(small);
  for (const auto& c : vc) fails += check_variant(c, seed++);
  std::printf("%zu variant cases, %d failures\n", vc.size(), fails);
  if (!small) {
    bench_variants();
    bench_logits_d64();
  }
  return fails == 0 ? 0 : 1;
}

static int run_small() {
  Shape s{2, 37, 53, 4, 2, 64, true, DType::kBFloat16, 0};
  int f = check_shape(s, 7, true);
  Shape s2{1, 29, 19, 3, 1, 96, true, DType::kFloat16, 0};
  f += check_shape(s2, 8, true);
  return f == 0 ? 0 : 1;
}

static int run_bench(int argc, char** argv) {
  // bench [hdims csv] [seqlens csv]
  std::vector<int> dims = {64, 128, 256}, seqs = {1024, 2048, 4096, 8192, 16384};
  auto parse = [](const char* a) {
    std::vector<int> v;
    for (const char* c = a; *c;) {
      v.push_back(std::atoi(c));
      while (*c && *c != ',') ++c;
      if (*c == ',') ++c;
    }
    return v;
  };
  if (argc > 2) dims = parse(argv[2]);
  if (argc > 3) seqs = parse(argv[3]);
  std::printf("bf16, 16k tokens, hidden 2048; backward only (preprocess + main + dq epilogue)\n");
  std::printf("%5s %6s %6s %4s %10s %10s %10s %10s %7s\n", "hdim", "seqlen", "batch", "caus",
              "atomic_ms", "atomic_TF", "determ_ms", "determ_TF", "det/at");
  for (int D : dims)
    for (int S : seqs)
      for (int causal = 0; causal < 2; ++causal) {
        const int H = 2048 / D, B = 16384 / S;
        Shape s{B, S, S, H, H, D, causal != 0, DType::kBFloat16, 0};
        DevProblem p = alloc_problem(s);
        // Random-ish data on the device: reuse a host buffer of small values.
        std::vector<uint16_t> h(p.nq);
        std::mt19937 rng(1);
        std::normal_distribution<float> nd(0.f, 1.f);
        for (auto& x : h) x = f2h(nd(rng), s.dt);
        for (auto* ptr : {p.q, p.k, p.v, p.o, p.dout}) CK(cudaMemcpy(ptr, h.data(), p.nq * 2, cudaMemcpyHostToDevice));
        std::vector<float> lse(size_t(B) * H * S, std::log(float(S)) + 3.f);
        CK(cudaMemcpy(p.lse, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice));
        double ms[2];
        for (int det = 0; det < 2; ++det) {
          BwdParams bp = make_params(p, det != 0);
          cudaEvent_t e0, e1;
          CK(cudaEventCreate(&e0));
          CK(cudaEventCreate(&e1));
          CK(jax_flash::cuda::run_bwd(bp, 0));
          CK(cudaDeviceSynchronize());
          const int reps = 5;
          CK(cudaEventRecord(e0));
          for (int r = 0; r < reps; ++r) CK(jax_flash::cuda::run_bwd(bp, 0));
          CK(cudaEventRecord(e1));
          CK(cudaEventSynchronize(e1));
          float t;
          CK(cudaEventElapsedTime(&t, e0, e1));
          ms[det] = t / reps;
          CK(cudaEventDestroy(e0));
          CK(cudaEventDestroy(e1));
        }
        const double flops = 2.5 * 4.0 * double(S) * S * D * H * B / (causal ? 2.0 : 1.0);
        std::printf("%5d %6d %6d %4d %10.3f %10.1f %10.3f %10.1f %7.3f\n", D, S, B, causal, ms[0],
                    flops / ms[0] / 1e9, ms[1], flops / ms[1] / 1e9, ms[1] / ms[0]);
        std::fflush(stdout);
        free_problem(p);
      }
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "test";
  if (mode == "test") return run_tests();
  if (mode == "small") return run_small();
  if (mode == "bench") return run_bench(argc, argv);
  if (mode == "variants") return run_variants(argc > 2 && std::string(argv[2]) == "small");
  if (mode == "one" && argc >= 9) {
    Shape s{std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]),
            std::atoi(argv[6]), std::atoi(argv[7]), std::atoi(argv[8]) != 0,
            (argc > 9 && std::string(argv[9]) == "fp16") ? DType::kFloat16 : DType::kBFloat16, 0};
    return check_shape(s, 5, true) == 0 ? 0 : 1;
  }
  std::fprintf(stderr, "usage: %s test|small|bench|one B Sq Sk Hq Hkv D causal [fp16|bf16]\n", argv[0]);
  return 2;
}
