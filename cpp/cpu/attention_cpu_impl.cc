// FlashAttention-2 on the CPU. This file is compiled once per instruction set
// (JF_ISA_NS names the namespace, the build adds the -m flags); the dispatcher
// in attention_cpu_dispatch.cc picks the best one the processor supports.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/attention_cpu.h"
#include "cpu/tile_math.h"
#include "dropout.h"

namespace jax_flash::cpu::JF_ISA_NS {
namespace {

constexpr int kBlockQ = 64;
constexpr int kBlockK = 64;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// rows x cols elements (row stride `stride`) -> float tile dst[r * ld + c],
// zero-filling columns [cols, ld).
template <class T>
void load_rows(const T* src, int64_t stride, int rows, int cols, float* dst, int ld) {
  for (int r = 0; r < rows; ++r) {
    const T* s = src + r * stride;
    float* d = dst + int64_t(r) * ld;
    for (int c = 0; c < cols; ++c) d[c] = to_float(s[c]);
    for (int c = cols; c < ld; ++c) d[c] = 0.f;
  }
}

// Transposed load: dst[c * ld + r] = src[r][c] for c < padded_cols (zero past
// cols), and zero for rows [rows, ld) so padded keys contribute nothing.
template <class T>
void load_rows_transposed(const T* src, int64_t stride, int rows, int cols, int padded_cols,
                          float* dst, int ld) {
  for (int c = 0; c < padded_cols; ++c)
    for (int r = rows; r < ld; ++r) dst[int64_t(c) * ld + r] = 0.f;
  for (int r = 0; r < rows; ++r) {
    const T* s = src + r * stride;
    for (int c = 0; c < cols; ++c) dst[int64_t(c) * ld + r] = to_float(s[c]);
    for (int c = cols; c < padded_cols; ++c) dst[int64_t(c) * ld + r] = 0.f;
  }
}

template <class T>
void store_row(const float* src, float mul, int cols, T* dst) {
  for (int c = 0; c < cols; ++c) dst[c] = from_float<T>(src[c] * mul);
}

// Max and sum over n (a multiple of kTileN) floats, in lanes so they vectorise
// without reassociation flags.
float row_max(const float* x, int n) {
  float lanes[kTileN];
  for (int i = 0; i < kTileN; ++i) lanes[i] = kNegInf;
  for (int j = 0; j < n; j += kTileN)
    for (int i = 0; i < kTileN; ++i) lanes[i] = std::max(lanes[i], x[j + i]);
  float m = kNegInf;
  for (int i = 0; i < kTileN; ++i) m = std::max(m, lanes[i]);
  return m;
}

float row_sum(const float* x, int n) {
  float lanes[kTileN] = {};
  for (int j = 0; j < n; j += kTileN)
    for (int i = 0; i < kTileN; ++i) lanes[i] += x[j + i];
  float s = 0.f;
  for (int i = 0; i < kTileN; ++i) s += lanes[i];
  return s;
}

// The mask policy of one (folded) batch element: the per-batch variants
// (sequence lengths, per-batch query offsets, segment ids) resolved once.
struct BatchPolicy {
  const FwdParams& p;
  int64_t offset;  // absolute position of query row 0
  int q_len;       // rows >= q_len are padding: o = 0, lse = -inf
  int kv_len;      // keys >= kv_len are masked
  const int32_t* q_seg = nullptr;   // [seqlen_q], null without segments
  const int32_t* kv_seg = nullptr;  // [seqlen_k]
  const int32_t* q_rng = nullptr;   // [ceil(seqlen_q / 16)][2] inclusive id ranges
  const int32_t* kv_rng = nullptr;

  BatchPolicy(const FwdParams& params, int b) : p(params) {
    offset = p.query_offset + (p.query_offsets ? p.query_offsets[b] : 0);
    q_len = p.q_seqlens ? std::clamp(p.q_seqlens[b], 0, p.seqlen_q) : p.seqlen_q;
    kv_len = p.kv_seqlens ? std::clamp(p.kv_seqlens[b], 0, p.seqlen_k) : p.seqlen_k;
    if (p.q_segment_ids) {
      const int64_t nq = cdiv(p.seqlen_q, FwdParams::kSegmentBlock);
      const int64_t nk = cdiv(p.seqlen_k, FwdParams::kSegmentBlock);
      q_seg = p.q_segment_ids + int64_t(b) * p.seqlen_q;
      kv_seg = p.kv_segment_ids + int64_t(b) * p.seqlen_k;
      q_rng = p.q_segment_ranges + int64_t(b) * nq * 2;
      kv_rng = p.kv_segment_ranges + int64_t(b) * nk * 2;
    }
  }
  // Inclusive range of keys query row i may see (lengths applied).
  int64_t first_key(int64_t i) const {
    return p.window_left >= 0 ? i + offset - p.window_left : INT64_MIN / 2;
  }
  int64_t last_key(int64_t i) const {
    int64_t last = int64_t(kv_len) - 1;
    if (p.causal) last = std::min(last, i + offset);
    if (p.window_right >= 0) last = std::min(last, i + offset + p.window_right);
    return last;
  }
  // Whether the segment ids of positions [a0, a1] and [b0, b1] may meet.
  bool segments_meet(int64_t a0, int64_t a1, int64_t b0, int64_t b1) const {
    if (!q_rng) return true;
    constexpr int kB = FwdParams::kSegmentBlock;
    int32_t qmin = INT32_MAX, qmax = INT32_MIN, kmin = INT32_MAX, kmax = INT32_MIN;
    for (int64_t blk = a0 / kB; blk <= a1 / kB; ++blk) {
      qmin = std::min(qmin, q_rng[2 * blk]);
      qmax = std::max(qmax, q_rng[2 * blk + 1]);
    }
    for (int64_t blk = b0 / kB; blk <= b1 / kB; ++blk) {
      kmin = std::min(kmin, kv_rng[2 * blk]);
      kmax = std::max(kmax, kv_rng[2 * blk + 1]);
    }
    return qmin <= kmax && kmin <= qmax;
  }
  // Whether any query row in [q0, q1] may see any key in [k0, k1]: the visible
  // key range of a row only moves right as the row index grows.
  bool tile_visible(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const {
    return last_key(q1) >= k0 && first_key(q0) <= k1 && segments_meet(q0, q1, k0, k1);
  }
};

// What one query row needs to shape its logits in a K tile.
struct RowCtx {
  int64_t first_key, last_key;  // visible key range (absolute key indices)
  int64_t pos;                  // absolute query position (ALiBi)
  float alibi_log2;             // slope * log2(e); 0: no ALiBi
  int32_t seg;                  // the row's segment id
  const int32_t* kv_seg;        // ids of the tile's keys (k0 applied), null: no segments
};

RowCtx row_ctx(const BatchPolicy& bp, float slope, int64_t i, int k0) {
  return RowCtx{bp.first_key(i), bp.last_key(i), i + bp.offset, slope * kLog2e,
                bp.q_seg ? bp.q_seg[i] : 0, bp.kv_seg ? bp.kv_seg + k0 : nullptr};
}

float alibi_slope(const FwdParams& p, int b, int h) {
  return p.alibi_slopes ? p.alibi_slopes[int64_t(b) * p.alibi_batch_stride + h] : 0.f;
}

// Logits of one row in the log2 domain, in place: scaled, soft-capped when
// p.softcap > 0, ALiBi added, and -inf outside [first_key, last_key], past the
// tile's valid columns or in another segment. deriv (may be null) receives
// d(capped)/d(uncapped) per key, which the backward needs (1 when there is no cap).
void logits_row(const FwdParams& p, float* s, int valid_cols, int k0, const RowCtx& row,
                float* deriv) {
  const int64_t lo = std::max<int64_t>(0, row.first_key - k0);
  const int64_t hi = std::min<int64_t>(valid_cols, row.last_key - k0 + 1);
  if (p.softcap > 0.f) {
    const float inv_cap = 1.f / p.softcap;
    for (int j = 0; j < kBlockK; ++j) {
      const float t = std::tanh(s[j] * p.scale * inv_cap);
      if (deriv) deriv[j] = 1.f - t * t;
      s[j] = (j >= lo && j < hi) ? p.softcap * t * kLog2e : kNegInf;
    }
  } else {
    const float scale_log2 = p.scale * kLog2e;
    for (int j = 0; j < kBlockK; ++j) s[j] = (j >= lo && j < hi) ? s[j] * scale_log2 : kNegInf;
    if (deriv)
      for (int j = 0; j < kBlockK; ++j) deriv[j] = 1.f;
  }
  if (row.alibi_log2 != 0.f) {
    const int64_t rel = row.pos - k0;  // query position minus key j is rel - j
    for (int64_t j = lo; j < hi; ++j) s[j] -= row.alibi_log2 * float(std::llabs(rel - j));
  }
  if (row.kv_seg)
    for (int64_t j = lo; j < hi; ++j)
      if (row.kv_seg[j] != row.seg) s[j] = kNegInf;
}

// Dropout multipliers of one row's keys [k0, k0 + cols): 1 / (1 - rate) where
// the Philox keep mask (dropout.h) keeps the element, 0 elsewhere and past cols.
void dropout_row(const FwdParams& p, int b, int h, int row, int k0, int cols, float* z) {
  const uint32_t threshold = dropout_threshold(p.dropout_rate);
  const float keep_scale = 1.f / (1.f - p.dropout_rate);
  for (int j = 0; j < cols; j += 4) {  // k0 and j are multiples of 4
    const Philox4 w = dropout_words(p.dropout_seed, b, h, row, k0 + j);
    for (int t = 0; t < 4; ++t) z[j + t] = dropout_draw(philox_word(w, t), row) >= threshold ? keep_scale : 0.f;
  }
  for (int j = cols; j < kBlockK; ++j) z[j] = 0.f;
}

struct Scratch {
  std::vector<float> buf;
  float* get(size_t n) {
    if (buf.size() < n) buf.resize(n);
    return buf.data();
  }
};
thread_local Scratch tls_scratch;

// ---------------------------------------------------------------------------
// Forward: one work item is one (batch, q head, Q tile).
template <class T>
void fwd_item(const FwdParams& p, int b, int h, int qt) {
  const int D = p.head_dim;
  const int Dp = round_up(D, kTileN);
  const int q0 = qt * kBlockQ;
  const int tile_rows = std::min(kBlockQ, p.seqlen_q - q0);
  const BatchPolicy bp(p, b);
  // Rows past the query length are padding: computed as empty rows.
  const int rows = std::max(0, std::min(tile_rows, bp.q_len - q0));
  const int kvh = h / p.group_size();
  const float slope = alibi_slope(p, b, h);

  float* base = tls_scratch.get(size_t(kBlockQ) * Dp * 2 + size_t(Dp) * kBlockK * 2 +
                                size_t(kBlockQ) * kBlockK + 2 * kBlockQ + kBlockK);
  float* Qf = base;                        // [rows][Dp]
  float* acc = Qf + kBlockQ * Dp;          // [rows][Dp], unnormalised output
  float* Kt = acc + kBlockQ * Dp;          // [Dp][kBlockK]
  float* Vf = Kt + Dp * kBlockK;           // [kBlockK][Dp]
  float* S = Vf + kBlockK * Dp;            // [rows][kBlockK]
  float* m = S + kBlockQ * kBlockK;        // running row max (log2 domain)
  float* l = m + kBlockQ;                  // running row sum
  float* z = l + kBlockQ;                  // dropout multipliers of one row

  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + q0 * p.q_row_stride +
               h * p.q_head_stride;
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + kvh * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + kvh * p.v_head_stride;

  load_rows(q, p.q_row_stride, rows, D, Qf, Dp);
  std::fill(acc, acc + size_t(rows) * Dp, 0.f);
  std::fill(m, m + rows, kNegInf);
  std::fill(l, l + rows, 0.f);

  // K/V tiles outside the rows' visible key band (causal, window, kv length)
  // are never touched: the loop runs over the band's tiles only, and skips
  // tiles whose segment ids cannot meet the rows'.
  const int64_t band_lo = rows ? std::max<int64_t>(0, bp.first_key(q0)) : 0;
  const int64_t band_hi = rows ? std::min<int64_t>(p.seqlen_k, bp.last_key(q0 + rows - 1) + 1) : 0;
  for (int k0 = int(band_lo / kBlockK) * kBlockK; k0 < band_hi; k0 += kBlockK) {
    const int cols = int(std::min<int64_t>(kBlockK, band_hi - k0));
    if (!bp.segments_meet(q0, q0 + rows - 1, k0, k0 + cols - 1)) continue;
    load_rows_transposed(k + k0 * p.k_row_stride, p.k_row_stride, cols, D, Dp, Kt, kBlockK);
    load_rows(v + k0 * p.v_row_stride, p.v_row_stride, cols, D, Vf, Dp);
    gemm(rows, kBlockK, Dp, Qf, Dp, 1, Kt, kBlockK, S, kBlockK, false);

    for (int r = 0; r < rows; ++r) {
      float* s = S + r * kBlockK;
      logits_row(p, s, cols, k0, row_ctx(bp, slope, q0 + r, k0), nullptr);
      const float m_new = std::max(m[r], row_max(s, kBlockK));
      // A row with nothing visible yet keeps p = 0 (exp2(-inf - 0)).
      const float m_use = m_new == kNegInf ? 0.f : m_new;
      for (int j = 0; j < kBlockK; ++j) s[j] = fast_exp2(s[j] - m_use);
      const float alpha = fast_exp2(m[r] - m_use);
      // l (hence lse) sums the probabilities before dropout.
      l[r] = l[r] * alpha + row_sum(s, kBlockK);
      m[r] = m_new;
      if (p.dropout_rate > 0.f) {
        dropout_row(p, b, h, q0 + r, k0, cols, z);
        for (int j = 0; j < kBlockK; ++j) s[j] *= z[j];
      }
      if (alpha != 1.f) {
        float* a = acc + r * Dp;
        for (int c = 0; c < Dp; ++c) a[c] *= alpha;
      }
    }
    gemm(rows, Dp, cols, S, kBlockK, 1, Vf, Dp, acc, Dp, true);
  }

  // Rescale once; a row that saw no key gets o = 0 and lse = -inf.
  T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + q0 * p.o_row_stride + h * p.o_head_stride;
  float* lse = p.lse + (int64_t(b) * p.heads_q + h) * p.seqlen_q + q0;
  for (int r = 0; r < tile_rows; ++r) {
    const bool empty = r >= rows || !(l[r] > 0.f);
    if (r >= rows) std::fill(acc + r * Dp, acc + r * Dp + D, 0.f);
    store_row(acc + r * Dp, empty ? 0.f : 1.f / l[r], D, o + r * p.o_row_stride);
    lse[r] = empty ? kNegInf : (m[r] + std::log2(l[r])) * kLn2;
  }
}

template <class T>
void fwd(const FwdParams& p, const Executor& exec) {
  const int64_t n_qt = cdiv(p.seqlen_q, kBlockQ);
  const int64_t items = int64_t(p.batch) * p.heads_q * n_qt;
  // Causal rows late in the sequence cost more: hand out the last Q tiles
  // first so the tail of the schedule is made of cheap items.
  exec.parallel_for(items, [&](int64_t i) {
    const int qt = int(n_qt - 1 - i % n_qt);
    const int64_t bh = i / n_qt;
    fwd_item<T>(p, int(bh / p.heads_q), int(bh % p.heads_q), qt);
  });
}

// ---------------------------------------------------------------------------
// Backward. Pass 1: D = rowsum(dO * O) per (batch, head, row). Pass 2: one
// work item per (batch, kv head, chunk of K/V tiles) owns dK/dV of its tiles
// (summed over the q heads of its group) and adds dS K into a float dQ
// buffer of its own chunk. Pass 3: dQ = scale * sum over chunks, in a fixed
// order, so results do not depend on scheduling.

template <class T>
void bwd_rowsum(const BwdParams& p, float* dsum, const Executor& exec) {
  const int D = p.head_dim;
  exec.parallel_for(int64_t(p.batch) * p.heads_q, [&](int64_t bh) {
    const int b = int(bh / p.heads_q), h = int(bh % p.heads_q);
    const T* o = static_cast<const T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride;
    const T* g = static_cast<const T*>(p.dout) + b * p.do_batch_stride + h * p.do_head_stride;
    float* out = dsum + bh * p.seqlen_q;
    for (int i = 0; i < p.seqlen_q; ++i) {
      const T* oi = o + i * p.o_row_stride;
      const T* gi = g + i * p.do_row_stride;
      float s = 0.f;
      for (int c = 0; c < D; ++c) s += to_float(oi[c]) * to_float(gi[c]);
      out[i] = s;
    }
  });
}

template <class T>
void bwd_kv_item(const BwdParams& p, int b, int kvh, int chunk, int n_chunks, const float* dsum,
                 float* dq_acc) {
  const int D = p.head_dim;
  const int Dp = round_up(D, kTileN);
  const int G = p.group_size();
  const int n_kt = int(cdiv(p.seqlen_k, kBlockK));
  const int n_qt = int(cdiv(p.seqlen_q, kBlockQ));

  float* base = tls_scratch.get(size_t(kBlockK) * Dp * 6 + size_t(kBlockQ) * Dp * 2 +
                                size_t(kBlockQ) * kBlockK * 2 + 2 * kBlockK);
  float* Kf = base;                   // [kBlockK][Dp]
  float* Kt = Kf + kBlockK * Dp;      // [Dp][kBlockK]
  float* Vt = Kt + Dp * kBlockK;      // [Dp][kBlockK]
  float* dK = Vt + Dp * kBlockK;      // [kBlockK][Dp]
  float* dV = dK + kBlockK * Dp;      // [kBlockK][Dp]
  float* Qf = dV + kBlockK * Dp;      // [kBlockQ][Dp]
  float* dOf = Qf + kBlockQ * Dp;     // [kBlockQ][Dp]
  float* P = dOf + kBlockQ * Dp;      // [kBlockQ][kBlockK]
  float* dS = P + kBlockQ * kBlockK;  // [kBlockQ][kBlockK]
  float* deriv = dS + kBlockQ * kBlockK;  // [kBlockK] soft-cap derivative of one row
  float* z = deriv + kBlockK;             // [kBlockK] dropout multipliers of one row
  const BatchPolicy bp(p, b);
  const int q_rows = std::min(p.seqlen_q, bp.q_len);  // later rows are padding: no gradient

  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + kvh * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + kvh * p.v_head_stride;

  // Tiles dealt round-robin to chunks so causal work (heavier for early K
  // tiles) spreads evenly.
  for (int kt = chunk; kt < n_kt; kt += n_chunks) {
    const int k0 = kt * kBlockK;
    const int cols = std::min(kBlockK, p.seqlen_k - k0);
    load_rows(k + k0 * p.k_row_stride, p.k_row_stride, cols, D, Kf, Dp);
    load_rows_transposed(k + k0 * p.k_row_stride, p.k_row_stride, cols, D, Dp, Kt, kBlockK);
    load_rows_transposed(v + k0 * p.v_row_stride, p.v_row_stride, cols, D, Dp, Vt, kBlockK);
    std::fill(dK, dK + size_t(cols) * Dp, 0.f);
    std::fill(dV, dV + size_t(cols) * Dp, 0.f);

    for (int h = kvh * G; h < (kvh + 1) * G; ++h) {
      const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride;
      const T* g = static_cast<const T*>(p.dout) + b * p.do_batch_stride + h * p.do_head_stride;
      const float* lse = p.lse + (int64_t(b) * p.heads_q + h) * p.seqlen_q;
      const float* drow = dsum + (int64_t(b) * p.heads_q + h) * p.seqlen_q;
      float* dq = dq_acc + ((int64_t(chunk) * p.batch + b) * p.heads_q + h) * p.seqlen_q * Dp;

      const float slope = alibi_slope(p, b, h);
      for (int qt = 0; qt < n_qt; ++qt) {
        const int q0 = qt * kBlockQ;
        const int rows = std::min(kBlockQ, q_rows - q0);
        if (rows <= 0) break;
        // Q tiles that see none of these keys (causal, window, lengths,
        // segments) are skipped.
        if (!bp.tile_visible(q0, q0 + rows - 1, k0, k0 + cols - 1)) continue;
        load_rows(q + q0 * p.q_row_stride, p.q_row_stride, rows, D, Qf, Dp);
        load_rows(g + q0 * p.do_row_stride, p.do_row_stride, rows, D, dOf, Dp);
        gemm(rows, kBlockK, Dp, Qf, Dp, 1, Kt, kBlockK, P, kBlockK, false);
        gemm(rows, kBlockK, Dp, dOf, Dp, 1, Vt, kBlockK, dS, kBlockK, false);  // dP
        for (int r = 0; r < rows; ++r) {
          float* pr = P + r * kBlockK;
          float* ds = dS + r * kBlockK;
          logits_row(p, pr, cols, k0, row_ctx(bp, slope, q0 + r, k0), deriv);
          // lse = -inf (no visible key): +inf offset makes every p exactly 0.
          const float l2 = lse[q0 + r] == kNegInf ? std::numeric_limits<float>::infinity()
                                                  : lse[q0 + r] * kLog2e;
          const float dr = drow[q0 + r];
          if (p.dropout_rate > 0.f) {
            // O = (Z P) V with Z the scaled keep mask: dV takes Z P, and
            // dS = P (Z dP~ - D) with D = rowsum(dO * O) as without dropout.
            dropout_row(p, b, h, q0 + r, k0, cols, z);
            for (int j = 0; j < kBlockK; ++j) {
              const float pj = fast_exp2(pr[j] - l2);
              pr[j] = pj * z[j];
              ds[j] = pj * (ds[j] * z[j] - dr) * deriv[j];
            }
          } else {
            for (int j = 0; j < kBlockK; ++j) {
              const float pj = fast_exp2(pr[j] - l2);
              pr[j] = pj;
              ds[j] = pj * (ds[j] - dr) * deriv[j];
            }
          }
        }
        gemm(cols, Dp, rows, P, 1, kBlockK, dOf, Dp, dV, Dp, true);        // dV += P^T dO
        gemm(cols, Dp, rows, dS, 1, kBlockK, Qf, Dp, dK, Dp, true);        // dK += dS^T Q
        gemm(rows, Dp, cols, dS, kBlockK, 1, Kf, Dp, dq + int64_t(q0) * Dp, Dp, true);  // dQ += dS K
      }
    }
    T* dk = static_cast<T*>(p.dk) + b * p.dk_batch_stride + kvh * p.dk_head_stride;
    T* dv = static_cast<T*>(p.dv) + b * p.dv_batch_stride + kvh * p.dv_head_stride;
    for (int c = 0; c < cols; ++c) {
      store_row(dK + c * Dp, p.scale, D, dk + (k0 + c) * p.dk_row_stride);
      store_row(dV + c * Dp, 1.f, D, dv + (k0 + c) * p.dv_row_stride);
    }
  }
}

template <class T>
void bwd(const BwdParams& p, const Executor& exec) {
  const int D = p.head_dim;
  const int Dp = round_up(D, kTileN);
  const int n_kt = int(cdiv(p.seqlen_k, kBlockK));
  const int64_t bkv = int64_t(p.batch) * p.heads_kv;
  // Enough items to keep every thread busy, but each chunk costs a float dQ
  // buffer, so no more than needed.
  const int n_chunks = int(std::clamp<int64_t>(cdiv(4 * int64_t(exec.num_threads), bkv), 1, n_kt));

  std::vector<float> dsum(size_t(p.batch) * p.heads_q * p.seqlen_q);
  std::vector<float> dq_acc(size_t(n_chunks) * p.batch * p.heads_q * p.seqlen_q * Dp, 0.f);
  bwd_rowsum<T>(p, dsum.data(), exec);

  exec.parallel_for(bkv * n_chunks, [&](int64_t i) {
    const int chunk = int(i % n_chunks);
    const int64_t bk = i / n_chunks;
    bwd_kv_item<T>(p, int(bk / p.heads_kv), int(bk % p.heads_kv), chunk, n_chunks, dsum.data(),
                   dq_acc.data());
  });

  const int64_t n_qt = cdiv(p.seqlen_q, kBlockQ);
  const size_t chunk_stride = size_t(p.batch) * p.heads_q * p.seqlen_q * Dp;
  exec.parallel_for(int64_t(p.batch) * p.heads_q * n_qt, [&](int64_t i) {
    const int64_t bh = i / n_qt;
    const int b = int(bh / p.heads_q), h = int(bh % p.heads_q);
    const int q0 = int(i % n_qt) * kBlockQ;
    const int rows = std::min(kBlockQ, p.seqlen_q - q0);
    T* dq = static_cast<T*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride;
    float sum[256 + kTileN];
    for (int r = q0; r < q0 + rows; ++r) {
      const float* src = dq_acc.data() + (bh * p.seqlen_q + r) * Dp;
      for (int c = 0; c < Dp; ++c) sum[c] = src[c];
      for (int ch = 1; ch < n_chunks; ++ch)
        for (int c = 0; c < Dp; ++c) sum[c] += src[ch * chunk_stride + c];
      store_row(sum, p.scale, D, dq + r * p.dq_row_stride);
    }
  });
}

}  // namespace

void attention_fwd_impl(const FwdParams& p, const Executor& exec) {
  switch (p.dtype) {
    case DType::kFloat32: return fwd<float>(p, exec);
    case DType::kBFloat16: return fwd<bf16>(p, exec);
    case DType::kFloat16: return fwd<f16>(p, exec);
  }
}

void attention_bwd_impl(const BwdParams& p, const Executor& exec) {
  switch (p.dtype) {
    case DType::kFloat32: return bwd<float>(p, exec);
    case DType::kBFloat16: return bwd<bf16>(p, exec);
    case DType::kFloat16: return bwd<f16>(p, exec);
  }
}

}  // namespace jax_flash::cpu::JF_ISA_NS
