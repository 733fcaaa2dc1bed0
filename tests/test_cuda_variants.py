"""CUDA attention variants (issue #5) vs an explicit-mask float32 reference and
vs the CPU target: local windows, soft-capping, query offsets (static and
per batch), query / key lengths, segment ids, ALiBi and dropout; forward and
gradients, bf16 and fp16.

Runs only where a CUDA GPU is visible (`pytest -m gpu` on the device).
Tolerance the FlashAttention way: the kernel's max error against the float32
reference stays within 3x (2x forward) the error of the same attention computed
naively in the 16-bit dtype, plus a small slack.

Dropout convention assumed here: `jax_flash.dropout_mask(...)` returns the
*keep* mask (True = kept); kept probabilities are scaled by 1 / (1 - rate),
the softmax normaliser (and lse) comes from the undropped probabilities.
"""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_flash
from helpers import gpu_devices, rising_max, skip_unless_cuda_head_dim

_GPUS = gpu_devices()
pytestmark = pytest.mark.gpu

ABS_SLACK = 1e-4


# ---------------------------------------------------------------------------
# Reference: explicit mask / bias / dropout, computed in `cdt` (float32 =
# reference, 16-bit = naive).

def _visible(b, sq, sk, *, causal, window, offset, q_len, kv_len, qseg, kvseg):
    """bool [b, 1, sq, sk]."""
    i = jnp.arange(sq)[None, :, None]
    j = jnp.arange(sk)[None, None, :]
    pos = i + offset[:, None, None]
    vis = jnp.ones((b, sq, sk), bool)
    if causal:
        vis &= j <= pos
    if window is not None:
        left, right = window
        if left is not None and left >= 0:
            vis &= j >= pos - left
        if right is not None and right >= 0:
            vis &= j <= pos + right
    if q_len is not None:
        vis &= i < q_len[:, None, None]
    if kv_len is not None:
        vis &= j < kv_len[:, None, None]
    if qseg is not None:
        vis &= qseg[:, :, None] == kvseg[:, None, :]
    return vis[:, None]


def _reference(q, k, v, *, cdt, causal=False, window=None, softcap=None, offset=0, q_len=None,
               kv_len=None, qseg=None, kvseg=None, slopes=None, keep=None, rate=0.0):
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    q, k, v = (x.astype(cdt) for x in (q, k, v))
    k = jnp.repeat(k, g, axis=2)
    v = jnp.repeat(v, g, axis=2)
    offset = jnp.broadcast_to(jnp.asarray(offset, jnp.int32), (b,))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest").astype(cdt) * jnp.asarray(d ** -0.5, cdt)
    if softcap:
        s = (softcap * jnp.tanh(s / softcap)).astype(cdt)
    if slopes is not None:
        sl = jnp.broadcast_to(jnp.asarray(slopes, jnp.float32).reshape(-1, hq), (b, hq))
        pos = jnp.arange(sq)[None, :] + offset[:, None]  # [b, sq]
        dist = jnp.abs(pos[:, :, None] - jnp.arange(sk)[None, None, :]).astype(jnp.float32)
        s = (s - (sl[:, :, None, None] * dist[:, None]).astype(cdt)).astype(cdt)
    vis = _visible(b, sq, sk, causal=causal, window=window, offset=offset, q_len=q_len, kv_len=kv_len,
                   qseg=qseg, kvseg=kvseg)
    s32 = jnp.where(vis, s.astype(jnp.float32), -jnp.inf)
    m = jnp.max(s32, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.where(vis, jnp.exp(s32 - m), 0.0)
    tot = jnp.sum(e, axis=-1, keepdims=True)
    p = e / jnp.where(tot > 0, tot, 1.0)
    lse = jnp.where(tot[..., 0] > 0, m[..., 0] + jnp.log(jnp.where(tot[..., 0] > 0, tot[..., 0], 1.0)), -jnp.inf)
    p = p.astype(cdt)
    if keep is not None:
        p = jnp.where(keep, p / jnp.asarray(1.0 - rate, cdt), 0).astype(cdt)
    o = jnp.einsum("bhqk,bkhd->bqhd", p, v, precision="highest").astype(cdt)
    return o.astype(jnp.float32), lse


def _ref_grads(q, k, v, do, cdt, **kw):
    """dq, dk, dv of the reference computed in `cdt` (its output is float32)."""
    f = lambda q, k, v: _reference(q, k, v, cdt=cdt, **kw)[0]
    _, vjp = jax.vjp(f, q.astype(cdt), k.astype(cdt), v.astype(cdt))
    return [np.asarray(g.astype(jnp.float32)) for g in vjp(do.astype(jnp.float32))]


# ---------------------------------------------------------------------------
# Cases: (name, shape, options). Options use the public argument names; the
# reference keyword of each is derived in _ref_kwargs.

def _seg_ids(rng, b, s):
    ids = np.zeros((b, s), np.int32)
    for bb in range(b):
        pos, doc = 0, 0
        while pos < s:
            n = int(rng.integers(1, 60))
            ids[bb, pos:pos + n] = doc
            pos += n
            doc += 1
    return ids


def _seg_runs(rng, b, s):
    """Runs of 40-400 tokens labelled from {0..3} at random: an id recurs
    after others, so a key tile's documents can sit on both sides of query
    tiles that share none of them (the skips between the first and the last
    query tile a key tile meets)."""
    ids = np.zeros((b, s), np.int32)
    for bb in range(b):
        pos = 0
        while pos < s:
            n = int(rng.integers(40, 400))
            ids[bb, pos:pos + n] = int(rng.integers(0, 4))
            pos += n
    return ids


def _make_case(name, b, sq, sk, hq, hkv, d, seed=0):
    rng = np.random.default_rng(seed)
    opts = {}
    if "window" in name:
        opts["local_window_size"] = (37, 11)
    if "causal" in name:
        opts["causal"] = True
    if "softcap" in name:
        opts["logits_soft_cap"] = 7.5
    if "offset" in name:
        opts["query_offset"] = sk - sq if sk > sq else 5
    if "batchoff" in name:
        opts["query_offset"] = jnp.asarray(rng.integers(-5, 40, size=b), jnp.int32)
    if "lengths" in name:
        ql = rng.integers(1, sq + 1, size=b).astype(np.int32)
        kl = rng.integers(1, sk + 1, size=b).astype(np.int32)
        ql[0], kl[0] = sq, sk
        if b > 1:
            ql[1] = 0  # no valid row at all in this batch
        opts["query_seq_lengths"] = jnp.asarray(ql)
        opts["key_value_seq_lengths"] = jnp.asarray(kl)
    if "segments" in name:
        qs = _seg_ids(rng, b, sq)
        ks = qs if sq == sk else _seg_ids(rng, b, sk)
        opts["q_segment_ids"] = jnp.asarray(qs)
        opts["kv_segment_ids"] = jnp.asarray(ks)
    if "segruns" in name:
        qs = _seg_runs(rng, b, sq)
        ks = qs if sq == sk else _seg_runs(rng, b, sk)
        opts["q_segment_ids"] = jnp.asarray(qs)
        opts["kv_segment_ids"] = jnp.asarray(ks)
    if "segqone" in name:
        # One query document, the keys of that document then of a second
        # one (in order): key tiles inside the first see a single id over
        # their whole band, and those of the second meet no query at all.
        qs = np.zeros((b, sq), np.int32)
        ks = np.zeros((b, sk), np.int32)
        ks[:, sk // 2:] = 1
        opts["q_segment_ids"] = jnp.asarray(qs)
        opts["kv_segment_ids"] = jnp.asarray(ks)
    if "seglong" in name or "segone" in name:
        # Long documents (300-900 tokens; segone: one), so that key tiles run
        # clean (every key the query tile's one id) between the mixed ones.
        assert sq == sk
        ids = np.zeros((b, sq), np.int32)
        if "seglong" in name:
            for bb in range(b):
                pos, doc = 0, 0
                while pos < sq:
                    n = int(rng.integers(300, 900))
                    ids[bb, pos:pos + n] = doc
                    pos, doc = pos + n, doc + 1
        opts["q_segment_ids"] = jnp.asarray(ids)
        opts["kv_segment_ids"] = jnp.asarray(ids)
    if "alibi" in name:
        sl = (2.0 ** (-8.0 * np.arange(1, hq + 1) / hq)).astype(np.float32)
        if "alibiX" in name:
            # Slopes of every kind: the Hopper forward takes positive ones (from
            # 1e-12 log2 units up) in distance units and zero, negative and tinier
            # ones in log2 units (apply_logits).
            sl = np.resize(np.asarray([0.05, 0.0, -0.2, 3.0, 1e-14, 0.7], np.float32), hq)
        opts["alibi_slopes"] = jnp.asarray(np.stack([sl * (1 + 0.1 * i) for i in range(b)]) if "alibiB" in name else sl)
    if "dropout" in name:
        opts["dropout_rate"] = 0.2
        opts["dropout_rng"] = jax.random.key(seed + 17)
    return opts


def _ref_kwargs(opts, b, sq, sk, hq):
    kw = dict(causal=bool(opts.get("causal", False)))
    if "local_window_size" in opts:
        kw["window"] = opts["local_window_size"]
    if "logits_soft_cap" in opts:
        kw["softcap"] = opts["logits_soft_cap"]
    if "query_offset" in opts:
        kw["offset"] = opts["query_offset"]
    if "query_seq_lengths" in opts:
        kw["q_len"] = opts["query_seq_lengths"]
        kw["kv_len"] = opts["key_value_seq_lengths"]
    if "q_segment_ids" in opts:
        kw["qseg"] = opts["q_segment_ids"]
        kw["kvseg"] = opts["kv_segment_ids"]
    if "alibi_slopes" in opts:
        kw["slopes"] = opts["alibi_slopes"]
    if "dropout_rate" in opts:
        rate = opts["dropout_rate"]
        kw["keep"] = jax_flash.dropout_mask(opts["dropout_rng"], rate, b, hq, sq, sk)
        kw["rate"] = rate
    return kw


CASES = [
    # each variant alone
    ("window", 2, 257, 301, 4, 2, 64),
    ("softcap", 2, 150, 170, 2, 1, 128),
    ("offset causal", 2, 129, 333, 4, 1, 64),
    ("lengths", 3, 200, 190, 8, 2, 128),
    ("segments", 2, 301, 301, 2, 1, 64),
    ("alibi", 2, 140, 150, 4, 2, 128),
    ("dropout", 2, 133, 177, 2, 1, 64),
    # combinations named in the issue
    ("causal window", 2, 300, 300, 2, 2, 128),
    ("segments causal", 2, 500, 500, 2, 2, 64),
    ("lengths gqa", 4, 131, 257, 8, 2, 64),
    ("dropout causal gqa", 2, 200, 200, 8, 2, 128),
    ("softcap alibi", 2, 257, 257, 4, 4, 64),
    # soft-cap alone and dropout alone at d64: their consumers issue in turns
    # (BwdConfig::kTurns), across skipped steps and masked tiles
    ("softcap segruns causal", 2, 700, 700, 4, 2, 64),
    ("dropout window lengths", 2, 400, 450, 4, 2, 64),
    ("softcap alibiB causal", 2, 129, 129, 4, 2, 128),
    ("batchoff causal", 3, 111, 260, 2, 1, 64),
    ("window batchoff lengths", 3, 190, 230, 2, 2, 64),
    ("causal window segments lengths softcap alibi dropout", 3, 201, 199, 4, 2, 128),
    # dropout with soft-cap and / or ALiBi (the Hopper backward's own kLogits sets)
    ("softcap dropout causal", 2, 400, 420, 4, 2, 64),
    ("alibi dropout lengths", 2, 300, 333, 2, 1, 128),
    ("softcap alibi dropout window", 2, 500, 500, 4, 2, 64),
    ("softcap dropout segruns", 1, 700, 700, 2, 1, 96),
    # masks-only options over many tiles (the Hopper backward at 64 / 128:
    # query-tile narrowing, skipped tiles, tiles straddling documents)
    ("segruns causal", 2, 1100, 1100, 2, 1, 128),
    ("segruns lengths", 2, 900, 1000, 4, 2, 64),
    ("segments causal window batchoff", 2, 700, 700, 2, 2, 128),
    # more than 32 query tiles a key tile (the Hopper backward's search
    # window refills past 32; GQA wraps back to the first window)
    ("segruns causal gqa", 1, 2500, 2500, 4, 2, 128),
    ("segruns gqa", 1, 4400, 4400, 4, 2, 64),
    # long documents and one document over many tiles: the Hopper forward's
    # masks kernel for segment ids, and with ALiBi the d128 kernel whose
    # interior runs cover the key tiles of the query tile's one id
    ("seglong causal", 2, 1500, 1500, 2, 1, 64),
    ("seglong window lengths", 1, 1000, 1000, 4, 2, 128),
    ("segone causal lengths", 2, 700, 700, 2, 1, 128),
    ("seglong causal alibi", 1, 1200, 1200, 2, 1, 128),
    ("segone causal alibi lengths", 2, 700, 700, 2, 1, 128),
    # head dims without their own variants kernels (run zero-padded on 128 / 256 / 64)
    ("causal window", 2, 150, 170, 4, 2, 96),
    ("softcap lengths", 2, 133, 129, 2, 1, 160),
    ("segments causal dropout", 2, 200, 200, 2, 2, 40),
    # head dims 32 and below: their own variants kernel (32) on SM80, padded on the Hopper 64 ones there
    ("causal window lengths", 2, 300, 280, 4, 2, 32),
    ("softcap alibi dropout segments", 1, 200, 230, 2, 1, 32),
    ("causal softcap segruns", 1, 500, 500, 2, 1, 24),
    # masks-only options on the wide-head Hopper backward (256; 192 padded)
    ("window lengths", 2, 333, 300, 4, 2, 256),
    ("segruns causal", 1, 900, 900, 2, 1, 256),
    ("segments causal window batchoff", 2, 500, 500, 2, 2, 192),
    # logits on it: soft-cap (P^T (1 - t^2) handed over), ALiBi + dropout, all three at 224
    ("softcap causal", 2, 333, 300, 4, 2, 256),
    ("alibi dropout lengths", 1, 400, 420, 2, 1, 256),
    ("softcap segruns causal", 1, 700, 700, 2, 1, 192),
    ("softcap alibi dropout window", 1, 300, 300, 2, 1, 224),
    # dropout on the d256 forward (its overlapped loop) and backward
    ("dropout causal gqa d256", 2, 333, 333, 4, 2, 256),
    # ALiBi slopes of every sign and size (alibiX), over many tiles: below,
    # above and straddling tiles (two-sided), a bottom-right offset (causal,
    # keys far before the queries), soft-cap with it, and the d256 loop
    ("alibiX", 2, 200, 333, 6, 3, 64),
    ("alibiX causal offset", 2, 130, 700, 6, 2, 128),
    ("alibiX softcap window", 1, 300, 280, 6, 2, 128),
    ("alibiX causal", 1, 300, 300, 6, 2, 256),
]


def _inputs(seed, b, sq, sk, hq, hkv, d, dtype):
    rng = np.random.default_rng(seed)
    mk = lambda *shape: jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype=dtype)
    return mk(b, sq, hq, d), mk(b, sk, hkv, d), mk(b, sk, hkv, d), mk(b, sq, hq, d)


def _on(dev, tree):
    return jax.tree_util.tree_map(lambda x: jax.device_put(x, dev) if isinstance(x, jax.Array) else x, tree)


def _max_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0].replace(" ", "+") for c in CASES])
def test_cuda_variant_forward_and_grads_match_reference_and_cpu(case, dtype):
    _check_case(case, dtype)


# Rows whose max keeps rising over the visited key tiles (scores rising by
# `slope` a key toward key 0; tiles are visited last to first): the forward
# rescales O only when a row's max moves by more than 2^8, which random
# scores almost never do after their first tile.
RISING_CASES = [
    ("lengths causal", 2, 333, 701, 2, 1, 128),
    ("softcap", 1, 300, 650, 2, 2, 128),
    ("alibi causal", 1, 650, 650, 2, 1, 64),
    ("dropout", 1, 300, 650, 2, 1, 128),
    ("segments window", 1, 500, 500, 2, 1, 256),
]


@pytest.mark.parametrize("slope", [0.08, 0.3])
@pytest.mark.parametrize("case", RISING_CASES, ids=[c[0].replace(" ", "+") for c in RISING_CASES])
def test_cuda_variant_rising_row_max(case, slope):
    _check_case(case, jnp.bfloat16, rising_slope=slope)


def _check_case(case, dtype, rising_slope=None):
    name, b, sq, sk, hq, hkv, d = case
    skip_unless_cuda_head_dim(d, variants=True)
    gpu, cpu = _GPUS[0], jax.devices("cpu")[0]
    q, k, v, do = _inputs(3, b, sq, sk, hq, hkv, d, dtype)
    if rising_slope is not None:
        q, k = rising_max(q, k, rising_slope)
    opts = _make_case(name, b, sq, sk, hq, hkv, d, seed=5)
    kw = _ref_kwargs(opts, b, sq, sk, hq)

    def run(dev):
        args = _on(dev, (q, k, v, do))
        o_opts = _on(dev, opts)
        f = lambda q, k, v: jax_flash.attention(q, k, v, **o_opts)
        o, vjp = jax.vjp(f, *args[:3])
        _, lse = jax_flash.attention(*args[:3], return_lse=True, **o_opts)
        grads = vjp(args[3])
        return (np.asarray(o.astype(jnp.float32)), np.asarray(lse),
                [np.asarray(g.astype(jnp.float32)) for g in grads])

    o, lse, grads = run(gpu)
    o_cpu, lse_cpu, grads_cpu = run(cpu)
    o_ref, lse_ref = (np.asarray(x) for x in _reference(q, k, v, cdt=jnp.float32, **kw))
    o_naive, _ = (np.asarray(x) for x in _reference(q, k, v, cdt=dtype, **kw))

    assert np.isfinite(o).all(), "non-finite output"
    err, err_naive = _max_err(o, o_ref), _max_err(o_naive, o_ref)
    assert err <= 2 * err_naive + ABS_SLACK, f"o error {err:.3e} > 2 x naive {err_naive:.3e}"
    empty = ~np.isfinite(lse_ref)
    assert np.all(np.isneginf(lse[empty])), "rows that see no key must give lse = -inf"
    assert np.all(o.transpose(0, 2, 1, 3)[empty] == 0), "rows that see no key must give o = 0"
    lse_err = np.max(np.abs(lse[~empty] - lse_ref[~empty]) / (1 + np.abs(lse_ref[~empty])), initial=0)
    assert lse_err <= 1e-4, f"lse relative error {lse_err:.3e}"
    # Same kernels' contract on the CPU target (the dropout mask included).
    assert _max_err(o, o_cpu) <= 4 * err_naive + 2 * ABS_SLACK, "CUDA and CPU outputs differ"
    assert np.array_equal(np.isneginf(lse), np.isneginf(lse_cpu))

    g_ref = _ref_grads(q, k, v, do, jnp.float32, **kw)
    g_naive = _ref_grads(q, k, v, do, dtype, **kw)
    for nm, g, gc, gr, gn in zip("qkv", grads, grads_cpu, g_ref, g_naive):
        assert np.isfinite(g).all(), f"d{nm}: non-finite"
        e, en = _max_err(g, gr), _max_err(gn, gr)
        scale = max(1.0, float(np.max(np.abs(gr))))
        assert e <= 3 * en + 1e-4 * scale, f"d{nm} error {e:.3e} > 3 x naive {en:.3e}"
        assert _max_err(g, gc) <= 6 * en + 2e-4 * scale, f"d{nm}: CUDA and CPU differ"
    if "query_seq_lengths" in opts:
        ql = np.asarray(opts["query_seq_lengths"])
        for bb in range(b):
            assert np.all(grads[0][bb, ql[bb]:] == 0), "padded query rows must get zero dq"
            assert np.all(o[bb, ql[bb]:] == 0), "padded query rows must give o = 0"


# Every option with and without segment ids over many tiles, which the
# Hopper kernels run in deterministic mode (their dQ reduces ranked per
# query tile by the key tiles that visit it; with segment ids the kSegOrder
# instantiations).
DET_CASES = [
    ("causal window segments lengths softcap alibi dropout", 2, 190, 210, 4, 2, 64),
    ("causal window lengths batchoff", 2, 1100, 900, 4, 2, 128),
    ("window offset", 1, 700, 1300, 2, 1, 64),
    ("lengths gqa", 3, 517, 517, 8, 2, 128),
    ("causal softcap alibi", 2, 700, 650, 4, 2, 128),
    ("alibi batchoff", 2, 600, 800, 4, 4, 128),
    ("causal lengths softcap", 2, 517, 517, 4, 2, 64),
    ("window dropout", 1, 900, 1000, 2, 1, 64),
    ("causal softcap dropout", 2, 600, 650, 4, 2, 128),
    ("alibi dropout lengths", 1, 700, 800, 2, 1, 64),
    ("causal window softcap d32", 2, 600, 600, 4, 2, 32),
    ("segments causal dropout d32", 1, 650, 650, 2, 1, 32),
    # the wide-head kernel's order keeper (256; 192 and 224 padded)
    ("causal window lengths batchoff d256", 2, 700, 600, 4, 2, 256),
    ("window offset gqa", 1, 500, 900, 4, 2, 192),
    ("causal softcap alibi d256", 1, 650, 650, 2, 1, 256),
    ("causal alibi dropout lengths", 2, 500, 520, 4, 2, 224),
    # segment ids on it (the wide kSegOrder kernel): in order, recurring, in order with a window at 192
    ("causal segments gqa d256", 2, 900, 900, 4, 2, 256),
    ("segruns lengths d256", 1, 800, 700, 2, 1, 256),
    ("causal seglong window", 1, 1100, 1100, 2, 1, 192),
    ("segqone d256", 1, 500, 900, 2, 1, 256),
    # segment ids with a transform set (the kSegOrder logits kernels): in order and recurring,
    # soft-cap / ALiBi / dropout, at 64, 128 and 256
    ("causal segments softcap", 2, 700, 700, 4, 2, 128),
    ("segruns alibi dropout lengths", 1, 900, 800, 2, 1, 128),
    ("causal segruns softcap dropout gqa", 1, 800, 800, 4, 2, 64),
    ("causal segments alibi d256", 1, 600, 600, 2, 1, 256),
    ("segruns softcap dropout d256", 1, 500, 520, 2, 1, 256),
    # segment ids, masks only (the Hopper kSegOrder kernels keep the band's
    # tiles and order the skipped ones too): long documents, recurring ids
    ("causal seglong", 2, 1100, 1100, 4, 2, 128),
    ("segruns gqa", 1, 900, 700, 4, 2, 64),
    ("segruns window lengths", 1, 1000, 1000, 2, 1, 128),
    # sorted ids (documents in order: the dQ order ranks the visiting CTAs alone); one query
    # document against two key documents, non-causal: CTAs of one id beside CTAs that visit nothing
    ("causal segments gqa", 2, 1500, 1500, 4, 2, 64),
    ("segments window", 1, 1300, 1100, 2, 1, 128),
    ("segqone", 2, 700, 1500, 4, 2, 128),
]


@pytest.mark.parametrize("case", DET_CASES, ids=[c[0].replace(" ", "+") for c in DET_CASES])
@pytest.mark.parametrize("deterministic", [False, True])
def test_cuda_variant_grads_deterministic_mode_matches_atomic(deterministic, case):
    _check_det_case(case, jnp.bfloat16, deterministic)


# fp16 has units of its own (the same templates): one deterministic case per
# kernel family, segment ids included.
DET_FP16_CASES = [
    ("causal window lengths softcap", 1, 600, 650, 4, 2, 64),
    ("causal segments softcap dropout", 1, 700, 700, 2, 1, 128),
    ("segruns window lengths", 1, 800, 700, 2, 1, 128),
    ("causal segments alibi d256", 1, 600, 600, 2, 1, 256),
    ("segruns lengths d256", 1, 700, 650, 2, 1, 256),
]


@pytest.mark.parametrize("case", DET_FP16_CASES, ids=[c[0].replace(" ", "+") for c in DET_FP16_CASES])
@pytest.mark.parametrize("dtype", [jnp.float16], ids=["fp16"])  # (a parameter: bf16-only builds skip it)
def test_cuda_variant_grads_deterministic_fp16(dtype, case):
    _check_det_case(case, dtype, True)


def _check_det_case(case, dtype, deterministic):
    name, b, sq, sk, hq, hkv, d = case
    skip_unless_cuda_head_dim(d, variants=True)
    q, k, v, do = _on(_GPUS[0], _inputs(9, b, sq, sk, hq, hkv, d, dtype))
    opts = _on(_GPUS[0], _make_case(name, b, sq, sk, hq, hkv, d))
    kw = _ref_kwargs(opts, b, sq, sk, hq)

    def grads(det):
        f = lambda q, k, v: jax_flash.attention(q, k, v, deterministic=det, **opts)
        return [np.asarray(g.astype(jnp.float32)) for g in jax.vjp(f, q, k, v)[1](do)]

    g1 = grads(deterministic)
    g_ref = _ref_grads(q, k, v, do, jnp.float32, **kw)
    g_naive = _ref_grads(q, k, v, do, dtype, **kw)
    for g, gr, gn in zip(g1, g_ref, g_naive):
        assert _max_err(g, gr) <= 3 * _max_err(gn, gr) + 1e-4 * max(1.0, float(np.abs(gr).max()))
    if deterministic:
        g2 = grads(True)
        for a, c in zip(g1, g2):
            assert np.array_equal(a, c), "deterministic mode must be bitwise reproducible"


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("sq,sk,d", [(100, 64, 64), (300, 128, 128), (150, 200, 256)])
def test_cuda_dropout_mask_is_the_cpu_mask_bit_for_bit(dtype, sq, sk, d):
    """q = k = 0 gives uniform P = 1 / sk; v = identity makes o[i, h, j] =
    keep[h, i, j] / ((1 - rate) sk): the kept set is read back exactly.
    Several query and key tiles of each head dim's forward kernel (the
    Hopper dropout kernels on sm_90a builds)."""
    skip_unless_cuda_head_dim(d, variants=True)
    b, hq, rate = 2, 3, 0.3
    key = jax.random.key(1234)
    q = jnp.zeros((b, sq, hq, d), dtype)
    k = jnp.zeros((b, sk, hq, d), dtype)
    v = jnp.broadcast_to(jnp.eye(sk, d, dtype=dtype)[None, :, None, :], (b, sk, hq, d))
    keep = np.asarray(jax_flash.dropout_mask(key, rate, b, hq, sq, sk))
    assert keep.shape == (b, hq, sq, sk) and keep.dtype == np.bool_
    assert abs(keep.mean() - (1 - rate)) < 0.02
    for dev in (_GPUS[0], jax.devices("cpu")[0]):
        o = jax_flash.attention(*_on(dev, (q, k, v)), dropout_rate=rate, dropout_rng=_on(dev, key))
        got = np.asarray(o.astype(jnp.float32)).transpose(0, 2, 1, 3)[..., :sk] > 0
        assert np.array_equal(got, keep), f"dropout keep mask differs on {dev.platform}"


def test_cuda_segments_skip_cross_document_work_exactly():
    """Two documents packed back to back give the same result as running each
    alone (no leakage across the boundary, forward and gradients)."""
    b, s1, s2, h, d = 1, 150, 190, 2, 128
    skip_unless_cuda_head_dim(d, variants=True)
    q, k, v, do = _inputs(4, b, s1 + s2, s1 + s2, h, h, d, jnp.bfloat16)
    ids = jnp.asarray(np.r_[np.zeros(s1), np.ones(s2)][None].astype(np.int32))
    dev = _GPUS[0]
    q, k, v, do, ids = _on(dev, (q, k, v, do, ids))
    f = lambda q, k, v: jax_flash.attention(q, k, v, causal=True, q_segment_ids=ids, kv_segment_ids=ids)
    o, vjp = jax.vjp(f, q, k, v)
    g = vjp(do)
    for lo, hi in ((0, s1), (s1, s1 + s2)):
        fs = lambda q, k, v: jax_flash.attention(q, k, v, causal=True)
        os_, vjps = jax.vjp(fs, q[:, lo:hi], k[:, lo:hi], v[:, lo:hi])
        gs = vjps(do[:, lo:hi])
        np.testing.assert_allclose(np.asarray(o[:, lo:hi], np.float32), np.asarray(os_, np.float32), atol=2e-2)
        for a, c in zip(g, gs):
            c = np.asarray(c, np.float32)
            tol = 2e-2 * max(1.0, float(np.abs(c).max()))  # bf16: different tile alignment, same math
            np.testing.assert_allclose(np.asarray(a[:, lo:hi], np.float32), c, atol=tol)


@pytest.mark.parametrize("d,sk", [(64, 4099), (128, 4099), (128, 140_003)])
def test_cuda_segment_walk_forward_over_many_key_tiles(d, sk):
    """The Hopper forward walks key tiles by segment-id bits in shared memory
    for up to 2048 tiles (131072 keys at d128) and by the ranges in global
    memory past that; both, with ids that recur so tiles between meeting
    ones are skipped, against the float32 reference."""
    skip_unless_cuda_head_dim(d, variants=True)
    b, sq, h = 1, 200, 2
    rng = np.random.default_rng(11)
    qseg = np.where(np.arange(sq) < 120, 0, 1)[None].astype(np.int32)  # ranges [0, 1] and [1, 1]
    kvseg = _seg_runs(rng, b, sk)
    q, k, v, _ = _inputs(7, b, sq, sk, h, h, d, jnp.bfloat16)
    kw = dict(qseg=jnp.asarray(qseg), kvseg=jnp.asarray(kvseg))
    dev = _GPUS[0]
    ids = _on(dev, (jnp.asarray(qseg), jnp.asarray(kvseg)))
    o = jax_flash.attention(*_on(dev, (q, k, v)), q_segment_ids=ids[0], kv_segment_ids=ids[1])
    o = np.asarray(o.astype(jnp.float32))
    o_ref, _ = (np.asarray(x) for x in _reference(q, k, v, cdt=jnp.float32, **kw))
    o_naive, _ = (np.asarray(x) for x in _reference(q, k, v, cdt=jnp.bfloat16, **kw))
    assert np.isfinite(o).all(), "non-finite output"
    err, err_naive = _max_err(o, o_ref), _max_err(o_naive, o_ref)
    assert err <= 2 * err_naive + ABS_SLACK, f"o error {err:.3e} > 2 x naive {err_naive:.3e}"


@pytest.mark.parametrize("d,cap", [(128, 7.5), (128, 50.0), (128, 51.2), (128, 51.4), (128, 200.0),
                                   (64, 50.0), (256, 50.0), (256, 200.0)])
def test_cuda_softcap_rows_saturated_at_either_bound(d, cap):
    """Soft-cap alone on the Hopper forward: caps up to 51.29 take a fixed
    stabiliser in place of the running max (exp2 arguments within [-124, 24]),
    larger caps the running max. Rows whose logits all sit near -cap (the
    bottom of that range: a row's P must not underflow to 0) and rows near
    +cap, either side of the switch, against the float32 reference: o and
    lse, then the gradients (the backward recomputes P from that lse)."""
    skip_unless_cuda_head_dim(d, variants=True)
    b, sq, sk, h = 1, 190, 333, 2
    rng = np.random.default_rng(int(cap * 10) + d)
    u = rng.standard_normal(d).astype(np.float32)
    beta = 3.0 * cap / np.sqrt(d)  # shared-direction score ~ +-3 cap: tanh saturated
    sign = np.where(np.arange(sq) % 2 == 0, 1.0, -1.0).astype(np.float32)[:, None, None]
    q = sign * beta * u + 0.5 * rng.standard_normal((sq, h, d)).astype(np.float32)
    k = u + 0.5 * rng.standard_normal((sk, h, d)).astype(np.float32)
    v = rng.standard_normal((sk, h, d)).astype(np.float32)
    do = rng.standard_normal((sq, h, d)).astype(np.float32)
    q, k, v, do = (jnp.asarray(x[None], jnp.bfloat16) for x in (q, k, v, do))
    dev = _GPUS[0]
    f = lambda q, k, v: jax_flash.attention(q, k, v, logits_soft_cap=cap)
    args = _on(dev, (q, k, v, do))
    o, vjp = jax.vjp(f, *args[:3])
    _, lse = jax_flash.attention(*args[:3], logits_soft_cap=cap, return_lse=True)
    grads = vjp(args[3])
    o, lse = np.asarray(o.astype(jnp.float32)), np.asarray(lse)
    o_ref, lse_ref = (np.asarray(x) for x in _reference(q, k, v, cdt=jnp.float32, softcap=cap))
    o_naive, _ = (np.asarray(x) for x in _reference(q, k, v, cdt=jnp.bfloat16, softcap=cap))
    assert np.isfinite(o).all() and np.isfinite(lse).all(), "non-finite output"
    # lse - log(sk) is at least a row's mean logit (Jensen) and at most its max.
    assert np.max(lse_ref[0, :, 1::2]) - np.log(sk) < -0.9 * cap, "odd rows must average below -0.9 cap"
    assert np.min(lse_ref[0, :, 0::2]) - np.log(sk) > 0.9 * cap, "even rows must reach above 0.9 cap"
    err, err_naive = _max_err(o, o_ref), _max_err(o_naive, o_ref)
    assert err <= 2 * err_naive + ABS_SLACK, f"o error {err:.3e} > 2 x naive {err_naive:.3e}"
    lse_err = np.max(np.abs(lse - lse_ref) / (1 + np.abs(lse_ref)))
    assert lse_err <= 1e-4, f"lse relative error {lse_err:.3e}"
    g_ref = _ref_grads(q, k, v, do, jnp.float32, softcap=cap)
    g_naive = _ref_grads(q, k, v, do, jnp.bfloat16, softcap=cap)
    for nm, g, gr, gn in zip("qkv", grads, g_ref, g_naive):
        g = np.asarray(g.astype(jnp.float32))
        assert np.isfinite(g).all(), f"d{nm}: non-finite"
        e, en = _max_err(g, gr), _max_err(gn, gr)
        scale = max(1.0, float(np.max(np.abs(gr))))
        assert e <= 3 * en + 1e-4 * scale, f"d{nm} error {e:.3e} > 3 x naive {en:.3e}"
