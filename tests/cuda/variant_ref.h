// Host side of the variant cases shared by fwd_harness.cu and bwd_harness.cu:
// case description, generation of the per-batch arrays (lengths, offsets,
// segment ids and their 16-block ranges, ALiBi slopes, dropout seed), device
// upload into FwdParams, and an explicit float64 reference of the forward
// (o, lse) and backward (dq, dk, dv) that applies the same mask, soft-cap,
// ALiBi bias and dropout keep mask (cpp/dropout.h, evaluated on the host).
// `round` != nullptr gives the naive low-precision variant (every
// intermediate rounded to the input dtype), the tolerance yardstick.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "dropout.h"
#include "params.h"

namespace vref {

using jax_flash::DType;
using jax_flash::FwdParams;

struct VarCase {
  const char* name;
  int B, Sq, Sk, Hq, Hkv, D;
  DType dt;
  bool causal = false;
  int64_t query_offset = 0;
  int64_t left = -1, right = -1;
  float softcap = 0.f;
  bool lengths = false;      // random q_seqlens / kv_seqlens per batch (one batch full, one 0 rows)
  bool batch_offsets = false;  // per-batch query_offsets
  bool segments = false;     // packed documents
  int alibi = 0;             // 0 none, 1 slopes [Hq], 2 slopes [B, Hq]
  float dropout = 0.f;
};

struct VarHost {
  std::vector<int32_t> q_len, kv_len, qoffs, qseg, kseg, qrng, krng;
  std::vector<float> slopes;
  uint32_t seed[2] = {0x1234567u, 0x9abcdefu};
};

inline std::vector<int32_t> seg_ids(int B, int S, std::mt19937_64& rng) {
  std::vector<int32_t> ids(size_t(B) * S);
  for (int b = 0; b < B; ++b) {
    int id = 0, left = 0;
    for (int i = 0; i < S; ++i) {
      if (left == 0) {
        ++id;
        left = 1 + int(rng() % 45);
      }
      --left;
      ids[size_t(b) * S + i] = id;
    }
  }
  return ids;
}
inline std::vector<int32_t> seg_ranges(const std::vector<int32_t>& ids, int B, int S) {
  const int nb = (S + 15) / 16;
  std::vector<int32_t> r(size_t(B) * nb * 2);
  for (int b = 0; b < B; ++b)
    for (int k = 0; k < nb; ++k) {
      int mn = INT32_MAX, mx = INT32_MIN;
      for (int i = k * 16; i < std::min(S, k * 16 + 16); ++i) {
        mn = std::min(mn, int(ids[size_t(b) * S + i]));
        mx = std::max(mx, int(ids[size_t(b) * S + i]));
      }
      r[(size_t(b) * nb + k) * 2] = mn;
      r[(size_t(b) * nb + k) * 2 + 1] = mx;
    }
  return r;
}

inline VarHost make_host(const VarCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  VarHost h;
  if (c.lengths) {
    for (int b = 0; b < c.B; ++b) {
      int ql = b == 0 ? c.Sq : int(rng() % (c.Sq + 1));
      int kl = b == 0 ? c.Sk : 1 + int(rng() % c.Sk);
      if (b == 1) ql = 0;  // a batch with no valid query row
      if (b == 2) kl = 0;  // and one with no valid key
      h.q_len.push_back(ql);
      h.kv_len.push_back(kl);
    }
  }
  if (c.batch_offsets)
    for (int b = 0; b < c.B; ++b) h.qoffs.push_back(int32_t(rng() % 97) - 20);
  if (c.segments) {
    h.qseg = seg_ids(c.B, c.Sq, rng);
    h.kseg = c.Sq == c.Sk ? h.qseg : seg_ids(c.B, c.Sk, rng);
    h.qrng = seg_ranges(h.qseg, c.B, c.Sq);
    h.krng = seg_ranges(h.kseg, c.B, c.Sk);
  }
  if (c.alibi) {
    const int n = c.alibi == 1 ? c.Hq : c.B * c.Hq;
    for (int i = 0; i < n; ++i) h.slopes.push_back(float(std::pow(2.0, -8.0 * (1 + i % c.Hq) / c.Hq)) * (1.f + 0.1f * (i / c.Hq)));
  }
  h.seed[0] = uint32_t(rng());
  h.seed[1] = uint32_t(rng());
  return h;
}

// Device copies of the arrays (freed by free_dev).
struct VarDev {
  std::vector<void*> ptrs;
  template <class T>
  const T* put(const std::vector<T>& v) {
    if (v.empty()) return nullptr;
    void* d = nullptr;
    if (cudaMalloc(&d, v.size() * sizeof(T)) != cudaSuccess) std::abort();
    cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    ptrs.push_back(d);
    return static_cast<const T*>(d);
  }
  void free_all() {
    for (void* p : ptrs) cudaFree(p);
    ptrs.clear();
  }
};

inline void fill_params(FwdParams& p, const VarCase& c, const VarHost& h, VarDev& dev) {
  p.causal = c.causal;
  p.query_offset = c.query_offset;
  p.window_left = c.left;
  p.window_right = c.right;
  p.softcap = c.softcap;
  p.q_seqlens = dev.put(h.q_len);
  p.kv_seqlens = dev.put(h.kv_len);
  p.query_offsets = dev.put(h.qoffs);
  p.q_segment_ids = dev.put(h.qseg);
  p.kv_segment_ids = dev.put(h.kseg);
  p.q_segment_ranges = dev.put(h.qrng);
  p.kv_segment_ranges = dev.put(h.krng);
  p.alibi_slopes = dev.put(h.slopes);
  p.alibi_batch_stride = c.alibi == 2 ? c.Hq : 0;
  p.dropout_rate = c.dropout;
  if (c.dropout > 0.f) p.dropout_seed = dev.put(std::vector<uint32_t>{h.seed[0], h.seed[1]});
}

struct Ref {
  std::vector<double> o, lse, dq, dk, dv;  // o/dq [B,Sq,Hq,D]; dk/dv [B,Sk,Hkv,D]; lse [B,Hq,Sq]
  std::vector<char> row_empty;             // [B,Hq,Sq]: the row sees no key
  std::vector<char> row_padded;            // [B,Sq]: row >= q_len
};

// Forward + backward reference. q,k,v,dout: rounded input values. o_in:
// the O used for D = rowsum(dO * O) (nullptr: this reference's own o).
inline Ref reference(const VarCase& c, const VarHost& h, const std::vector<float>& q,
                     const std::vector<float>& k, const std::vector<float>& v,
                     const std::vector<float>& dout, double (*round)(double, DType), bool bwd) {
  const int B = c.B, Sq = c.Sq, Sk = c.Sk, Hq = c.Hq, Hkv = c.Hkv, D = c.D, G = Hq / Hkv;
  const double scale = 1.0 / std::sqrt(double(D));
  auto R = [&](double x) { return round ? round(x, c.dt) : x; };
  const double keep_scale = c.dropout > 0.f ? 1.0 / (1.0 - double(c.dropout)) : 1.0;
  const uint32_t thr = jax_flash::dropout_threshold(c.dropout);
  Ref r;
  r.o.assign(size_t(B) * Sq * Hq * D, 0.0);
  r.lse.assign(size_t(B) * Hq * Sq, 0.0);
  r.row_empty.assign(size_t(B) * Hq * Sq, 0);
  r.row_padded.assign(size_t(B) * Sq, 0);
  r.dq.assign(size_t(B) * Sq * Hq * D, 0.0);
  std::vector<double> dk_h, dv_h;
  if (bwd) {
    dk_h.assign(size_t(B) * Hq * Sk * D, 0.0);
    dv_h.assign(size_t(B) * Hq * Sk * D, 0.0);
  }
  auto qi = [&](int b, int i, int hh, int d) { return ((size_t(b) * Sq + i) * Hq + hh) * D + d; };
  auto ki = [&](int b, int j, int hh, int d) { return ((size_t(b) * Sk + j) * Hkv + hh) * D + d; };
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < Sq; ++i)
      r.row_padded[size_t(b) * Sq + i] = h.q_len.empty() ? 0 : (i >= h.q_len[b]);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < B; ++b)
    for (int hh = 0; hh < Hq; ++hh) {
      const int hk = hh / G;
      const int ql = h.q_len.empty() ? Sq : h.q_len[b];
      const int kl = h.kv_len.empty() ? Sk : h.kv_len[b];
      const int64_t off = c.query_offset + (h.qoffs.empty() ? 0 : h.qoffs[b]);
      const double slope = c.alibi ? h.slopes[c.alibi == 2 ? b * Hq + hh : hh] : 0.0;
      std::vector<double> P(size_t(Sq) * Sk, 0.0), dS(size_t(Sq) * Sk, 0.0),
          dT(size_t(Sq) * Sk, 1.0);
      std::vector<char> keep(size_t(Sq) * Sk, 1), vis(size_t(Sq) * Sk, 0);
      for (int i = 0; i < Sq; ++i) {
        const int64_t pos = i + off;
        double mx = -INFINITY;
        for (int j = 0; j < Sk; ++j) {
          bool ok = i < ql && j < kl;
          if (c.causal && j > pos) ok = false;
          if (c.right >= 0 && j > pos + c.right) ok = false;
          if (c.left >= 0 && j < pos - c.left) ok = false;
          if (c.segments && h.qseg[size_t(b) * Sq + i] != h.kseg[size_t(b) * Sk + j]) ok = false;
          vis[size_t(i) * Sk + j] = ok;
          if (c.dropout > 0.f) {
            keep[size_t(i) * Sk + j] = jax_flash::dropout_keep(h.seed, b, hh, i, j, thr);
          }
          if (!ok) continue;
          double acc = 0;
          for (int d = 0; d < D; ++d) acc += double(q[qi(b, i, hh, d)]) * k[ki(b, j, hk, d)];
          double s = R(R(acc) * scale);
          if (c.softcap > 0.f) {
            const double t = std::tanh(s / c.softcap);
            s = R(c.softcap * t);
            dT[size_t(i) * Sk + j] = 1.0 - t * t;
          }
          if (c.alibi) s = R(s - slope * std::fabs(double(pos - j)));
          P[size_t(i) * Sk + j] = s;
          mx = std::max(mx, s);
        }
        double sum = 0;
        for (int j = 0; j < Sk; ++j) {
          double& p = P[size_t(i) * Sk + j];
          p = vis[size_t(i) * Sk + j] ? std::exp(p - mx) : 0.0;
          sum += p;
        }
        r.lse[(size_t(b) * Hq + hh) * Sq + i] = sum > 0 ? mx + std::log(sum) : -INFINITY;
        r.row_empty[(size_t(b) * Hq + hh) * Sq + i] = !(sum > 0);
        for (int j = 0; j < Sk; ++j) {
          double& p = P[size_t(i) * Sk + j];
          p = sum > 0 ? R(p / sum) : 0.0;
        }
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (int j = 0; j < Sk; ++j)
            if (keep[size_t(i) * Sk + j]) acc += P[size_t(i) * Sk + j] * v[ki(b, j, hk, d)];
          r.o[qi(b, i, hh, d)] = R(acc * keep_scale);
        }
        if (!bwd) continue;
        double Di = 0;
        for (int d = 0; d < D; ++d) Di += double(dout[qi(b, i, hh, d)]) * r.o[qi(b, i, hh, d)];
        if (round) Di = double(float(Di));
        for (int j = 0; j < Sk; ++j) {
          if (P[size_t(i) * Sk + j] == 0.0) continue;
          double dp = 0;
          for (int d = 0; d < D; ++d) dp += double(dout[qi(b, i, hh, d)]) * v[ki(b, j, hk, d)];
          dp = R(dp);
          const double dpk = keep[size_t(i) * Sk + j] ? dp * keep_scale : 0.0;
          dS[size_t(i) * Sk + j] = R(P[size_t(i) * Sk + j] * (dpk - Di) * dT[size_t(i) * Sk + j]);
        }
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (int j = 0; j < Sk; ++j) acc += dS[size_t(i) * Sk + j] * k[ki(b, j, hk, d)];
          r.dq[qi(b, i, hh, d)] = R(acc * scale);
        }
      }
      if (!bwd) continue;
      double* dkh = &dk_h[(size_t(b) * Hq + hh) * Sk * D];
      double* dvh = &dv_h[(size_t(b) * Hq + hh) * Sk * D];
      for (int i = 0; i < Sq; ++i)
        for (int j = 0; j < Sk; ++j) {
          const double ds = dS[size_t(i) * Sk + j];
          const double pd = keep[size_t(i) * Sk + j] ? P[size_t(i) * Sk + j] * keep_scale : 0.0;
          if (ds == 0 && pd == 0) continue;
          for (int d = 0; d < D; ++d) {
            dkh[size_t(j) * D + d] += ds * q[qi(b, i, hh, d)];
            dvh[size_t(j) * D + d] += R(pd) * dout[qi(b, i, hh, d)];
          }
        }
    }
  if (!bwd) return r;
  r.dk.assign(size_t(B) * Sk * Hkv * D, 0.0);
  r.dv.assign(size_t(B) * Sk * Hkv * D, 0.0);
  for (int b = 0; b < B; ++b)
    for (int hh = 0; hh < Hq; ++hh)
      for (int j = 0; j < Sk; ++j)
        for (int d = 0; d < D; ++d) {
          const size_t src = ((size_t(b) * Hq + hh) * Sk + j) * D + d;
          const size_t dst = ki(b, j, hh / G, d);
          r.dk[dst] += R(dk_h[src] * scale);
          r.dv[dst] += R(dv_h[src]);
        }
  if (round)
    for (auto* t : {&r.dk, &r.dv})
      for (auto& x : *t) x = round(x, c.dt);
  return r;
}

// The case list: each variant alone, then the combinations the issue names.
inline std::vector<VarCase> cases(bool small) {
  const DType B16 = DType::kBFloat16, F16 = DType::kFloat16;
  std::vector<VarCase> v;
  auto add = [&](VarCase c) { v.push_back(c); };
  if (small) {
    VarCase c{"sanitize: segments+causal+lengths+softcap+alibi+dropout GQA", 3, 67, 83, 4, 2, 64, B16};
    c.causal = true; c.segments = true; c.lengths = true; c.softcap = 20.f; c.alibi = 1; c.dropout = 0.2f;
    add(c);
    VarCase w{"sanitize: window+offset", 2, 45, 131, 2, 1, 64, F16};
    w.left = 30; w.right = 7; w.query_offset = 60;
    add(w);
    // Masks only at d128 over several tiles: the Hopper backward's masks
    // kernel on H100 (segment scan, skipped tiles, element masks).
    VarCase m{"sanitize: segments+causal+lengths+offsets (masks only) GQA", 2, 200, 260, 4, 2, 128, B16};
    m.causal = true; m.segments = true; m.lengths = true; m.batch_offsets = true; m.query_offset = 30;
    add(m);
    // Soft-cap + ALiBi at d128 over several tiles without dropout: the
    // Hopper backward's logits kernel (with masks) on H100.
    VarCase l{"sanitize: softcap+alibi+causal+window+lengths+segments (no dropout) GQA", 2, 200, 260, 4, 2, 128, B16};
    l.causal = true; l.softcap = 20.f; l.alibi = 2; l.left = 90; l.lengths = true; l.segments = true;
    add(l);
    // Dropout alone at d128 over several tiles (the Hopper backward's
    // dropout kernel: shuffles across lanes, keep bits under the wgmma).
    VarCase dd{"sanitize: dropout+causal (no soft-cap / ALiBi) GQA", 2, 200, 260, 4, 2, 128, B16};
    dd.causal = true; dd.dropout = 0.3f; dd.query_offset = 60;
    add(dd);
    // Soft-cap alone at d64 (its own kernel: ptxas's tanh schedule, 128
    // query rows a step).
    VarCase k{"sanitize: softcap+causal (no dropout) d64", 1, 300, 300, 2, 1, 64, F16};
    k.causal = true; k.softcap = 10.f;
    add(k);
    return v;
  }
  for (int D : {64, 128}) {
    const DType dt = D == 64 ? F16 : B16;
    { VarCase c{"window only (left 50, right 20)", 2, 257, 301, 4, 2, D, dt}; c.left = 50; c.right = 20; add(c); }
    { VarCase c{"causal + window left 64", 2, 300, 300, 2, 2, D, dt}; c.causal = true; c.left = 64; add(c); }
    { VarCase c{"causal + query_offset 100 (Sq < Sk)", 2, 129, 333, 4, 1, D, dt}; c.causal = true; c.query_offset = 100; add(c); }
    { VarCase c{"softcap 5 only", 2, 150, 170, 2, 1, D, dt}; c.softcap = 5.f; add(c); }
    { VarCase c{"lengths + GQA", 4, 200, 190, 8, 2, D, dt}; c.lengths = true; add(c); }
    { VarCase c{"lengths + causal", 3, 131, 257, 2, 2, D, dt}; c.lengths = true; c.causal = true; add(c); }
    { VarCase c{"segments only", 2, 301, 301, 2, 1, D, dt}; c.segments = true; add(c); }
    { VarCase c{"segments + causal", 2, 500, 500, 2, 2, D, dt}; c.segments = true; c.causal = true; add(c); }
    { VarCase c{"segments Sq != Sk", 2, 170, 260, 2, 1, D, dt}; c.segments = true; add(c); }
    { VarCase c{"alibi [Hq] only", 2, 140, 150, 4, 2, D, dt}; c.alibi = 1; add(c); }
    { VarCase c{"softcap 30 + alibi [B,Hq] + causal", 2, 257, 257, 4, 4, D, dt}; c.softcap = 30.f; c.alibi = 2; c.causal = true; add(c); }
    { VarCase c{"dropout 0.1 only", 2, 133, 177, 2, 1, D, dt}; c.dropout = 0.1f; add(c); }
    { VarCase c{"dropout 0.3 + causal + GQA", 2, 200, 200, 8, 2, D, dt}; c.dropout = 0.3f; c.causal = true; add(c); }
    { VarCase c{"per-batch query_offsets + causal", 3, 111, 260, 2, 1, D, dt}; c.batch_offsets = true; c.query_offset = 40; c.causal = true; add(c); }
    { VarCase c{"window + per-batch offsets + lengths", 3, 190, 230, 2, 2, D, dt}; c.batch_offsets = true; c.left = 33; c.right = 9; c.lengths = true; add(c); }
    { VarCase c{"everything", 3, 201, 199, 4, 2, D, dt}; c.causal = true; c.left = 70; c.segments = true; c.lengths = true; c.softcap = 15.f; c.alibi = 1; c.dropout = 0.15f; c.query_offset = 3; add(c); }
  }
  // Soft-cap / ALiBi without dropout at head dims 64 and 128 (the Hopper
  // backward's logits kernels on H100; elsewhere the SM80 generic ones):
  // every transform set, causal (one-sided tiles) and not (two-sided),
  // windows, lengths, segments, offsets static / per batch / far, GQA / MQA,
  // odd lengths, both dtypes.
  for (int D : {64, 128}) {
    for (DType dt : {B16, F16}) {
      { VarCase c{"L softcap 30 + causal, GQA", 2, 300, 300, 4, 2, D, dt}; c.softcap = 30.f; c.causal = true; add(c); }
      { VarCase c{"L alibi [Hq] + causal, Sq < Sk", 2, 129, 333, 4, 1, D, dt}; c.alibi = 1; c.causal = true; c.query_offset = 100; add(c); }
      { VarCase c{"L softcap 20 + alibi [B,Hq] + causal", 2, 257, 257, 4, 4, D, dt}; c.softcap = 20.f; c.alibi = 2; c.causal = true; add(c); }
    }
    const DType dt = D == 64 ? B16 : F16;
    { VarCase c{"L alibi not causal (two-sided tiles)", 2, 201, 257, 2, 2, D, dt}; c.alibi = 2; add(c); }
    { VarCase c{"L softcap 5 + alibi, window (40, 17), not causal", 2, 190, 230, 4, 2, D, dt}; c.softcap = 5.f; c.alibi = 1; c.left = 40; c.right = 17; add(c); }
    { VarCase c{"L softcap 10 + lengths + segments + causal", 3, 211, 199, 2, 1, D, dt}; c.softcap = 10.f; c.lengths = true; c.segments = true; c.causal = true; add(c); }
    { VarCase c{"L alibi + per-batch offsets + causal + window 64", 3, 111, 260, 4, 2, D, dt}; c.alibi = 1; c.batch_offsets = true; c.query_offset = 40; c.causal = true; c.left = 64; add(c); }
    { VarCase c{"L softcap 15 + alibi + far offset 3000, not causal", 1, 150, 170, 2, 1, D, dt}; c.softcap = 15.f; c.alibi = 1; c.query_offset = 3000; add(c); }
    { VarCase c{"L softcap 30 + alibi + segments + lengths + offsets, MQA", 2, 500, 480, 4, 1, D, dt}; c.softcap = 30.f; c.alibi = 2; c.segments = true; c.lengths = true; c.batch_offsets = true; c.causal = true; add(c); }
    { VarCase c{"L alibi, Sq 1", 2, 1, 300, 2, 1, D, dt}; c.alibi = 1; c.causal = true; c.query_offset = 299; add(c); }
    { VarCase c{"L softcap 30, Sk 17", 2, 130, 17, 2, 2, D, dt}; c.softcap = 30.f; add(c); }
  }
  // Dropout alone, with and without the masks, several tiles (the Hopper
  // backward's dropout kernels at d64 / d128 on H100: keep bits of the S^T
  // tile by the four-lane transpose).
  for (int D : {64, 128}) {
    for (DType dt : {B16, F16}) {
      { VarCase c{"D dropout 0.2 + causal, GQA", 2, 300, 300, 4, 2, D, dt}; c.dropout = 0.2f; c.causal = true; add(c); }
    }
    const DType dt = D == 64 ? F16 : B16;
    { VarCase c{"D dropout 0.5, not causal, Sq < Sk", 2, 131, 333, 2, 1, D, dt}; c.dropout = 0.5f; add(c); }
    { VarCase c{"D dropout 0.1 + segments + lengths + offsets + causal, MQA", 2, 500, 480, 4, 1, D, dt}; c.dropout = 0.1f; c.segments = true; c.lengths = true; c.batch_offsets = true; c.causal = true; add(c); }
    { VarCase c{"D dropout 0.3 + window (50, 20)", 2, 257, 301, 2, 2, D, dt}; c.dropout = 0.3f; c.left = 50; c.right = 20; add(c); }
  }
  { VarCase c{"odd head dim 40, causal+window+softcap", 2, 97, 131, 2, 1, 40, B16}; c.causal = true; c.left = 20; c.softcap = 8.f; add(c); }
  { VarCase c{"odd head dim 33 (scalar path), dropout+lengths", 3, 77, 91, 2, 1, 33, F16}; c.dropout = 0.25f; c.lengths = true; add(c); }
  { VarCase c{"hdim 64 bf16 everything", 2, 321, 300, 4, 1, 64, B16}; c.causal = true; c.segments = true; c.softcap = 10.f; c.alibi = 2; c.dropout = 0.1f; c.batch_offsets = true; add(c); }
  return v;
}

}  // namespace vref
