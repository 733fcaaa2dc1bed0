"""Batch and head sharding under jit (custom_partitioning): results equal the
single-device ones and the compiled program has no all-gather / all-to-all.

Runs on 4 CPU devices (2x2 mesh) and, when 8 are present, on a 2x4 mesh too;
both Shardy (the default) and GSPMD partitioners.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_flash
from jax_flash.ring import shard_map
from helpers import random_qkv

ATOL = 2e-5
GATHERS = re.compile(r"\b(all-gather|all-to-all)(-start)?\(")
COLLECTIVES = re.compile(r"\b(all-gather|all-to-all|all-reduce|collective-permute|reduce-scatter)(-start)?\(")


def _cpus():
    return jax.devices("cpu")


def _meshes():
    n = len(_cpus())
    shapes = [(2, 2)] if n >= 4 else []
    if n >= 8:
        shapes.append((2, 4))
    return shapes


needs4 = pytest.mark.skipif(
    len(jax.devices("cpu")) < 4,
    reason="needs 4 CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=4 or more)",
)


@pytest.fixture(params=["shardy", "gspmd"])
def partitioner(request):
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", request.param == "shardy")
    try:
        yield request.param
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


def _mesh(shape):
    return Mesh(np.array(_cpus()[: shape[0] * shape[1]]).reshape(shape), ("dp", "tp"))


def _loss(q, k, v, causal):
    o, lse = jax_flash.attention(q, k, v, causal=causal, return_lse=True)
    return jnp.sum(jnp.tanh(o)) + 0.1 * jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))


def _fwd_bwd(causal):
    def f(q, k, v):
        o = jax_flash.attention(q, k, v, causal=causal)
        return o, jax.grad(_loss, argnums=(0, 1, 2))(q, k, v, causal)

    return f


def _run_unsharded(f, q, k, v):
    with jax.default_device(_cpus()[0]):
        return jax.jit(f)(q, k, v)


def _check_same(out, ref, atol=ATOL):
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=1e-5)


def _collectives(compiled_text):
    return sorted({m.group(1) for m in COLLECTIVES.finditer(compiled_text)})


@needs4
@pytest.mark.parametrize("mesh_shape", _meshes(), ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize(
    "what",
    ["batch", "heads", "batch+heads", "batch_over_both_axes"],
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_batch_and_head_sharding_has_no_gathers(partitioner, mesh_shape, what, causal):
    mesh = _mesh(mesh_shape)
    tp = mesh_shape[1]
    hkv = tp  # divisible by the head axis
    hq = 2 * hkv  # GQA, group 2
    spec = {
        "batch": P("dp"),
        "heads": P(None, None, "tp"),
        "batch+heads": P("dp", None, "tp"),
        "batch_over_both_axes": P(("dp", "tp")),
    }[what]
    batch = mesh.size if what == "batch_over_both_axes" else 2
    q, k, v = random_qkv(10, batch, 24, 24, hq, hkv, 16, jnp.float32)
    sh = NamedSharding(mesh, spec)
    args = [jax.device_put(x, sh) for x in (q, k, v)]
    f = jax.jit(_fwd_bwd(causal))
    text = f.lower(*args).compile().as_text()
    assert not GATHERS.search(text), f"{what}: collectives {_collectives(text)}"
    out = f(*args)
    _check_same(out, _run_unsharded(_fwd_bwd(causal), q, k, v))
    o, (dq, dk, dv) = out
    for x in (o, dq, dk, dv):
        assert x.sharding.is_equivalent_to(sh, x.ndim), (what, x.sharding)


@needs4
def test_compound_gqa_factor_when_kv_heads_divide_the_mesh(partitioner):
    """kv heads divisible by the whole mesh: Shardy uses the compound (h g)
    factor; q heads alone sharded still gives kv shards without a gather."""
    mesh = _mesh((2, 2))
    q, k, v = random_qkv(11, 2, 16, 16, 8, 4, 8, jnp.float32)
    args = (jax.device_put(q, NamedSharding(mesh, P("dp", None, "tp"))),
            jax.device_put(k, NamedSharding(mesh, P("dp", None, "tp"))),
            jax.device_put(v, NamedSharding(mesh, P("dp", None, "tp"))))
    f = jax.jit(_fwd_bwd(True))
    text = f.lower(*args).compile().as_text()
    assert not GATHERS.search(text), _collectives(text)
    _check_same(f(*args), _run_unsharded(_fwd_bwd(True), q, k, v))


@needs4
@pytest.mark.parametrize(
    "case",
    ["kv_heads_not_divisible", "mqa", "sequence_sharded", "q_heads_only"],
)
def test_unsupported_shardings_fall_back_correctly(partitioner, case):
    """Shardings the kernels cannot run on (heads that would split a GQA group,
    a sharded sequence axis) are resharded by the partitioner: same results."""
    mesh = _mesh((1, 4))
    hq, hkv, qspec, kspec = {
        "kv_heads_not_divisible": (8, 2, P(None, None, "tp"), P()),
        "mqa": (4, 1, P(None, None, "tp"), P()),
        "sequence_sharded": (4, 2, P(None, "tp"), P(None, "tp")),
        "q_heads_only": (8, 4, P(None, None, "tp"), P()),
    }[case]
    q, k, v = random_qkv(12, 2, 16, 16, hq, hkv, 8, jnp.float32)
    args = (jax.device_put(q, NamedSharding(mesh, qspec)),
            jax.device_put(k, NamedSharding(mesh, kspec)),
            jax.device_put(v, NamedSharding(mesh, kspec)))
    f = jax.jit(_fwd_bwd(True))
    if case == "sequence_sharded":
        with pytest.warns(UserWarning, match="ring_attention"):
            out = f(*args)
    else:
        out = f(*args)
    _check_same(out, _run_unsharded(_fwd_bwd(True), q, k, v))


@needs4
def test_vmap_and_extra_batch_axes_under_sharding(partitioner):
    mesh = _mesh((2, 2))
    rng = np.random.default_rng(13)
    q = jnp.asarray(rng.standard_normal((2, 3, 2, 12, 4, 8)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((2, 3, 2, 12, 2, 8)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((2, 3, 2, 12, 2, 8)), jnp.float32)
    sh = NamedSharding(mesh, P("dp", None, None, None, "tp"))
    args = [jax.device_put(x, sh) for x in (q, k, v)]

    def f(q, k, v):  # vmap over axis 1, extra batch axes 0 and 2
        return jax.vmap(lambda q, k, v: _fwd_bwd(True)(q, k, v), in_axes=1, out_axes=1)(q, k, v)

    jf = jax.jit(f)
    text = jf.lower(*args).compile().as_text()
    assert not GATHERS.search(text), _collectives(text)
    _check_same(jf(*args), _run_unsharded(f, q, k, v))


@needs4
def test_attention_inside_shard_map_is_per_device():
    """Inside shard_map (check_vma on) the outputs vary per device, so reductions
    and gradients over them are right."""
    mesh = Mesh(np.array(_cpus()[:4]), ("dp",))
    q, k, v = random_qkv(14, 4, 16, 16, 4, 2, 8, jnp.float32)

    def local_loss(q, k, v):
        return jax.lax.psum(jnp.sum(jnp.tanh(jax_flash.attention(q, k, v, causal=True))), "dp")

    sm = shard_map(local_loss, mesh=mesh, in_specs=(P("dp"),) * 3, out_specs=P())
    val, grads = jax.jit(jax.value_and_grad(sm, argnums=(0, 1, 2)))(q, k, v)
    ref_loss = lambda q, k, v: jnp.sum(jnp.tanh(jax_flash.attention(q, k, v, causal=True)))
    with jax.default_device(_cpus()[0]):
        rval, rgrads = jax.value_and_grad(ref_loss, argnums=(0, 1, 2))(q, k, v)
    np.testing.assert_allclose(val, rval, rtol=1e-5)
    _check_same(grads, rgrads)
