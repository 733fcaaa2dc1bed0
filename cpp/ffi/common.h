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
  float dropout_rate = 0.f;
  int64_t optional_inputs = 0;  // bitmask of OptionalInput: which extra operands follow
  // The caller asked for full float32 matmul precision (JAX's
  // jax_default_matmul_precision "highest" / "float32"): the CUDA handlers
  // refuse float32 inputs then (their kernels run TF32); the CPU ignores it
  // (it computes float32 in float32).
  bool f32_full = false;
};

// The optional operands, after the fixed ones (q, k, v for the forward; q, k,
// v, o, lse, dout for the backward), in this order, each present when its bit
// is set in the `optional_inputs` attribute. `batch` is q's leading axes
// (folded: only the element count is checked).
enum OptionalInput : int64_t {
  kQSeqlens = 1 << 0,         // int32 [batch...]
  kKvSeqlens = 1 << 1,        // int32 [batch...]
  kQueryOffsets = 1 << 2,     // int32 [batch...]
  kQSegmentIds = 1 << 3,      // int32 [batch..., seqlen_q]
  kKvSegmentIds = 1 << 4,     // int32 [batch..., seqlen_k]
  kQSegmentRanges = 1 << 5,   // int32 [batch..., ceil(seqlen_q / 16), 2]
  kKvSegmentRanges = 1 << 6,  // int32 [batch..., ceil(seqlen_k / 16), 2]
  kAlibiSlopes = 1 << 7,      // float32 [heads_q] or [batch..., heads_q]
  kDropoutSeed = 1 << 8,      // uint32 [2]
  kNumOptionalInputs = 9,
};
inline constexpr int64_t kSegmentInputs =
    kQSegmentIds | kKvSegmentIds | kQSegmentRanges | kKvSegmentRanges;

inline const char* optional_input_name(int bit) {
  static const char* const names[kNumOptionalInputs] = {
      "q_seqlens",        "kv_seqlens",        "query_offsets",
      "q_segment_ids",    "kv_segment_ids",    "q_segment_ranges",
      "kv_segment_ranges", "alibi_slopes",     "dropout_seed"};
  return names[bit];
}

// Decodes the optional operands named by mask.optional_inputs into p (after
// the sizes are known). Pointers are passed through as they are: host memory
// for the CPU target, device memory for CUDA.
inline ffi::Error fill_optional(FwdParams& p, const ffi::RemainingArgs& extra,
                                const MaskAttrs& mask) {
  const int64_t present = mask.optional_inputs;
  if (present < 0 || present >= (int64_t(1) << kNumOptionalInputs))
    return ffi::Error::InvalidArgument("optional_inputs has unknown bits: " +
                                       std::to_string(present));
  if ((present & kSegmentInputs) != 0 && (present & kSegmentInputs) != kSegmentInputs)
    return ffi::Error::InvalidArgument(
        "segment ids need all four of q/kv_segment_ids and q/kv_segment_ranges");
  if (!(mask.dropout_rate >= 0.f && mask.dropout_rate < 1.f))
    return ffi::Error::InvalidArgument("dropout_rate must be in [0, 1), got " +
                                       std::to_string(mask.dropout_rate));
  if ((mask.dropout_rate > 0.f) != ((present & kDropoutSeed) != 0))
    return ffi::Error::InvalidArgument("dropout_rate > 0 needs the dropout_seed operand and only then");
  size_t expected = 0;
  for (int bit = 0; bit < kNumOptionalInputs; ++bit) expected += (present >> bit) & 1;
  if (extra.size() != expected)
    return ffi::Error::InvalidArgument("optional_inputs names " + std::to_string(expected) +
                                       " operands, got " + std::to_string(extra.size()));
  const int64_t B = p.batch;
  const auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  size_t next = 0;
  for (int bit = 0; bit < kNumOptionalInputs; ++bit) {
    if (!((present >> bit) & 1)) continue;
    auto buf_or = extra.get<ffi::AnyBuffer>(next++);
    if (buf_or.has_error()) return buf_or.error();
    const ffi::AnyBuffer buf = buf_or.value();
    const std::string name = optional_input_name(bit);
    const auto dims = buf.dimensions();
    ffi::DataType want = ffi::DataType::S32;
    if (bit == 7) want = ffi::DataType::F32;
    if (bit == 8) want = ffi::DataType::U32;
    if (buf.element_type() != want)
      return ffi::Error::InvalidArgument(name + " has the wrong element type");
    // Trailing dims that must match exactly; the rest multiply to `batch`.
    int64_t tail[2] = {0, 0};
    int n_tail = 0;
    switch (OptionalInput(int64_t(1) << bit)) {
      case kQSegmentIds: tail[0] = p.seqlen_q; n_tail = 1; break;
      case kKvSegmentIds: tail[0] = p.seqlen_k; n_tail = 1; break;
      case kQSegmentRanges:
        tail[0] = cdiv(p.seqlen_q, FwdParams::kSegmentBlock); tail[1] = 2; n_tail = 2; break;
      case kKvSegmentRanges:
        tail[0] = cdiv(p.seqlen_k, FwdParams::kSegmentBlock); tail[1] = 2; n_tail = 2; break;
      case kAlibiSlopes: tail[0] = p.heads_q; n_tail = 1; break;
      case kDropoutSeed: tail[0] = 2; n_tail = 1; break;
      default: break;
    }
    bool ok = dims.size() >= size_t(n_tail);
    int64_t lead = 1;
    if (ok) {
      const size_t n_lead = dims.size() - n_tail;
      for (size_t i = 0; i < n_lead; ++i) lead *= dims[i];
      for (int t = 0; t < n_tail; ++t) ok = ok && dims[n_lead + t] == tail[t];
    }
    const bool batch_ok = bit == 8 ? lead == 1 && dims.size() == 1
                                   : (lead == B || (bit == 7 && dims.size() == 1));
    if (!ok || !batch_ok)
      return ffi::Error::InvalidArgument(name + " has shape " + dims_str(dims) +
                                         ", which does not fit batch " + std::to_string(B) +
                                         ", seqlen_q " + std::to_string(p.seqlen_q) +
                                         ", seqlen_k " + std::to_string(p.seqlen_k) +
                                         ", heads_q " + std::to_string(p.heads_q));
    const void* data = buf.untyped_data();
    switch (OptionalInput(int64_t(1) << bit)) {
      case kQSeqlens: p.q_seqlens = static_cast<const int32_t*>(data); break;
      case kKvSeqlens: p.kv_seqlens = static_cast<const int32_t*>(data); break;
      case kQueryOffsets: p.query_offsets = static_cast<const int32_t*>(data); break;
      case kQSegmentIds: p.q_segment_ids = static_cast<const int32_t*>(data); break;
      case kKvSegmentIds: p.kv_segment_ids = static_cast<const int32_t*>(data); break;
      case kQSegmentRanges: p.q_segment_ranges = static_cast<const int32_t*>(data); break;
      case kKvSegmentRanges: p.kv_segment_ranges = static_cast<const int32_t*>(data); break;
      case kAlibiSlopes:
        p.alibi_slopes = static_cast<const float*>(data);
        p.alibi_batch_stride = dims.size() == 1 ? 0 : p.heads_q;
        break;
      case kDropoutSeed: p.dropout_seed = static_cast<const uint32_t*>(data); break;
      default: break;
    }
  }
  p.dropout_rate = mask.dropout_rate;
  return ffi::Error::Success();
}

// Fill the forward part of the params from q, k, v, o and lse.
inline ffi::Error fill_fwd(FwdParams& p, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                           const ffi::AnyBuffer& v, const ffi::RemainingArgs& extra, void* o,
                           float* lse, float scale, const MaskAttrs& mask) {
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
  return fill_optional(p, extra, mask);
}

// Fill the backward params: o and dout are shaped like q, dq like q and
// dk/dv like k. lse is [batch..., heads_q, seqlen_q] float32.
inline ffi::Error fill_bwd(BwdParams& p, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                           const ffi::AnyBuffer& v, const ffi::AnyBuffer& o,
                           const ffi::Buffer<ffi::F32>& lse, const ffi::AnyBuffer& dout,
                           const ffi::RemainingArgs& extra,
                           ffi::AnyBuffer dq, ffi::AnyBuffer dk, ffi::AnyBuffer dv, float scale,
                           const MaskAttrs& mask, bool deterministic) {
  if (!same_shape(q, o)) return mismatch("o must be shaped like q", q, o);
  if (!same_shape(q, dout)) return mismatch("dout must be shaped like q", q, dout);
  if (o.element_type() != q.element_type() || dout.element_type() != q.element_type())
    return ffi::Error::InvalidArgument("o and dout must have q's dtype");
  if (auto e = fill_fwd(p, q, k, v, extra, nullptr, const_cast<float*>(lse.typed_data()), scale, mask);
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
      .template Attr<float>("softcap")
      .template Attr<float>("dropout_rate")
      .template Attr<int64_t>("optional_inputs")
      .template Attr<bool>("f32_full");
}

template <typename Binding>
auto bind_fwd(Binding binding) {
  return bind_mask_attrs(std::move(binding).template Arg<ffi::AnyBuffer>()  // q
      .template Arg<ffi::AnyBuffer>()               // k
      .template Arg<ffi::AnyBuffer>()               // v
      .RemainingArgs()                              // optional inputs (see OptionalInput)
      .template Ret<ffi::AnyBuffer>()               // o
      .template Ret<ffi::Buffer<ffi::F32>>()        // lse
      .template Ret<ffi::AnyBuffer>());             // scheduler scratch (int32, CUDA only)
}

template <typename Binding>
auto bind_bwd(Binding binding) {
  return bind_mask_attrs(std::move(binding).template Arg<ffi::AnyBuffer>()  // q
      .template Arg<ffi::AnyBuffer>()               // k
      .template Arg<ffi::AnyBuffer>()               // v
      .template Arg<ffi::AnyBuffer>()               // o
      .template Arg<ffi::Buffer<ffi::F32>>()        // lse
      .template Arg<ffi::AnyBuffer>()               // dout
      .RemainingArgs()                              // optional inputs (see OptionalInput)
      .template Ret<ffi::AnyBuffer>()               // dq
      .template Ret<ffi::AnyBuffer>()               // dk
      .template Ret<ffi::AnyBuffer>()               // dv
      .template Ret<ffi::AnyBuffer>())              // workspace (float32 scratch, CUDA only)
      .template Attr<bool>("deterministic");
}

}  // namespace jax_flash::ffi_glue
