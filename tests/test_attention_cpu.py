"""Forward, LSE and gradients of the CPU kernels against float64 and jax.nn references."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from jax_flash.reference import attention_reference_grad_np, attention_reference_np
from helpers import assert_fa_close, max_err, naive_grads_in_dtype, naive_in_dtype, random_qkv

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
HEAD_DIMS = [8, 40, 64, 96, 128, 256]
# (batch, seqlen_q, seqlen_k, heads_q, heads_kv): odd seqlens, Sq != Sk both
# ways, GQA (8/2) and MQA (4/1); cycled over the head dims so every head dim
# meets several shapes across dtypes and causal flags.
SHAPES = [
    (2, 129, 1000, 8, 2),
    (1, 1000, 129, 4, 1),
    (2, 7, 64, 8, 2),
    (1, 64, 7, 4, 4),
    (3, 1, 129, 8, 2),
    (1, 129, 1, 4, 1),
]


def _cases():
    for i, (d, dtype, causal) in enumerate(itertools.product(HEAD_DIMS, DTYPES, [False, True])):
        yield pytest.param(SHAPES[i % len(SHAPES)], d, dtype, causal,
                           id=f"{SHAPES[i % len(SHAPES)]}-d{d}-{jnp.dtype(dtype).name}-{'causal' if causal else 'full'}")


def _f32(*xs):
    return [np.asarray(x.astype(jnp.float32)) for x in xs]


@pytest.mark.parametrize("shape,d,dtype,causal", list(_cases()))
def test_forward_lse_and_grads_match_float64_reference(shape, d, dtype, causal):
    b, sq, sk, hq, hkv = shape
    q, k, v = random_qkv(hash((shape, d, causal)) % 2**31, b, sq, sk, hq, hkv, d, dtype)
    o, lse = jax.jit(lambda q, k, v: jax_flash.attention(q, k, v, causal=causal, return_lse=True))(q, k, v)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert lse.shape == (b, hq, sq) and lse.dtype == jnp.float32

    q32, k32, v32 = _f32(q, k, v)
    ref_o, ref_lse = attention_reference_np(q32, k32, v32, causal=causal)
    naive_o, naive_lse = naive_in_dtype(q, k, v, causal)
    assert_fa_close("o", o, ref_o, naive_o)
    # lse is accumulated in float32 in both kernels: compare to float64 directly.
    assert max_err(lse, ref_lse) < 1e-4

    do = jnp.asarray(np.random.default_rng(1).standard_normal(o.shape), jnp.float32)

    def loss(q, k, v):
        return jnp.sum(jax_flash.attention(q, k, v, causal=causal).astype(jnp.float32) * do)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    ref_grads = attention_reference_grad_np(q32, k32, v32, np.asarray(do), causal=causal)
    naive_grads = naive_grads_in_dtype(q, k, v, do, causal)
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref_grads, naive_grads):
        assert g.shape == r.shape and g.dtype == dtype
        assert_fa_close(name, g, r, n)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(s, t) for s in (1, 7, 64, 129, 1000) for t in (1, 7, 64, 129, 1000)])
def test_float32_matches_jax_nn_xla_over_seqlen_grid(sq, sk, causal):
    q, k, v = random_qkv(sq * 7919 + sk, 1, sq, sk, 4, 2, 32, jnp.float32)
    do = jnp.asarray(np.random.default_rng(sq + sk).standard_normal(q.shape), jnp.float32)

    def ours(q, k, v):
        return jax_flash.attention(q, k, v, causal=causal)

    def theirs(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")

    o, vjp = jax.vjp(ours, q, k, v)
    o_ref, vjp_ref = jax.vjp(theirs, q, k, v)
    np.testing.assert_allclose(o, o_ref, atol=2e-5, rtol=1e-5)
    for g, g_ref in zip(vjp(do), vjp_ref(do)):
        np.testing.assert_allclose(g, g_ref, atol=5e-5, rtol=1e-4)


def test_custom_scale_is_applied():
    q, k, v = random_qkv(3, 2, 33, 45, 4, 2, 16, jnp.float32)
    o = jax_flash.attention(q, k, v, scale=0.37, causal=True)
    ref, _ = attention_reference_np(*_f32(q, k, v), causal=True, scale=0.37)
    np.testing.assert_allclose(o, ref, atol=2e-6)


def test_lse_cotangent_gives_exact_gradient():
    """A loss that uses lse (return_lse=True) gets the gradient through lse too."""
    q, k, v = random_qkv(4, 2, 37, 50, 4, 2, 24, jnp.float32)

    def loss(f):
        def inner(q, k, v):
            o, lse = f(q, k, v)
            return jnp.sum(jnp.sin(o)) + jnp.sum(jnp.cos(lse))
        return inner

    ours = loss(lambda q, k, v: jax_flash.attention(q, k, v, causal=True, return_lse=True))
    ref = loss(lambda q, k, v: jax_flash.attention_reference(q, k, v, causal=True))
    g = jax.grad(ours, argnums=(0, 1, 2))(q, k, v)
    g_ref = jax.grad(ref, argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4)


def test_residuals_are_exactly_inputs_output_and_lse():
    # Plus the optional non-differentiable operands (lengths, ids, ...), none here.
    q, k, v = random_qkv(5, 1, 16, 16, 2, 2, 8, jnp.float32)
    from jax_flash.attention import _flash_fwd
    from jax_flash.mask import NO_EXTRAS

    class P:  # what custom_vjp hands the fwd rule with symbolic_zeros=True
        def __init__(self, x):
            self.value = x

    (o, lse), res = _flash_fwd(P(q), P(k), P(v), NO_EXTRAS, 0.5, True, False)
    assert len(res) == 6 and res[5] == NO_EXTRAS
    for r, x in zip(res, (q, k, v, o, lse)):
        assert r is x
