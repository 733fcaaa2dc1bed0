// Attention variants as one small policy object (in the spirit of
// flashinfer's variants): absolute query positions (query_offset, per-batch
// query_offsets), causal / local window bands, per-batch query and key
// lengths, packed segment ids (with per-16-block id ranges for tile
// skipping), logit soft-capping, ALiBi and dropout (dropout.h Philox mask).
//
// Kernels take a `bool kVariants` template parameter. The plain
// instantiations (kVariants = false) never construct a Variant and keep their
// original code path; one generic variants instantiation per (head dim,
// dtype) builds a Variant per CTA and branches at run time on which fields are
// present. Shared by the forward and backward kernels (namespace-neutral).
#pragma once

#include <cmath>
#include <cstdint>

#include "dropout.h"
#include "params.h"

namespace jax_flash::cuda {

// Dropout is on: a rate and the seed words.
__host__ __device__ inline bool variant_dropout(const FwdParams& p) {
  return p.dropout_rate > 0.f && p.dropout_seed != nullptr;
}

// Dropout together with soft-cap and / or ALiBi: the Hopper kernels build
// these sets in units of their own.
__host__ __device__ inline bool variant_dropout_with_transform(const FwdParams& p) {
  return variant_dropout(p) && (p.softcap > 0.f || p.alibi_slopes != nullptr);
}

// Masks-only variants (window, lengths, offsets, segments): no soft-cap,
// ALiBi or dropout. Those run on kernels built without the logit transform
// and dropout code (kernel template kVariants = kVarMasks), whose register
// use matches the plain kernels'.
enum : int { kVarNone = 0, kVarGeneral = 1, kVarMasks = 2 };
__host__ __device__ inline bool variant_masks_only(const FwdParams& p) {
  return p.softcap == 0.f && p.alibi_slopes == nullptr && !variant_dropout(p);
}

// tanh(x) = 1 - 2 / (exp(2x) + 1) with ex2.approx and a fast reciprocal:
// absolute error ~1e-7, saturates correctly. Not used: under --use_fast_math
// tanhf already compiles to tanh.approx.f32, and this form (two MUFU ops)
// measured slower in the soft-cap forward (2.46x vs 1.87x plain, H100).
__device__ __forceinline__ float fast_tanh(float x) {
  const float e = exp2f(x * 2.8853900817779268f);  // exp(2x)
  return 1.f - __fdividef(2.f, e + 1.f);
}

// Keep bits of rows {row, row + 8} x columns {col_a, col_a + 1} and
// {col_b, col_b + 1} (two MMA tiles' column pairs; row % 16 < 8, columns
// even) held by this lane of an SM80 / wgmma accumulator. Lanes l and l ^ 1
// own the two column pairs of one 4-column Philox group (l odd: col % 4 ==
// 2) for the same two rows, which one call covers (dropout.h): the even lane
// computes tile a's call, the odd one tile b's, and each passes its partner
// the two words it needs: one Philox call per 8 elements. All 32 lanes of
// the warp must call it together.
// k[0], k[1]: row (col_a, col_a + 1); k[2], k[3]: row + 8; k[4..7]: col_b.
__device__ __forceinline__ void keep_oct(const uint32_t (&seed)[2], int batch, int head, uint32_t threshold, int row,
                                         int col_a, int col_b, bool (&k)[8]) {
  const bool odd = (threadIdx.x & 1) != 0;
  const Philox4 w = dropout_words(seed, batch, head, row, odd ? col_b : col_a);
  // Even lane: keeps words 0, 1 of a, sends 2, 3; odd: keeps 2, 3 of b, sends 0, 1.
  const uint32_t r0 = __shfl_xor_sync(0xffffffffu, odd ? w.x : w.z, 1);
  const uint32_t r1 = __shfl_xor_sync(0xffffffffu, odd ? w.y : w.w, 1);
  const uint32_t a0 = odd ? r0 : w.x, a1 = odd ? r1 : w.y;
  const uint32_t b0 = odd ? w.z : r0, b1 = odd ? w.w : r1;
  k[0] = (a0 & 0xFFFFu) >= threshold;
  k[1] = (a1 & 0xFFFFu) >= threshold;
  k[2] = (a0 >> 16) >= threshold;
  k[3] = (a1 >> 16) >= threshold;
  k[4] = (b0 & 0xFFFFu) >= threshold;
  k[5] = (b1 & 0xFFFFu) >= threshold;
  k[6] = (b0 >> 16) >= threshold;
  k[7] = (b1 >> 16) >= threshold;
}

struct Variant {
  // The kernel's parameters (a __grid_constant__ kernel argument): uniform
  // settings are read from the constant bank on use, so they cost no
  // registers; only the per-(batch, head) values below live in registers.
  const FwdParams& p;
  int q_len = 0;        // rows >= q_len see nothing (o = 0, lse = -inf, no grads)
  int kv_len = 0;       // keys >= kv_len are masked
  int64_t offset = 0;   // absolute position of query row 0
  float inv_softcap = 0.f;
  float alibi_log2 = 0.f;  // slope * log2(e); 0 = no ALiBi
  float keep_scale = 1.f;  // 1 / (1 - dropout_rate)
  uint32_t drop_threshold = 0;
  uint32_t seed[2] = {0u, 0u};
  int batch = 0, head = 0;

  static constexpr int kSegBlock = FwdParams::kSegmentBlock;

  __device__ __forceinline__ Variant(const FwdParams& params, int b, int h)
      : p(params), batch(b), head(h) {
    q_len = p.q_seqlens ? max(0, min(p.seqlen_q, int(p.q_seqlens[b]))) : p.seqlen_q;
    kv_len = p.kv_seqlens ? max(0, min(p.seqlen_k, int(p.kv_seqlens[b]))) : p.seqlen_k;
    offset = p.query_offset + (p.query_offsets ? int64_t(p.query_offsets[b]) : 0);
    inv_softcap = p.softcap > 0.f ? 1.f / p.softcap : 0.f;
    alibi_log2 = p.alibi_slopes ? p.alibi_slopes[int64_t(b) * p.alibi_batch_stride + h] *
                                      1.4426950408889634f
                                : 0.f;
    if (dropout()) {
      drop_threshold = dropout_threshold(p.dropout_rate);
      keep_scale = p.dropout_rate < 1.f ? 1.f / (1.f - p.dropout_rate) : 0.f;
      seed[0] = p.dropout_seed[0];
      seed[1] = p.dropout_seed[1];
    }
  }

  // Masks-only state restored from values a kernel saved earlier (the
  // Hopper backward keeps them in shared memory across its main loop rather
  // than in registers); soft-cap, ALiBi and dropout stay off.
  __device__ __forceinline__ Variant(const FwdParams& params, int b, int ql, int kvl, int64_t off)
      : p(params), q_len(ql), kv_len(kvl), offset(off), batch(b) {}

  // ---- settings read from the parameters ----
  __device__ __forceinline__ int64_t left() const { return p.window_left; }  // -1 = unbounded
  // Last visible key relative to the query position: min(causal ? 0 : inf,
  // window_right); -1 = unbounded.
  __device__ __forceinline__ int64_t right() const { return p.causal ? 0 : p.window_right; }
  __device__ __forceinline__ bool segments() const {
    return p.q_segment_ids != nullptr && p.kv_segment_ids != nullptr;
  }
  __device__ __forceinline__ bool seg_ranges() const {
    return segments() && p.q_segment_ranges != nullptr && p.kv_segment_ranges != nullptr;
  }
  __device__ __forceinline__ bool dropout() const {
    return variant_dropout(p);
  }
  __device__ __forceinline__ float softcap() const { return p.softcap > 0.f ? p.softcap : 0.f; }

  // Switch the q head (backward: one CTA serves a group of q heads).
  __device__ __forceinline__ void set_head(int h) {
    head = h;
    if (p.alibi_slopes)
      alibi_log2 = p.alibi_slopes[int64_t(batch) * p.alibi_batch_stride + h] * 1.4426950408889634f;
  }

  // ---- bands ----
  // Inclusive key range [first, last] row i may see, before lengths.
  __device__ __forceinline__ int64_t first_key(int64_t i) const {
    return left() >= 0 ? i + offset - left() : INT64_MIN / 4;
  }
  __device__ __forceinline__ int64_t last_key(int64_t i) const {
    return right() >= 0 ? i + offset + right() : INT64_MAX / 4;
  }

  // Key tiles [lo, hi) of width BN that rows [r0, r1] (inclusive, r1 < q_len
  // not required) may touch. Empty (lo >= hi) when no row is valid.
  template <int BN>
  __device__ __forceinline__ void key_tiles(int r0, int r1, int& lo, int& hi) const {
    r1 = min(r1, q_len - 1);
    if (r0 > r1 || kv_len == 0) { lo = 0; hi = 0; return; }
    const int64_t j0 = max(int64_t(0), first_key(r0));
    const int64_t j1 = min(int64_t(kv_len) - 1, last_key(r1));
    if (j0 > j1) { lo = 0; hi = 0; return; }
    lo = int(j0 / BN);
    hi = int(j1 / BN) + 1;
  }

  // Query tiles [lo, hi) of height BM whose rows may see keys [c0, c1].
  template <int BM>
  __device__ __forceinline__ void query_tiles(int c0, int c1, int& lo, int& hi) const {
    c1 = min(c1, kv_len - 1);
    if (c0 > c1 || q_len == 0) { lo = 0; hi = 0; return; }
    // last_key(i) >= c0  <=>  i >= c0 - offset - right ; first_key(i) <= c1 <=> i <= c1 + left - offset
    int64_t i0 = right() >= 0 ? int64_t(c0) - offset - right() : 0;
    int64_t i1 = left() >= 0 ? int64_t(c1) + left() - offset : int64_t(q_len) - 1;
    i0 = max(i0, int64_t(0));
    i1 = min(i1, int64_t(q_len) - 1);
    if (i0 > i1) { lo = 0; hi = 0; return; }
    lo = int(i0 / BM);
    hi = int(i1 / BM) + 1;
  }

  // ---- segments ----
  // Batch b's rows of an id block-range array ([batch, ceil(seqlen /
  // kSegBlock), 2]: each block's min, max).
  __device__ __forceinline__ static const int32_t* batch_ranges(const int32_t* ranges, int seqlen, int b) {
    return ranges + int64_t(b) * ((seqlen + kSegBlock - 1) / kSegBlock) * 2;
  }
  // Inclusive id range of positions [x0, x0 + n) from per-16-block ranges.
  __device__ __forceinline__ static void seg_range(const int32_t* rng, int x0, int n, int extent,
                                                   int& mn, int& mx) {
    const int b0 = x0 / kSegBlock;
    const int b1 = (min(x0 + n, extent) - 1) / kSegBlock;
    mn = INT32_MAX;
    mx = INT32_MIN;
    for (int bb = b0; bb <= b1; ++bb) {
      mn = min(mn, int(rng[2 * bb]));
      mx = max(mx, int(rng[2 * bb + 1]));
    }
  }
  struct SegRange {
    int mn = INT32_MIN, mx = INT32_MAX;  // default: unknown, overlaps everything
  };
  __device__ __forceinline__ SegRange q_range(int r0, int n) const {
    SegRange s;
    if (seg_ranges() && r0 < p.seqlen_q) {
      seg_range(batch_ranges(p.q_segment_ranges, p.seqlen_q, batch), r0, n, p.seqlen_q, s.mn, s.mx);
    }
    return s;
  }
  __device__ __forceinline__ SegRange k_range(int c0, int n) const {
    SegRange s;
    if (seg_ranges() && c0 < p.seqlen_k) {
      seg_range(batch_ranges(p.kv_segment_ranges, p.seqlen_k, batch), c0, n, p.seqlen_k, s.mn, s.mx);
    }
    return s;
  }
  __device__ __forceinline__ static bool disjoint(const SegRange& a, const SegRange& b) {
    return a.mx < b.mn || b.mx < a.mn;
  }
  __device__ __forceinline__ static bool same_single(const SegRange& a, const SegRange& b) {
    return a.mn == a.mx && b.mn == b.mx && a.mn == b.mn;
  }

  // Whether the (rows [r0, r0+BM), keys [c0, c0+BN)) tile needs element masks.
  __device__ __forceinline__ bool tile_needs_mask(int r0, int BM, int c0, int BN,
                                                  const SegRange& qr, const SegRange& kr) const {
    if (c0 + BN > kv_len || r0 + BM > q_len) return true;
    if (right() >= 0 && int64_t(c0) + BN - 1 > last_key(r0)) return true;
    if (left() >= 0 && int64_t(c0) < first_key(int64_t(r0) + BM - 1)) return true;
    if (segments() && !same_single(qr, kr)) return true;
    return false;
  }

  // ---- tile-relative band / length mask (masks-only kernels) ----
  // For a tile at (r0, c0), element (r, c) (tile-local) is visible, before
  // segments, when r < rmax, c < cmax and lo <= c - r <= hi: four 32-bit
  // values per tile instead of 64-bit positions per element.
  struct TileMask {
    int lo, hi, cmax, rmax;
    __device__ __forceinline__ bool operator()(int r, int c) const {
      const int d = c - r;
      return r < rmax && c < cmax && d <= hi && d >= lo;
    }
  };
  __device__ __forceinline__ TileMask tile_mask(int r0, int c0) const {
    constexpr int64_t kBig = int64_t(1) << 30;
    // col <= pos + right, pos = r0 + r + offset  <=>  c - r <= r0 + offset - c0 + right
    const int64_t base = int64_t(r0) + offset - c0;
    TileMask m;
    m.hi = right() >= 0 ? int(max(-kBig, min(kBig, base + right()))) : int(kBig);
    m.lo = left() >= 0 ? int(max(-kBig, min(kBig, base - left()))) : -int(kBig);
    m.cmax = kv_len - c0;
    m.rmax = q_len - r0;
    return m;
  }
  __device__ __forceinline__ bool kv_id_is(int col, int qid) const {
    return int(p.kv_segment_ids[int64_t(batch) * p.seqlen_k + col]) == qid;
  }

  // ---- element-wise ----
  __device__ __forceinline__ int q_segment(int row) const {
    return (segments() && row < p.seqlen_q)
               ? int(p.q_segment_ids[int64_t(batch) * p.seqlen_q + row])
               : 0;
  }
  // Whether the segment ids must be compared element by element in this
  // tile: not when all its query and key ids are one and the same id.
  __device__ __forceinline__ bool tile_seg_check(const SegRange& qr, const SegRange& kr) const {
    return segments() && !same_single(qr, kr);
  }
  // Whether row (with segment id qid) sees key col; seg: compare the ids
  // (tile_seg_check), else the tile is known to hold one id.
  __device__ __forceinline__ bool visible(int row, int col, int qid, bool seg) const {
    if (row >= q_len || col >= kv_len) return false;
    const int64_t pos = int64_t(row) + offset;
    if (right() >= 0 && int64_t(col) > pos + right()) return false;
    if (left() >= 0 && int64_t(col) < pos - left()) return false;
    if (seg && int(p.kv_segment_ids[int64_t(batch) * p.seqlen_k + col]) != qid) return false;
    return true;
  }
  // (Written out rather than delegating: the generic forward kernel sits at
  // 255 registers and the delegating form compiled to more spills.)
  __device__ __forceinline__ bool visible(int row, int col, int qid) const {
    if (row >= q_len || col >= kv_len) return false;
    const int64_t pos = int64_t(row) + offset;
    if (right() >= 0 && int64_t(col) > pos + right()) return false;
    if (left() >= 0 && int64_t(col) < pos - left()) return false;
    if (segments() && int(p.kv_segment_ids[int64_t(batch) * p.seqlen_k + col]) != qid) return false;
    return true;
  }

  // Whether logits change beyond scale and masks (soft-cap, ALiBi): then the
  // kernels compute logits element by element; otherwise they keep the plain
  // kernels' raw scores with the scale fused into exp2.
  __device__ __forceinline__ bool transforms_logits() const {
    return p.softcap > 0.f || alibi_log2 != 0.f;
  }

  // Raw q.k -> logit in log2 units (scale, soft-cap, ALiBi). dtanh gets
  // d(capped)/d(uncapped) = 1 - tanh^2 (1 without soft-cap).
  __device__ __forceinline__ float logit_log2(float qk, float scale, int row, int col,
                                              float& dtanh) const {
    float s = qk * scale;
    dtanh = 1.f;
    if (p.softcap > 0.f) {
      // --use_fast_math makes tanhf tanh.approx.f32 (one MUFU op; the
      // harness tolerances pass with it); fast_tanh measured slower.
      const float t = tanhf(s * inv_softcap);
      s = p.softcap * t;
      dtanh = 1.f - t * t;
    }
    s *= 1.4426950408889634f;
    if (alibi_log2 != 0.f) {
      const float dist = float(int64_t(row) + offset - int64_t(col));
      s -= alibi_log2 * fabsf(dist);
    }
    return s;
  }

  // Dropout keep bits of two MMA tiles' column pairs (the free keep_oct).
  __device__ __forceinline__ void keep_oct(int row, int col_a, int col_b, bool (&k)[8]) const {
    jax_flash::cuda::keep_oct(seed, batch, head, drop_threshold, row, col_a, col_b, k);
  }
};

}  // namespace jax_flash::cuda
