// The contract between the FFI layer and the KV-cache (decode) kernels:
// attention of a few new queries against a contiguous or paged K/V cache,
// optionally appending the new keys/values first. Host and device code.
#pragma once

#include <cstdint>

#include "host_device.h"
#include "params.h"

namespace jax_flash {

// Layouts (all dense, row-major):
//   q, o           [batch, seqlen_q, heads_q, head_dim]
//   k/v_new        [batch, seqlen_q, heads_kv, head_dim]          (append only)
//   contiguous k/v_cache [batch, cache_rows, heads_kv, head_dim]
//   paged k/v_cache      [num_pages, cache_rows, heads_kv, head_dim], cache_rows = page_size,
//                        page_table [batch, pages_per_seq]: position p of sequence b lives
//                        in page page_table[b, p / page_size], row p % page_size.
//   lse            [batch, heads_q, seqlen_q] float32
//   o_partial      [num_splits, batch, heads_q, seqlen_q, head_dim] float32 (num_splits > 1)
//   lse_partial    [num_splits, batch, heads_q, seqlen_q] float32
//
// Visibility. raw_b = max(cache_seqlens[b], 0) (+ seqlen_q when appending) is
// the sequence length; query i sits at position raw_b - seqlen_q + i. Keys j
// with 0 <= j < min(raw_b, capacity) exist; causal / the window mask them as
// in attention(). Rows that would land past the capacity are neither written
// nor read. Keys in a page whose id is outside [0, num_pages) are treated as
// masked (never read); appended rows that map to such a page are dropped. A
// query row that sees no key gets o = 0 and lse = -inf.
struct KvcacheParams {
  const void* q = nullptr;
  void* k_cache = nullptr;  // written only when appending (aliased FFI buffer)
  void* v_cache = nullptr;
  const void* k_new = nullptr;  // nullptr: nothing to append
  const void* v_new = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  const int32_t* cache_seqlens = nullptr;  // [batch]
  const int32_t* page_table = nullptr;     // nullptr: contiguous cache
  const float* alibi_slopes = nullptr;     // slope = alibi_slopes[b * alibi_batch_stride + h]
  int64_t alibi_batch_stride = 0;

  int batch = 0;
  int seqlen_q = 0;
  int heads_q = 0;
  int heads_kv = 0;
  int head_dim = 0;
  int64_t cache_rows = 0;    // contiguous: max_seqlen; paged: page_size
  int64_t num_pages = 0;     // paged: leading axis of the caches; contiguous: batch
  int64_t pages_per_seq = 0; // paged only

  float scale = 0.f;
  bool causal = true;
  int64_t window_left = -1;  // >= 0: query at p sees keys j >= p - window_left
  int64_t window_right = -1; // >= 0: ... and j <= p + window_right
  float softcap = 0.f;
  // attention()'s decode route: query i of b sits at query_offset (+
  // query_offsets[b]) + i instead of the bottom-right position.
  bool explicit_positions = false;
  int64_t query_offset = 0;
  const int32_t* query_offsets = nullptr;  // [batch] or nullptr
  DType dtype = DType::kFloat32;

  int num_splits = 1;  // CUDA: key ranges per (batch, kv head); the CPU picks its own
  float* o_partial = nullptr;
  float* lse_partial = nullptr;

  JAX_FLASH_HD bool paged() const { return page_table != nullptr; }
  JAX_FLASH_HD bool appending() const { return k_new != nullptr; }
  JAX_FLASH_HD int group_size() const { return heads_q / heads_kv; }
  // Positions a sequence can hold.
  JAX_FLASH_HD int64_t capacity() const {
    return paged() ? pages_per_seq * cache_rows : cache_rows;
  }
  // Rows of one (page or batch) slab of the cache, in elements.
  JAX_FLASH_HD int64_t row_stride() const { return int64_t(heads_kv) * head_dim; }
  JAX_FLASH_HD int64_t slab_stride() const { return cache_rows * row_stride(); }

  // Unclamped sequence length of b (queries sit at its last seqlen_q positions).
  JAX_FLASH_HD int64_t raw_length(int b) const {
    int64_t n = cache_seqlens[b];
    if (n < 0) n = 0;
    return n + (appending() ? seqlen_q : 0);
  }
  // Position of query row 0 of b.
  JAX_FLASH_HD int64_t query_start(int b) const {
    if (explicit_positions) return query_offset + (query_offsets ? query_offsets[b] : 0);
    return raw_length(b) - seqlen_q;
  }
  // Keys of b that exist: [0, length(b)).
  JAX_FLASH_HD int64_t length(int b) const {
    int64_t n = raw_length(b), cap = capacity();
    return n < cap ? n : cap;
  }
  // Element offset of (b, position p, kv head h) in the cache, or -1 when
  // p's page id is out of range (p < capacity assumed).
  JAX_FLASH_HD int64_t cache_offset(int b, int64_t p, int h) const {
    if (!paged()) return (int64_t(b) * cache_rows + p) * row_stride() + int64_t(h) * head_dim;
    const int64_t page = page_table[int64_t(b) * pages_per_seq + p / cache_rows];
    if (page < 0 || page >= num_pages) return -1;
    return (page * cache_rows + p % cache_rows) * row_stride() + int64_t(h) * head_dim;
  }
  // Inclusive key range of a query at absolute position pos (before
  // clipping to [0, length)).
  JAX_FLASH_HD int64_t first_key(int64_t pos) const {
    return window_left >= 0 ? pos - window_left : INT64_MIN / 2;
  }
  JAX_FLASH_HD int64_t last_key(int64_t pos) const {
    int64_t last = INT64_MAX / 2;
    if (causal) last = pos;
    if (window_right >= 0 && pos + window_right < last) last = pos + window_right;
    return last;
  }
};

}  // namespace jax_flash
