// Buffers + attributes -> KvcacheParams for the two KV-cache targets, shared
// by the CPU and CUDA handlers:
//   jax_flash_kvcache_fwd:        (q, k_cache, v_cache, cache_seqlens, extras...)
//                                 -> (o, lse, workspace)
//   jax_flash_kvcache_append_fwd: same operands with k_new, v_new among the extras
//                                 -> (o, lse, k_cache, v_cache, workspace); the
//                                 returned caches alias the operands (Python
//                                 sets input_output_aliases), so a donated
//                                 cache is updated in place.
// Every check returns an ffi::Error; nothing aborts.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "ffi/common.h"
#include "kvcache_params.h"

namespace jax_flash::ffi_glue {

// Which optional operands follow cache_seqlens, in this order.
enum KvcacheInput : int64_t {
  kKvcacheNewKv = 1 << 0,      // k_new, v_new [batch, seqlen_q, heads_kv, head_dim]
  kKvcachePageTable = 1 << 1,  // int32 [batch, pages_per_seq]
  kKvcacheAlibi = 1 << 2,      // float32 [heads_q] or [batch, heads_q]
  kKvcacheQueryOffsets = 1 << 3,  // int32 [batch]: added to the query_offset attribute
  kKvcachePositions = 1 << 4,  // no operand: positions are query_offset (+ offsets) + i
};

struct KvcacheAttrs {
  float scale = 0.f;
  bool causal = true;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.f;
  int64_t optional_inputs = 0;
  int64_t num_splits = 1;
  int64_t query_offset = 0;
};

inline ffi::Error kv_err(const std::string& msg) {
  return ffi::Error::InvalidArgument("attention_with_kvcache: " + msg);
}

// Fills p from the operands. k_cache_out / v_cache_out: the (aliased) result
// buffers when appending, else nullptr (the caches are read only).
inline ffi::Error fill_kvcache(KvcacheParams& p, const ffi::AnyBuffer& q, const ffi::AnyBuffer& kc,
                               const ffi::AnyBuffer& vc, const ffi::Buffer<ffi::S32>& seqlens,
                               const ffi::RemainingArgs& extra, const KvcacheAttrs& a,
                               ffi::AnyBuffer& o, float* lse, ffi::AnyBuffer* kc_out,
                               ffi::AnyBuffer* vc_out) {
  auto dt = dtype_of(q.element_type());
  if (dt.has_error()) return dt.error();
  if (kc.element_type() != q.element_type() || vc.element_type() != q.element_type())
    return kv_err("q, k_cache and v_cache must share one dtype");
  const auto qd = q.dimensions(), kd = kc.dimensions();
  if (qd.size() != 4) return kv_err("q must have rank 4, got " + dims_str(qd));
  if (kd.size() != 4) return kv_err("k_cache must have rank 4, got " + dims_str(kd));
  if (!same_shape(kc, vc)) return mismatch("k_cache and v_cache shapes differ", kc, vc);
  if (!same_shape(q, o)) return mismatch("o must be shaped like q", q, o);
  if (qd[3] != kd[3]) return mismatch("q and the cache disagree in head_dim", q, kc);
  if (kd[2] == 0 || qd[2] % kd[2] != 0)
    return mismatch("q heads must be a multiple of the cache's kv heads", q, kc);
  if (qd[3] < 1 || qd[3] > 256) return kv_err("head_dim must be in [1, 256]");
  if (qd[0] * qd[2] > INT32_MAX || qd[1] > INT32_MAX) return kv_err("sizes exceed the int32 range");
  const int64_t present = a.optional_inputs;
  if (present < 0 || present >= 32) return kv_err("optional_inputs has unknown bits");
  if ((present & kKvcacheQueryOffsets) && !(present & kKvcachePositions))
    return kv_err("query_offsets need explicit positions");
  const bool append = (present & kKvcacheNewKv) != 0;
  if (append != (kc_out != nullptr))
    return kv_err("k/v to append must come with the appending target, and only there");
  // New rows sit at the cache's end, where bottom-right queries sit; the
  // split kernel stores them on that assumption (cpp/cuda/decode/decode_kernel.cuh).
  if (append && (present & kKvcachePositions))
    return kv_err("k/v to append cannot be combined with explicit query positions");
  const size_t expected = (append ? 2 : 0) + ((present & kKvcachePageTable) ? 1 : 0) +
                          ((present & kKvcacheAlibi) ? 1 : 0) +
                          ((present & kKvcacheQueryOffsets) ? 1 : 0);
  if (extra.size() != expected)
    return kv_err("optional_inputs names " + std::to_string(expected) + " operands, got " +
                  std::to_string(extra.size()));
  p.batch = int(qd[0]);
  p.seqlen_q = int(qd[1]);
  p.heads_q = int(qd[2]);
  p.heads_kv = int(kd[2]);
  p.head_dim = int(qd[3]);
  if (seqlens.element_count() != size_t(p.batch))
    return kv_err("cache_seqlens must hold batch = " + std::to_string(p.batch) + " values");
  size_t next = 0;
  if (append) {
    auto kn = extra.get<ffi::AnyBuffer>(next++);
    auto vn = extra.get<ffi::AnyBuffer>(next++);
    if (kn.has_error()) return kn.error();
    if (vn.has_error()) return vn.error();
    const auto nd = kn.value().dimensions();
    if (!same_shape(kn.value(), vn.value())) return mismatch("k and v shapes differ", kn.value(), vn.value());
    if (nd.size() != 4 || nd[0] != qd[0] || nd[1] != qd[1] || nd[2] != kd[2] || nd[3] != qd[3])
      return kv_err("k/v must be [batch, seqlen_q, heads_kv, head_dim], got " + dims_str(nd));
    if (kn.value().element_type() != q.element_type() || vn.value().element_type() != q.element_type())
      return kv_err("k and v must have q's dtype");
    if (!same_shape(kc, *kc_out) || !same_shape(vc, *vc_out))
      return kv_err("the returned caches must be shaped like the caches");
    p.k_new = kn.value().untyped_data();
    p.v_new = vn.value().untyped_data();
    // The results alias the operands; write (and read) through them.
    p.k_cache = kc_out->untyped_data();
    p.v_cache = vc_out->untyped_data();
  } else {
    p.k_cache = const_cast<void*>(kc.untyped_data());
    p.v_cache = const_cast<void*>(vc.untyped_data());
  }
  if (present & kKvcachePageTable) {
    auto pt = extra.get<ffi::AnyBuffer>(next++);
    if (pt.has_error()) return pt.error();
    const auto pd = pt.value().dimensions();
    if (pt.value().element_type() != ffi::DataType::S32) return kv_err("page_table must be int32");
    if (pd.size() != 2 || pd[0] != qd[0])
      return kv_err("page_table must be [batch, pages_per_sequence], got " + dims_str(pd));
    p.page_table = static_cast<const int32_t*>(pt.value().untyped_data());
    p.pages_per_seq = pd[1];
    p.num_pages = kd[0];
  } else {
    if (kd[0] != qd[0]) return mismatch("q and a contiguous cache disagree in batch", q, kc);
    p.num_pages = kd[0];
  }
  p.cache_rows = kd[1];
  if (kd[0] * kd[1] > INT32_MAX) return kv_err("the cache holds more than 2^31 rows");
  if (p.paged() && p.pages_per_seq * p.cache_rows > INT32_MAX)
    return kv_err("pages_per_sequence * page_size exceeds 2^31 positions");
  if (present & kKvcacheAlibi) {
    auto al = extra.get<ffi::AnyBuffer>(next++);
    if (al.has_error()) return al.error();
    const auto ad = al.value().dimensions();
    if (al.value().element_type() != ffi::DataType::F32) return kv_err("alibi_slopes must be float32");
    const bool per_head = ad.size() == 1 && ad[0] == qd[2];
    const bool per_batch = ad.size() == 2 && ad[0] == qd[0] && ad[1] == qd[2];
    if (!per_head && !per_batch)
      return kv_err("alibi_slopes must be [heads_q] or [batch, heads_q], got " + dims_str(ad));
    p.alibi_slopes = static_cast<const float*>(al.value().untyped_data());
    p.alibi_batch_stride = per_batch ? p.heads_q : 0;
  }
  if (present & kKvcacheQueryOffsets) {
    auto qo = extra.get<ffi::AnyBuffer>(next++);
    if (qo.has_error()) return qo.error();
    if (qo.value().element_type() != ffi::DataType::S32 ||
        qo.value().element_count() != size_t(p.batch))
      return kv_err("query_offsets must be int32 [batch]");
    p.query_offsets = static_cast<const int32_t*>(qo.value().untyped_data());
  }
  p.explicit_positions = (present & kKvcachePositions) != 0;
  p.query_offset = a.query_offset;
  if (a.softcap < 0.f || a.window_left < -1 || a.window_right < -1)
    return kv_err("softcap must be >= 0 and window sizes >= -1");
  if (a.num_splits < 1 || a.num_splits > 1024) return kv_err("num_splits must be in [1, 1024]");
  p.q = q.untyped_data();
  p.o = o.untyped_data();
  p.lse = lse;
  p.cache_seqlens = seqlens.typed_data();
  p.scale = a.scale;
  p.causal = a.causal;
  p.window_left = a.window_left;
  p.window_right = a.window_right;
  p.softcap = a.softcap;
  p.num_splits = int(a.num_splits);
  p.dtype = dt.value();
  return ffi::Error::Success();
}

template <typename Binding>
auto bind_kvcache_attrs(Binding binding) {
  return std::move(binding)
      .template Attr<float>("scale")
      .template Attr<bool>("causal")
      .template Attr<int64_t>("window_left")
      .template Attr<int64_t>("window_right")
      .template Attr<float>("softcap")
      .template Attr<int64_t>("optional_inputs")
      .template Attr<int64_t>("num_splits")
      .template Attr<int64_t>("query_offset");
}

// Operands: q, k_cache, v_cache, cache_seqlens, then the KvcacheInput extras.
#define JAX_FLASH_KVCACHE_ARGS(binding)             \
  std::move(binding)                                \
      .template Arg<ffi::AnyBuffer>()        /* q */ \
      .template Arg<ffi::AnyBuffer>()  /* k_cache */ \
      .template Arg<ffi::AnyBuffer>()  /* v_cache */ \
      .template Arg<ffi::Buffer<ffi::S32>>()        \
      .RemainingArgs()

template <typename Binding>
auto bind_kvcache_fwd(Binding binding) {
  return bind_kvcache_attrs(JAX_FLASH_KVCACHE_ARGS(binding)
      .template Ret<ffi::AnyBuffer>()            // o
      .template Ret<ffi::Buffer<ffi::F32>>()     // lse
      .template Ret<ffi::Buffer<ffi::F32>>());   // workspace (CUDA split partials)
}

template <typename Binding>
auto bind_kvcache_append_fwd(Binding binding) {
  return bind_kvcache_attrs(JAX_FLASH_KVCACHE_ARGS(binding)
      .template Ret<ffi::AnyBuffer>()            // o
      .template Ret<ffi::Buffer<ffi::F32>>()     // lse
      .template Ret<ffi::AnyBuffer>()            // k_cache (aliases the operand)
      .template Ret<ffi::AnyBuffer>()            // v_cache (aliases the operand)
      .template Ret<ffi::Buffer<ffi::F32>>());   // workspace
}

#define JAX_FLASH_KVCACHE_ATTR_PARAMS                                                   \
  float scale, bool causal, int64_t window_left, int64_t window_right, float softcap, \
      int64_t optional_inputs, int64_t num_splits, int64_t query_offset
#define JAX_FLASH_KVCACHE_ATTRS \
  KvcacheAttrs { scale, causal, window_left, window_right, softcap, optional_inputs, num_splits, query_offset }

}  // namespace jax_flash::ffi_glue
