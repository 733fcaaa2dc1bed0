"""Per-batch variants on the CPU kernels: sequence lengths, segment ids, ALiBi,
per-batch query offsets and dropout, alone and combined, forward and backward,
against explicit-mask references, jax.nn.dot_product_attention, and under
jit / vmap / grad / batch-head sharding."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_flash
from jax_flash.dropout import dropout_mask_from_seed, dropout_threshold, philox4x32_10
from jax_flash.reference import (attention_reference_grad_np, attention_reference_np,
                                 variant_mask_and_bias)
from jax_flash.ring import shard_map
from helpers import assert_fa_close, random_qkv

GATHERS = re.compile(r"\b(all-gather|all-to-all)(-start)?\(")


def _sorted_ids(rng, batch, s, n_docs):
    return jnp.asarray(np.sort(rng.integers(0, n_docs, (batch, s)), axis=-1), jnp.int32)


def _options(name, rng, b, sq, sk, hq):
    """Keyword arguments of one option (arrays drawn from rng)."""
    if name == "lengths":
        return dict(query_seq_lengths=jnp.asarray(rng.integers(1, sq + 1, b), jnp.int32),
                    key_value_seq_lengths=jnp.asarray(rng.integers(1, sk + 1, b), jnp.int32))
    if name == "kv_lengths":
        return dict(key_value_seq_lengths=jnp.asarray(rng.integers(1, sk + 1, b), jnp.int32))
    if name == "segments":  # sq == sk: kv ids default to q's
        return dict(q_segment_ids=_sorted_ids(rng, b, sq, 4))
    if name == "segments_cross":
        return dict(q_segment_ids=_sorted_ids(rng, b, sq, 3), kv_segment_ids=_sorted_ids(rng, b, sk, 3))
    if name == "alibi":
        return dict(alibi_slopes=jnp.asarray(2.0 ** -np.arange(1, hq + 1), jnp.float32))
    if name == "alibi_batch":
        return dict(alibi_slopes=jnp.asarray(rng.uniform(0.01, 0.5, (b, hq)), jnp.float32))
    if name == "offsets":
        return dict(query_offset=jnp.asarray(rng.integers(-3, sk - sq + 4, b), jnp.int32))
    if name == "dropout":
        return dict(dropout_rate=0.25, dropout_rng=jax.random.key(int(rng.integers(1 << 30))))
    raise KeyError(name)


# (sq, sk, hq, hkv, d, static kwargs, options)
CASES = [
    (45, 70, 4, 2, 16, dict(), ("lengths",)),                                  # lengths + GQA
    (70, 70, 2, 1, 24, dict(causal=True, local_window_size=(9, 0)), ("lengths",)),
    (83, 83, 2, 2, 16, dict(causal=True), ("segments",)),                      # segments + causal
    (40, 67, 4, 2, 8, dict(), ("segments_cross",)),
    (33, 50, 4, 2, 16, dict(logits_soft_cap=2.0), ("alibi",)),                 # softcap + alibi
    (50, 71, 4, 4, 16, dict(causal=True, query_offset=10), ("alibi_batch",)),
    (30, 90, 2, 1, 16, dict(causal=True, local_window_size=20), ("offsets",)),  # array query_offset
    (66, 66, 4, 2, 16, dict(causal=True), ("dropout",)),                       # dropout + causal + GQA
    (75, 75, 4, 2, 16, dict(causal=True, local_window_size=(30, 0)),
     ("lengths", "segments", "alibi_batch", "offsets", "dropout")),
]


def _ids(c):
    return f"{c[0]}x{c[1]}-h{c[2]}/{c[3]}-" + "-".join(list(c[5]) + list(c[6]))


def _reference_kwargs(kw, b, hq, sq, sk):
    """The reference's keyword arguments for jax_flash.attention's."""
    ref = {n: x for n, x in kw.items() if n != "dropout_rng"}
    if kw.get("dropout_rate"):
        ref["dropout_mask"] = jax_flash.dropout_mask(kw["dropout_rng"], kw["dropout_rate"], b, hq, sq, sk)
    return ref


# float32 for every case; bfloat16 for the lengths, dropout and combined cases.
PARAMS = [pytest.param(c, jnp.float32, id=_ids(c) + "-float32") for c in CASES] + [
    pytest.param(c, jnp.bfloat16, id=_ids(c) + "-bfloat16")
    for c in CASES if len(c[6]) > 1 or c[6][0] in ("lengths", "dropout")]


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_option_outputs_lse_and_grads_match_float64_reference(case, dtype):
    sq, sk, hq, hkv, d, static, names = case
    b = 2
    rng = np.random.default_rng(sq * 7 + sk)
    kw = dict(static)
    for n in names:
        kw.update(_options(n, rng, b, sq, sk, hq))
    q, k, v = random_qkv(sq + sk, b, sq, sk, hq, hkv, d, dtype)
    rkw = _reference_kwargs(kw, b, hq, sq, sk)

    o, lse = jax_flash.attention(q, k, v, return_lse=True, **kw)
    f32 = [np.asarray(x.astype(jnp.float32)) for x in (q, k, v)]
    ref_o, ref_lse = attention_reference_np(*f32, **rkw)
    naive_fn = jax.jit(lambda q, k, v: jax_flash.attention_reference(q, k, v, dtype=dtype, **rkw))
    naive_o, _ = naive_fn(q, k, v)
    assert_fa_close("o", o, ref_o, naive_o)
    finite = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.asarray(lse)[~finite], -np.inf)
    np.testing.assert_allclose(np.asarray(lse)[finite], ref_lse[finite], atol=1e-4)
    if "query_seq_lengths" in kw:  # padding rows: o = 0, lse = -inf
        ql = np.asarray(kw["query_seq_lengths"])
        for bi in range(b):
            assert np.all(np.asarray(o, np.float32)[bi, ql[bi]:] == 0)
            assert np.all(np.asarray(lse)[bi, :, ql[bi]:] == -np.inf)

    # Loss through o and lse: every gradient path of the custom_vjp.
    g_rng = np.random.default_rng(sq)
    do = jnp.asarray(g_rng.standard_normal(q.shape), jnp.float32)
    dlse = jnp.asarray(g_rng.standard_normal(lse.shape), jnp.float32)

    def loss(fn):
        def f(q, k, v):
            o, lse = fn(q, k, v)
            return jnp.sum(o.astype(jnp.float32) * do) + jnp.sum(jnp.where(jnp.isfinite(lse), lse * dlse, 0.0))
        return f

    ours = loss(lambda q, k, v: jax_flash.attention(q, k, v, return_lse=True, **kw))
    naive = loss(naive_fn)
    grads = jax.grad(ours, argnums=(0, 1, 2))(q, k, v)
    naive_grads = jax.jit(jax.grad(naive, argnums=(0, 1, 2)))(q, k, v)
    refs = attention_reference_grad_np(*f32, np.asarray(do), dlse=np.asarray(dlse), **rkw)
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, refs, naive_grads):
        assert_fa_close(name, g, r, n)
    if "query_seq_lengths" in kw:
        ql = np.asarray(kw["query_seq_lengths"])
        for bi in range(b):
            assert np.all(np.asarray(grads[0], np.float32)[bi, ql[bi]:] == 0)


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, (6, 0)), (False, 5)])
def test_lengths_match_jax_nn_on_valid_rows(causal, window):
    b, sq, sk, hq, hkv, d = 3, 41, 41, 4, 2, 16
    q, k, v = random_qkv(5, b, sq, sk, hq, hkv, d, jnp.float32)
    ql = jnp.asarray([41, 17, 1], jnp.int32)
    kl = jnp.asarray([30, 41, 9], jnp.int32)
    kw = dict(query_seq_lengths=ql, key_value_seq_lengths=kl, local_window_size=window)
    ours = lambda q, k, v: jax_flash.attention(q, k, v, causal=causal, **kw)
    theirs = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla", **kw)
    o, vjp = jax.vjp(ours, q, k, v)
    o_ref, vjp_ref = jax.vjp(theirs, q, k, v)
    # Compare rows that see a key: jax.nn gives padding rows and rows with
    # every key masked some output, ours gives 0 (and lse = -inf).
    vis, _ = variant_mask_and_bias((b,), sq, sk, hq, causal=causal, local_window_size=window,
                                   query_seq_lengths=ql, key_value_seq_lengths=kl)
    rows = np.any(vis, axis=-1)[:, 0, :, None, None]  # [b, sq, 1, 1]
    np.testing.assert_allclose(np.where(rows, o, 0), np.where(rows, o_ref, 0), atol=2e-5)
    assert np.all(np.asarray(o)[~np.broadcast_to(rows, o.shape)] == 0)
    do = jnp.asarray(np.random.default_rng(1).standard_normal(o.shape) * rows, jnp.float32)
    for g, g_ref in zip(vjp(do), vjp_ref(do)):
        np.testing.assert_allclose(g, g_ref, atol=5e-5, rtol=1e-4)


def test_alibi_segments_and_offsets_match_jax_nn_with_explicit_bias_and_mask():
    b, s, hq, hkv, d = 2, 53, 4, 2, 16
    q, k, v = random_qkv(8, b, s, s, hq, hkv, d, jnp.float32)
    rng = np.random.default_rng(3)
    ids = _sorted_ids(rng, b, s, 3)
    slopes = jnp.asarray(rng.uniform(0.05, 0.6, (b, hq)), jnp.float32)
    offsets = jnp.asarray([0, 4], jnp.int32)
    kw = dict(causal=True, q_segment_ids=ids, alibi_slopes=slopes, query_offset=offsets)
    vis, bias = variant_mask_and_bias((b,), s, s, hq, causal=True, query_offset=offsets,
                                      q_segment_ids=ids, alibi_slopes=slopes, xp=jnp)
    ours = lambda q, k, v: jax_flash.attention(q, k, v, **kw)
    theirs = lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, bias=jnp.broadcast_to(bias, (b, hq, s, s)), mask=jnp.broadcast_to(vis, (b, 1, s, s)),
        implementation="xla")
    o, vjp = jax.vjp(ours, q, k, v)
    o_ref, vjp_ref = jax.vjp(theirs, q, k, v)
    np.testing.assert_allclose(o, o_ref, atol=2e-5)
    do = jnp.asarray(np.random.default_rng(0).standard_normal(o.shape), jnp.float32)
    for g, g_ref in zip(vjp(do), vjp_ref(do)):
        np.testing.assert_allclose(g, g_ref, atol=5e-5, rtol=1e-4)


def test_segment_tiles_skipped_give_same_result_as_unsorted_ids():
    # Many short documents: most tiles are skipped by the id ranges; the same
    # ids in a scrambled (non-sortable) pattern disable skipping.
    b, s, h, d = 1, 200, 2, 16
    q, k, v = random_qkv(4, b, s, s, h, h, d, jnp.float32)
    ids = jnp.asarray(np.repeat(np.arange(10), 20)[None], jnp.int32)
    o = jax_flash.attention(q, k, v, q_segment_ids=ids)
    ref, _ = attention_reference_np(q, k, v, q_segment_ids=ids)
    np.testing.assert_allclose(o, ref, atol=2e-6)
    ranges = jax_flash.segment_ranges(jnp.asarray(np.arange(37)[None], jnp.int32))
    assert ranges.shape == (1, 3, 2)
    np.testing.assert_array_equal(ranges[0], [[0, 15], [16, 31], [32, 36]])


def test_philox_matches_random123_known_answers():
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for ctr, key, want in cases:
        got = philox4x32_10(ctr, key)
        assert [int(x) for x in got] == list(want)


def test_dropout_mask_follows_its_definition_element_by_element():
    # dropout.h: element (b, h, i, j) takes the (i // 8) % 2 half of word j % 4
    # of philox(seed, (j // 4, (i // 16) * 8 + i % 8, h, b)), kept when >= the
    # 16-bit threshold round(rate * 65536). Checked here from scalar Philox
    # calls, independently of dropout_mask_from_seed's vectorised gather.
    seed = (0x1234567, 0x89ABCDEF)
    rate, batch, heads, sq, sk = 0.3, 2, 3, 41, 23
    mask = np.asarray(dropout_mask_from_seed(jnp.asarray(seed, jnp.uint32), rate, batch, heads, sq, sk))
    threshold = int(np.float32(rate) * 65536.0 + 0.5)
    for b, h, i, j in [(0, 0, 0, 0), (1, 2, 8, 3), (1, 1, 15, 22), (0, 2, 16, 5), (1, 0, 24, 7),
                       (0, 1, 40, 21), (1, 2, 33, 0), (0, 0, 9, 10)]:
        words = philox4x32_10((j // 4, (i // 16) * 8 + i % 8, h, b), seed)
        word = int(words[j % 4])
        draw = word >> 16 if (i // 8) % 2 else word & 0xFFFF
        assert bool(mask[b, h, i, j]) == (draw >= threshold), (b, h, i, j)
    # The threshold: the rate rounded to 1/65536.
    assert dropout_threshold(0.0) == 0 and dropout_threshold(0.1) == 6554
    assert dropout_threshold(1 - 2**-18) == 65536  # rounds to "drop everything"


@pytest.mark.parametrize("rng_kind", ["typed", "raw"])
def test_dropout_mask_equals_the_kernels_mask(rng_kind):
    # q = 0: uniform probabilities 1/Sk; v = one-hot of the key index, so
    # o[..., i, h, j] = keep[b, h, i, j] / (1 - rate) / Sk exactly.
    batch, sq, sk, hq, hkv = (2, 3), 19, 37, 4, 2
    rate = 0.4
    rng = jax.random.key(11) if rng_kind == "typed" else jax.random.PRNGKey(11)
    q = jnp.zeros(batch + (sq, hq, 40), jnp.float32)
    k = jnp.asarray(np.random.default_rng(0).standard_normal(batch + (sk, hkv, 40)), jnp.float32)
    v = jnp.broadcast_to(jnp.eye(sk, 40)[:, None, :], batch + (sk, hkv, 40))
    o = jax_flash.attention(q, k, v, dropout_rate=rate, dropout_rng=rng)
    keep_kernel = np.asarray(o).reshape(6, sq, hq, 40)[..., :sk].transpose(0, 2, 1, 3) > 0
    keep = np.asarray(jax_flash.dropout_mask(rng, rate, 6, hq, sq, sk))
    np.testing.assert_array_equal(keep_kernel, keep)
    np.testing.assert_allclose(np.asarray(o).reshape(6, sq, hq, 40)[..., :sk].transpose(0, 2, 1, 3),
                               keep / (1 - rate) / sk, rtol=1e-6)


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_dropout_keep_rate_within_4_sigma(rate):
    keep = np.asarray(jax_flash.dropout_mask(jax.random.key(2), rate, 2, 4, 64, 96))
    n = keep.size
    sigma = np.sqrt(rate * (1 - rate) / n)
    assert abs(keep.mean() - (1 - rate)) < 4 * sigma
    # And the kernel itself: the mean of o with q = 0, v = 1 is the keep rate / (1 - rate).
    q = jnp.zeros((2, 64, 4, 8), jnp.float32)
    v = jnp.ones((2, 96, 4, 8), jnp.float32)
    o = jax_flash.attention(q, v, v, dropout_rate=rate, dropout_rng=jax.random.key(2))
    assert abs(float(jnp.mean(o[..., 0])) * (1 - rate) - (1 - rate)) < 4 * sigma


def test_dropout_is_deterministic_per_key_and_differs_between_keys():
    q, k, v = random_qkv(1, 2, 33, 33, 2, 2, 16, jnp.float32)
    f = lambda key: jax_flash.attention(q, k, v, dropout_rate=0.5, dropout_rng=key)
    np.testing.assert_array_equal(f(jax.random.key(1)), f(jax.random.key(1)))
    assert not np.allclose(f(jax.random.key(1)), f(jax.random.key(2)))
    np.testing.assert_array_equal(f(jax.random.key(1)), jax.jit(f)(jax.random.key(1)))


def _all_options(rng, b, s, hq):
    return dict(causal=True, query_seq_lengths=jnp.asarray(rng.integers(1, s + 1, b), jnp.int32),
                key_value_seq_lengths=jnp.asarray(rng.integers(1, s + 1, b), jnp.int32),
                q_segment_ids=_sorted_ids(rng, b, s, 3),
                alibi_slopes=jnp.asarray(rng.uniform(0.01, 0.3, (b, hq)), jnp.float32),
                query_offset=jnp.asarray(rng.integers(0, 5, b), jnp.int32))


def test_jit_vmap_grad_with_every_option():
    v_, b, s, hq, hkv, d = 3, 2, 29, 4, 2, 8
    rng = np.random.default_rng(0)
    q, k, v = (x.reshape((v_, b) + x.shape[1:]) for x in random_qkv(2, v_ * b, s, s, hq, hkv, d, jnp.float32))
    opts = _all_options(rng, v_ * b, s, hq)
    arrays = {n: x.reshape((v_, b) + x.shape[1:]) for n, x in opts.items() if n != "causal"}
    key = jax.random.key(4)

    def loss(q, k, v, arrays, key):
        o = jax_flash.attention(q, k, v, causal=True, dropout_rate=0.2, dropout_rng=key, **arrays)
        return jnp.sum(o ** 2)

    # jit(grad) with traced per-batch arrays equals the eager value.
    g_eager = jax.grad(loss, argnums=(0, 1, 2))(q, k, v, arrays, key)
    g_jit = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v, arrays, key)
    for a, r in zip(g_jit, g_eager):
        np.testing.assert_allclose(a, r, atol=1e-6)
    # vmap over the leading axis with a shared key: the mapped axis is folded
    # into the batch, so it equals the call on the stacked batch.
    g_vmap = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2)), in_axes=(0, 0, 0, 0, None)))(
        q, k, v, arrays, key)
    for a, r in zip(g_vmap, g_eager):
        np.testing.assert_allclose(a, r, atol=1e-6)
    # vmap with one key per instance: each instance is its own call.
    keys = jax.random.split(jax.random.key(5), v_)
    o_vmap = jax.vmap(lambda q, k, v, a, key: jax_flash.attention(
        q, k, v, causal=True, dropout_rate=0.2, dropout_rng=key, **a))(q, k, v, arrays, keys)
    for i in range(v_):
        a_i = {n: x[i] for n, x in arrays.items()}
        o_i = jax_flash.attention(q[i], k[i], v[i], causal=True, dropout_rate=0.2, dropout_rng=keys[i], **a_i)
        np.testing.assert_allclose(o_vmap[i], o_i, atol=1e-6)
    # vmap over q alone with shared k/v and shared per-batch arrays.
    o_q = jax.vmap(lambda q: jax_flash.attention(q, k[0], v[0], causal=True,
                                                 **{n: x[0] for n, x in arrays.items()}))(q)
    for i in range(v_):
        o_i = jax_flash.attention(q[i], k[0], v[0], causal=True, **{n: x[0] for n, x in arrays.items()})
        np.testing.assert_allclose(o_q[i], o_i, atol=1e-6)


def _cpu_mesh():
    devs = jax.devices("cpu")
    if len(devs) < 8:
        pytest.skip("needs 8 CPU devices")
    return Mesh(np.array(devs[:8]).reshape(2, 4), ("b", "h"))


@pytest.mark.parametrize("partitioner", ["shardy", "gspmd"])
def test_options_under_batch_head_sharding_without_gathers(partitioner):
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
    try:
        mesh = _cpu_mesh()
        b, s, hq, hkv, d = 4, 40, 8, 4, 16
        q, k, v = random_qkv(6, b, s, s, hq, hkv, d, jnp.float32)
        opts = _all_options(np.random.default_rng(1), b, s, hq)
        arrays = {n: x for n, x in opts.items() if n != "causal"}
        spec = {"query_seq_lengths": P("b"), "key_value_seq_lengths": P("b"), "query_offset": P("b"),
                "q_segment_ids": P("b", None), "alibi_slopes": P("b", "h")}

        def loss(q, k, v, arrays):
            o, lse = jax_flash.attention(q, k, v, causal=True, return_lse=True, **arrays)
            return jnp.sum(o ** 2) + 0.1 * jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))

        f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
        x_sh = NamedSharding(mesh, P("b", None, "h"))
        args = [jax.device_put(x, x_sh) for x in (q, k, v)]
        sharded = {n: jax.device_put(x, NamedSharding(mesh, spec[n])) for n, x in arrays.items()}
        out = f(*args, sharded)
        with jax.default_device(jax.devices("cpu")[0]):
            ref = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v, arrays)
        for a, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(r), atol=2e-5, rtol=1e-5)
        assert not GATHERS.search(f.lower(*args, sharded).compile().as_text())

        # Dropout: runs sharded with the seed replicated, no gathers.
        g = jax.jit(lambda q, k, v, key: jax_flash.attention(q, k, v, dropout_rate=0.3, dropout_rng=key))
        o = g(*args, jax.random.key(0))
        assert o.shape == q.shape and np.all(np.isfinite(np.asarray(o)))
        assert not GATHERS.search(g.lower(*args, jax.random.key(0)).compile().as_text())
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


def test_options_inside_shard_map_use_the_bare_call():
    mesh = _cpu_mesh()
    b, s, h, d = 8, 24, 2, 8
    q, k, v = random_qkv(9, b, s, s, h, h, d, jnp.float32)
    kl = jnp.asarray(np.arange(1, b + 1) * 3, jnp.int32)
    ids = _sorted_ids(np.random.default_rng(2), b, s, 3)
    f = shard_map(lambda q, k, v, kl, ids: jax_flash.attention(
        q, k, v, key_value_seq_lengths=kl, q_segment_ids=ids),
        mesh=mesh, in_specs=(P(("b", "h")),) * 5, out_specs=P(("b", "h")))
    o = jax.jit(f)(q, k, v, kl, ids)
    ref, _ = attention_reference_np(q, k, v, key_value_seq_lengths=kl, q_segment_ids=ids)
    np.testing.assert_allclose(o, ref, atol=2e-6)


def test_dropout_under_vmap_inside_shard_map():
    """vmap inside shard_map with dropout: the seed stays one key for all the
    vmapped instances (it used to be broadcast and refused by the kernel).
    Each device's block equals the same computation run unsharded on it."""
    mesh = _cpu_mesh()
    x = jax.random.normal(jax.random.key(3), (8, 3, 20, 2, 8), jnp.float32)
    key = jax.random.key(4)
    inner = lambda x: jax.vmap(lambda t: jax_flash.attention(
        t, t, t, causal=True, dropout_rate=0.25, dropout_rng=key))(x)
    f = shard_map(inner, mesh=mesh, in_specs=P(("b", "h")), out_specs=P(("b", "h")))
    xs = jax.device_put(x, NamedSharding(mesh, P(("b", "h"))))
    o = jax.jit(f)(xs)
    g = jax.jit(jax.grad(lambda x: jnp.sum(f(x) ** 2)))(xs)
    for i in range(8):
        np.testing.assert_array_equal(np.asarray(o[i:i + 1]), np.asarray(inner(x[i:i + 1])))
        g_i = jax.grad(lambda x: jnp.sum(inner(x) ** 2))(x[i:i + 1])
        np.testing.assert_allclose(np.asarray(g[i:i + 1]), np.asarray(g_i), atol=1e-6)
    # Dropout really ran: some probabilities were zeroed.
    assert not np.allclose(np.asarray(o), np.asarray(jax.vmap(jax.vmap(
        lambda t: jax_flash.attention(t, t, t, causal=True)))(x)), atol=1e-3)

Q_SHAPE = (2, 8, 4, 8)
K_SHAPE = (2, 12, 2, 8)
I32 = jnp.int32


@pytest.mark.parametrize(
    "kw,exc,pattern",
    [
        (dict(query_seq_lengths=jnp.array([3, 9], I32)), ValueError, r"query_seq_lengths must lie in \[0, 8\]"),
        (dict(query_seq_lengths=jnp.array([-1, 2], I32)), ValueError, "query_seq_lengths must lie in"),
        (dict(key_value_seq_lengths=jnp.array([3, 13], I32)), ValueError, r"key_value_seq_lengths must lie in \[0, 12\]"),
        (dict(query_seq_lengths=jnp.array([3], I32)), ValueError, r"query_seq_lengths must have shape .*\(2,\)"),
        (dict(key_value_seq_lengths=jnp.array([3.0, 4.0])), TypeError, "key_value_seq_lengths must have an integer dtype"),
        (dict(q_segment_ids=jnp.zeros((2, 8), I32)), ValueError, "kv_segment_ids is required when seqlen_q != seqlen_k"),
        (dict(kv_segment_ids=jnp.zeros((2, 12), I32)), ValueError, "kv_segment_ids needs q_segment_ids"),
        (dict(q_segment_ids=jnp.zeros((2, 9), I32), kv_segment_ids=jnp.zeros((2, 12), I32)), ValueError,
         r"q_segment_ids must have shape .*\(2, 8\)"),
        (dict(q_segment_ids=jnp.zeros((2, 8), I32), kv_segment_ids=jnp.zeros((2, 8), I32)), ValueError,
         r"kv_segment_ids must have shape .*\(2, 12\)"),
        (dict(q_segment_ids=jnp.zeros((2, 8)), kv_segment_ids=jnp.zeros((2, 12), I32)), TypeError,
         "q_segment_ids must have an integer dtype"),
        (dict(alibi_slopes=jnp.ones((2,))), ValueError, r"alibi_slopes must have shape \(num_heads,\)"),
        (dict(alibi_slopes=jnp.ones((3, 4))), ValueError, "alibi_slopes must have shape"),
        (dict(alibi_slopes=jnp.ones((4,), I32)), TypeError, "alibi_slopes must be floating point"),
        (dict(query_offset=jnp.array([1, 2, 3], I32)), ValueError, r"query_offset must have shape .*\(2,\)"),
        (dict(query_offset=jnp.array([1.0, 2.0])), TypeError, "query_offset must have an integer dtype"),
        (dict(dropout_rate=0.1), ValueError, "dropout_rate > 0 needs dropout_rng"),
        (dict(dropout_rate=1.0, dropout_rng=jax.random.key(0)), ValueError, r"dropout_rate must be in \[0, 1\)"),
        (dict(dropout_rate=-0.1, dropout_rng=jax.random.key(0)), ValueError, r"dropout_rate must be in \[0, 1\)"),
        (dict(dropout_rate="x", dropout_rng=jax.random.key(0)), TypeError, "dropout_rate must be a number"),
        (dict(dropout_rate=0.1, dropout_rng=jnp.zeros((2,), jnp.float32)), TypeError, "dropout_rng must be a JAX PRNG key"),
        (dict(dropout_rate=0.1, dropout_rng=jax.random.split(jax.random.key(0), 2)), ValueError,
         "dropout_rng must be a single key"),
    ],
)
def test_bad_per_batch_arguments_raise_before_running(kw, exc, pattern):
    q = jnp.ones(Q_SHAPE, jnp.float32)
    k = v = jnp.ones(K_SHAPE, jnp.float32)
    with pytest.raises(exc, match=pattern):
        jax_flash.attention(q, k, v, **kw)


def test_traced_dropout_rate_raises():
    q = jnp.ones(Q_SHAPE, jnp.float32)
    k = jnp.ones(K_SHAPE, jnp.float32)
    with pytest.raises(TypeError, match="dropout_rate must be a static"):
        jax.jit(lambda r: jax_flash.attention(q, k, k, dropout_rate=r, dropout_rng=jax.random.key(0)))(0.1)


def test_ffi_rejects_inconsistent_optional_operands():
    # The C++ decode checks what Python would never send: a clear ffi error.
    from jax_flash import partitioning
    from jax_flash.mask import Extras, Mask

    q, k, v = random_qkv(0, 2, 8, 8, 2, 2, 8, jnp.float32)
    bad = Extras(kv_seqlens=jnp.zeros((3,), jnp.int32))
    with pytest.raises(Exception, match="kv_seqlens has shape"):
        jax.block_until_ready(partitioning.ffi_fwd(q, k, v, 1.0, Mask(), bad))
    with pytest.raises(Exception, match="dropout_rate > 0 needs the dropout_seed"):
        jax.block_until_ready(partitioning.ffi_fwd(q, k, v, 1.0, Mask(dropout_rate=0.5)))
    seed = Extras(dropout_seed=jnp.zeros((2,), jnp.int32))
    with pytest.raises(Exception, match="dropout_seed has the wrong element type"):
        jax.block_until_ready(partitioning.ffi_fwd(q, k, v, 1.0, Mask(dropout_rate=0.5), seed))


def test_dropout_mask_from_seed_shapes_and_rate_zero_keeps_all():
    m = dropout_mask_from_seed(jnp.array([1, 2], jnp.uint32), 0.0, 1, 2, 3, 5)
    assert m.shape == (1, 2, 3, 5) and bool(jnp.all(m))
