"""attention_with_kvcache on CUDA (the split-KV decode kernels) against a float32
reference built from the dense cache. Run on the device: pytest -m gpu."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_flash
from jax_flash import _ffi
from helpers import skip_unless_cuda_head_dim
from kvcache_reference import paged_with_table, reference, to_paged

pytestmark = pytest.mark.gpu

_DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _built_dtypes():
    return [_DTYPES[n] for n in _ffi.cuda_dtypes()] or [jnp.bfloat16]


def _built_dims():
    return list(_ffi.cuda_kvcache_head_dims()) or [128]


def _assert_near(out, ro, dtype):
    """out is finite and within a small factor of the naive error against the
    float32 reference ro: the naive attention rounds the probabilities and the
    output to `dtype`, as any 16-bit kernel must."""
    err = float(np.max(np.abs(np.asarray(out, np.float32) - ro)))
    rounded = np.asarray(jnp.asarray(ro).astype(dtype).astype(jnp.float32))
    naive = float(np.max(np.abs(rounded - ro)))
    assert np.all(np.isfinite(np.asarray(out, np.float32)))
    assert err <= 4 * naive + 2e-3, f"max error {err} vs naive rounding {naive}"


def _check(out, q, kc, vc, lens, dtype, lse=None, **kw):
    ro, rlse, _, _ = reference(q, kc, vc, lens, **kw)
    _assert_near(out, ro, dtype)
    if lse is not None:
        lse = np.asarray(lse)
        assert np.array_equal(np.isneginf(lse), np.isneginf(rlse))
        fin = np.isfinite(rlse)
        np.testing.assert_allclose(lse[fin], rlse[fin], atol=2e-2, rtol=1e-3)


def _inputs(seed, b, sq, hq, hkv, d, cap, dtype):
    rng = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(rng.standard_normal(s, dtype=np.float32), dtype)  # noqa: E731
    return rng, f(b, sq, hq, d), f(b, cap, hkv, d), f(b, cap, hkv, d), f(b, sq, hkv, d), f(b, sq, hkv, d)


def _attend_with_lse(q, kc, vc, lens, page_size, rng, **opts):
    """(o, lse) of attention_with_kvcache over the contiguous cache, or (page_size
    set) over the same cache laid out in random pages."""
    if not page_size:
        return jax_flash.attention_with_kvcache(q, kc, vc, lens, return_lse=True, **opts)
    kp, pt = to_paged(np.asarray(kc), page_size, rng)
    vp = paged_with_table(np.asarray(vc), pt, page_size, kp)
    return jax_flash.attention_with_kvcache(q, jnp.asarray(kp), jnp.asarray(vp), lens, return_lse=True,
                                            page_table=jnp.asarray(pt), **opts)


@pytest.mark.parametrize("dtype", _built_dtypes())
@pytest.mark.parametrize("d", _built_dims())
@pytest.mark.parametrize("b,sq,hq,hkv,cap,lens", [
    (3, 1, 32, 8, 4096, [0, 4096, 1237]),     # GQA 4, ragged incl. empty, many splits
    (2, 16, 32, 8, 2048, [2048, 17]),         # 64 rows a CTA, causal inside the block
    (1, 1, 32, 1, 6000, [5999]),              # MQA: 32 rows share one kv head
    (2, 3, 5, 5, 700, [700, 3]),              # MHA, odd sizes, a row block of 16 for 3 rows
    (2, 7, 12, 2, 333, [300, 5]),             # group of 6 x 7 queries = 42 rows: two warps' rows
])
def test_contiguous_matches_reference(dtype, d, b, sq, hq, hkv, cap, lens):
    _, q, kc, vc, _, _ = _inputs(d + b + sq, b, sq, hq, hkv, d, cap, dtype)
    lens = jnp.asarray(lens, jnp.int32)
    o, lse = jax_flash.attention_with_kvcache(q, kc, vc, lens, return_lse=True)
    _check(o, q, kc, vc, lens, dtype, lse=lse)


@pytest.mark.parametrize("d", _built_dims())
@pytest.mark.parametrize("b,sq,hq,hkv,cap,lens,splits", [
    (2, 1, 8, 8, 3000, [2999, 0], 2),      # one row a kv head; an empty sequence
    (2, 1, 8, 8, 3000, [2999, 700], 37),   # splits past the sequence's blocks stay empty
    (1, 16, 32, 8, 1500, [1484], 7),       # 64 rows a CTA
    (2, 3, 10, 2, 900, [900, 1], 1024),    # 15 rows; the most splits the FFI takes
])
def test_split_partials_merge_at_any_split_count(monkeypatch, d, b, sq, hq, hkv, cap, lens, splits):
    """The combine kernel merges every split's partial o and lse (empty splits
    included), and every element of o, lse and the partials is written on
    every call (they start as NaN bytes); a second call gives the same bits."""
    dtype = _built_dtypes()[0]
    monkeypatch.setenv("JAX_FLASH_DECODE_SPLITS", str(splits))
    _, q, kc, vc, _, _ = _inputs(d + splits, b, sq, hq, hkv, d, cap, dtype)
    lens = jnp.asarray(lens, jnp.int32)
    run = jax.jit(lambda q, kc, vc, lens: jax_flash.attention_with_kvcache(
        q, kc, vc, lens, return_lse=True))
    o, lse = run(q, kc, vc, lens)
    _check(o, q, kc, vc, lens, dtype, lse=lse)
    o2, lse2 = run(q, kc, vc, lens)
    np.testing.assert_array_equal(np.asarray(o2, np.float32), np.asarray(o, np.float32))
    np.testing.assert_array_equal(np.asarray(lse2), np.asarray(lse))


@pytest.mark.parametrize("dtype", _built_dtypes())
@pytest.mark.parametrize("d", _built_dims())
@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("sq", [2, 16])  # one row warp (d64: paired heads) / four
def test_paged_equals_contiguous_random_pages(dtype, d, page_size, sq):
    b, hq, hkv, cap = 3, 8, 2, 8 * page_size
    rng, q, kc, vc, _, _ = _inputs(page_size, b, sq, hq, hkv, d, cap, dtype)
    lens = jnp.asarray([cap - 2, 0, page_size + 5], jnp.int32)
    kp, pt = to_paged(np.asarray(kc), page_size, rng)
    vp = paged_with_table(np.asarray(vc), pt, page_size, kp)  # v in k's pages
    oc = jax_flash.attention_with_kvcache(q, kc, vc, lens)
    op = jax_flash.attention_with_kvcache(q, jnp.asarray(kp), jnp.asarray(vp), lens,
                                          page_table=jnp.asarray(pt))
    np.testing.assert_array_equal(np.asarray(oc, np.float32), np.asarray(op, np.float32))
    _check(op, q, kc, vc, lens, dtype)


def test_pages_smaller_than_the_kernels_row_step_are_refused():
    # The split kernel steps a thread's rows 1024 / head_dim apart, one page at
    # most a step: smaller pages get a clear error instead of wrong rows.
    dtype, d = _built_dtypes()[0], _built_dims()[0]
    page_size = max(1, 1024 // d // 2)
    b, sq, hq, hkv, cap = 2, 1, 4, 2, 16 * page_size
    rng, q, kc, vc, _, _ = _inputs(3, b, sq, hq, hkv, d, cap, dtype)
    kp, pt = to_paged(np.asarray(kc), page_size, rng)
    with pytest.raises(Exception, match="page_size"):
        jax.block_until_ready(jax_flash.attention_with_kvcache(
            q, jnp.asarray(kp), jnp.asarray(kp), jnp.asarray([cap, 3], jnp.int32), page_table=jnp.asarray(pt)))


def _maybe_paged(kc, vc, page_size, rng, paged):
    """(k, v, page_table): the caches as they are (table None), or in random
    pages of page_size rows (v in k's pages)."""
    if not paged:
        return kc, vc, None
    kp, pt = to_paged(np.asarray(kc), page_size, rng)
    vp = paged_with_table(np.asarray(vc), pt, page_size, kp)
    return jnp.asarray(kp), jnp.asarray(vp), pt


@pytest.mark.parametrize("paged", [False, True])
def test_append_and_donation(paged):
    dtype, d = _built_dtypes()[0], _built_dims()[0]
    b, sq, hq, hkv, cap, ps = 2, 4, 8, 2, 512, 16
    rng, q, kc, vc, kn, vn = _inputs(11, b, sq, hq, hkv, d, cap, dtype)
    lens = np.asarray([100, cap - sq], np.int32)
    kc, vc, pt = _maybe_paged(kc, vc, ps, rng, paged)
    kw = {} if pt is None else {"page_table": jnp.asarray(pt)}
    ro, _, rk, rv = reference(q, kc, vc, lens, k=kn, v=vn, page_table=kw.get("page_table"))
    step = jax.jit(lambda q, kc, vc, lens, kn, vn: jax_flash.attention_with_kvcache(
        q, kc, vc, lens, k=kn, v=vn, **kw), donate_argnums=(1, 2))
    kd, vd = jnp.array(kc), jnp.array(vc)
    ptr = kd.unsafe_buffer_pointer()
    o, k2, v2 = step(q, kd, vd, jnp.asarray(lens), kn, vn)
    assert kd.is_deleted() and k2.unsafe_buffer_pointer() == ptr
    if paged:
        from kvcache_reference import dense_view
        cap_p = pt.shape[1] * ps
        k2d, _ = dense_view(k2, pt, cap_p)
        v2d, _ = dense_view(v2, pt, cap_p)
    else:
        k2d, v2d = np.asarray(k2, np.float32), np.asarray(v2, np.float32)
    np.testing.assert_array_equal(k2d, rk)
    np.testing.assert_array_equal(v2d, rv)
    err = float(np.max(np.abs(np.asarray(o, np.float32) - ro)))
    assert err < 2e-2


@pytest.mark.parametrize("d", _built_dims())
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("b,sq,hq,hkv,cap,lens,splits", [
    (3, 5, 8, 2, 1024, [0, 255, 1022], None),  # empty; across a block edge; 3 rows past the capacity
    (3, 5, 8, 2, 1024, [0, 255, 1022], 3),     # row 255 in split 1, rows 256.. in split 2
    (1, 16, 16, 1, 512, [200], 2),             # 256 rows: four row-block CTAs store the same rows
    (2, 2, 4, 2, 304, [0, 301], None),         # d64: paired heads
])
def test_split_kernel_appends_new_rows(monkeypatch, d, paged, b, sq, hq, hkv, cap, lens, splits):
    """The split kernel stores the new k/v rows of its own keys before reading
    them: every new row lands once, in whichever split (and row block) holds
    its position, and rows past the capacity are dropped."""
    dtype, ps = _built_dtypes()[0], 16
    if splits is not None:
        monkeypatch.setenv("JAX_FLASH_DECODE_SPLITS", str(splits))
        jax.clear_caches()
    rng, q, kc, vc, kn, vn = _inputs(d + sq + cap, b, sq, hq, hkv, d, cap, dtype)
    lens = np.asarray(lens, np.int32)
    kc, vc, pt = _maybe_paged(kc, vc, ps, rng, paged)
    kw = {} if pt is None else {"page_table": jnp.asarray(pt)}
    ro, _, rk, rv = reference(q, kc, vc, lens, k=kn, v=vn, page_table=kw.get("page_table"))
    # Under jit the lengths are traced, so rows past the capacity reach the
    # kernel (concrete lengths that overflow are refused in Python).
    o, k2, v2 = jax.jit(lambda q, kc, vc, lens, kn, vn: jax_flash.attention_with_kvcache(
        q, kc, vc, lens, k=kn, v=vn, **kw))(q, kc, vc, jnp.asarray(lens), kn, vn)
    if paged:
        from kvcache_reference import dense_view
        (k2d, _), (v2d, _) = dense_view(k2, pt, cap), dense_view(v2, pt, cap)
    else:
        k2d, v2d = np.asarray(k2, np.float32), np.asarray(v2, np.float32)
    np.testing.assert_array_equal(k2d, rk)
    np.testing.assert_array_equal(v2d, rv)
    _assert_near(o, ro, dtype)  # ro attends the appended cache, as the kernel must
    if splits is not None:
        jax.clear_caches()


@pytest.mark.parametrize("opts", [
    dict(local_window_size=100),
    dict(local_window_size=(300, 0), causal=False),
    dict(logits_soft_cap=5.0),
    dict(alibi_slopes=True),
    dict(alibi_slopes=True, causal=False),  # distances on both sides of the query
    dict(causal=False),
])
def test_options_match_reference(opts):
    dtype, d = _built_dtypes()[0], _built_dims()[0]
    b, sq, hq, hkv, cap = 2, 3, 8, 2, 3000
    rng, q, kc, vc, _, _ = _inputs(12, b, sq, hq, hkv, d, cap, dtype)
    lens = jnp.asarray([2999, 1500], jnp.int32)
    opts = dict(opts)
    if opts.pop("alibi_slopes", None):
        opts["alibi_slopes"] = jnp.asarray(rng.uniform(0.001, 0.05, hq), jnp.float32)
    o = jax_flash.attention_with_kvcache(q, kc, vc, lens, **opts)
    _check(o, q, kc, vc, lens, dtype, causal=opts.get("causal", True),
           window=opts.get("local_window_size"), softcap=opts.get("logits_soft_cap"),
           alibi=opts.get("alibi_slopes"))


@pytest.mark.parametrize("d", _built_dims())
@pytest.mark.parametrize("sq,hq,hkv", [
    (1, 16, 4),   # 4 rows: one row warp (d64: paired heads)
    (6, 8, 2),    # 24 rows: two row warps
    (16, 32, 8),  # 64 rows: four row warps
])
@pytest.mark.parametrize("opt", ["logits_soft_cap", "alibi_slopes"])
@pytest.mark.parametrize("page_size", [None, 16])
def test_logit_options_at_every_row_tiling(d, sq, hq, hkv, opt, page_size):
    """Soft-cap and ALiBi run kernels of their own (the plain ones compute
    neither): each row tiling, contiguous and paged, against the reference."""
    dtype = _built_dtypes()[0]
    b, cap = 2, 1024
    rng, q, kc, vc, _, _ = _inputs(d + hq + sq, b, sq, hq, hkv, d, cap, dtype)
    lens = jnp.asarray([1000, 300], jnp.int32)
    opts = ({"logits_soft_cap": 4.0} if opt == "logits_soft_cap" else
            {"alibi_slopes": jnp.asarray(rng.uniform(0.001, 0.05, hq), jnp.float32)})
    o, lse = _attend_with_lse(q, kc, vc, lens, page_size, rng, **opts)
    _check(o, q, kc, vc, lens, dtype, lse=lse, softcap=opts.get("logits_soft_cap"),
           alibi=opts.get("alibi_slopes"))


def _paired_dims():  # d64 kv heads pair up on the d128 kernel
    return [64] if {64, 128} <= set(_built_dims()) else []


@pytest.mark.parametrize("d", _paired_dims())
@pytest.mark.parametrize("b,sq,hq,hkv,lens", [
    (3, 1, 16, 4, [1800, 1, 999]),  # GQA 4: 4 rows a head, 8 a pair
    (2, 2, 8, 2, [1024, 77]),       # 16 rows a pair: the largest paired tile
    (1, 1, 6, 6, [1500]),           # MHA: three pairs of one row each
    (2, 3, 6, 3, [900, 400]),       # odd kv heads: not paired, same answer
])
@pytest.mark.parametrize("opts", [
    dict(),
    dict(alibi_slopes=True, splits="1"),
    dict(local_window_size=200, logits_soft_cap=5.0),
    dict(causal=False, page_size=16),
])
def test_paired_heads_match_reference(monkeypatch, d, b, sq, hq, hkv, lens, opts):
    """Two d64 kv heads run as one d128 head (at one row tile): each q row
    must still see only its own kv head, with its own ALiBi slope, in one
    split and in many, contiguous and paged."""
    dtype = _built_dtypes()[0]
    cap = 2048
    rng, q, kc, vc, _, _ = _inputs(d + hq + sq, b, sq, hq, hkv, d, cap, dtype)
    lens = jnp.asarray(lens, jnp.int32)
    opts = dict(opts)
    if opts.pop("alibi_slopes", None):
        opts["alibi_slopes"] = jnp.asarray(rng.uniform(0.001, 0.05, hq), jnp.float32)
    monkeypatch.setenv("JAX_FLASH_DECODE_SPLITS", opts.pop("splits", "5"))
    page_size = opts.pop("page_size", None)
    o, lse = _attend_with_lse(q, kc, vc, lens, page_size, rng, **opts)
    _check(o, q, kc, vc, lens, dtype, lse=lse, causal=opts.get("causal", True),
           window=opts.get("local_window_size"), softcap=opts.get("logits_soft_cap"),
           alibi=opts.get("alibi_slopes"))


def test_out_of_range_page_ids_are_masked():
    dtype, d = _built_dtypes()[0], _built_dims()[0]
    b, sq, hq, hkv, ps = 2, 1, 4, 1, 16
    rng, q, kc, vc, kn, vn = _inputs(13, b, sq, hq, hkv, d, 8 * ps, dtype)
    kp, pt = to_paged(np.asarray(kc), ps, rng, spare_pages=0)
    vp = np.asarray(kp)[::-1].copy()
    pt = pt.copy()
    pt[0, 3], pt[1, 7], pt[1, 0] = 1 << 30, -1, -7
    lens = jnp.asarray([8 * ps - 1, 8 * ps - 1], jnp.int32)
    o, k2, _ = jax_flash.attention_with_kvcache(q, jnp.asarray(kp), jnp.asarray(vp), lens,
                                                k=kn, v=vn, page_table=jnp.asarray(pt))
    ro, _, _, _ = reference(q, kp, vp, lens, k=kn, v=vn, page_table=pt)
    assert float(np.max(np.abs(np.asarray(o, np.float32) - ro))) < 2e-2
    changed = np.argwhere(np.any(np.asarray(k2, np.float32) != np.asarray(kp, np.float32), axis=(2, 3)))
    assert changed.tolist() == [[pt[0, 7], ps - 1]]


def test_attention_routes_decode_shapes_to_split_kv(monkeypatch):
    """attention() at decode shapes runs the split-KV kernel on CUDA and agrees
    with the training kernel; its gradient is unchanged."""
    dtype, d = _built_dtypes()[0], _built_dims()[0]
    # The reference runs the training forward with query offsets and lengths.
    skip_unless_cuda_head_dim(d, variants=True)
    rng = np.random.default_rng(14)
    q = jnp.asarray(rng.standard_normal((2, 4, 16, d)), dtype)
    k = jnp.asarray(rng.standard_normal((2, 4096, 4, d)), dtype)
    v = jnp.asarray(rng.standard_normal((2, 4096, 4, d)), dtype)
    kw = dict(causal=True, query_offset=jnp.asarray([4092, 1000], jnp.int32),
              key_value_seq_lengths=jnp.asarray([4096, 3000], jnp.int32))
    f = jax.jit(lambda q, k, v: jax_flash.attention(q, k, v, return_lse=True, **kw))
    assert "jax_flash_kvcache_fwd" in f.lower(q, k, v).as_text()
    o, lse = f(q, k, v)
    monkeypatch.setenv("JAX_FLASH_DECODE_ROUTE", "0")
    g = jax.jit(lambda q, k, v: jax_flash.attention(q, k, v, return_lse=True, **kw))
    assert "jax_flash_kvcache_fwd" not in g.lower(q, k, v).as_text()
    ro, rlse = g(q, k, v)
    assert float(np.max(np.abs(np.asarray(o, np.float32) - np.asarray(ro, np.float32)))) < 2e-2
    np.testing.assert_allclose(np.asarray(lse), np.asarray(rlse), atol=1e-2)



@pytest.mark.parametrize("page_size", [None, 16])
def test_flax_decode_steps_match_full_forward_on_gpu(page_size):
    """DecoderLM in bfloat16 on the decode kernel: each step's logits stay
    within bfloat16 noise of one full forward over the same tokens."""
    nnx = pytest.importorskip("flax.nnx")
    import jax_flash.flax as jf

    # The full forward runs the training kernels: a head dim built for both.
    both = [d for d in _built_dims() if d in _ffi.cuda_head_dims()]
    if not both:
        pytest.skip(f"no head dim with both decode and training kernels (decode {_built_dims()}, "
                    f"training {_ffi.cuda_head_dims()})")
    d = both[0]
    model = jf.DecoderLM(128, d_model=4 * d, num_layers=2, num_heads=4, num_kv_heads=2,
                         dtype=_built_dtypes()[0], rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 128, (2, 40)), jnp.int32)
    full = np.asarray(model(tokens))
    cache = model.init_cache(2, 48, page_size=page_size)
    _, cache = model(tokens[:, :32], cache=cache, prefill=True)
    step = jax.jit(lambda t, c: model(t, cache=c))
    scale = float(np.max(np.abs(full)))
    for t in range(32, 40):
        logits, cache = step(tokens[:, t:t + 1], cache)
        err = float(np.max(np.abs(np.asarray(logits[:, 0]) - full[:, t])))
        assert err <= 0.03 * scale + 0.03, f"step {t}: {err} (logit scale {scale})"
    out = model.generate(tokens[:, :8], 8, page_size=page_size)
    assert out.shape == (2, 16) and out.dtype == jnp.int32
