// XLA FFI handlers of the KV-cache targets on the CPU: append (in place, on
// the aliased result caches), then attend. Host memory throughout.
#include "cpu/kvcache_cpu.h"
#include "ffi/cpu_executor.h"
#include "ffi/handlers.h"
#include "ffi/kvcache_common.h"

namespace jax_flash::ffi_glue {
namespace {

ffi::Error KvcacheCpu(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer kc, ffi::AnyBuffer vc,
                      ffi::Buffer<ffi::S32> seqlens, ffi::RemainingArgs extra,
                      ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::Buffer<ffi::F32>> lse,
                      ffi::Result<ffi::Buffer<ffi::F32>> /*workspace: CUDA only*/,
                      JAX_FLASH_KVCACHE_ATTR_PARAMS) {
  KvcacheParams p;
  if (auto e = fill_kvcache(p, q, kc, vc, seqlens, extra, JAX_FLASH_KVCACHE_ATTRS, *o,
                            lse->typed_data(), nullptr, nullptr);
      e.failure())
    return e;
  cpu::kvcache_attention(p, cpu_executor(pool));
  return ffi::Error::Success();
}

ffi::Error KvcacheAppendCpu(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer kc,
                            ffi::AnyBuffer vc, ffi::Buffer<ffi::S32> seqlens,
                            ffi::RemainingArgs extra, ffi::Result<ffi::AnyBuffer> o,
                            ffi::Result<ffi::Buffer<ffi::F32>> lse,
                            ffi::Result<ffi::AnyBuffer> kc_out, ffi::Result<ffi::AnyBuffer> vc_out,
                            ffi::Result<ffi::Buffer<ffi::F32>> /*workspace*/,
                            JAX_FLASH_KVCACHE_ATTR_PARAMS) {
  KvcacheParams p;
  if (auto e = fill_kvcache(p, q, kc, vc, seqlens, extra, JAX_FLASH_KVCACHE_ATTRS, *o,
                            lse->typed_data(), &*kc_out, &*vc_out);
      e.failure())
    return e;
  cpu::kvcache_append(p);
  cpu::kvcache_attention(p, cpu_executor(pool));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_flash::ffi_glue

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_kvcache_fwd_cpu, jax_flash::ffi_glue::KvcacheCpu,
                              jax_flash::ffi_glue::bind_kvcache_fwd(
                                  ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_flash_kvcache_append_fwd_cpu,
                              jax_flash::ffi_glue::KvcacheAppendCpu,
                              jax_flash::ffi_glue::bind_kvcache_append_fwd(
                                  ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
