// Buffers + attributes -> AttentionParams, shared by the CPU and CUDA
// handlers. Every check returns an ffi::Error; nothing here aborts.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "params.h"
#include "xla/ffi/api/ffi.h"

namespace jax_flash::ffi_glue {

namespace ffi = xla::ffi;

// A BTNH tensor seen as [batch, seqlen, heads, head_dim]: every axis before
// the last three is folded into batch (extra leading batch axes, vmap).
struct Shape4 {
  int64_t batch = 1, seqlen = 0, heads = 0, head_dim = 0;
  int64_t batch_stride() const { return seqlen * heads * head_dim; }
  int64_t row_stride() const { return heads * head_dim; }
  int64_t head_stride() const { return head_dim; }
};

inline std::string dims_str(ffi::Span<const int64_t> d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

inline ffi::ErrorOr<Shape4> shape_of(const ffi::AnyBuffer& buf, const char* name) {
  auto d = buf.dimensions();
  if (d.size() < 3)
    return ffi::Unexpected(ffi::Error::InvalidArgument(std::string(name) +
                                                       " must have rank >= 3, got " + dims_str(d)));
  Shape4 s;
  for (size_t i = 0; i + 3 < d.size(); ++i) s.batch *= d[i];
  s.seqlen = d[d.size() - 3];
  s.heads = d[d.size() - 2];
  s.head_dim = d[d.size() - 1];
  return s;
}

inline ffi::ErrorOr<DType> dtype_of(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return DType::kFloat32;
    case ffi::DataType::F16: return DType::kFloat16;
    case ffi::DataType::BF16: return DType::kBFloat16;
    default:
      return ffi::Unexpected(
          ffi::Error::InvalidArgument("jax_flash supports float32, float16 and bfloat16"));
  }
}

inline bool same_shape(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b) {
  auto x = a.dimensions(), y = b.dimensions();
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != y[i]) return false;
  return true;
}

inline ffi::Error mismatch(const char* what, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b) {
  return ffi::Error::InvalidArgument(std::string(what) + ": " + dims_str(a.dimensions()) +
                                     " vs " + dims_str(b.dimensions()));
}

// The mask/logit attributes every target takes (see FwdParams).
struct MaskAttrs {
  bool causal = false;
  int64_t query_offset = 0;
  int64_t window_left = -1;
  int64_t window_right = -1;
  float softcap = 0.f;
};

// Fill the forward part of the params from q, k, v, o and lse.
inline ffi::Error fill_fwd(FwdParams& p, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                           const ffi::AnyBuffer& v, void* o, float* lse, float scale,
                           const MaskAttrs& mask) {
  auto dt = dtype_of(q.element_type());
  if (dt.has_error()) return dt.error();
  if (k.element_type() != q.element_type() || v.element_type() != q.element_type())
    return ffi::Error::InvalidArgument("q, k and v must share one dtype");
  auto qs = shape_of(q, "q"), ks = shape_of(k, "k");
  if (qs.has_error()) return qs.error();
  if (ks.has_error()) return ks.error();
  if (!same_shape(k, v)) return mismatch("k and v shapes differ", k, v);
  const Shape4 Q = qs.value(), K = ks.value();
  if (Q.batch != K.batch || Q.head_dim != K.head_dim)
    return mismatch("q and k disagree in batch or head_dim", q, k);
  if (K.heads == 0 || Q.heads % K.heads != 0)
    return mismatch("q heads must be a multiple of k/v heads", q, k);
  if (Q.head_dim < 1 || Q.head_dim > 256)
    return ffi::Error::InvalidArgument("head_dim must be in [1, 256], got " +
                                       std::to_string(Q.head_dim));
  if (Q.batch * Q.heads > INT32_MAX || Q.seqlen > INT32_MAX || K.seqlen > INT32_MAX)
    return ffi::Error::InvalidArgument("sizes exceed the int32 range");

  p.q = q.untyped_data();
  p.k = k.untyped_data();
  p.v = v.untyped_data();
  p.o = o;
  p.lse = lse;
  p.q_batch_stride = Q.batch_stride(); p.q_row_stride = Q.row_stride(); p.q_head_stride = Q.head_stride();
  p.k_batch_stride = K.batch_stride(); p.k_row_stride = K.row_stride(); p.k_head_stride = K.head_stride();
  p.v_batch_stride = K.batch_stride(); p.v_row_stride = K.row_stride(); p.v_head_stride = K.head_stride();
  p.o_batch_stride = Q.batch_stride(); p.o_row_stride = Q.row_stride(); p.o_head_stride = Q.head_stride();
  p.batch = int(Q.batch);
  p.seqlen_q = int(Q.seqlen);
  p.seqlen_k = int(K.seqlen);
  p.heads_q = int(Q.heads);
  p.heads_kv = int(K.heads);
  p.head_dim = int(Q.head_dim);
  if (mask.softcap < 0.f || mask.window_left < -1 || mask.window_right < -1)
    return ffi::Error::InvalidArgument("softcap must be >= 0 and window sizes >= -1");
  p.scale = scale;
  p.causal = mask.causal;
  p.query_offset = mask.query_offset;
  p.window_left = mask.window_left;
  p.window_right = mask.window_right;
  p.softcap = mask.softcap;
  p.dtype = dt.value();
  return ffi::Error::Success();
}

// Fill the backward params: o and dout are shaped like q, dq like q and
// dk/dv like k. lse is [batch..., heads_q, seqlen_q] float32.
inline ffi::Error fill_bwd(BwdParams& p, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                           const ffi::AnyBuffer& v, const ffi::AnyBuffer& o,
                           const ffi::Buffer<ffi::F32>& lse, const ffi::AnyBuffer& dout,
                           ffi::AnyBuffer dq, ffi::AnyBuffer dk, ffi::AnyBuffer dv, float scale,
                           const MaskAttrs& mask, bool deterministic) {
  if (!same_shape(q, o)) return mismatch("o must be shaped like q", q, o);
  if (!same_shape(q, dout)) return mismatch("dout must be shaped like q", q, dout);
  if (o.element_type() != q.element_type() || dout.element_type() != q.element_type())
    return ffi::Error::InvalidArgument("o and dout must have q's dtype");
  if (auto e = fill_fwd(p, q, k, v, nullptr, const_cast<float*>(lse.typed_data()), scale, mask);
      e.failure())
    return e;
  if (lse.element_count() != size_t(p.batch) * p.heads_q * p.seqlen_q)
    return ffi::Error::InvalidArgument("lse must hold batch * heads_q * seqlen_q elements");
  p.o = const_cast<void*>(o.untyped_data());
  p.dout = dout.untyped_data();
  p.dq = dq.untyped_data();
  p.dk = dk.untyped_data();
  p.dv = dv.untyped_data();
  p.do_batch_stride = p.o_batch_stride; p.do_row_stride = p.o_row_stride; p.do_head_stride = p.o_head_stride;
  p.dq_batch_stride = p.q_batch_stride; p.dq_row_stride = p.q_row_stride; p.dq_head_stride = p.q_head_stride;
  p.dk_batch_stride = p.k_batch_stride; p.dk_row_stride = p.k_row_stride; p.dk_head_stride = p.k_head_stride;
  p.dv_batch_stride = p.v_batch_stride; p.dv_row_stride = p.v_row_stride; p.dv_head_stride = p.v_head_stride;
  p.deterministic = deterministic;
  return ffi::Error::Success();
}

// The targets' signatures after the platform context, shared by the CPU and
// CUDA handlers so the two registrations cannot drift apart.

// scale and the MaskAttrs fields, in the order the handlers take them.
template <typename Binding>
auto bind_mask_attrs(Binding binding) {
  return std::move(binding)
      .template Attr<float>("scale")
      .template Attr<bool>("causal")
      .template Attr<int64_t>("query_offset")
      .template Attr<int64_t>("window_left")
      .template Attr<int64_t>("window_right")
      .template Attr<float>("softcap");
}

template <typename Binding>
auto bind_fwd(Binding binding) {
  return bind_mask_attrs(std::move(binding).template Arg<ffi::AnyBuffer>()  // q
      .template Arg<ffi::AnyBuffer>()               // k
      .template Arg<ffi::AnyBuffer>()               // v
      .template Ret<ffi::AnyBuffer>()               // o
      .template Ret<ffi::Buffer<ffi::F32>>());      // lse
}

template <typename Binding>
auto bind_bwd(Binding binding) {
  return bind_mask_attrs(std::move(binding).template Arg<ffi::AnyBuffer>()  // q
      .template Arg<ffi::AnyBuffer>()               // k
      .template Arg<ffi::AnyBuffer>()               // v
      .template Arg<ffi::AnyBuffer>()               // o
      .template Arg<ffi::Buffer<ffi::F32>>()        // lse
      .template Arg<ffi::AnyBuffer>()               // dout
      .template Ret<ffi::AnyBuffer>()               // dq
      .template Ret<ffi::AnyBuffer>()               // dk
      .template Ret<ffi::AnyBuffer>()               // dv
      .template Ret<ffi::AnyBuffer>())              // workspace (float32 scratch, CUDA only)
      .template Attr<bool>("deterministic");
}

}  // namespace jax_flash::ffi_glue
