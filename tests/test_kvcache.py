"""attention_with_kvcache on the CPU against a float32 reference built from the
dense cache: contiguous and paged caches, appends, GQA/MQA, ragged lengths,
the options, jit with donated caches, and the argument checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from jax_flash.kvcache import num_splits
from kvcache_reference import paged_with_table, reference, to_paged

TOL = {jnp.float32: 2e-5, jnp.bfloat16: 2e-2, jnp.float16: 4e-3}


def _inputs(seed, b, sq, hq, hkv, d, cap, dtype, append=False):
    rng = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(rng.standard_normal(s, dtype=np.float32), dtype)  # noqa: E731
    q = f(b, sq, hq, d)
    kc, vc = f(b, cap, hkv, d), f(b, cap, hkv, d)
    kn = vn = None
    if append:
        kn, vn = f(b, sq, hkv, d), f(b, sq, hkv, d)
    return rng, q, kc, vc, kn, vn


def _close(out, ref, dtype, what):
    err = float(np.max(np.abs(np.asarray(out, np.float32) - ref)))
    assert err <= TOL[dtype], f"{what}: max error {err} > {TOL[dtype]}"


@pytest.mark.parametrize("b,sq,hq,hkv,d,cap,lens", [
    (3, 1, 4, 2, 32, 97, [0, 50, 97]),      # ragged incl. an empty cache, full cache
    (2, 5, 6, 1, 16, 300, [7, 300 - 5]),    # MQA, several queries
    (1, 1, 8, 8, 64, 1031, [1031]),         # MHA, prime length > one split
    (2, 3, 4, 2, 40, 64, [2, 1]),           # lens < seqlen_q: early rows see no key
])
@pytest.mark.parametrize("causal", [True, False])
def test_contiguous_matches_reference(b, sq, hq, hkv, d, cap, lens, causal):
    _, q, kc, vc, _, _ = _inputs(1, b, sq, hq, hkv, d, cap, jnp.float32)
    lens = jnp.asarray(lens, jnp.int32)
    o, lse = jax_flash.attention_with_kvcache(q, kc, vc, lens, causal=causal, return_lse=True)
    ro, rlse, _, _ = reference(q, kc, vc, lens, causal=causal)
    _close(o, ro, jnp.float32, "o")
    np.testing.assert_allclose(np.asarray(lse), rlse, atol=1e-4, rtol=1e-5)


def test_rows_that_see_no_key_give_zero_and_minus_inf():
    _, q, kc, vc, _, _ = _inputs(2, 2, 3, 2, 1, 8, 16, jnp.float32)
    lens = jnp.asarray([0, 1], jnp.int32)
    o, lse = jax_flash.attention_with_kvcache(q, kc, vc, lens, return_lse=True)
    o, lse = np.asarray(o), np.asarray(lse)
    assert np.all(o[0] == 0) and np.all(np.isneginf(lse[0]))
    # b=1: one key; query rows 0, 1 sit at positions -2, -1, row 2 at 0.
    assert np.all(o[1, :2] == 0) and np.all(np.isneginf(lse[1, :, :2]))
    np.testing.assert_allclose(o[1, 2], np.broadcast_to(np.asarray(vc)[1, 0, 0], (2, 8)), rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("page_size", [16, 32])
def test_paged_equals_contiguous_random_pages(dtype, page_size):
    b, sq, hq, hkv, d, cap = 3, 2, 8, 2, 24, 4 * page_size
    rng, q, kc, vc, _, _ = _inputs(3, b, sq, hq, hkv, d, cap, dtype)
    lens = jnp.asarray([cap - sq, 0, page_size + 3], jnp.int32)
    kp, pt = to_paged(np.asarray(kc), page_size, rng)
    vp = paged_with_table(np.asarray(vc), pt, page_size, np.zeros_like(kp))  # v in k's pages
    oc = jax_flash.attention_with_kvcache(q, kc, vc, lens)
    op = jax_flash.attention_with_kvcache(q, jnp.asarray(kp), jnp.asarray(vp), lens,
                                          page_table=jnp.asarray(pt))
    np.testing.assert_array_equal(np.asarray(oc, np.float32), np.asarray(op, np.float32))
    ro, _, _, _ = reference(q, kc, vc, lens)
    _close(op, ro, dtype, "paged o")


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("sq", [1, 4])
def test_append_writes_new_rows_and_keeps_the_rest(paged, sq):
    b, hq, hkv, d, cap, ps = 3, 4, 2, 16, 64, 16
    rng, q, kc, vc, kn, vn = _inputs(4, b, sq, hq, hkv, d, cap, jnp.bfloat16, append=True)
    lens = np.asarray([0, 17, cap - sq], np.int32)
    kwargs = {}
    if paged:
        kp, pt = to_paged(np.asarray(kc), ps, rng)
        # spare pages hold random values, which the append must leave alone
        vp = paged_with_table(np.asarray(vc), pt, ps, rng.standard_normal(kp.shape).astype(kp.dtype))
        kc_in, vc_in = jnp.asarray(kp), jnp.asarray(vp)
        kwargs["page_table"] = jnp.asarray(pt)
    else:
        kc_in, vc_in = kc, vc
    before_k, before_v = np.asarray(kc_in, np.float32), np.asarray(vc_in, np.float32)
    o, k2, v2 = jax_flash.attention_with_kvcache(q, kc_in, vc_in, jnp.asarray(lens), k=kn, v=vn,
                                                 **kwargs)
    k2, v2 = np.asarray(k2, np.float32), np.asarray(v2, np.float32)
    # Exactly the appended rows changed, to the new values.
    exp_k, exp_v = before_k.copy(), before_v.copy()
    for bi in range(b):
        for i in range(sq):
            p = lens[bi] + i
            if paged:
                page, row = pt[bi, p // ps], p % ps
                exp_k[page, row] = np.asarray(kn, np.float32)[bi, i]
                exp_v[page, row] = np.asarray(vn, np.float32)[bi, i]
            else:
                exp_k[bi, p] = np.asarray(kn, np.float32)[bi, i]
                exp_v[bi, p] = np.asarray(vn, np.float32)[bi, i]
    np.testing.assert_array_equal(k2, exp_k)
    np.testing.assert_array_equal(v2, exp_v)
    ro, _, _, _ = reference(q, kc_in, vc_in, lens, k=kn, v=vn, page_table=kwargs.get("page_table"))
    _close(o, ro, jnp.bfloat16, "o after append")


@pytest.mark.parametrize("opts", [
    dict(local_window_size=5),
    dict(local_window_size=(7, 0)),
    dict(logits_soft_cap=2.0),
    dict(alibi_slopes="per_head"),
    dict(alibi_slopes="per_batch", local_window_size=(20, 3), causal=False),
    dict(scale=0.3, logits_soft_cap=1.5, alibi_slopes="per_head"),
])
def test_options_match_reference(opts):
    b, sq, hq, hkv, d, cap = 2, 3, 4, 2, 32, 90
    rng, q, kc, vc, kn, vn = _inputs(5, b, sq, hq, hkv, d, cap, jnp.float32, append=True)
    lens = jnp.asarray([40, 80], jnp.int32)
    opts = dict(opts)
    al = opts.pop("alibi_slopes", None)
    if al == "per_head":
        opts["alibi_slopes"] = jnp.asarray(rng.uniform(0.05, 0.5, hq), jnp.float32)
    elif al == "per_batch":
        opts["alibi_slopes"] = jnp.asarray(rng.uniform(0.05, 0.5, (b, hq)), jnp.float32)
    o, _, _ = jax_flash.attention_with_kvcache(q, kc, vc, lens, k=kn, v=vn, **opts)
    ro, _, _, _ = reference(q, kc, vc, lens, k=kn, v=vn, causal=opts.get("causal", True),
                            scale=opts.get("scale"), window=opts.get("local_window_size"),
                            softcap=opts.get("logits_soft_cap"), alibi=opts.get("alibi_slopes"))
    _close(o, ro, jnp.float32, f"o with {opts}")


def test_matches_attention_with_offsets_and_lengths():
    """Without an append, the cache call is attention() with per-batch query
    offsets lens - seqlen_q and key lengths lens."""
    b, sq, hq, hkv, d, cap = 2, 4, 4, 2, 32, 100
    _, q, kc, vc, _, _ = _inputs(6, b, sq, hq, hkv, d, cap, jnp.float32)
    lens = jnp.asarray([30, 100], jnp.int32)
    o = jax_flash.attention_with_kvcache(q, kc, vc, lens)
    ref = jax_flash.attention(q, kc, vc, causal=True, query_offset=lens - sq,
                              key_value_seq_lengths=lens)
    np.testing.assert_allclose(np.asarray(o), np.asarray(ref), atol=2e-5)


def test_out_of_range_page_ids_mask_their_keys_and_drop_appends():
    b, sq, hq, hkv, d, ps = 2, 1, 2, 1, 8, 16
    rng, q, kc, vc, kn, vn = _inputs(7, b, sq, hq, hkv, d, 3 * ps, jnp.float32, append=True)
    kp, pt = to_paged(np.asarray(kc), ps, rng, spare_pages=0)
    vp, _ = to_paged(np.asarray(vc), ps, rng, spare_pages=0)
    vp = kp * 0.5 + 1.0
    pt = pt.copy()
    pt[0, 1] = 999      # middle page of sequence 0 out of range
    pt[1, 2] = -5       # the page sequence 1 appends into
    lens = jnp.asarray([3 * ps - 1, 2 * ps + 2], jnp.int32)
    o, k2, v2 = jax_flash.attention_with_kvcache(q, jnp.asarray(kp), jnp.asarray(vp), lens,
                                                 k=kn, v=vn, page_table=jnp.asarray(pt))
    ro, _, _, _ = reference(q, kp, vp, lens, k=kn, v=vn, page_table=pt)
    _close(o, ro, jnp.float32, "o with bad pages")
    # Sequence 1's append went nowhere: only sequence 0's row changed.
    changed = np.argwhere(np.any(np.asarray(k2) != kp, axis=(2, 3)))
    assert changed.tolist() == [[pt[0, 2], ps - 1]]


def test_jit_with_donated_caches_updates_in_place():
    b, sq, hq, hkv, d, cap = 2, 1, 4, 2, 16, 40
    _, q, kc, vc, kn, vn = _inputs(8, b, sq, hq, hkv, d, cap, jnp.float32, append=True)
    lens = jnp.asarray([3, 10], jnp.int32)
    ro, _, rk, rv = reference(q, kc, vc, lens, k=kn, v=vn)

    @jax.jit
    def step_ref(q, kc, vc, lens, kn, vn):
        return jax_flash.attention_with_kvcache(q, kc, vc, lens, k=kn, v=vn)

    step = jax.jit(step_ref.__wrapped__, donate_argnums=(1, 2))
    kc_d, vc_d = jnp.array(kc), jnp.array(vc)
    ptr = kc_d.unsafe_buffer_pointer()
    o, k2, v2 = step(q, kc_d, vc_d, lens, kn, vn)
    assert kc_d.is_deleted() and vc_d.is_deleted()
    assert k2.unsafe_buffer_pointer() == ptr, "the donated cache was copied"
    _close(o, ro, jnp.float32, "jit o")
    np.testing.assert_array_equal(np.asarray(k2), rk)
    np.testing.assert_array_equal(np.asarray(v2), rv)


def _base(b=2, sq=1, hq=4, hkv=2, d=16, cap=32):
    _, q, kc, vc, kn, vn = _inputs(9, b, sq, hq, hkv, d, cap, jnp.float32, append=True)
    return q, kc, vc, kn, vn, jnp.asarray([1, 2], jnp.int32)


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda a: a.update(q=a["q"][0]), ValueError, "q must have rank 4"),
    (lambda a: a.update(lens=a["lens"].astype(jnp.int16)), TypeError, "cache_seqlens must be int32"),
    (lambda a: a.update(lens=jnp.asarray([1, 2, 3], jnp.int32)), ValueError, r"cache_seqlens must have shape"),
    (lambda a: a.update(vc=a["vc"][:, :8]), ValueError, "same shape"),
    (lambda a: a.update(q=a["q"][:, :, :3]), ValueError, "multiple of the cache's kv heads"),
    (lambda a: a.update(kn=None), ValueError, "given together"),
    (lambda a: a.update(kn=a["kn"][:, :, :1]), ValueError, "k must have shape"),
    (lambda a: a.update(lens=jnp.asarray([1, 32], jnp.int32)), ValueError, "exceeds the cache capacity"),
    (lambda a: a.update(pt=jnp.zeros((2, 2), jnp.uint32)), TypeError, "page_table must be int32"),
    (lambda a: a.update(pt=jnp.zeros((3, 2), jnp.int32)), ValueError, "page_table must have shape"),
    (lambda a: a.update(kc=a["kc"].astype(jnp.bfloat16)), TypeError, "share one dtype"),
])
def test_bad_arguments_raise_before_tracing(mutate, exc, match):
    q, kc, vc, kn, vn, lens = _base()
    a = dict(q=q, kc=kc, vc=vc, kn=kn, vn=vn, lens=lens, pt=None)
    mutate(a)
    with pytest.raises(exc, match=match):
        jax_flash.attention_with_kvcache(a["q"], a["kc"], a["vc"], a["lens"], k=a["kn"], v=a["vn"],
                                         page_table=a["pt"])


@pytest.mark.parametrize("kwargs", [
    dict(causal=True, query_offset=37),
    dict(causal=True, query_offset="per_batch", key_value_seq_lengths=[60, 41]),
    dict(causal=False, local_window_size=(9, 2), logits_soft_cap=3.0),
    dict(causal=True, alibi_slopes=[0.1, 0.2, 0.3, 0.4], query_offset=50),
])
def test_attention_decode_route_matches_regular_kernel(monkeypatch, kwargs):
    """attention()'s decode route (forced onto the CPU kernel here) gives the
    regular kernel's forward, and its gradient still comes from the training
    kernels."""
    rng = np.random.default_rng(10)
    q = jnp.asarray(rng.standard_normal((2, 3, 4, 32)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((2, 64, 2, 32)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((2, 64, 2, 32)), jnp.float32)
    kwargs = dict(kwargs)
    if kwargs.get("query_offset") == "per_batch":
        kwargs["query_offset"] = jnp.asarray([57, 20], jnp.int32)
    if "key_value_seq_lengths" in kwargs:
        kwargs["key_value_seq_lengths"] = jnp.asarray(kwargs["key_value_seq_lengths"], jnp.int32)
    if "alibi_slopes" in kwargs:
        kwargs["alibi_slopes"] = jnp.asarray(kwargs["alibi_slopes"], jnp.float32)
    ref_o, ref_lse = jax_flash.attention(q, k, v, return_lse=True, **kwargs)
    ref_g = jax.grad(lambda q: jax_flash.attention(q, k, v, **kwargs).sum())(q)
    monkeypatch.setenv("JAX_FLASH_DECODE_ROUTE", "force")
    o, lse = jax.jit(lambda q, k, v: jax_flash.attention(q, k, v, return_lse=True, **kwargs))(q, k, v)
    hlo = jax.jit(lambda q: jax_flash.attention(q, k, v, **kwargs)).lower(q).as_text()
    assert "jax_flash_kvcache_fwd" in hlo
    np.testing.assert_allclose(np.asarray(o), np.asarray(ref_o), atol=2e-5)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(ref_lse), atol=2e-5)
    g = jax.grad(lambda q: jax_flash.attention(q, k, v, **kwargs).sum())(q)
    np.testing.assert_allclose(np.asarray(g), np.asarray(ref_g), atol=2e-5)


def test_num_splits_fill_the_sms():
    # batch 8, 32k, 32:8, d128: 64 CTAs a split, 2 a SM -> 4 splits = 256 of 264 slots.
    assert num_splits(8, 1, 32, 8, 128, 32768, 132) == 4
    assert num_splits(64, 1, 32, 8, 128, 8192, 132) == 1
    assert num_splits(1, 1, 32, 8, 128, 1 << 17, 132) == 32


def test_bench_decode_runs_on_cpu(tmp_path):
    """Two runs (--runs 2, as the README's figures): records of both, and a
    last table with each point's best; --calls 3 times three calls a sample."""
    import json
    import pathlib
    import subprocess
    import sys

    script = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_decode.py"
    out = subprocess.run([sys.executable, "-P", str(script), "--shapes", "quick", "--time", "0.01", "--runs", "2",
                          "--calls", "3", "--impls", "jax_flash,jax_flash_paged,xla", "--out", str(tmp_path / "d.json")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    recs = json.loads((tmp_path / "d.json").read_text())
    assert {r["impl"] for r in recs} == {"jax_flash", "jax_flash_paged16", "jax_flash_paged256", "xla"}
    assert {r["run"] for r in recs} == {1, 2}
    assert all(r["gbps"] > 0 and r["calls"] == 3 for r in recs)
    best = [ln for ln in out.stdout.split("best of 2 runs\n")[1].splitlines() if ln.startswith("b=")]
    assert len(best) == 2, out.stdout
    flash = [r["gbps"] for r in recs if r["impl"] == "jax_flash" and r["seqlen_k"] == 2048]
    assert len(flash) == 2 and f"jax_flash={max(flash):7.0f}" in best[0], (best[0], flash)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("opts", [dict(), dict(local_window_size=(6, 1), logits_soft_cap=2.0),
                                  dict(alibi_slopes=True, causal=False)])
def test_xla_fallback_matches_reference(monkeypatch, paged, opts):
    """kvcache_xla (what CUDA runs for float32 or head dims without a decode
    kernel) has the kernels' semantics, appends and bad pages included."""
    import jax_flash.kvcache as kv

    b, sq, hq, hkv, d, ps = 2, 3, 4, 2, 16, 16
    rng, q, kc, vc, kn, vn = _inputs(15, b, sq, hq, hkv, d, 4 * ps, jnp.float32, append=True)
    lens = jnp.asarray([0, 4 * ps - sq], jnp.int32)
    kw = dict(opts)
    if kw.pop("alibi_slopes", None):
        kw["alibi_slopes"] = jnp.asarray(rng.uniform(0.1, 0.4, hq), jnp.float32)
    if paged:
        kp, pt = to_paged(np.asarray(kc), ps, rng)
        vp = kp * 0.5 - 1.0
        pt = pt.copy()
        pt[1, 0] = 99
        kc, vc = jnp.asarray(kp), jnp.asarray(vp)
        kw["page_table"] = jnp.asarray(pt)
    want = jax_flash.attention_with_kvcache(q, kc, vc, lens, k=kn, v=vn, return_lse=True, **kw)
    monkeypatch.setattr(kv, "_FORCE_XLA", True)
    got = jax.jit(lambda *a: jax_flash.attention_with_kvcache(
        *a, k=kn, v=vn, return_lse=True, **kw))(q, kc, vc, lens)
    (o, lse), k2, v2 = got
    (wo, wlse), wk, wv = want
    np.testing.assert_allclose(np.asarray(o), np.asarray(wo), atol=2e-5)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(wlse), atol=2e-5)
    np.testing.assert_array_equal(np.asarray(k2), np.asarray(wk))
    np.testing.assert_array_equal(np.asarray(v2), np.asarray(wv))


def test_ffi_refuses_appending_with_explicit_positions():
    """The FFI target itself (not only the Python API) refuses new k/v rows for
    queries at explicit positions: the kernels store new rows where
    bottom-right queries sit."""
    from jax_flash import kvcache

    b, sq, h, d, cap = 1, 2, 2, 64, 32
    q = jnp.ones((b, sq, h, d), jnp.float32)
    kc = jnp.zeros((b, cap, h, d), jnp.float32)
    kn = jnp.ones((b, sq, h, d), jnp.float32)
    f = jax.ffi.ffi_call(
        kvcache.KVCACHE_APPEND_TARGET,
        (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, sq), jnp.float32),
         jax.ShapeDtypeStruct(kc.shape, kc.dtype), jax.ShapeDtypeStruct(kc.shape, kc.dtype),
         jax.ShapeDtypeStruct((1,), jnp.float32)),
        input_output_aliases={1: 2, 2: 3})
    with pytest.raises(Exception, match="explicit query positions"):
        jax.block_until_ready(f(
            q, kc, kc, jnp.zeros((b,), jnp.int32), kn, kn, num_splits=np.int64(1),
            scale=np.float32(0.125), causal=True, window_left=np.int64(-1),
            window_right=np.int64(-1), softcap=np.float32(0),
            optional_inputs=np.int64(kvcache._NEW_KV | kvcache._POSITIONS),
            query_offset=np.int64(0)))
