// The FFI handler symbols exported to Python by module.cc.
#pragma once

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(jax_flash_fwd_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(jax_flash_bwd_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(jax_flash_kvcache_fwd_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(jax_flash_kvcache_append_fwd_cpu);
#ifdef JAX_FLASH_WITH_CUDA
XLA_FFI_DECLARE_HANDLER_SYMBOL(jax_flash_fwd_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(jax_flash_bwd_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(jax_flash_kvcache_fwd_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(jax_flash_kvcache_append_fwd_cuda);
#endif
