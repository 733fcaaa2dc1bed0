"""Bad input raises ValueError/TypeError naming the argument and shapes, before tracing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash


def _z(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def _call(q, k, v, **kw):
    # Shape structs, not arrays: the checks must fire on shapes alone, so
    # nothing is traced or run. (jnp.asarray of a ShapeDtypeStruct would fail,
    # proving the check came first.)
    return jax_flash.attention(q, k, v, **kw)


GOOD_Q, GOOD_KV = (2, 16, 8, 64), (2, 24, 2, 64)

BAD_SHAPES = [
    ((16, 64), GOOD_KV, GOOD_KV, ValueError, r"q must have shape.*rank >= 3.*\(16, 64\)"),
    (GOOD_Q, (24, 64), (24, 64), ValueError, r"k must have shape.*\(24, 64\)"),
    (GOOD_Q, GOOD_KV, (2, 25, 2, 64), ValueError, r"k and v must have the same shape.*\(2, 24, 2, 64\).*\(2, 25, 2, 64\)"),
    (GOOD_Q, (3, 24, 2, 64), (3, 24, 2, 64), ValueError, r"same batch axes.*\(2, 16, 8, 64\).*\(3, 24, 2, 64\)"),
    (GOOD_Q, (1, 2, 24, 2, 64), (1, 2, 24, 2, 64), ValueError, r"same batch axes"),
    (GOOD_Q, (2, 24, 2, 32), (2, 24, 2, 32), ValueError, r"same head_dim.*\(2, 24, 2, 32\)"),
    (GOOD_Q, (2, 24, 3, 64), (2, 24, 3, 64), ValueError, r"q heads \(8\) must be a multiple.*k/v heads \(3\)"),
    ((2, 16, 8, 0), (2, 24, 2, 0), (2, 24, 2, 0), ValueError, r"q has an empty axis.*\(2, 16, 8, 0\)"),
    ((2, 16, 8, 300), (2, 24, 2, 300), (2, 24, 2, 300), ValueError, r"head_dim must be in \[1, 256\], got 300"),
    ((0, 16, 8, 64), (0, 24, 2, 64), (0, 24, 2, 64), ValueError, r"q has an empty axis"),
    (GOOD_Q, (2, 0, 2, 64), (2, 0, 2, 64), ValueError, r"k has an empty axis"),
]


@pytest.mark.parametrize("qs,ks,vs,exc,pattern", BAD_SHAPES)
def test_bad_shapes_raise_with_shapes_in_message(qs, ks, vs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _call(_z(*qs), _z(*ks), _z(*vs))


@pytest.mark.parametrize(
    "dq,dk,dv,pattern",
    [
        (jnp.int32, jnp.int32, jnp.int32, r"q must be floating point.*int32"),
        (jnp.float32, jnp.float32, jnp.bool_, r"v must be floating point.*bool"),
        (jnp.float32, jnp.bfloat16, jnp.float32, r"same dtype.*q.dtype=float32, k.dtype=bfloat16"),
        (jnp.float16, jnp.float16, jnp.bfloat16, r"same dtype"),
    ],
)
def test_bad_dtypes_raise_type_error(dq, dk, dv, pattern):
    with pytest.raises(TypeError, match=pattern):
        _call(_z(*GOOD_Q, dtype=dq), _z(*GOOD_KV, dtype=dk), _z(*GOOD_KV, dtype=dv))


def test_float64_is_refused_with_hint():
    q, k = _z(*GOOD_Q, dtype=np.float64), _z(*GOOD_KV, dtype=np.float64)
    with pytest.raises(TypeError, match="float64 is not supported"):
        _call(q, k, k)


def test_non_array_and_bad_scale():
    with pytest.raises(TypeError, match="q must be an array, got list"):
        _call([[1.0]], _z(*GOOD_KV), _z(*GOOD_KV))
    q, k = jnp.ones((1, 4, 2, 8)), jnp.ones((1, 4, 2, 8))
    with pytest.raises(TypeError, match="scale must be a number"):
        jax_flash.attention(q, k, k, scale="big")
    with pytest.raises(ValueError, match="scale must be finite"):
        jax_flash.attention(q, k, k, scale=float("nan"))
    with pytest.raises(TypeError, match="static Python number"):
        jax.jit(lambda s: jax_flash.attention(q, k, k, scale=s))(0.5)


def test_errors_come_before_tracing():
    """A bad call inside jit raises our ValueError, not an XLA error at run time."""
    q = jnp.ones((1, 4, 3, 8))
    k = jnp.ones((1, 4, 2, 8))
    with pytest.raises(ValueError, match="multiple"):
        jax.jit(lambda q, k: jax_flash.attention(q, k, k))(q, k)


def test_concrete_array_scalars_are_accepted_traced_ones_refused():
    q = jnp.asarray(np.random.default_rng(0).standard_normal((1, 6, 2, 8)), jnp.float32)
    a = jax_flash.attention(q, q, q, scale=jnp.float32(0.5), query_offset=jnp.int32(2), causal=True)
    b = jax_flash.attention(q, q, q, scale=0.5, query_offset=2, causal=True)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="local_window_size must be a static Python int"):
        jax.jit(lambda w: jax_flash.attention(q, q, q, local_window_size=w))(3)
    # A traced query_offset is a run-time (per-batch) offset, not an error.
    c = jax.jit(lambda off: jax_flash.attention(q, q, q, scale=0.5, query_offset=off, causal=True))(2)
    np.testing.assert_array_equal(c, b)
