// XLA FFI handlers for the CUDA kernels: host C++ only (the kernels live in
// cpp/cuda and are reached through cuda/launch.h). Launches go on the stream
// XLA hands us; nothing here synchronises.
#include <string>

#include <cuda_runtime_api.h>

#include "cuda/launch.h"
#include "cuda/tf32_dispatch.h"
#include "ffi/common.h"
#include "ffi/handlers.h"

namespace jax_flash::ffi_glue {
namespace {

// float32 runs on the TF32 kernels (cpp/cuda/tf32/): JAX's default float32
// matmul precision on NVIDIA GPUs. A request for full float32 precision is
// refused rather than served in TF32.
ffi::Error check_supported_f32(const FwdParams& p, bool f32_full) {
  if (f32_full)
    return ffi::Error::InvalidArgument(
        "jax_flash on CUDA computes float32 inputs on TF32 tensor cores (JAX's default float32 "
        "matmul precision on GPU), but jax_default_matmul_precision asks for full float32 "
        "('highest' / 'float32'), which these kernels do not provide: use the default precision "
        "(or 'tensorfloat32' / 'high') around jax_flash.attention, or "
        "jax.nn.dot_product_attention for full float32");
  if (!cuda::tf32_supports(p.head_dim)) {
    std::string dims;
    for (int d : cuda::tf32_head_dims()) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    return ffi::Error::InvalidArgument(
        "jax_flash: no CUDA float32 (TF32) kernel for head_dim " + std::to_string(p.head_dim) +
        " in this build (built: " + (dims.empty() ? "none" : dims) +
        "; see JAX_FLASH_CUDA_DTYPES (tf32) / JAX_FLASH_CUDA_HEAD_DIMS)");
  }
  return ffi::Error::Success();
}

// variants: the call runs on the variants kernels, which a trimmed build may
// lack (the forward: cuda::fwd_uses_variants; the backward's plain kernels
// take any rows, so only its options count).
ffi::Error check_supported(const FwdParams& p, bool f32_full, bool variants) {
  if (p.dtype == DType::kFloat32) return check_supported_f32(p, f32_full);
  if (!cuda::dtype_built(p.dtype))
    return ffi::Error::InvalidArgument(std::string("jax_flash: no CUDA ") +
                                       (p.dtype == DType::kFloat16 ? "float16" : "bfloat16") +
                                       " kernels in this build (see JAX_FLASH_CUDA_DTYPES)");
  if (!cuda::supports(p.dtype, p.head_dim, variants)) {
    std::string dims;
    for (int d : cuda::head_dims(variants)) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    return ffi::Error::InvalidArgument(
        std::string("jax_flash: no CUDA ") + (variants ? "variants " : "") +
        "kernel for head_dim " + std::to_string(p.head_dim) + " in this build (built: " +
        (dims.empty() ? "none" : dims) + "; see JAX_FLASH_CUDA_HEAD_DIMS / _VARIANT_HEAD_DIMS)");
  }
  return ffi::Error::Success();
}

ffi::Error from_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string(what) + ": " + cudaGetErrorString(err));
}

ffi::Error FwdCuda(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                   ffi::RemainingArgs extra, ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::Buffer<ffi::F32>> lse,
                   ffi::Result<ffi::AnyBuffer> scratch, float scale, bool causal, int64_t query_offset, int64_t window_left,
                  int64_t window_right, float softcap, float dropout_rate,
                  int64_t optional_inputs, bool f32_full) {
  FwdParams p;
  if (auto e = fill_fwd(p, q, k, v, extra, o->untyped_data(), lse->typed_data(), scale,
                         {causal, query_offset, window_left, window_right, softcap, dropout_rate,
                          optional_inputs, f32_full});
      e.failure())
    return e;
  if (!same_shape(q, *o)) return mismatch("o must be shaped like q", q, *o);
  if (auto e = check_supported(p, f32_full, cuda::fwd_uses_variants(p)); e.failure()) return e;
  // float32: the scratch also holds the Hopper TF32 kernel's K / V copies
  // (sized by the Python side; smaller scratch runs the mma.sync kernel).
  if (p.dtype == DType::kFloat32)
    return from_cuda(cuda::run_fwd_tf32(p, scratch->untyped_data(), scratch->size_bytes(), stream),
                     "jax_flash float32 forward launch");
  if (scratch->size_bytes() >= sizeof(int32_t)) p.tile_counter = static_cast<int32_t*>(scratch->untyped_data());
  return from_cuda(cuda::run_fwd(p, stream), "jax_flash forward launch");
}

ffi::Error BwdCuda(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                   ffi::AnyBuffer o, ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dout,
                   ffi::RemainingArgs extra, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                   ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> workspace,
                   float scale, bool causal, int64_t query_offset, int64_t window_left,
                  int64_t window_right, float softcap, float dropout_rate,
                  int64_t optional_inputs, bool f32_full, bool deterministic) {
  BwdParams p;
  if (auto e = fill_bwd(p, q, k, v, o, lse, dout, extra, *dq, *dk, *dv, scale,
                         {causal, query_offset, window_left, window_right, softcap, dropout_rate,
                          optional_inputs, f32_full}, deterministic);
      e.failure())
    return e;
  if (auto e = check_supported(p, f32_full, !p.plain_mask()); e.failure()) return e;
  const bool f32 = p.dtype == DType::kFloat32;
  // Scratch comes as an extra output sized by the Python side (XLA's scratch
  // allocator is not available to every custom call).
  const size_t bytes = f32 ? cuda::bwd_workspace_bytes_tf32(p) : cuda::bwd_workspace_bytes(p);
  if (workspace->size_bytes() < bytes)
    return ffi::Error::InvalidArgument("jax_flash backward: workspace output holds " +
                                       std::to_string(workspace->size_bytes()) + " bytes, needs " +
                                       std::to_string(bytes));
  p.workspace = workspace->untyped_data();
  if (f32) return from_cuda(cuda::run_bwd_tf32(p, stream), "jax_flash float32 backward launch");
  return from_cuda(cuda::run_bwd(p, stream), "jax_flash backward launch");
}

}  // namespace
}  // namespace jax_flash::ffi_glue

namespace ffi = xla::ffi;

// kCmdBufferCompatible: a handler only launches on XLA's stream, and what it
// launches depends on shapes, attributes and the device alone, so XLA may
// record it into a CUDA graph with its neighbours (a decode loop then replays
// one graph a step instead of launching kernel by kernel).
XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_fwd_cuda, jax_flash::ffi_glue::FwdCuda,
                              jax_flash::ffi_glue::bind_fwd(
                                  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_bwd_cuda, jax_flash::ffi_glue::BwdCuda,
                              jax_flash::ffi_glue::bind_bwd(
                                  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});
