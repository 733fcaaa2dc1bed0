// The one contract between the FFI layer and the kernels: raw pointers,
// element strides and sizes. Kernels never see XLA or nanobind types.
#pragma once

#include <cstddef>
#include <cstdint>

namespace jax_flash {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Layout is BTNH: q [batch, seqlen_q, heads_q, head_dim], k/v [batch,
// seqlen_k, heads_kv, head_dim]. Strides are in elements and int64 so that
// index products never overflow. The last (head_dim) stride is always 1.
struct FwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;      // same dtype and strides layout as q
  float* lse = nullptr;   // [batch, heads_q, seqlen_q], natural log

  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  // lse is always contiguous [batch, heads_q, seqlen_q].

  int batch = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int heads_q = 0;
  int heads_kv = 0;   // heads_q % heads_kv == 0; q head h reads kv head h / (heads_q / heads_kv)
  int head_dim = 0;

  float scale = 0.f;  // softmax scale applied to q.k
  bool causal = false;  // query at position p (see query_offset) sees keys j <= p
  DType dtype = DType::kFloat32;

  // Logit variants, one policy for every kernel (defaults: plain attention).
  // Query row i sits at absolute position p = i + query_offset; it sees key j
  // when j <= p (causal), j >= p - window_left (window_left >= 0) and
  // j <= p + window_right (window_right >= 0).
  int64_t query_offset = 0;
  int64_t window_left = -1;
  int64_t window_right = -1;
  float softcap = 0.f;  // > 0: scaled logits become softcap * tanh(logits / softcap)

  // Per-batch variants: arrays in the kernel's memory space (device memory
  // on CUDA, host on CPU); nullptr = absent. "batch" is the folded batch.
  // q_seqlens[b]: rows i >= q_seqlens[b] give o = 0, lse = -inf and zero
  // gradients. kv_seqlens[b]: keys j >= kv_seqlens[b] are masked.
  const int32_t* q_seqlens = nullptr;   // [batch]
  const int32_t* kv_seqlens = nullptr;  // [batch]
  // query_offsets[b] is added to query_offset (per-batch cache positions).
  const int32_t* query_offsets = nullptr;  // [batch]
  // Packed documents: query i sees key j only when the ids are equal.
  const int32_t* q_segment_ids = nullptr;   // [batch, seqlen_q]
  const int32_t* kv_segment_ids = nullptr;  // [batch, seqlen_k]
  // Per-block (kSegmentBlock rows/keys) inclusive [min, max] of the ids,
  // computed once by the caller, so kernels skip tiles whose id ranges are
  // disjoint: [batch, ceil(seqlen / kSegmentBlock), 2].
  const int32_t* q_segment_ranges = nullptr;
  const int32_t* kv_segment_ranges = nullptr;
  // ALiBi: logit (after scale and softcap) += -slope * |p - j|, where p is the
  // query's absolute position. slope = alibi_slopes[b * alibi_batch_stride + h].
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0;  // heads_q for [batch, heads_q], 0 for [heads_q]
  // Dropout of the normalised probabilities with a counter-based keep mask
  // (see dropout.h): kept values scaled by 1 / (1 - dropout_rate).
  float dropout_rate = 0.f;
  const uint32_t* dropout_seed = nullptr;  // [2] key words

  static constexpr int kSegmentBlock = 16;

  // CUDA: one int32 of device scratch (an FFI output, contents undefined on
  // entry) for the persistent Hopper forward's tile counter; nullptr: the
  // kernel falls back to a static schedule.
  int32_t* tile_counter = nullptr;

  int group_size() const { return heads_q / heads_kv; }
  // Packed documents: both id arrays given.
  bool segment_ids() const { return q_segment_ids != nullptr && kv_segment_ids != nullptr; }
  bool plain_mask() const {
    return query_offset == 0 && window_left < 0 && window_right < 0 && softcap == 0.f &&
           !q_seqlens && !kv_seqlens && !query_offsets && !q_segment_ids && !alibi_slopes &&
           dropout_rate == 0.f;
  }
  // Inclusive range of keys query row i may see (before clipping to seqlen_k).
  int64_t first_key(int64_t i) const {
    return window_left >= 0 ? i + query_offset - window_left : INT64_MIN / 2;
  }
  int64_t last_key(int64_t i) const {
    int64_t last = INT64_MAX / 2;
    if (causal) last = i + query_offset;
    if (window_right >= 0 && i + query_offset + window_right < last)
      last = i + query_offset + window_right;
    return last;
  }
};

// Backward: inputs of the forward plus o, lse and the incoming cotangent do;
// outputs dq (like q) and dk, dv (like k, v: never heads_q-sized).
struct BwdParams : FwdParams {
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;

  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  // Device scratch for the CUDA backward (float32 dq accumulator, rowsum
  // D = rowsum(dO * O), ...), sized by cuda::bwd_workspace_bytes(params) and
  // handed over by the FFI layer. Unused on the CPU.
  void* workspace = nullptr;
  bool deterministic = false;  // CUDA: no atomics, bitwise reproducible
};

}  // namespace jax_flash
