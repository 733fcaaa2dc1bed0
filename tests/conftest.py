"""Test setup: several CPU devices (pmap/sharding tests) before JAX starts."""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"

# CUDA kernels' outputs start as NaN bytes (cpp/cuda/common/poison.h): an element a
# kernel fails to write fails the test instead of passing on stale memory.
os.environ.setdefault("JAX_FLASH_POISON_OUTPUTS", "1")

import jax  # noqa: E402
import pytest  # noqa: E402


def _has_gpu() -> bool:
    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:
        return False


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        _skip_unbuilt_dtypes(items)
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine with -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _skip_unbuilt_dtypes(items):
    """GPU cases in a dtype this build left out (JAX_FLASH_CUDA_DTYPES: a
    16-bit dtype parameter, or float32 for tests marked tf32) skip instead of
    failing on the entry point's error."""
    from helpers import unbuilt_cuda_kernels
    from jax_flash import _ffi

    built, float32_built = _ffi.cuda_dtypes(), _ffi.cuda_float32()
    for item in items:
        if "gpu" not in item.keywords:
            continue
        params = getattr(getattr(item, "callspec", None), "params", None)
        missing = unbuilt_cuda_kernels(params, item.keywords, built, float32_built)
        if missing:
            item.add_marker(pytest.mark.skip(reason=f"{missing}: not in this build's JAX_FLASH_CUDA_DTYPES"))


@pytest.fixture(autouse=True)
def _cpu_unless_gpu_test(request):
    """CPU tests pin the CPU backend, so they test the CPU kernels even on a GPU machine."""
    if "gpu" in request.keywords:
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield
