// FlashAttention-2 forward for SM80+ (mma.sync), one CTA per
// (query tile, head, batch). Q tile in smem for the whole CTA; K and V tiles
// stream through one smem buffer each with cp.async: V(j) loads while
// S = Q K(j)^T is computed, K(j-1) loads while the softmax and O += P V(j) run.
// Key tiles are visited from the last one down, so the only tiles that need a
// mask (key end, causal diagonal) come first.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>

#include "cuda/common/mask.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/common/utils.cuh"
#include "cuda/common/variants.cuh"
#include "cuda/sm80/kernel_traits.cuh"
#include "params.h"

namespace jax_flash::cuda::fwd {

struct FwdArgs {
  FwdParams p;
  float scale_log2;  // scale * log2(e)
  bool vec;          // variants kernel: 16 B vector copies legal (run-time kVec)
  int order_group = 0;  // (Hopper, causal) CTA order: 0 head-major, else sections (cuda/common/tile_order.h)
};

// No variants: an empty stand-in for cuda::Variant.
struct NoVariant {
  __device__ __forceinline__ NoVariant(const FwdParams&, int, int) {}
};

// kVec: 16 B vector access is legal for every row of q, k, v, o (aligned
// pointers and strides, head_dim % 8 == 0); otherwise element-wise copies.
// The variants kernel ignores kVec and reads args.vec (one instantiation
// per head dim and dtype instead of two: build time).
// kVariants: kVarGeneral = the generic variants kernel (cuda::Variant policy,
// run-time branches on which FwdParams variant fields are set); kVarMasks =
// the same without soft-cap, ALiBi and dropout code (masks-only variants);
// kVarNone (0) = plain causal/full attention, the variant code compiled out.
template <class Traits, bool kVec, int kVariants = kVarNone>
__global__ void __launch_bounds__(Traits::kNThreads, 1) fwd_kernel(const __grid_constant__ FwdArgs args) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;

  extern __shared__ __align__(128) char smem_raw[];

  const FwdParams& p = args.p;
  const int tid = threadIdx.x;
  // Causal: the longest rows (most key tiles) are scheduled first.
  const int m_block = p.causal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int head_kv = head / (p.heads_q / p.heads_kv);
  const int row0 = m_block * kBlockM;
  const int rows_left = p.seqlen_q - row0;
  const int head_dim = p.head_dim;

  using VarT = std::conditional_t<kVariants != 0, Variant, NoVariant>;
  const VarT var(p, batch, head);

  // Key tiles visited: n_first down to n_stop (inclusive), skipping tiles
  // whose segment ids cannot match (variants).
  int n_first, n_stop = 0;
  [[maybe_unused]] Variant::SegRange q_rng;
  if constexpr (kVariants != 0) {
    int lo, hi;
    var.template key_tiles<kBlockN>(row0, row0 + kBlockM - 1, lo, hi);
    n_stop = lo;
    n_first = hi;  // stepped down below
    q_rng = var.q_range(row0, kBlockM);
  } else {
    int n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
    if (p.causal) {
      const int last_row = min(row0 + kBlockM, p.seqlen_q);  // exclusive
      n_blocks = min(n_blocks, (last_row + kBlockN - 1) / kBlockN);
    }
    n_first = n_blocks - 1;
  }
  // Next key tile to visit below n (n_stop - 1 when none), skipping tiles
  // whose segment ids cannot meet the query tile's; rng gets its id range.
  // The generic kernel carries the range to the tile's iteration; the
  // masks-only kernel reads it again there (fewer registers: no spills).
  [[maybe_unused]] Variant::SegRange k_rng, k_rng_next;
  auto prev_tile = [&](int n, Variant::SegRange& rng) {
    --n;
    if constexpr (kVariants != 0) {
      if (var.segments()) {
        for (; n >= n_stop; --n) {
          rng = var.k_range(n * kBlockN, kBlockN);
          if (!Variant::disjoint(q_rng, rng)) break;
        }
      }
    }
    return n;
  };
  if constexpr (kVariants != 0) n_first = prev_tile(n_first, k_rng);

  // ---- global tensors (BTNH, int64 strides) ----
  const Element* q_ptr = static_cast<const Element*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const Element* k_ptr = static_cast<const Element*>(p.k) + batch * p.k_batch_stride + head_kv * p.k_head_stride;
  const Element* v_ptr = static_cast<const Element*>(p.v) + batch * p.v_batch_stride + head_kv * p.v_head_stride;
  Element* o_ptr = static_cast<Element*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride;

  Tensor mQ = make_tensor(make_gmem_ptr(q_ptr), make_shape(p.seqlen_q, Int<kHeadDim>{}), make_stride(p.q_row_stride, _1{}));
  Tensor mK = make_tensor(make_gmem_ptr(k_ptr), make_shape(p.seqlen_k, Int<kHeadDim>{}), make_stride(p.k_row_stride, _1{}));
  Tensor mV = make_tensor(make_gmem_ptr(v_ptr), make_shape(p.seqlen_k, Int<kHeadDim>{}), make_stride(p.v_row_stride, _1{}));
  Tensor mO = make_tensor(make_gmem_ptr(o_ptr), make_shape(p.seqlen_q, Int<kHeadDim>{}), make_stride(p.o_row_stride, _1{}));
  Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, 0));
  Tensor gO = local_tile(mO, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, 0));
  Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));  // (BN, D, n)
  Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));

  // ---- shared memory: [Q | K | V]; O reuses Q at the end ----
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem_raw)), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});
  Tensor sVtPlain = make_tensor(sV.data().get(), typename Traits::SmemLayoutVtPlain{});

  // ---- gmem -> smem copies ----
  typename Traits::GmemCopyIn gcopy;
  auto gthr = gcopy.get_thread_slice(tid);
  Tensor tQg = gthr.partition_S(gQ);
  Tensor tQs = gthr.partition_D(sQ);
  Tensor tKg = gthr.partition_S(gK);  // (CPY, CPY_N, CPY_K, n)
  Tensor tKs = gthr.partition_D(sK);
  Tensor tVg = gthr.partition_S(gV);
  Tensor tVs = gthr.partition_D(sV);
  Tensor tQc = gthr.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tKVc = gthr.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));

  // gmem -> smem tile copy: vector path fixed at compile time (plain) or
  // chosen at run time (variants).
  auto load = [&](auto const& src, auto&& dst, auto const& coord, int max_row, auto check_rows) {
    constexpr bool kCheck = decltype(check_rows)::value;
    if constexpr (kVariants == 0 || kVariants == kVarMasks) {
      load_tile<kVec, kCheck>(gcopy, src, dst, coord, max_row, head_dim);
    } else {
      if (args.vec) load_tile<true, kCheck>(gcopy, src, dst, coord, max_row, head_dim);
      else load_tile<false, kCheck>(gcopy, src, dst, coord, max_row, head_dim);
    }
  };

  // ---- MMA partitions ----
  typename Traits::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  Tensor rQ = thr_mma.partition_fragment_A(sQ);
  Tensor rK = thr_mma.partition_fragment_B(sK);
  Tensor rVt = thr_mma.partition_fragment_B(sVtPlain);
  Tensor acc_o = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kHeadDim>>{});

  auto s2r_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma);
  auto s2r_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma);
  auto s2r_v = make_tiled_copy_B(typename Traits::SmemCopyAtomT{}, mma);
  Tensor sQ_part = s2r_q.get_thread_slice(tid).partition_S(sQ);
  Tensor sK_part = s2r_k.get_thread_slice(tid).partition_S(sK);
  Tensor sVt_part = s2r_v.get_thread_slice(tid).partition_S(sVt);

  // (row, col) inside the S tile of every accumulator value.
  Tensor tSc = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));

  constexpr int kRows = 2 * decltype(size<1>(acc_o))::value;
  OnlineSoftmax<kRows> softmax;
  clear(acc_o);

  // Scores stay raw and the scale is fused into exp2 (one FFMA per score);
  // a non-positive scale would flip the max, so such scores are pre-scaled.
  // Variants that change logits (soft-cap, ALiBi) turn the scores into logits
  // in log2 units element by element instead; the masks-only variants keep
  // the plain kernel's fused path.
  bool transform = false;
  if constexpr (kVariants == kVarGeneral) transform = var.transforms_logits();
  const bool pre_scale = !transform && !(args.scale_log2 > 0.f);
  const float scale_log2 = (transform || pre_scale) ? 1.f : args.scale_log2;

  Tensor tSc_rc = make_tensor(tSc.data(), acc_rowcol_layout(tSc.layout()));
  // Query segment ids per row (generic kernel; the masks-only kernel loads
  // them on the boundary tiles that compare ids: registers).
  [[maybe_unused]] int q_ids[kRows];
  if constexpr (kVariants == kVarGeneral) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) q_ids[r] = var.q_segment(row0 + get<0>(tSc_rc(r, 0)));
  }

  int n_block = n_first;
  if (n_block >= n_stop) {
    load(tQg, tQs, tQc, rows_left, std::true_type{});
    load(tKg(_, _, _, n_block), tKs, tKVc, p.seqlen_k - n_block * kBlockN, std::true_type{});
    cp_async_fence();
  }

  // One K/V tile per iteration; the mask only where the tile crosses the key
  // end or the causal diagonal. Only the last key tile (the first visited)
  // can be partial, so K prefetches load unchecked rows.
  for (; n_block >= n_stop;) {
    const int col0 = n_block * kBlockN;
    bool need_mask = false;
    [[maybe_unused]] bool seg = false;
    if constexpr (kVariants == 0) {
      need_mask = tile_needs_mask<kBlockM, kBlockN>(row0, col0, p.seqlen_k, p.causal);
    } else if constexpr (kVariants == kVarGeneral) {
      // (The generic kernel compares ids on every masked tile: a per-tile
      // flag there compiled to more spills.)
      need_mask = var.tile_needs_mask(row0, kBlockM, col0, kBlockN, q_rng, k_rng);
    }
    Tensor acc_s = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    cp_async_wait<0>();
    __syncthreads();  // K(n) landed; everyone is done with V(n+1)
    load(tVg(_, _, _, n_block), tVs, tKVc, p.seqlen_k - n_block * kBlockN, std::true_type{});
    cp_async_fence();

    gemm_smem_smem(acc_s, rQ, rK, sQ_part, sK_part, mma, s2r_q, s2r_k, tid);
    // After the MMAs are issued: the segment range loads overlap them.
    const int n_next = prev_tile(n_block, k_rng_next);
    if constexpr (kVariants == kVarMasks) {
      const Variant::SegRange k_rng_here = var.k_range(col0, kBlockN);
      need_mask = var.tile_needs_mask(row0, kBlockM, col0, kBlockN, q_rng, k_rng_here);
      seg = var.tile_seg_check(q_rng, k_rng_here);
    }

    if (pre_scale) {
#pragma unroll
      for (int i = 0; i < size(acc_s); ++i) acc_s(i) *= args.scale_log2;
    }
    if constexpr (kVariants != 0) {
      Tensor s_rc = make_tensor(acc_s.data(), acc_rowcol_layout(acc_s.layout()));
      if (transform) {
        // Raw scores -> logits (log2 units) with scale, soft-cap, ALiBi; masks.
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const int row = row0 + get<0>(tSc_rc(r, 0));
#pragma unroll
          for (int c = 0; c < size<1>(s_rc); ++c) {
            const int col = col0 + get<1>(tSc_rc(r, c));
            float dt;
            const float l = var.logit_log2(s_rc(r, c), p.scale, row, col, dt);
            s_rc(r, c) = (!need_mask || var.visible(row, col, q_ids[r])) ? l : -INFINITY;
          }
        }
      } else if (kVariants == kVarGeneral && need_mask) {
        // Generic kernel (dropout alone, element-wise copies): per-element
        // visibility (fewer registers there than the tile-relative form).
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const int row = row0 + get<0>(tSc_rc(r, 0));
#pragma unroll
          for (int c = 0; c < size<1>(s_rc); ++c) {
            if (!var.visible(row, col0 + get<1>(tSc_rc(r, c)), q_ids[r])) s_rc(r, c) = -INFINITY;
          }
        }
      } else if (need_mask) {
        // Masks only (band, lengths, segments): raw scores, as the plain
        // kernel; tile-relative 32-bit band/length tests, then the segment
        // ids (loaded once per column) where the tile's ids are not one.
        const Variant::TileMask tm = var.tile_mask(row0, col0);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int c = 0; c < size<1>(s_rc); ++c)
            if (!tm(get<0>(tSc_rc(r, 0)), get<1>(tSc_rc(r, c)))) s_rc(r, c) = -INFINITY;
        }
        if (seg) {
          int qid[kRows];
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            if constexpr (kVariants == kVarMasks) qid[r] = var.q_segment(row0 + get<0>(tSc_rc(r, 0)));
            else qid[r] = q_ids[r];
          }
#pragma unroll
          for (int c = 0; c < size<1>(s_rc); ++c) {
            const int col = col0 + get<1>(tSc_rc(0, c));
            if (col >= var.kv_len) continue;  // masked above
            const int kid = int(p.kv_segment_ids[int64_t(batch) * p.seqlen_k + col]);
#pragma unroll
            for (int r = 0; r < kRows; ++r)
              if (kid != qid[r]) s_rc(r, c) = -INFINITY;
          }
        }
      }
    } else {
      if (need_mask) apply_mask(acc_s, tSc, row0, col0, p.seqlen_k, p.causal);
    }

    cp_async_wait<0>();
    __syncthreads();  // V(n) landed; everyone is done with K(n)
    if (n_next >= n_stop) {
      load(tKg(_, _, _, n_next), tKs, tKVc, kBlockN, std::false_type{});
      cp_async_fence();
    }

    softmax.update(acc_s, acc_o, scale_log2);

    if constexpr (kVariants == kVarGeneral) {
      // Dropout of P (the row sums above stay undropped); 1/(1-rate) at the end.
      if (var.dropout()) {
        // Rows 2m, 2m + 1 of the row-col view are rows r and r + 8 of one
        // MMA tile; columns 2n, 2n + 1 a column pair, 2n + 2 the next MMA
        // tile's (see keep_oct: two tiles a call).
        Tensor s_rc = make_tensor(acc_s.data(), acc_rowcol_layout(acc_s.layout()));
        static_assert(decltype(size<1>(s_rc))::value % 4 == 0);
#pragma unroll
        for (int r = 0; r < kRows; r += 2) {
          const int row_lo = row0 + get<0>(tSc_rc(r, 0));
#pragma unroll
          for (int c = 0; c < size<1>(s_rc); c += 4) {
            bool k[8];
            var.keep_oct(row_lo, col0 + get<1>(tSc_rc(r, c)), col0 + get<1>(tSc_rc(r, c + 2)), k);
#pragma unroll
            for (int t = 0; t < 2; ++t) {
              if (!k[4 * t + 0]) s_rc(r, c + 2 * t) = 0.f;
              if (!k[4 * t + 1]) s_rc(r, c + 2 * t + 1) = 0.f;
              if (!k[4 * t + 2]) s_rc(r + 1, c + 2 * t) = 0.f;
              if (!k[4 * t + 3]) s_rc(r + 1, c + 2 * t + 1) = 0.f;
            }
          }
        }
      }
    }

    Tensor rP = convert_regs<Element>(acc_s);
    Tensor rP_a = make_tensor(rP.data(), acc_as_a_layout(rP.layout()));
    gemm_reg_smem(acc_o, rP_a, rVt, sVt_part, mma, s2r_v, tid);
    n_block = n_next;
    if constexpr (kVariants == kVarGeneral) k_rng = k_rng_next;
  }

  // ---- epilogue ----
  float lse[kRows];
  softmax.finalize(acc_o, lse, scale_log2);
  if constexpr (kVariants == kVarGeneral) {
    if (var.dropout()) {
#pragma unroll
      for (int i = 0; i < size(acc_o); ++i) acc_o(i) *= var.keep_scale;
    }
  }

  cp_async_wait<0>();
  __syncthreads();  // (no key tile case: Q copy never waited on)

  Tensor rO = convert_regs<Element>(acc_o);
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutQ{});
  auto r2s = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, mma);
  auto r2s_thr = r2s.get_thread_slice(tid);
  Tensor rO_view = r2s_thr.retile_S(rO);
  Tensor sO_part = r2s_thr.partition_D(sO);
  cute::copy(r2s, rO_view, sO_part);

  // LSE: lane % 4 == 0 owns column 0 of its rows.
  if (get<1>(tSc_rc(0, 0)) == 0) {
    float* lse_row = p.lse + (int64_t(batch) * p.heads_q + head) * int64_t(p.seqlen_q);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = row0 + get<0>(tSc_rc(r, 0));
      if (row < p.seqlen_q) lse_row[row] = lse[r];
    }
  }

  __syncthreads();
  typename Traits::GmemCopyOut gcopy_o;
  auto gthr_o = gcopy_o.get_thread_slice(tid);
  Tensor tOs = gthr_o.partition_S(sO);
  Tensor tOg = gthr_o.partition_D(gO);
  Tensor tOr = make_tensor<Element>(shape(tOg));
  cute::copy(gcopy_o, tOs, tOr);
  Tensor tOc = gthr_o.partition_D(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  if constexpr (kVariants == 0 || kVariants == kVarMasks) {
    store_tile<kVec>(gcopy_o, tOr, tOg, tOc, rows_left, head_dim);
  } else {
    if (args.vec) store_tile<true>(gcopy_o, tOr, tOg, tOc, rows_left, head_dim);
    else store_tile<false>(gcopy_o, tOr, tOg, tOc, rows_left, head_dim);
  }
}

}  // namespace jax_flash::cuda::fwd
