"""float32 precision requests (issue 29): jax_default_matmul_precision is read
at trace time; a full-float32 request marks float32 calls so that the CUDA
kernels (TF32) refuse them instead of computing in TF32; the CPU kernels
compute float32 in float32 either way. The CUDA side runs in
tests/test_cuda_float32.py."""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from jax_flash.mask import Mask

attn_mod = importlib.import_module("jax_flash.attention")  # the module, not the function


@pytest.mark.parametrize(
    "setting,full",
    [(None, False), ("default", False), ("high", False), ("tensorfloat32", False), ("bfloat16", False),
     ("highest", True), ("float32", True), ("F32_F32_F32", True), ("TF32_TF32_F32", False)],
)
def test_full_float32_request_is_read_from_the_config(setting, full):
    if setting is None:
        assert attn_mod._full_f32_requested() is False
        return
    with jax.default_matmul_precision(setting):
        assert attn_mod._full_f32_requested() is full


def test_only_float32_calls_are_marked():
    q32, q16 = jnp.zeros((4, 2, 8), jnp.float32), jnp.zeros((4, 2, 8), jnp.bfloat16)
    with jax.default_matmul_precision("highest"):
        assert attn_mod._with_precision(Mask(), q32).f32_full
        assert not attn_mod._with_precision(Mask(), q16).f32_full
    assert not attn_mod._with_precision(Mask(), q32).f32_full
    assert Mask(f32_full=True).ffi_attrs()["f32_full"] is True


def test_float32_under_highest_runs_on_cpu_with_gradients():
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 33, 2, 16), dtype=np.float32)) for _ in range(3))
    f = lambda q, k, v: jax_flash.attention(q, k, v, causal=True)  # noqa: E731
    o = f(q, k, v)
    g = jax.grad(lambda q: f(q, k, v).sum())(q)
    with jax.default_matmul_precision("highest"):
        o_h = jax.jit(f)(q, k, v)
        g_h = jax.grad(lambda q: f(q, k, v).sum())(q)
    np.testing.assert_array_equal(np.asarray(o), np.asarray(o_h))
    np.testing.assert_array_equal(np.asarray(g), np.asarray(g_h))


def test_flax_precision_argument_maps_to_a_full_float32_request():
    pytest.importorskip("flax")
    import jax_flash.flax as jf

    assert jf._full_f32_precision(jax.lax.Precision.HIGHEST)
    assert jf._full_f32_precision("float32")
    assert jf._full_f32_precision((None, "highest"))
    assert not jf._full_f32_precision(None)
    assert not jf._full_f32_precision(jax.lax.Precision.DEFAULT)
