"""Registers the compiled FFI handlers with XLA, once, at import.

Each target name ("jax_flash_fwd", "jax_flash_bwd") is registered for every
platform the extension was built for, so XLA picks the CPU or CUDA kernel by
backend and Python never branches on the device.
"""

from __future__ import annotations

import jax

try:
    from jax_flash import _jax_flash
except ImportError as e:  # pragma: no cover - only on a broken install
    import os

    _here = os.path.dirname(os.path.abspath(__file__))
    if os.path.exists(os.path.join(_here, os.pardir, "pyproject.toml")):
        raise ImportError(
            f"jax_flash was imported from the source tree ({_here}), which has no compiled "
            "extension: Python put the current directory first on sys.path. Run from another "
            "directory, use the `jax-flash` command, or run with `python -P` (e.g. `python -P -m "
            "jax_flash.demo`)."
        ) from e
    raise ImportError(
        "jax_flash's compiled extension is missing; install the package with "
        "`pip install --no-build-isolation .` (see README.md)"
    ) from e

FWD_TARGET = "jax_flash_fwd"
BWD_TARGET = "jax_flash_bwd"

_REGISTRATIONS = _jax_flash.registrations()
for _platform, _targets in _REGISTRATIONS.items():
    for _name, _capsule in _targets.items():
        jax.ffi.register_ffi_target(_name, _capsule, platform=_platform)


def compiled_platforms() -> list[str]:
    """Platforms with compiled kernels, e.g. ["cpu", "CUDA"]."""
    return sorted(_REGISTRATIONS)


def cuda_archs() -> str | None:
    """CUDA targets of this build ("80;90a"), or None for a CPU-only build."""
    return _jax_flash.cuda_archs


def cuda_head_dims(variants: bool = False) -> tuple[int, ...]:
    """Head dims of the compiled CUDA kernels, ascending: the plain ones, or
    with `variants` those of the variants kernels (fewer: other head dims run
    zero-padded on the next larger one). Empty for a CPU-only build."""
    if _jax_flash.cuda_archs is None:
        return ()
    return tuple(_jax_flash.cuda_head_dims(bool(variants)))


def cuda_kvcache_head_dims() -> tuple[int, ...]:
    """Head dims of the compiled CUDA decode kernels (attention_with_kvcache);
    empty for a CPU-only build."""
    if _jax_flash.cuda_archs is None:
        return ()
    return tuple(_jax_flash.cuda_kvcache_head_dims())


def cuda_dtypes() -> tuple[str, ...]:
    """The 16-bit dtypes ("bfloat16", "float16") with compiled CUDA kernels;
    JAX_FLASH_CUDA_DTYPES can leave one out. Empty for a CPU-only build."""
    if _jax_flash.cuda_archs is None:
        return ()
    return tuple(_jax_flash.cuda_dtypes())


def cuda_float32() -> bool:
    """Whether float32 inputs have compiled CUDA (TF32) kernels;
    JAX_FLASH_CUDA_DTYPES can leave them out. False for a CPU-only build."""
    if _jax_flash.cuda_archs is None:
        return False
    return bool(_jax_flash.cuda_float32())


def cpu_isa() -> str:
    """Instruction set the CPU kernels run with on this machine."""
    return _jax_flash.cpu_isa()
