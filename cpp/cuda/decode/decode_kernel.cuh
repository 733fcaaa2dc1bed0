// Split-KV decode kernel: a few query rows against a long (contiguous or
// paged) KV cache. Memory bound, so the design is about reading each K/V
// byte once, in 16-byte coalesced cp.async loads with several stages in
// flight:
//   - grid (split, row block x kv head, batch): the keys of one sequence are
//     cut into num_splits ranges of 64-key blocks, one CTA each;
//   - GQA packing: the CTA's rows are the q heads of one kv group times the
//     queries (row r = g * seqlen_q + i), so K/V are read once per group;
//   - 4 warps; WM of them split the rows (16 each), the other factor splits
//     each 64-key stage into 16-key slices. Every warp keeps its own online
//     softmax, and the warps' (m, l, o) merge through shared memory at the end;
//   - QK^T and PV on tensor cores (m16n8k16, float32 accumulation), K/V tiles
//     in shared memory with an XOR swizzle so ldmatrix is conflict-free;
//   - paired heads (kPair: d 64 at one 16-row tile): two neighbouring kv
//     heads run as one head of 128, so a CTA reads 256 contiguous bytes of a
//     cache row instead of 128; each q row sits in its kv head's half of a
//     zero-padded Q row, so S and O stay per head;
//   - soft-cap and ALiBi (kLogits, their own instantiation): the plain
//     kernel computes neither (with a run-time test, ptxas computed tanh
//     for every score and then selected the plain value: the 16-query loop
//     ran 15% more instructions and twice the MUFU work);
//   - paged caches (their own instantiation): a row table in shared memory
//     holds each key's cache row (-1: past the length or in an out-of-range
//     page, zero-filled and masked, never read), filled one block ahead by one
//     thread a key, so the copies and the mask read one int a row. Contiguous
//     caches compute their rows in place and mask by position alone.
// One split writes o/lse directly; several write float32 partials that
// decode_combine merges.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/decode/decode_ptx.cuh"
#include "kvcache_params.h"

namespace jax_flash::cuda::decode {

constexpr int kBlockN = 64;  // keys per pipeline stage (jax_flash/kvcache.py KEY_BLOCK)

template <class Element_, int D, int WM, int Stages = (D == 64 ? 4 : (D == 128 ? 3 : 2))>
struct DecodeConfig {
  using Element = Element_;
  static_assert(D == 64 || D == 128 || D == 256, "decode head dims: 64, 128, 256");
  static_assert(WM == 1 || WM == 2 || WM == 4, "row warps");
  static constexpr int kThreads = 128;
  static constexpr int kWarpsN = 4 / WM;    // warps sharing a stage's keys
  static constexpr int kBlockM = 16 * WM;   // query rows per CTA
  // 4 / 3 / 2 stages for d 64 / 128 / 256 fit sm_80's 163 KB; d 256 takes 3
  // where the device allows (H100: 227 KB a CTA), chosen at launch.
  static constexpr int kStages = Stages;
  static constexpr int kChunks = D / 8;     // 16-byte chunks per row
  static constexpr int kTileElems = kBlockN * D;
  static constexpr int kSmemQ = kBlockM * D * 2;
  static constexpr int kSmemKV = 2 * kStages * kTileElems * 2;
  // (Paged) row tables: one slot more than the stages, so that a block's
  // slot is refilled only after every warp has masked that block. The
  // contiguous instantiation leaves them unused.
  static constexpr int kRowSlots = kStages + 1;
  static constexpr int kSmemRows = kRowSlots * kBlockN * 4;
  // (jax_flash/kvcache.py _cta_slots_per_sm mirrors this to size splits.)
  static constexpr int kSmem = kSmemQ + kSmemKV + kSmemRows;
  // The epilogue's per-warp partials reuse the K/V stages.
  static_assert(kWarpsN * kBlockM * (D + 2) * 4 <= kSmemKV, "epilogue scratch");
};

// Element offset of 16-byte chunk c of row r in a swizzled [rows][D] tile.
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
  return r * D + ((c ^ (r & 7)) << 3);
}

// Appending: stores the new k/v rows of kv head hk whose positions fall in
// the split's keys [key_lo, key_end) (clipped to the length L) into the
// cache; returns whether the range held any (uniform over the CTA). Every
// row block of the split stores the same bytes. The last query sees every
// new row, so each new row below L lies in exactly one split; rows past the
// capacity or in an out-of-range page are dropped. A separate append kernel
// cost a launch a layer (~2 us a graph node in a generate step, H200 trace).
template <class Element, int D, int kThreads>
__device__ __forceinline__ bool append_rows(const KvcacheParams& p, int b, int hk, int64_t key_lo,
                                         int64_t key_end, int64_t L) {
  constexpr int kChunks = D / 8;
  const int sq = p.seqlen_q;
  const int64_t first_new = p.raw_length(b) - sq;  // position of new row 0
  const int64_t end = key_end < L ? key_end : L;
  const int64_t i_lo = key_lo > first_new ? key_lo - first_new : 0;
  const int64_t i_hi = end - first_new < sq ? end - first_new : sq;
  if (i_hi <= i_lo) return false;
  const Element* kn = static_cast<const Element*>(p.k_new);
  const Element* vn = static_cast<const Element*>(p.v_new);
  Element* kw = static_cast<Element*>(p.k_cache);
  Element* vw = static_cast<Element*>(p.v_cache);
  for (int64_t idx = threadIdx.x; idx < (i_hi - i_lo) * kChunks; idx += kThreads) {
    const int64_t i = i_lo + idx / kChunks;
    const int c = int(idx % kChunks);
    const int64_t off = p.cache_offset(b, first_new + i, hk);
    if (off < 0) continue;
    const int64_t src = ((int64_t(b) * sq + i) * p.heads_kv + hk) * D + c * 8;
    *reinterpret_cast<uint4*>(kw + off + c * 8) = *reinterpret_cast<const uint4*>(kn + src);
    *reinterpret_cast<uint4*>(vw + off + c * 8) = *reinterpret_cast<const uint4*>(vn + src);
  }
  return true;
}

template <class Cfg, bool kPaged, bool kPair, bool kLogits>
__global__ void __launch_bounds__(128) decode_kernel(const KvcacheParams p) {
  using Element = typename Cfg::Element;
  constexpr int D = Cfg::kChunks * 8;
  // Head dim of q and o: paired heads fill half of each D-wide row.
  constexpr int DQ = kPair ? D / 2 : D;
  static_assert(!kPair || (D == 128 && Cfg::kBlockM == 16), "paired d 64 heads: one row tile");
  constexpr int kBlockM = Cfg::kBlockM, kWarpsN = Cfg::kWarpsN, kStages = Cfg::kStages;
  constexpr int WM = kBlockM / 16;
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kNegInf = -INFINITY;

  extern __shared__ __align__(128) char smem[];
  Element* sQ = reinterpret_cast<Element*>(smem);
  Element* sK = sQ + kBlockM * D;
  Element* sV = sK + kStages * Cfg::kTileElems;
  int32_t* sRow = reinterpret_cast<int32_t*>(sV + kStages * Cfg::kTileElems);

  const int split = blockIdx.x;
  const int hk = blockIdx.y % p.heads_kv, mb = blockIdx.y / p.heads_kv;
  const int b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // With one key warp wn is 0 (tid < 128); said outright, the row-table index
  // math folds to constants (else the 16-query paged kernel spilled).
  const int wm = warp % WM, wn = kWarpsN == 1 ? 0 : warp / WM;
  const int G = p.group_size(), sq = p.seqlen_q, rows = G * sq;
  const int64_t L = p.length(b), pos0 = p.query_start(b);

  // The 64-key blocks this split covers: the group's visible range, cut evenly.
  const int64_t first = p.first_key(pos0), last = p.last_key(pos0 + sq - 1);
  const int64_t lo = first > 0 ? first : 0;
  const int64_t hi = last + 1 < L ? last + 1 : L;
  const int64_t blk_lo = lo / kBlockN;
  const int64_t n_total = hi > lo ? (hi + kBlockN - 1) / kBlockN - blk_lo : 0;
  const int64_t per = (n_total + p.num_splits - 1) / p.num_splits;
  const int64_t blk_begin = blk_lo + split * per;
  int64_t n_blocks = n_total - split * per;
  n_blocks = n_blocks < 0 ? 0 : (n_blocks > per ? per : n_blocks);

  const Element* q = static_cast<const Element*>(p.q);
  const Element* kc = static_cast<const Element*>(p.k_cache);
  const Element* vc = static_cast<const Element*>(p.v_cache);

  // Appending (append_rows, above): this split's share of the new rows goes
  // into the cache before the copies below read it.
  if (p.appending() &&
      append_rows<typename Cfg::Element, D, Cfg::kThreads>(p, b, hk, blk_begin * kBlockN,
                                                          (blk_begin + n_blocks) * kBlockN, L)) {
    // The copies read through L2 (cp.async.cg): the stores are visible
    // there before any thread issues them.
    __threadfence();
    __syncthreads();
  }

  // Q rows of this CTA (zero rows past the group), in cp.async group 0.
  // Paired: q heads [0, G / 2) of the group belong to the first kv head and
  // fill the row's first half; the rest the second half.
  for (int idx = tid; idx < kBlockM * Cfg::kChunks; idx += Cfg::kThreads) {
    const int r = idx / Cfg::kChunks, c = idx % Cfg::kChunks;
    const int gr = mb * kBlockM + r;
    bool ok = gr < rows;
    const int g = ok ? gr / sq : 0, i = ok ? gr % sq : 0;
    int cq = c;
    if constexpr (kPair) {
      ok = ok && c / (Cfg::kChunks / 2) == 2 * g / G;
      cq = c % (Cfg::kChunks / 2);
    }
    const Element* src = q + ((int64_t(b) * sq + i) * p.heads_q + hk * G + g) * DQ + cq * 8;
    cp_async_16(smem_addr(sQ + swz<D>(r, c)), ok ? src : q, ok);
  }

  // (Paged) row tables. Block n (of this split) has slot n % kRowSlots.
  // Thread group g = tid / kBlockN fills the tables of the blocks n with
  // n % 2 == g, thread tid % kBlockN the key of its index, and loads the page
  // id of its next block's key when filling, so the page-table round trip is
  // off the copies' path. One row a thread a block: the copies used to walk
  // pages per row and per thread, which cost the issue-bound 16-query kernel
  // 12% over the contiguous cache (H100, ncu: +12.5% instructions).
  constexpr int kRowSlots = Cfg::kRowSlots;
  // Each thread copies one 16-byte chunk column of kPasses rows a stage:
  // rows lr, lr + kRowsPerPass, ... (one swizzle phase, so constant smem
  // offsets). Their table entries sit side by side (key r at
  // (r % kRowsPerPass) * kPasses + r / kRowsPerPass), read as int4s.
  constexpr int kRowsPerPass = Cfg::kThreads / Cfg::kChunks;
  constexpr int kPasses = kBlockN / kRowsPerPass;
  static_assert(kPasses % 4 == 0, "int4 table reads");
  static_assert(Cfg::kThreads == 2 * kBlockN, "two row-table groups");
  const int trow = tid % kBlockN, tgrp = tid / kBlockN;
  auto table_index = [](int key) { return (key % kRowsPerPass) * kPasses + key / kRowsPerPass; };
  const int table_slot = table_index(trow);
  const int32_t* page_row = kPaged ? p.page_table + int64_t(b) * p.pages_per_seq : nullptr;
  const uint32_t page_size = uint32_t(p.cache_rows);
  const int32_t contig_base = int32_t(int64_t(b) * p.cache_rows);
  // Key positions and cache rows are below 2^31 (capacity < 2^31), block
  // counts below 2^25: 32-bit index math.
  const int32_t key0 = int32_t(blk_begin * kBlockN) + trow, len = int32_t(L);
  // Page sizes that are powers of two divide by a shift.
  const int page_shift = __popc(page_size) == 1 ? __ffs(page_size) - 1 : -1;
  // The page id of key trow of block n and the key's row in it.
  auto load_page = [&](int n, int32_t& pid, uint32_t& rem) {
    const int32_t j = key0 + n * kBlockN;
    pid = -1;
    if (j < len) {
      const uint32_t pg = page_shift >= 0 ? uint32_t(j) >> page_shift : uint32_t(j) / page_size;
      rem = uint32_t(j) - pg * page_size;
      pid = page_row[pg];
    }
  };
  auto fill_rows = [&](int n, int32_t pid, uint32_t rem) {
    const int32_t j = key0 + n * kBlockN;
    const bool ok = j < len && pid >= 0 && pid < p.num_pages;
    sRow[(n % kRowSlots) * kBlockN + table_slot] = ok ? int32_t(uint32_t(pid) * page_size + rem) : -1;
  };

  const int lc = tid % Cfg::kChunks, lr = tid / Cfg::kChunks;
  const int64_t row_stride = p.row_stride();
  const Element* kc_col = kc + int64_t(hk) * D + lc * 8;
  const Element* vc_col = vc + int64_t(hk) * D + lc * 8;
  auto load_block = [&](int stage, int n) {
    Element* dk = sK + stage * Cfg::kTileElems;
    Element* dv = sV + stage * Cfg::kTileElems;
    const int32_t j0 = key0 - trow + n * kBlockN;
    // (Paged) the thread's kPasses table entries, side by side (table_slot),
    // all read before the first copy: a table read after a cp.async waits
    // for it (both touch shared memory), which serialised the passes (ncu,
    // 16 queries: the top short-scoreboard stalls, ~5% of the kernel).
    int32_t rows_of[kPaged ? kPasses : 1];
    if constexpr (kPaged) {
      const int4* src = reinterpret_cast<const int4*>(sRow + (n % kRowSlots) * kBlockN + lr * kPasses);
#pragma unroll
      for (int v = 0; v < kPasses / 4; ++v) {
        const int4 x = src[v];
        rows_of[4 * v] = x.x; rows_of[4 * v + 1] = x.y; rows_of[4 * v + 2] = x.z; rows_of[4 * v + 3] = x.w;
      }
    }
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
      const int r = lr + k * kRowsPerPass;
      int32_t cache_row;
      if constexpr (kPaged) cache_row = rows_of[k];
      else cache_row = j0 + r < len ? contig_base + j0 + r : -1;
      const bool ok = cache_row >= 0;
      const int64_t off = int64_t(cache_row) * row_stride;
      cp_async_16(smem_addr(dk + swz<D>(r, lc)), ok ? kc_col + off : kc, ok);
      cp_async_16(smem_addr(dv + swz<D>(r, lc)), ok ? vc_col + off : vc, ok);
    }
  };

  // The first kStages blocks' tables, then this group's next block's page id.
  int32_t pid = -1;
  uint32_t rem = 0;
  if constexpr (kPaged) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      if ((s & 1) == tgrp && s < n_blocks) {
        load_page(s, pid, rem);
        fill_rows(s, pid, rem);
      }
    }
    if (const int n0 = kStages + ((tgrp ^ kStages) & 1); n0 < n_blocks) load_page(n0, pid, rem);
    __syncthreads();
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_blocks) load_block(s, s);
    cp_async_commit();
  }

  // This thread's two rows (lane / 4 and + 8 within the warp's 16).
  // Visible keys [kmin, kmax] as int32 (positions < capacity < 2^31);
  // pos stays int64 for the ALiBi distance.
  int32_t kmin[2], kmax[2];
  int64_t pos[2];
  float slope[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int gr = mb * kBlockM + wm * 16 + (lane >> 2) + 8 * h;
    const int g = gr / sq, i = gr % sq;
    pos[h] = pos0 + i;
    const int64_t f = p.first_key(pos[h]), l = p.last_key(pos[h]);
    kmin[h] = int32_t(f > 0 ? (f < L ? f : L) : 0);
    kmax[h] = int32_t(l < L - 1 ? (l > -1 ? l : -1) : L - 1);
    if (gr >= rows) kmax[h] = -1;  // padding row: sees nothing
    slope[h] = (kLogits && p.alibi_slopes && gr < rows)
                   ? p.alibi_slopes[b * p.alibi_batch_stride + hk * G + g] * kLog2e
                   : 0.f;
  }
  const bool softcap = kLogits && p.softcap > 0.f;
  const float scale_log2 = p.scale * kLog2e;
  const float cap_in = softcap ? p.scale / p.softcap : 0.f;
  const float cap_out = p.softcap * kLog2e;

  float acc[D / 8][4];
#pragma unroll
  for (int t = 0; t < D / 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};

  const uint32_t q_base = smem_addr(sQ);
  const int lrow = lane & 15, lchunk = lane >> 4;

  // Q's A fragments stay in registers where they fit (d <= 128: 32 regs);
  // d 256 reloads them from shared memory per 16-key slice.
  constexpr bool kQInRegs = D <= 128;
  uint32_t qf[kQInRegs ? D / 16 : 1][4];
  for (int64_t it = 0; it < n_blocks; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (kQInRegs && it == 0) {
#pragma unroll
      for (int kk = 0; kk < (kQInRegs ? D / 16 : 0); ++kk)
        ldmatrix_x4(qf[kk], q_base + 2 * swz<D>(wm * 16 + lrow, 2 * kk + lchunk));
    }
    const int64_t nxt = it + kStages - 1;
    if (nxt < n_blocks) load_block(int(nxt % kStages), int(nxt));
    cp_async_commit();
    // The table of block nxt + 1, into the slot block it - 1 has finished with.
    if constexpr (kPaged) {
      if (const int f = int(nxt) + 1; (f & 1) == tgrp && f < n_blocks) {
        fill_rows(f, pid, rem);
        if (f + 2 < n_blocks) load_page(f + 2, pid, rem);
      }
    }

    const int stage = int(it % kStages);
    const int32_t* key_rows = sRow + int(it) % kRowSlots * kBlockN;
    const int64_t j0 = (blk_begin + it) * kBlockN;
    // ALiBi distances as floats: pos - key = rel - (a constant of the
    // unrolled loops), rel once a row a block (exact below 2^24 positions).
    // Branch-free and without an integer conversion an element: a test of
    // the slope there compiled to a branch region an element (ncu, 16
    // queries: branch and convergence instructions ~16% of the stall
    // samples, ALiBi or not).
    float rel[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) rel[h] = float(pos[h] - j0 - 2 * (lane & 3) - wn * 16);
    const uint32_t k_base = smem_addr(sK + stage * Cfg::kTileElems);
    const uint32_t v_base = smem_addr(sV + stage * Cfg::kTileElems);
    // This warp's slices of the block (16 keys each: wn, wn + kWarpsN, ...)
    // go through the softmax kPerUpdate at a time, so the row max, the
    // correction and the rescale of O are paid once a group, not once a
    // slice. d 256 keeps one slice an update: its registers are full.
    constexpr int kSlices = kBlockN / 16 / kWarpsN;
    constexpr int kPerUpdate = D <= 128 ? kSlices : 1;
    // (d 256 walks its slices in a loop: unrolled, they spill.)
    constexpr int kUnrollUpdates = D <= 128 ? kSlices / kPerUpdate : 1;
#pragma unroll kUnrollUpdates
    for (int u = 0; u < kSlices / kPerUpdate; ++u) {
      float s[kPerUpdate][2][4];
#pragma unroll
      for (int i = 0; i < kPerUpdate; ++i) {
        const int sb = wn + (u * kPerUpdate + i) * kWarpsN;
        // S = Q K^T for 16 rows x 16 keys.
#pragma unroll
        for (int t = 0; t < 2; ++t) s[i][t][0] = s[i][t][1] = s[i][t][2] = s[i][t][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          uint32_t bk[4];
          ldmatrix_x4(bk, k_base + 2 * swz<D>(sb * 16 + lrow, 2 * kk + lchunk));
          if constexpr (kQInRegs) {
            mma_16816<Element>(s[i][0], qf[kk], bk[0], bk[2]);
            mma_16816<Element>(s[i][1], qf[kk], bk[1], bk[3]);
          } else {
            uint32_t a[4];
            ldmatrix_x4(a, q_base + 2 * swz<D>(wm * 16 + lrow, 2 * kk + lchunk));
            mma_16816<Element>(s[i][0], a, bk[0], bk[2]);
            mma_16816<Element>(s[i][1], a, bk[1], bk[3]);
          }
        }
        // Logits in log2 units, masked to -inf.
#pragma unroll
        for (int t = 0; t < 2; ++t) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int h = e >> 1;
            const int col = sb * 16 + t * 8 + 2 * (lane & 3) + (e & 1);
            const int32_t j = int32_t(j0) + col;
            float x = s[i][t][e];
            if constexpr (kLogits) {
              x = softcap ? cap_out * tanhf(x * cap_in) : x * scale_log2;
              x -= slope[h] * fabsf(rel[h] - float((sb - wn) * 16 + t * 8 + (e & 1)));  // ALiBi (slope 0: none)
            } else {
              x *= scale_log2;
            }
            // (Contiguous: kmax < L keeps the keys past the length out.)
            const bool vis = (!kPaged || key_rows[table_index(col)] >= 0) && j >= kmin[h] && j <= kmax[h];
            s[i][t][e] = vis ? x : kNegInf;
          }
        }
      }
      // Online softmax over the warp's keys of this block, per row.
      float corr[2], m_use[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = kNegInf;
#pragma unroll
        for (int i = 0; i < kPerUpdate; ++i)
          mx = fmaxf(mx, fmaxf(fmaxf(s[i][0][2 * h], s[i][0][2 * h + 1]),
                               fmaxf(s[i][1][2 * h], s[i][1][2 * h + 1])));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[h], mx);
        m_use[h] = m_new == kNegInf ? 0.f : m_new;
        corr[h] = exp2f(m[h] - m_use[h]);
        m[h] = m_new;
        l[h] *= corr[h];
      }
#pragma unroll
      for (int i = 0; i < kPerUpdate; ++i)
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[i][t][e] = exp2f(s[i][t][e] - m_use[e >> 1]);
            l[e >> 1] += s[i][t][e];
          }
#pragma unroll
      for (int t = 0; t < D / 8; ++t) {
        acc[t][0] *= corr[0]; acc[t][1] *= corr[0];
        acc[t][2] *= corr[1]; acc[t][3] *= corr[1];
      }
      // O += P V: the S accumulators are already P's A fragment layout.
#pragma unroll
      for (int i = 0; i < kPerUpdate; ++i) {
        const int sb = wn + (u * kPerUpdate + i) * kWarpsN;
        const uint32_t pa[4] = {pack2<Element>(s[i][0][0], s[i][0][1]), pack2<Element>(s[i][0][2], s[i][0][3]),
                                pack2<Element>(s[i][1][0], s[i][1][1]), pack2<Element>(s[i][1][2], s[i][1][3])};
#pragma unroll
        for (int dd = 0; dd < D / 16; ++dd) {
          uint32_t bv[4];
          ldmatrix_x4_trans(bv, v_base + 2 * swz<D>(sb * 16 + lrow, 2 * dd + lchunk));
          mma_16816<Element>(acc[2 * dd], pa, bv[0], bv[1]);
          mma_16816<Element>(acc[2 * dd + 1], pa, bv[2], bv[3]);
        }
      }
    }
  }

  // Merge the warps that shared the keys, then write o/lse or the partials.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Let the combine kernel (a programmatic dependent) be staged now; it
  // still waits for this grid to complete before reading the partials.
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
  cp_async_wait<0>();
  __syncthreads();
  float* sO = reinterpret_cast<float*>(sK);  // [kWarpsN][kBlockM][D]
  float* sML = sO + kWarpsN * kBlockM * D;   // [kWarpsN][kBlockM][2]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  {
    const int r0 = wm * 16 + (lane >> 2);
#pragma unroll
    for (int t = 0; t < D / 8; ++t) {
      const int col = t * 8 + 2 * (lane & 3);
      *reinterpret_cast<float2*>(&sO[(wn * kBlockM + r0) * D + col]) = make_float2(acc[t][0], acc[t][1]);
      *reinterpret_cast<float2*>(&sO[(wn * kBlockM + r0 + 8) * D + col]) = make_float2(acc[t][2], acc[t][3]);
    }
    if ((lane & 3) == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sML[(wn * kBlockM + r0 + 8 * h) * 2] = m[h];
        sML[(wn * kBlockM + r0 + 8 * h) * 2 + 1] = l[h];
      }
    }
  }
  __syncthreads();
  const int64_t part_rows = int64_t(p.batch) * p.heads_q * sq;
  for (int idx = tid; idx < kBlockM * (D / 4); idx += Cfg::kThreads) {
    const int r = idx / (D / 4), c4 = idx % (D / 4);
    const int gr = mb * kBlockM + r;
    if (gr >= rows) continue;
    const int g = gr / sq, i = gr % sq, h = hk * G + g;
    // Paired: only the row's own head half is output; oc4 its column there.
    if (kPair && c4 / (DQ / 4) != 2 * g / G) continue;
    const int oc4 = kPair ? c4 % (DQ / 4) : c4;
    float mx = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarpsN; ++w) mx = fmaxf(mx, sML[(w * kBlockM + r) * 2]);
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    float lsum = 0.f;
    if (mx != kNegInf) {
#pragma unroll
      for (int w = 0; w < kWarpsN; ++w) {
        const float wgt = exp2f(sML[(w * kBlockM + r) * 2] - mx);
        lsum += wgt * sML[(w * kBlockM + r) * 2 + 1];
        const float4 x = *reinterpret_cast<const float4*>(&sO[(w * kBlockM + r) * D + c4 * 4]);
        o.x += wgt * x.x; o.y += wgt * x.y; o.z += wgt * x.z; o.w += wgt * x.w;
      }
    }
    const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
    o.x *= inv; o.y *= inv; o.z *= inv; o.w *= inv;
    const float lse = lsum > 0.f ? (mx + __log2f(lsum)) * 0.6931471805599453f : kNegInf;
    const int64_t row = (int64_t(b) * p.heads_q + h) * sq + i;  // lse layout
    if (p.num_splits == 1) {
      Element* dst = static_cast<Element*>(p.o) + ((int64_t(b) * sq + i) * p.heads_q + h) * DQ + oc4 * 4;
      const uint32_t lo2 = pack2<Element>(o.x, o.y), hi2 = pack2<Element>(o.z, o.w);
      *reinterpret_cast<uint2*>(dst) = make_uint2(lo2, hi2);
      if (oc4 == 0) p.lse[row] = lse;
    } else {
      const int64_t prow = int64_t(split) * part_rows + row;
      *reinterpret_cast<float4*>(p.o_partial + prow * DQ + oc4 * 4) = o;
      if (oc4 == 0) p.lse_partial[prow] = lse;
    }
  }
}

}  // namespace jax_flash::cuda::decode
