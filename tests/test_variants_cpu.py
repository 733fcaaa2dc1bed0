"""Logit variants on the CPU kernels: local window, soft-capping, query offset."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from jax_flash.reference import attention_reference_grad_np, attention_reference_np
from helpers import assert_fa_close, random_qkv

# (sq, sk, hq, hkv, d, causal, variants)
CASES = [
    (37, 211, 4, 2, 16, True, dict(local_window_size=5)),
    (150, 150, 4, 4, 32, False, dict(local_window_size=(3, 70))),
    (300, 300, 2, 1, 24, True, dict(local_window_size=(64, 0))),
    (64, 200, 4, 2, 16, True, dict(query_offset=136)),          # bottom-right: Sk - Sq
    (9, 300, 2, 2, 8, True, dict(query_offset=291, local_window_size=16)),
    (130, 70, 4, 2, 40, False, dict(logits_soft_cap=2.0)),
    (100, 100, 2, 2, 64, True, dict(logits_soft_cap=5.0, local_window_size=(20, 0))),
    (77, 129, 8, 2, 32, True, dict(logits_soft_cap=1.5, query_offset=52)),
]


def _ids(c):
    return f"{c[0]}x{c[1]}-h{c[2]}/{c[3]}-d{c[4]}-{'causal' if c[5] else 'full'}-" + "-".join(
        f"{k}={v}" for k, v in c[6].items())


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_variant_forward_and_grads_match_float64_reference(case, dtype):
    sq, sk, hq, hkv, d, causal, kw = case
    q, k, v = random_qkv(sq * 31 + sk, 2, sq, sk, hq, hkv, d, dtype)
    o, lse = jax_flash.attention(q, k, v, causal=causal, return_lse=True, **kw)
    f32 = [np.asarray(x.astype(jnp.float32)) for x in (q, k, v)]
    ref_o, ref_lse = attention_reference_np(*f32, causal=causal, **kw)
    naive_o, _ = jax.jit(lambda q, k, v: jax_flash.attention_reference(
        q, k, v, causal=causal, dtype=dtype, **kw))(q, k, v)
    assert_fa_close("o", o, ref_o, naive_o)
    finite = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.asarray(lse)[~finite], -np.inf)
    np.testing.assert_allclose(np.asarray(lse)[finite], ref_lse[finite], atol=1e-4)

    do = jnp.asarray(np.random.default_rng(sq).standard_normal(q.shape), jnp.float32)
    grads = jax.grad(lambda q, k, v: jnp.sum(
        jax_flash.attention(q, k, v, causal=causal, **kw).astype(jnp.float32) * do), argnums=(0, 1, 2))(q, k, v)
    refs = attention_reference_grad_np(*f32, np.asarray(do), causal=causal, **kw)
    naive = jax.jit(jax.grad(lambda q, k, v: jnp.sum(jax_flash.attention_reference(
        q, k, v, causal=causal, dtype=dtype, **kw)[0].astype(jnp.float32) * do), argnums=(0, 1, 2)))(q, k, v)
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, refs, naive):
        assert_fa_close(name, g, r, n)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [0, 7, (2, 30), (100, 1)])
def test_local_window_matches_jax_nn(window, causal):
    q, k, v = random_qkv(7, 2, 190, 190, 4, 2, 32, jnp.float32)
    ours = lambda q, k, v: jax_flash.attention(q, k, v, causal=causal, local_window_size=window)
    theirs = lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=causal, local_window_size=window, implementation="xla")
    o, vjp = jax.vjp(ours, q, k, v)
    o_ref, vjp_ref = jax.vjp(theirs, q, k, v)
    np.testing.assert_allclose(o, o_ref, atol=2e-5)
    do = jnp.asarray(np.random.default_rng(0).standard_normal(o.shape), jnp.float32)
    for g, g_ref in zip(vjp(do), vjp_ref(do)):
        np.testing.assert_allclose(g, g_ref, atol=5e-5, rtol=1e-4)


def test_rows_that_see_no_key_give_zero_output_lse_minus_inf_and_zero_grads():
    # query_offset -40 with causal: rows 0..39 see no key.
    q, k, v = random_qkv(9, 1, 70, 50, 2, 2, 16, jnp.float32)
    o, lse = jax_flash.attention(q, k, v, causal=True, query_offset=-40, return_lse=True)
    assert np.all(np.asarray(o)[:, :40] == 0) and np.all(np.asarray(lse)[:, :, :40] == -np.inf)
    assert np.all(np.isfinite(np.asarray(o)))
    g = jax.grad(lambda q: jnp.sum(jax_flash.attention(q, k, v, causal=True, query_offset=-40) ** 2))(q)
    assert np.all(np.isfinite(np.asarray(g))) and np.all(np.asarray(g)[:, :40] == 0)
    ref, _ = attention_reference_np(q, k, v, causal=True, query_offset=-40)
    np.testing.assert_allclose(o, ref, atol=2e-6)


@pytest.mark.parametrize(
    "kw,exc,pattern",
    [
        (dict(local_window_size=-1), ValueError, "local_window_size entries must be >= 0"),
        (dict(local_window_size=(1, 2, 3)), ValueError, r"\(left, right\) pair"),
        (dict(local_window_size=2.5), TypeError, "local_window_size must be an int"),
        (dict(logits_soft_cap=0.0), ValueError, "logits_soft_cap must be a positive"),
        (dict(logits_soft_cap=float("inf")), ValueError, "logits_soft_cap must be a positive"),
        (dict(query_offset=1.5), TypeError, "query_offset must be an int"),
        (dict(query_offset=np.arange(3)), ValueError, r"query_offset must have shape .*\(2,\)"),
        (dict(local_window_size=np.arange(2)), TypeError, "local_window_size must be a static Python int"),
    ],
)
def test_bad_variant_arguments_raise(kw, exc, pattern):
    q, k, v = random_qkv(1, 2, 8, 8, 2, 2, 8, jnp.float32)
    with pytest.raises(exc, match=pattern):
        jax_flash.attention(q, k, v, **kw)


def test_variants_under_vmap_and_batch_head_sharding():
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    kw = dict(causal=True, local_window_size=(5, 3), logits_soft_cap=2.0, query_offset=10)
    q, k, v = random_qkv(11, 4, 50, 60, 4, 2, 16, jnp.float32)
    ref, _ = attention_reference_np(q, k, v, **kw)
    o = jax.vmap(lambda q, k, v: jax_flash.attention(q, k, v, **kw))(q, k, v)
    np.testing.assert_allclose(o, ref, atol=2e-6)

    devs = jax.devices("cpu")
    if len(devs) < 4:
        pytest.skip("needs 4 CPU devices")
    sh = NamedSharding(Mesh(np.array(devs[:4]).reshape(2, 2), ("b", "h")), P("b", None, "h"))
    loss = lambda q, k, v: jnp.sum(jax_flash.attention(q, k, v, **kw) ** 2)
    f = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    args = [jax.device_put(x, sh) for x in (q, k, v)]
    for a, b in zip(f(*args), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    text = f.lower(*args).compile().as_text()
    assert "all-gather" not in text and "all-to-all" not in text
