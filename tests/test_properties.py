"""Property test: random shapes, dtypes and flags against the float64 reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, example, given, settings, strategies as st

import jax_flash
from jax_flash.reference import attention_reference_grad_np, attention_reference_np
from helpers import assert_fa_close, design_grad_errors, naive_grads_in_dtype, naive_in_dtype, random_qkv


@st.composite
def configs(draw):
    hkv = draw(st.integers(1, 3))
    return dict(
        batch=draw(st.integers(1, 2)),
        sq=draw(st.integers(1, 150)),
        sk=draw(st.integers(1, 150)),
        hkv=hkv,
        hq=hkv * draw(st.integers(1, 3)),
        d=draw(st.integers(1, 130)),
        dtype=draw(st.sampled_from([jnp.float32, jnp.bfloat16, jnp.float16])),
        causal=draw(st.booleans()),
        scale=draw(st.one_of(st.none(), st.floats(0.05, 2.0))),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


# 10 fresh random configurations a run (each one compiles anew: ~10 s on
# CI's 2 cores), plus the pinned example.
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
# Found by CI: row 1 sees two keys that nearly coincide, so its dq cancels and
# the error of D taken from the bf16 O (design_grad_errors) dominates.
@example(dict(batch=1, sq=2, sk=142, hkv=1, hq=2, d=2, dtype=jnp.bfloat16, causal=True, scale=None, seed=67))
def test_random_configs_match_reference(c):
    q, k, v = random_qkv(c["seed"], c["batch"], c["sq"], c["sk"], c["hq"], c["hkv"], c["d"], c["dtype"])
    causal, scale = c["causal"], c["scale"]
    o = jax_flash.attention(q, k, v, causal=causal, scale=scale)
    f32 = [np.asarray(x.astype(jnp.float32)) for x in (q, k, v)]
    ref_o, _ = attention_reference_np(*f32, causal=causal, scale=scale)
    assert_fa_close("o", o, ref_o, naive_in_dtype(q, k, v, causal, scale)[0])

    do = jnp.asarray(np.random.default_rng(c["seed"]).standard_normal(q.shape), jnp.float32)
    grads = jax.grad(
        lambda q, k, v: jnp.sum(jax_flash.attention(q, k, v, causal=causal, scale=scale).astype(jnp.float32) * do),
        argnums=(0, 1, 2),
    )(q, k, v)
    refs = attention_reference_grad_np(*f32, np.asarray(do), causal=causal, scale=scale)
    naive = naive_grads_in_dtype(q, k, v, do, causal, scale)
    # dq and dk cancel to ~0 when a row sees one key: scale their slack by the
    # gradients' overall size (dv), not by their own.
    size = max(float(np.max(np.abs(r))) for r in refs) if refs[0].size else 0.0
    design = design_grad_errors(q, k, v, do, causal, scale)
    for name, g, r, n, e in zip(("dq", "dk", "dv"), grads, refs, naive, design):
        assert_fa_close(name, g, r, n, magnitude=size, design_err=e)
