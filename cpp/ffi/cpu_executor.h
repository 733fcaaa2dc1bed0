// The CPU kernels' Executor on XLA's intra-op thread pool (cpu_handlers.cc),
// shared by every CPU handler file.
#pragma once

#include "cpu/attention_cpu.h"
#include "xla/ffi/api/ffi.h"

namespace jax_flash::ffi_glue {

cpu::Executor cpu_executor(xla::ffi::ThreadPool& pool);

}  // namespace jax_flash::ffi_glue
