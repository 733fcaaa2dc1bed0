"""Ring attention (sequence parallelism inside shard_map) on 2, 4 and 8 CPU devices:
forward and gradients equal the unsharded jax_flash.attention, the only
collectives are collective-permutes, zigzag helpers, errors."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_flash
from jax_flash import partitioning as _partitioning
from jax_flash.ring import shard_map
from helpers import random_qkv

ATOL = 2e-5
COLLECTIVES = re.compile(r"\b(all-gather|all-to-all|all-reduce|collective-permute|reduce-scatter)(-start)?\(")
N_CPU = len(jax.devices("cpu"))
RING_SIZES = [n for n in (2, 4, 8) if n <= N_CPU]


def _mesh(n, names=("sp",)):
    return Mesh(np.array(jax.devices("cpu")[:n]), names)


def _ring_fn(mesh, causal, zigzag, axis="sp", spec=P(None, "sp"), **kw):
    def local(q, k, v):
        return jax_flash.ring_attention(q, k, v, axis_name=axis, causal=causal, zigzag=zigzag, **kw)

    return shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)


def _global(ring, n, zigzag):
    """The ring as a function of unsharded arrays (zigzag permute in and out)."""
    if not zigzag:
        return ring
    perm = lambda x: jax_flash.zigzag_permute(x, n)
    return lambda q, k, v: jax_flash.zigzag_unpermute(ring(perm(q), perm(k), perm(v)), n)


def _with_grads(attn, w):
    def f(q, k, v):
        loss = lambda q, k, v: jnp.sum(attn(q, k, v) * w)
        return attn(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    return f


def _assert_close(out, ref, atol=ATOL):
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=1e-5)


def _collectives(fn, *args):
    text = jax.jit(fn).lower(*args).compile().as_text()
    return sorted({m.group(1) for m in COLLECTIVES.finditer(text)})


# GQA on every ring size; MHA and MQA on the largest.
RING_CASES = [(n, 4, 2) for n in RING_SIZES] + [(RING_SIZES[-1], 4, 4), (RING_SIZES[-1], 4, 1)]


@pytest.mark.parametrize("n,hq,hkv", RING_CASES, ids=lambda c: str(c))
@pytest.mark.parametrize(
    "causal,zigzag", [(False, False), (True, False), (True, True)], ids=["full", "causal", "causal_zigzag"])
def test_ring_matches_unsharded(n, hq, hkv, causal, zigzag):
    s = 8 * n
    q, k, v = random_qkv(20 + n, 2, s, s, hq, hkv, 16, jnp.float32)
    w = random_qkv(30, 2, s, s, hq, hkv, 16, jnp.float32)[0]
    ring = _global(_ring_fn(_mesh(n), causal, zigzag), n, zigzag)
    ref = lambda q, k, v: jax_flash.attention(q, k, v, causal=causal)
    out = jax.jit(_with_grads(ring, w))(q, k, v)
    _assert_close(out, jax.jit(_with_grads(ref, w))(q, k, v))


@pytest.mark.parametrize("causal,zigzag", [(False, False), (True, False), (True, True)])
def test_only_collective_permutes(causal, zigzag):
    n = RING_SIZES[-1]
    q, k, v = random_qkv(40, 1, 4 * n, 4 * n, 4, 2, 8, jnp.float32)
    ring = _ring_fn(_mesh(n), causal, zigzag)
    fwd_bwd = _with_grads(ring, q)
    sh = NamedSharding(_mesh(n), P(None, "sp"))
    args = [jax.device_put(x, sh) for x in (q, k, v)]
    assert _collectives(fwd_bwd, *args) == ["collective-permute"]


def test_ring_lse_and_its_gradient():
    n = RING_SIZES[-1]
    s = 4 * n
    q, k, v = random_qkv(41, 2, s, s, 4, 2, 8, jnp.float32)
    mesh = _mesh(n)
    spec, lse_spec = P(None, "sp"), P(None, None, "sp")
    for causal, zigzag in [(False, False), (True, False), (True, True)]:
        local = lambda q, k, v: jax_flash.ring_attention(
            q, k, v, axis_name="sp", causal=causal, zigzag=zigzag, return_lse=True)
        ring = shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=(spec, lse_spec))
        perm = (lambda x: jax_flash.zigzag_permute(x, n)) if zigzag else (lambda x: x)
        unperm = (lambda x, a=-3: jax_flash.zigzag_unpermute(x, n, a)) if zigzag else (lambda x, a=-3: x)

        def ring_loss(q, k, v):
            o, lse = ring(perm(q), perm(k), perm(v))
            o, lse = unperm(o), unperm(lse, -1)
            return jnp.sum(jnp.tanh(o)) + 0.3 * jnp.sum(jnp.sin(lse)), (o, lse)

        def ref_loss(q, k, v):
            o, lse = jax_flash.attention(q, k, v, causal=causal, return_lse=True)
            return jnp.sum(jnp.tanh(o)) + 0.3 * jnp.sum(jnp.sin(lse)), (o, lse)

        g = jax.jit(jax.grad(ring_loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
        g_ref = jax.jit(jax.grad(ref_loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
        _assert_close(g, g_ref, atol=5e-5)


def test_ring_with_batch_and_sequence_mesh():
    if N_CPU < 4:
        pytest.skip("needs 4 CPU devices")
    mesh = Mesh(np.array(jax.devices("cpu")[:4]).reshape(2, 2), ("dp", "sp"))
    q, k, v = random_qkv(42, 4, 16, 16, 4, 2, 8, jnp.float32)
    w = random_qkv(43, 4, 16, 16, 4, 2, 8, jnp.float32)[0]
    ring = _global(_ring_fn(mesh, True, True, spec=P("dp", "sp")), 2, True)
    ref = lambda q, k, v: jax_flash.attention(q, k, v, causal=True)
    _assert_close(jax.jit(_with_grads(ring, w))(q, k, v), jax.jit(_with_grads(ref, w))(q, k, v))


def test_ring_noncausal_with_different_q_and_kv_lengths():
    n = RING_SIZES[-1]
    q, k, v = random_qkv(44, 1, 3 * n, 5 * n, 2, 1, 8, jnp.float32)
    w = random_qkv(45, 1, 3 * n, 5 * n, 2, 1, 8, jnp.float32)[0]
    ring = _ring_fn(_mesh(n), False, False)
    ref = lambda q, k, v: jax_flash.attention(q, k, v)
    _assert_close(jax.jit(_with_grads(ring, w))(q, k, v), jax.jit(_with_grads(ref, w))(q, k, v))


def test_ring_bfloat16_and_scale():
    n = RING_SIZES[-1]
    q, k, v = random_qkv(46, 1, 8 * n, 8 * n, 2, 2, 32, jnp.bfloat16)
    ring = _global(_ring_fn(_mesh(n), True, True, scale=0.3), n, True)
    ref = lambda q, k, v: jax_flash.attention(q, k, v, causal=True, scale=0.3)
    out = jax.jit(_with_grads(ring, q))(q, k, v)
    expect = jax.jit(_with_grads(ref, q))(q, k, v)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(expect)):
        assert a.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=3e-2, rtol=3e-2)


def test_zigzag_permute_layout_and_inverse():
    n = 4
    x = jnp.arange(2 * 16 * 3).reshape(2, 16, 3, 1)  # [B, S, H, D], S = 2n chunks of 2
    z = jax_flash.zigzag_permute(x, n)
    chunks = np.asarray(z[0, :, 0, 0]).reshape(2 * n, 2) // 3 // 2  # chunk id of each position
    assert [int(c[0]) for c in chunks] == [0, 7, 1, 6, 2, 5, 3, 4]
    # device i (contiguous quarter) holds chunks i and 2n-1-i
    for i in range(n):
        assert {int(chunks[2 * i][0]), int(chunks[2 * i + 1][0])} == {i, 2 * n - 1 - i}
    np.testing.assert_array_equal(jax_flash.zigzag_unpermute(z, n), x)
    lse = jnp.arange(24.0).reshape(1, 3, 8)  # [B, H, S]: sequence on the last axis
    np.testing.assert_array_equal(
        jax_flash.zigzag_unpermute(jax_flash.zigzag_permute(lse, 2, axis=-1), 2, axis=-1), lse)
    with pytest.raises(ValueError, match="divisible by 2\\*n"):
        jax_flash.zigzag_permute(x, 3)


def test_ring_argument_errors():
    mesh = _mesh(2)
    q, k, v = random_qkv(47, 1, 8, 12, 2, 2, 8, jnp.float32)
    with pytest.raises(ValueError, match="equal q and k/v shard lengths"):
        jax.jit(_ring_fn(mesh, True, False))(q, k, v)
    q, k, v = random_qkv(48, 1, 6, 6, 2, 2, 8, jnp.float32)  # 3 per device: odd
    with pytest.raises(ValueError, match="must be even"):
        jax.jit(_ring_fn(mesh, True, True))(q, k, v)
    q, k, v = random_qkv(49, 1, 8, 8, 3, 2, 8, jnp.float32)
    with pytest.raises(ValueError, match="multiple"):
        jax.jit(_ring_fn(mesh, False, False))(q, k, v)


def _dp_sp_rings():
    """A 2 x 2 ("dp", "sp") CPU mesh and the causal ring over "sp" in shard_map,
    manual over "sp" only (batch on the automatic "dp") and over both axes."""
    if N_CPU < 4 or not hasattr(jax, "shard_map"):
        pytest.skip("needs 4 CPU devices and jax.shard_map")
    mesh = Mesh(np.array(jax.devices("cpu")[:4]).reshape(2, 2), ("dp", "sp"))
    local = lambda q, k, v: jax_flash.ring_attention(q, k, v, axis_name="sp", causal=True)
    some = jax.shard_map(local, mesh=mesh, in_specs=(P(None, "sp"),) * 3, out_specs=P(None, "sp"),
                         axis_names={"sp"})
    every = jax.shard_map(local, mesh=mesh, in_specs=(P("dp", "sp"),) * 3, out_specs=P("dp", "sp"))
    return mesh, some, every


@pytest.mark.parametrize("shardy", [True, False], ids=["shardy", "gspmd"])
def test_ring_in_shard_map_over_some_mesh_axes(shardy):
    """shard_map manual over the sequence axis only, batch on an auto axis:
    correct (XLA gathers the auto batch axis around the kernels)."""
    mesh, ring, _ = _dp_sp_rings()
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        q, k, v = random_qkv(50, 4, 16, 16, 4, 2, 8, jnp.float32)
        w = random_qkv(51, 4, 16, 16, 4, 2, 8, jnp.float32)[0]
        sh = NamedSharding(mesh, P("dp", "sp"))
        args = [jax.device_put(x, sh) for x in (q, k, v)]
        ref = lambda q, k, v: jax_flash.attention(q, k, v, causal=True)
        if not shardy and _partitioning._jaxlib_version() < _partitioning._GSPMD_PARTIAL_MANUAL_FIXED:
            # That XLA would abort the process: a clear error instead.
            with pytest.raises(NotImplementedError, match="GSPMD"):
                jax.jit(_with_grads(ring, w))(*args)
            return
        _assert_close(jax.jit(_with_grads(ring, w))(*args), jax.jit(_with_grads(ref, w))(q, k, v))
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


@pytest.mark.parametrize("shardy", [True, False], ids=["shardy", "gspmd"])
def test_old_jaxlib_gspmd_partial_manual_is_refused_not_crashed(shardy, monkeypatch):
    """jaxlib 0.10.0 / 0.10.1's GSPMD partitioner aborts the process on a custom
    call inside a shard_map that leaves a mesh axis automatic: jax_flash raises
    a clear error there instead (at trace time), and only there: Shardy, and a
    shard_map manual over every axis, trace as usual."""
    _, some, every = _dp_sp_rings()
    monkeypatch.setattr(_partitioning, "_jaxlib_version", lambda: (0, 10, 1))
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        q, k, v = random_qkv(52, 4, 16, 16, 4, 2, 8, jnp.float32)
        w = random_qkv(53, 4, 16, 16, 4, 2, 8, jnp.float32)[0]
        jax.jit(_with_grads(every, w)).trace(q, k, v)
        if shardy:
            jax.jit(_with_grads(some, w)).trace(q, k, v)
        else:
            with pytest.raises(NotImplementedError, match=r"manual \('sp',\), automatic \('dp',\).*0\.10\.1"):
                jax.jit(_with_grads(some, w)).trace(q, k, v)
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


# ---------------------------------------------------------------------------
# Local windows: each step's shard sits at a different global offset.

WINDOW_CASES = [
    # (causal, zigzag, window, hq, hkv)
    # 8 tokens a device (4 a zigzag chunk); zigzag on 4 devices, contiguous on 8.
    (False, False, 3, 4, 2),            # smaller than a shard
    (True, False, 3, 4, 2),
    (True, True, 3, 4, 2),
    (False, True, (5, 2), 4, 4),        # asymmetric, zigzag without causal
    (True, True, 20, 4, 1),             # spans several shards (chunks of 4)
    (False, False, (19, 11), 4, 2),     # spans several shards, asymmetric
]


@pytest.mark.parametrize("causal,zigzag,window,hq,hkv", WINDOW_CASES, ids=lambda c: str(c))
def test_ring_local_window_matches_unsharded(causal, zigzag, window, hq, hkv):
    # Zigzag plans differ on every device (a switch branch each): 4 devices keep compiles short.
    n = min(4, RING_SIZES[-1]) if zigzag else RING_SIZES[-1]
    s = 8 * n
    q, k, v = random_qkv(60, 1, s, s, hq, hkv, 8, jnp.float32)
    w = random_qkv(61, 1, s, s, hq, hkv, 8, jnp.float32)[0]
    ring = _global(_ring_fn(_mesh(n), causal, zigzag, local_window_size=window), n, zigzag)
    ref = lambda q, k, v: jax_flash.attention(q, k, v, causal=causal, local_window_size=window)
    _assert_close(jax.jit(_with_grads(ring, w))(q, k, v), jax.jit(_with_grads(ref, w))(q, k, v))


def test_ring_local_window_lse_gradient_and_unequal_lengths():
    n = 4 if N_CPU >= 4 else RING_SIZES[-1]
    mesh = _mesh(n)
    # Non-causal, q and k/v shards of different lengths (3 and 5 tokens a device).
    q, k, v = random_qkv(62, 1, 3 * n, 5 * n, 2, 1, 8, jnp.float32)
    w = random_qkv(63, 1, 3 * n, 5 * n, 2, 1, 8, jnp.float32)[0]
    ring = _ring_fn(mesh, False, False, local_window_size=(2, 6))
    ref = lambda q, k, v: jax_flash.attention(q, k, v, local_window_size=(2, 6))
    _assert_close(jax.jit(_with_grads(ring, w))(q, k, v), jax.jit(_with_grads(ref, w))(q, k, v))
    # The lse output and its cotangent, zigzag causal window.
    q, k, v = random_qkv(64, 1, 4 * n, 4 * n, 2, 2, 8, jnp.float32)
    spec = P(None, "sp")
    local = lambda q, k, v: jax_flash.ring_attention(
        q, k, v, axis_name="sp", causal=True, zigzag=True, local_window_size=5, return_lse=True)
    ring = shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=(spec, P(None, None, "sp")))
    zz = lambda x: jax_flash.zigzag_permute(x, n)

    def ring_loss(q, k, v):
        o, lse = ring(zz(q), zz(k), zz(v))
        o, lse = jax_flash.zigzag_unpermute(o, n), jax_flash.zigzag_unpermute(lse, n, -1)
        return jnp.sum(jnp.tanh(o)) + 0.3 * jnp.sum(jnp.sin(lse)), (o, lse)

    def ref_loss(q, k, v):
        o, lse = jax_flash.attention(q, k, v, causal=True, local_window_size=5, return_lse=True)
        return jnp.sum(jnp.tanh(o)) + 0.3 * jnp.sum(jnp.sin(lse)), (o, lse)

    g = jax.jit(jax.grad(ring_loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    _assert_close(g, jax.jit(jax.grad(ref_loss, argnums=(0, 1, 2), has_aux=True))(q, k, v), atol=5e-5)


def test_ring_local_window_skips_blocks_outside_the_band():
    """A window smaller than a shard: on a contiguous causal ring only steps 0 and 1
    meet the band, so the compiled program has kernel calls for those alone."""
    from jax_flash.ring import _plan

    n = 8
    plans = [[_plan(d, t, n, 8, 8, True, (3, 3), False) for d in range(n)] for t in range(n)]
    assert all(p == () for row in plans[2:] for p in row)
    assert all(len(p) == 1 for p in plans[0])
    assert plans[1][0] == () and all(len(p) == 1 for p in plans[1][1:])
    # Zigzag causal, window 3 (chunks of 4): never more than two calls, and most
    # (device, step) pairs make none.
    zz = [_plan(d, t, n, 8, 8, True, (3, 3), True) for t in range(n) for d in range(n)]
    assert max(len(p) for p in zz) <= 2
    assert sum(p == () for p in zz) >= n * n // 2


def test_ring_local_window_errors():
    mesh = _mesh(2)
    q, k, v = random_qkv(65, 1, 8, 8, 2, 2, 8, jnp.float32)
    with pytest.raises(ValueError, match=">= 0"):
        jax.jit(_ring_fn(mesh, False, False, local_window_size=-1))(q, k, v)
    with pytest.raises(ValueError, match="pair"):
        jax.jit(_ring_fn(mesh, False, False, local_window_size=(1, 2, 3)))(q, k, v)
    q, k, v = random_qkv(66, 1, 6, 6, 2, 2, 8, jnp.float32)  # 3 per device: odd
    with pytest.raises(ValueError, match="must be even"):
        jax.jit(_ring_fn(mesh, False, True, local_window_size=2))(q, k, v)


# ---------------------------------------------------------------------------
# Segment ids (packed documents): the kv ids travel around the ring with K/V.


def _packed_ids(seed, batch, s, docs):
    """Sorted random segment ids [batch, s] (documents of random lengths)."""
    rng = np.random.default_rng(seed)
    return jnp.asarray(np.sort(rng.integers(0, docs, (batch, s)), axis=-1), jnp.int32)


def _seg_ring(mesh, n, causal, zigzag, q_ids, kv_ids, pass_kv=True, **kw):
    """The ring with segment ids as a function of unsharded q, k, v."""
    spec, ids_spec = P(None, "sp"), P(None, "sp")

    def local(q, k, v, qi, ki):
        return jax_flash.ring_attention(q, k, v, axis_name="sp", causal=causal, zigzag=zigzag,
                                        q_segment_ids=qi, kv_segment_ids=ki if pass_kv else None,
                                        **kw)

    ring = shard_map(local, mesh=mesh, in_specs=(spec,) * 3 + (ids_spec,) * 2, out_specs=spec)
    if not zigzag:
        return lambda q, k, v: ring(q, k, v, q_ids, kv_ids)
    zz = lambda x, a=-3: jax_flash.zigzag_permute(x, n, a)
    return lambda q, k, v: jax_flash.zigzag_unpermute(
        ring(zz(q), zz(k), zz(v), zz(q_ids, -1), zz(kv_ids, -1)), n)


SEGMENT_CASES = [
    # (causal, zigzag, hq, hkv, window)
    (True, True, 4, 2, None),
    (False, False, 4, 2, None),
    (True, False, 4, 1, None),
    (True, True, 4, 2, 6),
]


@pytest.mark.parametrize("causal,zigzag,hq,hkv,window", SEGMENT_CASES, ids=lambda c: str(c))
def test_ring_segment_ids_match_unsharded(causal, zigzag, hq, hkv, window):
    n = min(4, RING_SIZES[-1])
    s = 8 * n
    q, k, v = random_qkv(70, 2, s, s, hq, hkv, 8, jnp.float32)
    w = random_qkv(71, 2, s, s, hq, hkv, 8, jnp.float32)[0]
    ids = _packed_ids(72, 2, s, 5)
    kw = {} if window is None else dict(local_window_size=window)
    ring = _seg_ring(_mesh(n), n, causal, zigzag, ids, ids, pass_kv=False, **kw)
    ref = lambda q, k, v: jax_flash.attention(q, k, v, causal=causal, q_segment_ids=ids,
                                              kv_segment_ids=ids, **kw)
    _assert_close(jax.jit(_with_grads(ring, w))(q, k, v), jax.jit(_with_grads(ref, w))(q, k, v))


def test_ring_segment_ids_unequal_lengths_and_lse_gradient():
    n = min(4, RING_SIZES[-1])
    mesh = _mesh(n)
    # Non-causal, different q and kv ids and lengths (3 and 5 tokens a device).
    q, k, v = random_qkv(73, 1, 3 * n, 5 * n, 4, 2, 8, jnp.float32)
    w = random_qkv(74, 1, 3 * n, 5 * n, 4, 2, 8, jnp.float32)[0]
    q_ids, kv_ids = _packed_ids(75, 1, 3 * n, 3), _packed_ids(76, 1, 5 * n, 3)
    ring = _seg_ring(mesh, n, False, False, q_ids, kv_ids)
    ref = lambda q, k, v: jax_flash.attention(q, k, v, q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    _assert_close(jax.jit(_with_grads(ring, w))(q, k, v), jax.jit(_with_grads(ref, w))(q, k, v))
    # The lse output and its cotangent, causal zigzag.
    s = 4 * n
    q, k, v = random_qkv(77, 1, s, s, 2, 2, 8, jnp.float32)
    ids = _packed_ids(78, 1, s, 4)
    spec = P(None, "sp")
    local = lambda q, k, v, i: jax_flash.ring_attention(
        q, k, v, axis_name="sp", causal=True, zigzag=True, q_segment_ids=i, return_lse=True)
    ring = shard_map(local, mesh=mesh, in_specs=(spec,) * 4, out_specs=(spec, P(None, None, "sp")))
    zz = lambda x, a=-3: jax_flash.zigzag_permute(x, n, a)

    def ring_loss(q, k, v):
        o, lse = ring(zz(q), zz(k), zz(v), zz(ids, -1))
        o, lse = jax_flash.zigzag_unpermute(o, n), jax_flash.zigzag_unpermute(lse, n, -1)
        return jnp.sum(jnp.tanh(o)) + 0.3 * jnp.sum(jnp.sin(lse)), (o, lse)

    def ref_loss(q, k, v):
        o, lse = jax_flash.attention(q, k, v, causal=True, q_segment_ids=ids, return_lse=True)
        return jnp.sum(jnp.tanh(o)) + 0.3 * jnp.sum(jnp.sin(lse)), (o, lse)

    g = jax.jit(jax.grad(ring_loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    _assert_close(g, jax.jit(jax.grad(ref_loss, argnums=(0, 1, 2), has_aux=True))(q, k, v), atol=5e-5)


def test_ring_segment_ids_errors():
    mesh = _mesh(2)
    spec = P(None, "sp")
    q, k, v = random_qkv(79, 1, 8, 12, 2, 2, 8, jnp.float32)
    ids = jnp.zeros((1, 8), jnp.int32)

    def run(qi, ki, **kw):
        local = lambda q, k, v, *i: jax_flash.ring_attention(
            q, k, v, axis_name="sp", q_segment_ids=i[0] if i else None,
            kv_segment_ids=ki if ki is None else i[1], **kw)
        args = [x for x in (qi, ki) if x is not None]
        fn = shard_map(local, mesh=mesh, in_specs=(spec,) * (3 + len(args)), out_specs=spec)
        return jax.jit(fn)(q, k, v, *args)

    with pytest.raises(ValueError, match="kv_segment_ids is required"):
        run(ids, None)
    with pytest.raises(ValueError, match="must have shape"):
        run(ids, jnp.zeros((1, 8), jnp.int32))
    with pytest.raises(TypeError, match="integer dtype"):
        run(ids.astype(jnp.float32), jnp.zeros((1, 12), jnp.int32))
