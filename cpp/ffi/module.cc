// The nanobind module: hands the FFI handler capsules to Python, which
// registers each target name for its platform (jax_flash/_ffi.py).
#include <nanobind/nanobind.h>

#include "cpu/attention_cpu.h"
#include "ffi/handlers.h"
#ifdef JAX_FLASH_WITH_CUDA
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "cuda/decode/decode_launch.h"
#include "cuda/launch.h"
#include "cuda/tf32_dispatch.h"
#endif

namespace nb = nanobind;

namespace {

template <typename T>
nb::capsule capsule(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "not an XLA FFI handler");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_jax_flash, m) {
  m.doc() = "jax_flash kernels as XLA FFI handlers";
  // {platform: {target: capsule}}
  m.def("registrations", []() {
    nb::dict cpu, cuda, out;
    cpu["jax_flash_fwd"] = capsule(jax_flash_fwd_cpu);
    cpu["jax_flash_bwd"] = capsule(jax_flash_bwd_cpu);
    cpu["jax_flash_kvcache_fwd"] = capsule(jax_flash_kvcache_fwd_cpu);
    cpu["jax_flash_kvcache_append_fwd"] = capsule(jax_flash_kvcache_append_fwd_cpu);
    out["cpu"] = cpu;
#ifdef JAX_FLASH_WITH_CUDA
    cuda["jax_flash_fwd"] = capsule(jax_flash_fwd_cuda);
    cuda["jax_flash_bwd"] = capsule(jax_flash_bwd_cuda);
    cuda["jax_flash_kvcache_fwd"] = capsule(jax_flash_kvcache_fwd_cuda);
    cuda["jax_flash_kvcache_append_fwd"] = capsule(jax_flash_kvcache_append_fwd_cuda);
    out["CUDA"] = cuda;
#endif
    return out;
  });
  m.def("cpu_isa", []() { return jax_flash::cpu::isa_name(); });
#ifdef JAX_FLASH_WITH_CUDA
  m.attr("cuda_archs") = JAX_FLASH_CUDA_ARCHS_STR;
  // Head dims of the compiled CUDA kernels (plain, variants): the Python side
  // sizes the backward's workspace by the head dim that will run.
  m.def("cuda_head_dims", [](bool variants) { return jax_flash::cuda::head_dims(variants); });
  // Head dims of the split-KV decode kernels (attention_with_kvcache).
  m.def("cuda_kvcache_head_dims", []() { return jax_flash::cuda::kvcache_head_dims(); });
  // The 16-bit dtypes with compiled CUDA kernels (JAX_FLASH_CUDA_DTYPES).
  m.def("cuda_dtypes", []() {
    std::vector<std::string> out;
    if (jax_flash::cuda::dtype_built(jax_flash::DType::kBFloat16)) out.push_back("bfloat16");
    if (jax_flash::cuda::dtype_built(jax_flash::DType::kFloat16)) out.push_back("float16");
    return out;
  });
  // Whether float32 inputs have CUDA (TF32) kernels (JAX_FLASH_CUDA_DTYPES).
  m.def("cuda_float32", []() { return jax_flash::cuda::tf32_built(); });
#else
  m.attr("cuda_archs") = nb::none();
#endif
}
