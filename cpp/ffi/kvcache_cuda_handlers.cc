// XLA FFI handlers of the KV-cache targets on CUDA: host C++ only; the
// kernels are reached through cuda/decode/decode_launch.h. Launches go on
// XLA's stream; nothing here synchronises.
#include <string>

#include <cuda_runtime_api.h>

#include "cuda/decode/decode_launch.h"
#include "cuda/launch.h"
#include "ffi/handlers.h"
#include "ffi/kvcache_common.h"

namespace jax_flash::ffi_glue {
namespace {

ffi::Error run(KvcacheParams& p, ffi::Buffer<ffi::F32>& workspace, cudaStream_t stream) {
  if (p.dtype == DType::kFloat32)
    return kv_err("on CUDA q and the caches must be float16 or bfloat16");
  if (!cuda::dtype_built(p.dtype) || !cuda::kvcache_supports(p.dtype, p.head_dim))
    return kv_err("no CUDA decode kernel for this dtype and head_dim " +
                  std::to_string(p.head_dim) +
                  " in this build (built head dims: 64, 128, 256 minus those JAX_FLASH_CUDA_HEAD_DIMS "
                  "/ JAX_FLASH_CUDA_DTYPES leave out)");
  // Smaller pages would send the split kernel's page walk to wrong rows,
  // past the pool at its end (cuda::kvcache_min_page_size).
  if (const int min_page = cuda::kvcache_min_page_size(p.head_dim); p.paged() && p.cache_rows < min_page)
    return kv_err("on CUDA a paged cache needs page_size (k_cache.shape[1]) of at least " +
                  std::to_string(min_page) + " at head_dim " + std::to_string(p.head_dim) + ", got " +
                  std::to_string(p.cache_rows));
  const size_t need = cuda::kvcache_workspace_floats(p);
  if (workspace.element_count() < need)
    return kv_err("workspace holds " + std::to_string(workspace.element_count()) +
                  " floats, needs " + std::to_string(need));
  const cudaError_t err = cuda::run_kvcache(p, workspace.typed_data(), stream);
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string("attention_with_kvcache launch: ") +
                                cudaGetErrorString(err));
  return ffi::Error::Success();
}

ffi::Error KvcacheCuda(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer kc, ffi::AnyBuffer vc,
                       ffi::Buffer<ffi::S32> seqlens, ffi::RemainingArgs extra,
                       ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::Buffer<ffi::F32>> lse,
                       ffi::Result<ffi::Buffer<ffi::F32>> workspace,
                       JAX_FLASH_KVCACHE_ATTR_PARAMS) {
  KvcacheParams p;
  if (auto e = fill_kvcache(p, q, kc, vc, seqlens, extra, JAX_FLASH_KVCACHE_ATTRS, *o,
                            lse->typed_data(), nullptr, nullptr);
      e.failure())
    return e;
  return run(p, *workspace, stream);
}

ffi::Error KvcacheAppendCuda(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer kc,
                             ffi::AnyBuffer vc, ffi::Buffer<ffi::S32> seqlens,
                             ffi::RemainingArgs extra, ffi::Result<ffi::AnyBuffer> o,
                             ffi::Result<ffi::Buffer<ffi::F32>> lse,
                             ffi::Result<ffi::AnyBuffer> kc_out, ffi::Result<ffi::AnyBuffer> vc_out,
                             ffi::Result<ffi::Buffer<ffi::F32>> workspace,
                             JAX_FLASH_KVCACHE_ATTR_PARAMS) {
  KvcacheParams p;
  if (auto e = fill_kvcache(p, q, kc, vc, seqlens, extra, JAX_FLASH_KVCACHE_ATTRS, *o,
                            lse->typed_data(), &*kc_out, &*vc_out);
      e.failure())
    return e;
  return run(p, *workspace, stream);
}

}  // namespace
}  // namespace jax_flash::ffi_glue

namespace ffi = xla::ffi;

// kCmdBufferCompatible: a handler only launches on XLA's stream, and what it
// launches depends on shapes, attributes and the device alone, so XLA may
// record it into a CUDA graph with its neighbours (a decode loop then replays
// one graph a step instead of launching kernel by kernel).
XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_kvcache_fwd_cuda, jax_flash::ffi_glue::KvcacheCuda,
                              jax_flash::ffi_glue::bind_kvcache_fwd(
                                  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_kvcache_append_fwd_cuda,
                              jax_flash::ffi_glue::KvcacheAppendCuda,
                              jax_flash::ffi_glue::bind_kvcache_append_fwd(
                                  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});
