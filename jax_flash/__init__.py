"""jax_flash: FlashAttention for JAX (CPU and CUDA kernels as XLA FFI custom calls)."""

from jax_flash._ffi import compiled_platforms, cpu_isa, cuda_archs
from jax_flash.attention import attention, segment_ranges
from jax_flash.dropout import dropout_mask
from jax_flash.kvcache import attention_with_kvcache
from jax_flash.reference import attention_reference
from jax_flash.ring import ring_attention, zigzag_permute, zigzag_unpermute

__version__ = "0.1.0"

__all__ = [
    "attention",
    "attention_with_kvcache",
    "attention_reference",
    "compiled_platforms",
    "cpu_isa",
    "cuda_archs",
    "dropout_mask",
    "segment_ranges",
    "ring_attention",
    "zigzag_permute",
    "zigzag_unpermute",
    "__version__",
]
