"""jit, vmap, vmap-of-grad, pmap, NamedSharding, extra batch axes, higher order."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_flash
from jax_flash.reference import attention_reference_np
from helpers import random_qkv

ATOL = 2e-5


def _ref(q, k, v, causal):
    return attention_reference_np(np.asarray(q), np.asarray(k), np.asarray(v), causal=causal)[0]


def _loss(q, k, v, causal=True):
    return jnp.sum(jnp.tanh(jax_flash.attention(q, k, v, causal=causal)))


def _loss_ref(q, k, v, causal=True):
    return jnp.sum(jnp.tanh(jax_flash.attention_reference(q, k, v, causal=causal)[0]))


def test_vmap_over_all_inputs_matches_loop():
    q, k, v = random_qkv(0, 5, 19, 23, 4, 2, 16, jnp.float32)  # batch axis used as vmap axis
    out = jax.vmap(lambda q, k, v: jax_flash.attention(q[None], k[None], v[None], causal=True)[0])(q, k, v)
    np.testing.assert_allclose(out, _ref(q, k, v, True), atol=ATOL)


def test_vmap_over_q_alone_with_shared_kv():
    q, k, v = random_qkv(1, 3, 17, 31, 4, 1, 8, jnp.float32)
    qs = jnp.stack([q, 2 * q, -q])  # [3, B, Sq, H, D]
    out = jax.vmap(lambda qq: jax_flash.attention(qq, k, v))(qs)
    for i in range(3):
        np.testing.assert_allclose(out[i], _ref(qs[i], k, v, False), atol=ATOL)


def test_vmap_of_grad_matches_reference_grad():
    q, k, v = random_qkv(2, 4, 21, 21, 2, 2, 8, jnp.float32)
    add_batch = lambda f: (lambda q, k, v: f(q[None], k[None], v[None]))
    g = jax.vmap(jax.grad(add_batch(_loss), argnums=(0, 1, 2)))(q, k, v)
    g_ref = jax.vmap(jax.grad(add_batch(_loss_ref), argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4)


def test_grad_of_vmap_with_shared_kv():
    q, k, v = random_qkv(3, 2, 9, 14, 4, 2, 8, jnp.float32)
    qs = jnp.stack([q, 0.5 * q])

    def f(attn):
        return lambda qs, k, v: jnp.sum(jax.vmap(lambda qq: jnp.tanh(attn(qq, k, v)))(qs))

    ours = f(lambda q, k, v: jax_flash.attention(q, k, v, causal=True))
    ref = f(lambda q, k, v: jax_flash.attention_reference(q, k, v, causal=True)[0])
    for a, b in zip(jax.grad(ours, argnums=(0, 1, 2))(qs, k, v), jax.grad(ref, argnums=(0, 1, 2))(qs, k, v)):
        np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4)


def test_extra_leading_batch_axes_and_rank3():
    rng = np.random.default_rng(4)
    q = jnp.asarray(rng.standard_normal((2, 3, 11, 4, 8)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((2, 3, 13, 2, 8)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((2, 3, 13, 2, 8)), jnp.float32)
    o, lse = jax_flash.attention(q, k, v, causal=True, return_lse=True)
    assert o.shape == q.shape and lse.shape == (2, 3, 4, 11)
    ref_o, ref_lse = attention_reference_np(q, k, v, causal=True)
    np.testing.assert_allclose(o, ref_o, atol=ATOL)
    np.testing.assert_allclose(lse, ref_lse, atol=ATOL)
    o3 = jax_flash.attention(q[0, 0], k[0, 0], v[0, 0], causal=True)  # unbatched [S, H, D]
    np.testing.assert_allclose(o3, ref_o[0, 0], atol=ATOL)
    g = jax.grad(lambda q: jnp.sum(jax_flash.attention(q, k, v) ** 2))(q)
    g_ref = jax.grad(lambda q: jnp.sum(jax_flash.attention_reference(q, k, v)[0] ** 2))(q)
    np.testing.assert_allclose(g, g_ref, atol=5e-5, rtol=1e-4)


def test_pmap_over_four_devices():
    if len(jax.devices("cpu")) < 4:
        pytest.skip("needs 4 CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=4)")
    devs = jax.devices("cpu")[:4]
    q, k, v = random_qkv(5, 4 * 2, 33, 20, 4, 2, 16, jnp.float32)
    split = lambda x: x.reshape(4, 2, *x.shape[1:])
    out = jax.pmap(lambda q, k, v: jax_flash.attention(q, k, v, causal=True), devices=devs)(
        split(q), split(k), split(v))
    np.testing.assert_allclose(np.asarray(out).reshape(q.shape), _ref(q, k, v, True), atol=ATOL)
    g = jax.pmap(jax.grad(_loss, argnums=(0, 1, 2)), devices=devs)(split(q), split(k), split(v))
    g_ref = jax.grad(_loss_ref, argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(np.asarray(a).reshape(b.shape), b, atol=5e-5, rtol=1e-4)


def test_jit_with_batch_named_sharding():
    devs = jax.devices("cpu")
    n = 4 if len(devs) >= 4 else len(devs)
    mesh = Mesh(np.array(devs[:n]), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    q, k, v = random_qkv(6, 2 * n, 25, 25, 4, 2, 16, jnp.float32)
    qs, ks, vs = (jax.device_put(x, sharding) for x in (q, k, v))
    out = jax.jit(lambda q, k, v: jax_flash.attention(q, k, v, causal=True))(qs, ks, vs)
    np.testing.assert_allclose(out, _ref(q, k, v, True), atol=ATOL)
    g = jax.jit(jax.grad(_loss, argnums=(0, 1, 2)))(qs, ks, vs)
    g_ref = jax.grad(_loss_ref, argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4)


def test_second_order_gradient_raises_clear_error():
    q, k, v = random_qkv(7, 1, 8, 8, 2, 2, 8, jnp.float32)
    gq = lambda q: jnp.sum(jax.grad(_loss)(q, k, v))
    with pytest.raises(NotImplementedError, match="first-order gradients only"):
        jax.grad(gq)(q)
    # Forward mode is refused by JAX itself for a custom_vjp, with its own message.
    with pytest.raises(TypeError, match="forward-mode"):
        jax.jvp(lambda q: jax_flash.attention(q, k, v), (q,), (q,))


def test_fwd_bwd_temp_memory_is_linear_in_seqlen():
    """fwd+bwd at S=16384 must not allocate anything S x S (1 GiB in float32)."""
    s = jax.ShapeDtypeStruct((1, 16384, 1, 64), jnp.float32)
    for causal in (False, True):
        f = jax.jit(jax.grad(lambda q, k, v: jnp.sum(jax_flash.attention(q, k, v, causal=causal)),
                             argnums=(0, 1, 2)))
        mem = f.lower(s, s, s).compile().memory_analysis()
        assert mem is not None
        assert mem.temp_size_in_bytes < 64 * 2**20, mem


def _bwd_workspace_shape(platform, q, k, v, **opts):
    """The shape of the backward custom call's workspace result when the
    gradient is lowered for `platform` (no device of it needed)."""
    f = jax.jit(jax.grad(lambda q, k, v: jnp.sum(jax_flash.attention(q, k, v, **opts).astype(jnp.float32)),
                         argnums=(0, 1, 2)))
    text = f.trace(q, k, v).lower(lowering_platforms=(platform,)).as_text()
    calls = [line for line in text.splitlines() if "@jax_flash_bwd" in line]
    assert len(calls) == 1, calls
    results = re.findall(r"tensor<([0-9x]+)x(?:f32|bf16|f16)>", calls[0].split("->")[-1])
    return tuple(int(n) for n in results[-1].split("x"))


@pytest.mark.parametrize("opts", [dict(causal=True), dict(causal=True, deterministic=True),
                                  dict(local_window_size=(100, 0))], ids=["causal", "deterministic", "window"])
def test_bwd_workspace_is_allocated_for_cuda_only(opts):
    """The backward's float32 scratch (an extra FFI output, ~ dq in size) is the
    CUDA kernels'; the CPU kernel ignores it, so the CPU lowering asks for one
    float a batch element and the CUDA lowering for the full size."""
    from jax_flash import partitioning

    q = jax.ShapeDtypeStruct((2, 1000, 8, 64), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 1000, 4, 64), jnp.bfloat16)
    variants = "local_window_size" in opts
    want = partitioning._bwd_workspace_floats(q, opts.get("deterministic", False), variants)
    assert want > 8 * 1000 * 64
    assert _bwd_workspace_shape("cpu", q, k, k, **opts) == (2, 1)
    assert _bwd_workspace_shape("cuda", q, k, k, **opts) == (2, want)
    # XLA folds the per-platform choice away: no conditional is left to run.
    f = jax.jit(jax.grad(lambda q, k, v: jnp.sum(jax_flash.attention(q, k, v, **opts).astype(jnp.float32)),
                         argnums=(0, 1, 2)))
    assert "conditional(" not in f.lower(q, k, k).compile().as_text()
