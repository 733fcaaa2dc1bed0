// Split-KV decode kernel: a few query rows against a long (contiguous or
// paged) KV cache. Memory bound, so the design is about reading each K/V
// byte once, in 16-byte coalesced cp.async loads with several stages in
// flight:
//   - grid (split, row block x kv head, batch): the keys of one sequence are
//     cut into num_splits ranges of key blocks (one pipeline stage each:
//     128 keys at d 64, 64 at d 128 / 256), one CTA a range;
//   - GQA packing: the CTA's rows are the q heads of one kv group times the
//     queries (row r = g * seqlen_q + i), so K/V are read once per group;
//   - 4 warps; WM of them split the rows (16 each), the other factor splits
//     each stage into 16-key slices. Every warp keeps its own online softmax
//     (one update per kSlicesPerStep of its slices), and the warps' (m, l, o)
//     merge through shared memory at the end;
//   - QK^T and PV on tensor cores (m16n8k16, float32 accumulation), K/V tiles
//     in shared memory with an XOR swizzle so ldmatrix is conflict-free;
//   - paged caches: each row's address comes from the page table; rows in an
//     out-of-range page are zero-filled and masked (never read);
//   - d 64 (Cfg::kLeanSteps): 128-key stages, two slices a softmax update,
//     and leaner steps for the common case (no soft-cap / ALiBi).
// One split writes o/lse directly; several write float32 partials that
// decode_combine merges.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/decode/decode_ptx.cuh"
#include "kvcache_params.h"

namespace jax_flash::cuda::decode {

// Keys per pipeline stage (jax_flash/kvcache.py _key_block mirrors it). A
// 64-key stage of K + V is 32 KB at d 128 but only 16 KB at d 64, where it
// paid twice d 128's __syncthreads, cp.async wait and loop bookkeeping per
// byte read; d 64 takes 128 keys, so every head dim moves >= 32 KB a stage.
template <int D>
constexpr int decode_block_n() {
  return D == 64 ? 128 : 64;
}

// Stages: 3 / 3 / 2 for d 64 / 128 / 256 (96 / 96 / 128 KB of K + V) fit
// sm_80's 163 KB and two CTAs an H100 SM at d 64 and 128; d 256 takes 3
// where the device allows (H100: 227 KB a CTA), chosen at launch.
template <int D>
constexpr int decode_stages() {
  return D == 256 ? 2 : 3;
}

template <class Element_, int D, int WM, int Stages = decode_stages<D>()>
struct DecodeConfig {
  using Element = Element_;
  static_assert(D == 64 || D == 128 || D == 256, "decode head dims: 64, 128, 256");
  static_assert(WM == 1 || WM == 2 || WM == 4, "row warps");
  static constexpr int kThreads = 128;
  static constexpr int kWarpsN = 4 / WM;    // warps sharing a stage's keys
  static constexpr int kBlockM = 16 * WM;   // query rows per CTA
  static constexpr int kBlockN = decode_block_n<D>();
  static constexpr int kStages = Stages;
  // 16-key slices a warp takes through one online-softmax update. At d 64 a
  // slice's P V is only 8 MMAs, so the max / rescale / shuffle work (the
  // same at every head dim) is shared by two slices; d 128 and 256 keep one.
  static constexpr int kSlicesPerStep = D == 64 ? 2 : 1;
  static_assert((kBlockN / 16) % (kWarpsN * kSlicesPerStep) == 0, "slices a stage");
  // Leaner steps, at d 64 only: a key there carries half d 128's bytes, so
  // per-key instructions weigh double (d 128 and 256 keep the code they were
  // measured with). See "Lean steps" in decode_kernel.
  static constexpr bool kLeanSteps = D == 64;
  static_assert(!kLeanSteps || D <= 128, "lean steps keep Q's fragments in registers");
  static constexpr int kChunks = D / 8;     // 16-byte chunks per row
  static constexpr int kTileElems = kBlockN * D;
  static constexpr int kSmemQ = kBlockM * D * 2;
  static constexpr int kSmemKV = 2 * kStages * kTileElems * 2;
  static constexpr int kSmemFlags = kStages * kBlockN * 4;
  // (jax_flash/kvcache.py _cta_slots_per_sm mirrors this to size splits.)
  static constexpr int kSmem = kSmemQ + kSmemKV + kSmemFlags;
  // The epilogue's per-warp partials reuse the K/V stages.
  static_assert(kWarpsN * kBlockM * (D + 2) * 4 <= kSmemKV, "epilogue scratch");
};

// How a warp step treats the logits (decode_kernel's step).
enum class StepMode { kGeneral, kPlainMasked, kPlainFull };

// Element offset of 16-byte chunk c of row r in a swizzled [rows][D] tile.
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
  return r * D + ((c ^ (r & 7)) << 3);
}

template <class Cfg>
__global__ void __launch_bounds__(128) decode_kernel(const KvcacheParams p) {
  using Element = typename Cfg::Element;
  constexpr int D = Cfg::kChunks * 8;
  constexpr int kBlockM = Cfg::kBlockM, kWarpsN = Cfg::kWarpsN, kStages = Cfg::kStages;
  constexpr int kBlockN = Cfg::kBlockN, kStep = Cfg::kSlicesPerStep;
  constexpr int WM = kBlockM / 16;
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kNegInf = -INFINITY;

  extern __shared__ __align__(128) char smem[];
  Element* sQ = reinterpret_cast<Element*>(smem);
  Element* sK = sQ + kBlockM * D;
  Element* sV = sK + kStages * Cfg::kTileElems;
  int* sFlag = reinterpret_cast<int*>(sV + kStages * Cfg::kTileElems);

  const int split = blockIdx.x;
  const int hk = blockIdx.y % p.heads_kv, mb = blockIdx.y / p.heads_kv;
  const int b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp % WM, wn = warp / WM;
  const int G = p.group_size(), sq = p.seqlen_q, rows = G * sq;
  const int64_t L = p.length(b), pos0 = p.query_start(b);

  // The key blocks this split covers: the group's visible range, cut evenly.
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

  // Q rows of this CTA (zero rows past the group), in cp.async group 0.
  for (int idx = tid; idx < kBlockM * Cfg::kChunks; idx += Cfg::kThreads) {
    const int r = idx / Cfg::kChunks, c = idx % Cfg::kChunks;
    const int gr = mb * kBlockM + r;
    const bool ok = gr < rows;
    const int g = ok ? gr / sq : 0, i = ok ? gr % sq : 0;
    const Element* src = q + ((int64_t(b) * sq + i) * p.heads_q + hk * G + g) * D + c * 8;
    cp_async_16(smem_addr(sQ + swz<D>(r, c)), ok ? src : q, ok);
  }

  // Each thread copies one 16-byte chunk column of kPasses rows a stage. For
  // a paged cache the rows' page ids are read one block ahead of the copies
  // that use them (fetch_pages, a loop iteration earlier), so the page-table
  // round trip does not stall the cp.async issue (H100: paged d256 and
  // 16-query shapes had run at 0.63-0.82x the contiguous cache).
  constexpr int kRowsPerPass = Cfg::kThreads / Cfg::kChunks;
  constexpr int kPasses = kBlockN / kRowsPerPass;
  const int lc = tid % Cfg::kChunks, lr = tid / Cfg::kChunks;
  const int64_t row_stride = p.row_stride();
  const int32_t* page_row = p.paged() ? p.page_table + int64_t(b) * p.pages_per_seq : nullptr;
  const uint32_t page_size = uint32_t(p.cache_rows);
  const Element* kc_col = kc + int64_t(hk) * D + lc * 8;
  const Element* vc_col = vc + int64_t(hk) * D + lc * 8;
  const int64_t contig_base = int64_t(b) * p.cache_rows;
  // This thread's rows of block blk are j = first + k kRowsPerPass; their
  // pages advance by at most one a row step (kRowsPerPass <= 16 <= page
  // size), so one division a block, not one a row (a division per row had
  // cost the issue-bound d256 / 16-query kernels up to 30%).
  auto first_row = [&](int64_t blk, uint32_t& page, uint32_t& rem) {
    const uint32_t j = uint32_t(blk * kBlockN + lr);
    page = j / page_size;
    rem = j - page * page_size;
  };
  auto next_row = [&](uint32_t& page, uint32_t& rem) {
    rem += kRowsPerPass;
    if (rem >= page_size) {
      rem -= page_size;
      ++page;
    }
  };
  // (Paged caches) Page ids of this thread's rows of block blk, -1 past L.
  auto fetch_pages = [&](int64_t blk, int32_t (&pages)[kPasses]) {
    if (!page_row) return;
    uint32_t pg, rem;
    first_row(blk, pg, rem);
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
      const int64_t j = blk * kBlockN + lr + k * kRowsPerPass;
      pages[k] = j < L ? page_row[pg] : -1;
      next_row(pg, rem);
    }
  };
  auto load_block = [&](int stage, int64_t blk, const int32_t (&pages)[kPasses]) {
    const int64_t j0 = blk * kBlockN;
    int32_t cache_row[kPasses];  // row of the [slabs * cache_rows] cache, -1: not read
    if (page_row) {
      uint32_t pg, rem;
      first_row(blk, pg, rem);
#pragma unroll
      for (int k = 0; k < kPasses; ++k) {
        const bool ok = j0 + lr + k * kRowsPerPass < L && pages[k] >= 0 && pages[k] < p.num_pages;
        cache_row[k] = ok ? int32_t(uint32_t(pages[k]) * page_size + rem) : -1;
        next_row(pg, rem);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kPasses; ++k) {
        const int64_t j = j0 + lr + k * kRowsPerPass;
        cache_row[k] = j < L ? int32_t(contig_base + j) : -1;
      }
    }
    Element* dk = sK + stage * Cfg::kTileElems;
    Element* dv = sV + stage * Cfg::kTileElems;
    bool all_read = true;  // every one of this thread's rows (some configs use it)
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
      const int r = lr + k * kRowsPerPass;
      const bool ok = cache_row[k] >= 0;
      const int64_t off = int64_t(cache_row[k]) * row_stride;
      cp_async_16(smem_addr(dk + swz<D>(r, lc)), ok ? kc_col + off : kc, ok);
      cp_async_16(smem_addr(dv + swz<D>(r, lc)), ok ? vc_col + off : vc, ok);
      if (lc == 0) sFlag[stage * kBlockN + r] = ok;
      all_read = all_read && ok;
    }
    return all_read;
  };

  int32_t pages[kPasses];  // (paged) the next block's page ids
  // (kLeanSteps) Bit s: this thread's rows of stage s were all read.
  [[maybe_unused]] uint32_t rows_read = 0;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_blocks) {
      fetch_pages(blk_begin + s, pages);
      const bool all_read = load_block(s, blk_begin + s, pages);
      if constexpr (Cfg::kLeanSteps) rows_read |= uint32_t(all_read) << s;
    }
    cp_async_commit();
  }
  if (kStages - 1 < n_blocks) fetch_pages(blk_begin + kStages - 1, pages);

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
    slope[h] = (p.alibi_slopes && gr < rows)
                   ? p.alibi_slopes[b * p.alibi_batch_stride + hk * G + g] * kLog2e
                   : 0.f;
  }
  const bool softcap = p.softcap > 0.f;
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

  // Lean steps (Cfg::kLeanSteps):
  //   - plain steps where no soft-cap or ALiBi is set and scale > 0 (CTA
  //     uniform): no tanh select or per-logit ALiBi branch (a third of a
  //     step's instructions), logits unscaled until exp2(s * scale_log2 - m),
  //     one FFMA a logit, and no O rescale where no row's max moved;
  //   - of those, unmasked steps in a stage whose keys every real row of the
  //     CTA sees and whose rows were all read ([lo_all, hi_all) is the
  //     intersection of the rows' visible ranges; padding rows then see keys
  //     too, but their zero Q rows give finite logits and are never written);
  //   - K fragments loaded in MMA register order (no register moves before
  //     the MMAs), from lane offsets computed once (k_off / v_off: byte
  //     offsets in a tile, per 16 dims).
  [[maybe_unused]] const bool plain_logits =
      Cfg::kLeanSteps && !softcap && !p.alibi_slopes && scale_log2 > 0.f;
  [[maybe_unused]] int64_t lo_all = 0, hi_all = 0;
  [[maybe_unused]] uint32_t k_off[D / 16], v_off[D / 16];
  if constexpr (Cfg::kLeanSteps) {
    const int64_t f = p.first_key(pos0 + sq - 1), e = p.last_key(pos0) + 1;
    lo_all = f > 0 ? f : 0;
    hi_all = e < L ? e : L;
    // ldmatrix.x4 of K as (keys 0-7, dims 0-7), (0-7, 8-15), (8-15, 0-7),
    // (8-15, 8-15): b0 / b1 of each 8-key MMA in consecutive registers.
    const int krow = (lane & 7) | ((lane >> 1) & 8), kchunk = (lane >> 3) & 1;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      k_off[kk] = 2 * swz<D>(krow, 2 * kk + kchunk);
      v_off[kk] = 2 * swz<D>(lrow, 2 * kk + lchunk);
    }
  }

  // One step of a warp: slices sb0 + u kWarpsN (u < kStep) of the stage at
  // k_base / v_base whose first key is j0. kMode: kGeneral (any options,
  // masked), kPlainMasked, kPlainFull (plain, no key masked).
  auto step = [&](int sb0, int stage, int64_t j0, uint32_t k_base, uint32_t v_base, auto mode) {
    constexpr StepMode kMode = decltype(mode)::value;
    constexpr bool kPlain = kMode != StepMode::kGeneral;
    constexpr bool kPaired = Cfg::kLeanSteps;
    // S = Q K^T for 16 rows x 16 keys a slice.
    float s[kStep][2][4];
#pragma unroll
    for (int u = 0; u < kStep; ++u) {
      const int sb = sb0 + u * kWarpsN;
#pragma unroll
      for (int t = 0; t < 2; ++t) s[u][t][0] = s[u][t][1] = s[u][t][2] = s[u][t][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t bk[4];
        if constexpr (kPaired) {
          ldmatrix_x4(bk, k_base + sb * (32 * D) + k_off[kk]);
          mma_16816<Element>(s[u][0], qf[kk], bk[0], bk[1]);
          mma_16816<Element>(s[u][1], qf[kk], bk[2], bk[3]);
        } else {
          ldmatrix_x4(bk, k_base + 2 * swz<D>(sb * 16 + lrow, 2 * kk + lchunk));
          if constexpr (kQInRegs) {
            mma_16816<Element>(s[u][0], qf[kk], bk[0], bk[2]);
            mma_16816<Element>(s[u][1], qf[kk], bk[1], bk[3]);
          } else {
            uint32_t a[4];
            ldmatrix_x4(a, q_base + 2 * swz<D>(wm * 16 + lrow, 2 * kk + lchunk));
            mma_16816<Element>(s[u][0], a, bk[0], bk[2]);
            mma_16816<Element>(s[u][1], a, bk[1], bk[3]);
          }
        }
      }
    }
    // Logits in log2 units (plain steps: unscaled), masked to -inf.
    if constexpr (kMode != StepMode::kPlainFull) {
#pragma unroll
      for (int u = 0; u < kStep; ++u) {
#pragma unroll
        for (int t = 0; t < 2; ++t) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int h = e >> 1;
            const int col = (sb0 + u * kWarpsN) * 16 + t * 8 + 2 * (lane & 3) + (e & 1);
            const int32_t j = int32_t(j0) + col;
            float x = s[u][t][e];
            if constexpr (!kPlain) {
              x = softcap ? cap_out * tanhf(x * cap_in) : x * scale_log2;
              if (slope[h] != 0.f) x -= slope[h] * float(pos[h] > j ? pos[h] - j : int64_t(j) - pos[h]);
            }
            const bool vis = sFlag[stage * kBlockN + col] && j >= kmin[h] && j <= kmax[h];
            s[u][t][e] = vis ? x : kNegInf;
          }
        }
      }
    }
    // Online softmax over the step's 16 x kStep keys, per row.
    float corr[2], m_use[2];
    [[maybe_unused]] bool grew = false;  // some row's running max changed
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = fmaxf(fmaxf(s[0][0][2 * h], s[0][0][2 * h + 1]),
                       fmaxf(s[0][1][2 * h], s[0][1][2 * h + 1]));
#pragma unroll
      for (int u = 1; u < kStep; ++u)
        mx = fmaxf(mx, fmaxf(fmaxf(s[u][0][2 * h], s[u][0][2 * h + 1]),
                             fmaxf(s[u][1][2 * h], s[u][1][2 * h + 1])));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      if constexpr (kPlain) mx *= scale_log2;  // > 0: the max commutes with it
      const float m_new = fmaxf(m[h], mx);
      if constexpr (kPlain) grew = grew || m_new != m[h];
      m_use[h] = m_new == kNegInf ? 0.f : m_new;
      corr[h] = exp2f(m[h] - m_use[h]);
      m[h] = m_new;
      l[h] *= corr[h];
    }
    float pr[kStep][2][4];
#pragma unroll
    for (int u = 0; u < kStep; ++u)
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (kPlain)
            pr[u][t][e] = exp2f(fmaf(s[u][t][e], scale_log2, -m_use[e >> 1]));
          else
            pr[u][t][e] = exp2f(s[u][t][e] - m_use[e >> 1]);
          l[e >> 1] += pr[u][t][e];
        }
    // Plain steps skip the rescale where no row of the warp has a new max
    // (corr is then 1, or 0 for a row with no visible key yet and o = 0).
    if (!kPlain || __any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int t = 0; t < D / 8; ++t) {
        acc[t][0] *= corr[0]; acc[t][1] *= corr[0];
        acc[t][2] *= corr[1]; acc[t][3] *= corr[1];
      }
    }
    // O += P V: the S accumulators are already P's A fragment layout.
#pragma unroll
    for (int u = 0; u < kStep; ++u) {
      const int sb = sb0 + u * kWarpsN;
      const uint32_t pa[4] = {
          pack2<Element>(pr[u][0][0], pr[u][0][1]), pack2<Element>(pr[u][0][2], pr[u][0][3]),
          pack2<Element>(pr[u][1][0], pr[u][1][1]), pack2<Element>(pr[u][1][2], pr[u][1][3])};
#pragma unroll
      for (int dd = 0; dd < D / 16; ++dd) {
        uint32_t bv[4];
        if constexpr (kPaired)
          ldmatrix_x4_trans(bv, v_base + sb * (32 * D) + v_off[dd]);
        else
          ldmatrix_x4_trans(bv, v_base + 2 * swz<D>(sb * 16 + lrow, 2 * dd + lchunk));
        mma_16816<Element>(acc[2 * dd], pa, bv[0], bv[1]);
        mma_16816<Element>(acc[2 * dd + 1], pa, bv[2], bv[3]);
      }
    }
  };
  using General = std::integral_constant<StepMode, StepMode::kGeneral>;
  using PlainMasked = std::integral_constant<StepMode, StepMode::kPlainMasked>;
  using PlainFull = std::integral_constant<StepMode, StepMode::kPlainFull>;

  for (int64_t it = 0; it < n_blocks; ++it) {
    cp_async_wait<kStages - 2>();
    [[maybe_unused]] bool stage_read = false;  // every row of this stage was read
    if constexpr (Cfg::kLeanSteps)
      stage_read = __syncthreads_and(int(rows_read >> int(it % kStages)) & 1);
    else
      __syncthreads();
    if (kQInRegs && it == 0) {
#pragma unroll
      for (int kk = 0; kk < (kQInRegs ? D / 16 : 0); ++kk)
        ldmatrix_x4(qf[kk], q_base + 2 * swz<D>(wm * 16 + lrow, 2 * kk + lchunk));
    }
    const int64_t nxt = it + kStages - 1;
    if (nxt < n_blocks) {
      const int ns = int(nxt % kStages);
      const bool all_read = load_block(ns, blk_begin + nxt, pages);
      if constexpr (Cfg::kLeanSteps)
        rows_read = (rows_read & ~(1u << ns)) | (uint32_t(all_read) << ns);
      if (nxt + 1 < n_blocks) fetch_pages(blk_begin + nxt + 1, pages);  // used next iteration
    }
    cp_async_commit();

    const int stage = int(it % kStages);
    const int64_t j0 = (blk_begin + it) * kBlockN;
    const uint32_t k_base = smem_addr(sK + stage * Cfg::kTileElems);
    const uint32_t v_base = smem_addr(sV + stage * Cfg::kTileElems);
    [[maybe_unused]] const bool full =
        plain_logits && stage_read && j0 >= lo_all && j0 + kBlockN <= hi_all;
    // Warp wn takes slices wn, wn + kWarpsN, ...; kStep of them (sb0 +
    // u kWarpsN) share one online-softmax update.
#pragma unroll
    for (int sb0 = wn; sb0 < kBlockN / 16; sb0 += kWarpsN * kStep) {
      if constexpr (Cfg::kLeanSteps) {
        if (full) {
          step(sb0, stage, j0, k_base, v_base, PlainFull{});
          continue;
        }
        if (plain_logits) {
          step(sb0, stage, j0, k_base, v_base, PlainMasked{});
          continue;
        }
      }
      step(sb0, stage, j0, k_base, v_base, General{});
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
    const int g = gr / sq, i = gr % sq, h = hk * G + g;
    const int64_t row = (int64_t(b) * p.heads_q + h) * sq + i;  // lse layout
    if (p.num_splits == 1) {
      Element* dst = static_cast<Element*>(p.o) + ((int64_t(b) * sq + i) * p.heads_q + h) * D + c4 * 4;
      const uint32_t lo2 = pack2<Element>(o.x, o.y), hi2 = pack2<Element>(o.z, o.w);
      *reinterpret_cast<uint2*>(dst) = make_uint2(lo2, hi2);
      if (c4 == 0) p.lse[row] = lse;
    } else {
      const int64_t prow = int64_t(split) * part_rows + row;
      *reinterpret_cast<float4*>(p.o_partial + prow * D + c4 * 4) = o;
      if (c4 == 0) p.lse_partial[prow] = lse;
    }
  }
}

}  // namespace jax_flash::cuda::decode
