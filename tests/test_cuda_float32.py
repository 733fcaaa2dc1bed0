"""float32 on CUDA (issue 29): TF32 tensor cores with float32 accumulation,
float32 outputs and gradients, every option of jax_flash.attention.

The bar, measured in the same test: the kernel's error against a float64
reference stays within XLA_FACTOR of the error of XLA's own float32 attention
at the same (default) matmul precision on the same GPU --
jax.nn.dot_product_attention(implementation="xla") for plain / causal
attention, and the explicit-mask attention_reference (XLA einsums, float32)
for the options jax.nn has no argument for. Forward (o, lse) and gradients
(dq, dk, dv).

Why a factor and not "no larger": both sides round the same operands to TF32
(round to nearest) and accumulate in float32, so their max errors are draws
from about the same distribution. Measured on an H100 (this file, first
device run) the ratio ours / XLA was 0.6-1.56: o, lse and dv alike (lse and
dv often equal to three digits), dq and dk up to 1.56x because the backward
takes D = rowsum(dO * O) from the saved (TF32) O, FlashAttention's design,
where XLA differentiates the softmax itself. A single key or a single query
(XLA then skips TF32: a GEMV or an element-wise product, error ~0) is held
to the error that rounding the inputs to TF32 alone causes instead.

Runs only where a CUDA GPU is visible (`pytest -m gpu` on the device).
"""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_flash
from helpers import gpu_devices, skip_unless_cuda_head_dim
from jax_flash import _ffi
from jax_flash.reference import attention_reference, attention_reference_grad_np, attention_reference_np

_GPUS = gpu_devices()
pytestmark = [pytest.mark.gpu, pytest.mark.tf32]
F32 = jnp.float32

# Our error / XLA's error allowed (see the module docstring).
XLA_FACTOR = 2.0
# Roundoff slack relative to the reference's magnitude, always allowed.
REL_SLACK = 2e-6


def _round_tf32(x):
    """float32 -> the nearest TF32 value (ties away from zero: cvt.rna)."""
    b = np.asarray(x, np.float32).view(np.uint32)
    return ((b + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def _inputs(seed, b, sq, sk, hq, hkv, d):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, sq, hq, d), dtype=np.float32)
    k = rng.standard_normal((b, sk, hkv, d), dtype=np.float32)
    v = rng.standard_normal((b, sk, hkv, d), dtype=np.float32)
    do = rng.standard_normal((b, sq, hq, d), dtype=np.float32)
    return q, k, v, do


def _err(x, ref) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    fin = np.isfinite(ref)
    assert np.array_equal(np.isfinite(x), fin), "non-finite values where the reference has none"
    return float(np.max(np.abs(x[fin] - ref[fin]), initial=0.0))


def _run(fn, q, k, v, do):
    """o, lse and the vjp of sum(o * do) of fn(q, k, v) -> (o, lse), on the GPU."""
    gpu = _GPUS[0]
    q, k, v, do = (jax.device_put(jnp.asarray(x), gpu) for x in (q, k, v, do))

    @jax.jit
    def f(q, k, v, do):
        (o, lse), vjp = jax.vjp(lambda q, k, v: fn(q, k, v), q, k, v)
        return o, lse, vjp((do, jnp.zeros_like(lse)))

    o, lse, grads = f(q, k, v, do)
    assert o.dtype == F32 and all(g.dtype == F32 for g in grads)
    return [np.asarray(x) for x in (o, lse, *grads)]


def _check(name, q, k, v, do, ours, xla, ref_opts, *, lse_from_xla=True):
    """ours / xla: callables (q, k, v) -> (o, lse); ref_opts: the float64
    reference's keyword arguments. Asserts error(ours) <= error(xla) for o,
    lse (when xla returns one), dq, dk, dv."""
    o64, lse64 = attention_reference_np(q, k, v, **ref_opts)
    g64 = attention_reference_grad_np(q, k, v, do, **ref_opts)
    got = _run(ours, q, k, v, do)
    base = _run(xla, q, k, v, do)
    refs = [o64, lse64, *g64]
    report = []
    for what, a, b, r in zip(("o", "lse", "dq", "dk", "dv"), got, base, refs):
        if what == "lse" and not lse_from_xla:
            continue
        e, e_xla = _err(a, r), _err(b, r)
        slack = REL_SLACK * max(1.0, float(np.max(np.abs(r[np.isfinite(r)]), initial=0.0)))
        report.append(f"{what}: {e:.2e} vs xla {e_xla:.2e} ({e / max(e_xla, 1e-30):.2f}x)")
        assert e <= XLA_FACTOR * e_xla + slack, (
            f"{name} {what}: float32 error {e:.3e} > {XLA_FACTOR} x XLA float32 {e_xla:.3e}")
    print(f"{name}: " + ", ".join(report))


def _flash(**opts):
    return lambda q, k, v: jax_flash.attention(q, k, v, return_lse=True, **opts)


def _xla_ref(**opts):
    return lambda q, k, v: attention_reference(q, k, v, dtype=F32, **opts)


def _jax_nn(causal):
    """jax.nn's XLA float32 attention; lse from the same XLA einsums."""

    def f(q, k, v):
        o = jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")
        _, lse = attention_reference(q, k, v, causal=causal, dtype=F32)
        return o, lse

    return f


# ---------------------------------------------------------------------------
# Plain and causal attention against jax.nn's XLA float32 attention: every
# kernel head dim, zero-padded ones (80 -> 128, 200 -> 256) and the
# element-wise copy path (33: rows not 16 B multiples), odd seqlens, GQA.

@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "b,sq,sk,hq,hkv,d",
    [
        (2, 257, 257, 4, 4, 64),
        (1, 131, 263, 4, 2, 128),
        (2, 200, 77, 2, 1, 32),
        (1, 97, 97, 2, 2, 256),
        (1, 150, 150, 4, 2, 80),
        (1, 61, 70, 2, 1, 33),
        # The Hopper TF32 wgmma forward (head dims 33-128, multiples of 4):
        # batches and GQA groups through the K / V^T copies, keys not whole
        # groups of eight, a zero-padded head dim, several work tiles.
        (3, 300, 517, 6, 2, 64),
        (1, 1000, 1021, 2, 2, 96),
        (2, 130, 9, 4, 1, 128),
    ],
)
def test_float32_matches_float64_no_worse_than_xla(b, sq, sk, hq, hkv, d, causal):
    skip_unless_cuda_head_dim(d)
    q, k, v, do = _inputs(d + sq, b, sq, sk, hq, hkv, d)
    _check(f"d{d} {sq}x{sk} h{hq}/{hkv} causal={causal}", q, k, v, do, _flash(causal=causal),
           _jax_nn(causal), dict(causal=causal))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq,sk", [(1, 300), (300, 1)])
def test_float32_single_query_or_key_within_tf32_input_rounding(sq, sk, causal):
    """One query or one key: XLA computes these without TF32, so the bar is
    the error that rounding q, k, v and dO to TF32 alone causes (float64
    attention of the rounded inputs), times 3, plus for dq and dk a few TF32
    roundings of the terms that cancel there (with one key dS = P (dP - D)
    is exactly 0: dP = dO.v and D = dO.o, o = v, each rounded differently)."""
    q, k, v, do = _inputs(sq + 2 * sk, 1, sq, sk, 2, 2, 64)
    opts = dict(causal=causal)
    o64, lse64 = attention_reference_np(q, k, v, **opts)
    g64 = attention_reference_grad_np(q, k, v, do, **opts)
    rq, rk, rv, rdo = (_round_tf32(x) for x in (q, k, v, do))
    o_r, lse_r = attention_reference_np(rq, rk, rv, **opts)
    g_r = attention_reference_grad_np(rq, rk, rv, rdo, **opts)
    got = _run(_flash(**opts), q, k, v, do)
    scale = 1.0 / np.sqrt(64)
    dp = float(np.max(np.abs(np.einsum("bqhd,bkhd->bhqk", do.astype(np.float64), v.astype(np.float64)))))
    cancel = {"dq": scale * dp * float(np.max(np.abs(k))), "dk": scale * dp * float(np.max(np.abs(q)))}
    for what, a, r, rr in zip(("o", "lse", "dq", "dk", "dv"), got, [o64, lse64, *g64], [o_r, lse_r, *g_r]):
        bar = _err(rr, r)
        mag = max(1.0, float(np.max(np.abs(r[np.isfinite(r)]), initial=0.0)))
        e = _err(a, r)
        allowed = 3.0 * bar + 1e-4 * mag + 4 * 2.0**-11 * cancel.get(what, 0.0)
        assert e <= allowed, f"{sq}x{sk} {what}: error {e:.3e} > {allowed:.3e} (TF32 input rounding {bar:.3e})"


# ---------------------------------------------------------------------------
# Every option, float32, against the explicit-mask XLA float32 attention.

B, SQ, SK, HQ, HKV = 2, 181, 203, 4, 2


def _option(name):
    """(attention kwargs, reference kwargs) for option `name`."""
    rng = np.random.default_rng(3)
    if name == "window":
        o = dict(causal=True, local_window_size=(37, 0))
        return o, o
    if name == "window_two_sided":
        o = dict(local_window_size=(20, 45))
        return o, o
    if name == "softcap":
        o = dict(causal=True, logits_soft_cap=2.5)
        return o, o
    if name == "query_offset":
        o = dict(causal=True, query_offset=SK - SQ)
        return o, o
    if name == "per_batch_offsets":
        o = dict(causal=True, query_offset=jnp.asarray([5, 22], jnp.int32))
        return o, o
    if name == "lengths":
        o = dict(causal=True, query_seq_lengths=jnp.asarray([150, 181], jnp.int32),
                 key_value_seq_lengths=jnp.asarray([203, 96], jnp.int32))
        return o, o
    if name == "segments":
        qs = np.sort(rng.integers(0, 4, (B, SQ))).astype(np.int32)
        ks = np.sort(rng.integers(0, 4, (B, SK))).astype(np.int32)
        o = dict(causal=False, q_segment_ids=jnp.asarray(qs), kv_segment_ids=jnp.asarray(ks))
        return o, o
    if name == "alibi":
        o = dict(causal=True, alibi_slopes=jnp.asarray(rng.uniform(0.01, 0.3, (B, HQ)), F32))
        return o, o
    if name == "softcap_alibi_window":
        o = dict(causal=True, logits_soft_cap=4.0, local_window_size=(60, 0),
                 alibi_slopes=jnp.asarray(rng.uniform(0.01, 0.1, (HQ,)), F32))
        return o, o
    if name == "dropout":
        key = jax.random.key(7)
        mask = jax_flash.dropout_mask(key, 0.2, B, HQ, SQ, SK)
        return (dict(causal=True, dropout_rate=0.2, dropout_rng=key),
                dict(causal=True, dropout_rate=0.2, dropout_mask=mask))
    raise KeyError(name)


OPTIONS = ["window", "window_two_sided", "softcap", "query_offset", "per_batch_offsets", "lengths",
           "segments", "alibi", "softcap_alibi_window", "dropout"]


def _np_opts(opts):
    return {k: (np.asarray(v) if isinstance(v, jax.Array) else v) for k, v in opts.items()}


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("name", OPTIONS)
def test_float32_option_no_worse_than_xla(name, d):
    ours_opts, ref_opts = _option(name)
    q, k, v, do = _inputs(11, B, SQ, SK, HQ, HKV, d)
    gpu = _GPUS[0]
    on_gpu = {k_: (jax.device_put(v_, gpu) if isinstance(v_, jax.Array) and k_ != "dropout_rng" else v_)
              for k_, v_ in ours_opts.items()}
    ref_gpu = {k_: (jax.device_put(v_, gpu) if isinstance(v_, jax.Array) else v_)
               for k_, v_ in ref_opts.items()}
    _check(f"{name} d{d}", q, k, v, do, _flash(**on_gpu), _xla_ref(**ref_gpu), _np_opts(ref_opts))


# ---------------------------------------------------------------------------
# Deterministic gradients, precision requests, the Flax modules.

def test_float32_gradients_are_bitwise_reproducible():
    q, k, v, do = _inputs(5, 2, 333, 333, 4, 2, 64)
    runs = [_run(_flash(causal=True, deterministic=det), q, k, v, do) for det in (True, True, False)]
    for a, b in zip(runs[0], runs[1]):
        assert np.array_equal(a, b)
    for a, b in zip(runs[0], runs[2]):  # the float32 backward has no atomics in either mode
        assert np.array_equal(a, b)


def test_float32_full_precision_request_raises_on_cuda():
    q, k, v, _ = (jax.device_put(jnp.asarray(x), _GPUS[0]) for x in _inputs(1, 1, 64, 64, 2, 2, 64))
    with jax.default_matmul_precision("highest"):
        with pytest.raises(Exception, match="full float32"):
            jax.block_until_ready(jax_flash.attention(q, k, v))
    with jax.default_matmul_precision("float32"):
        with pytest.raises(Exception, match="full float32"):
            jax.block_until_ready(jax.grad(lambda q: jax_flash.attention(q, k, v).sum())(q))
    # TF32-level requests run; bfloat16 inputs (where built) ignore the setting.
    with jax.default_matmul_precision("tensorfloat32"):
        assert np.isfinite(np.asarray(jax_flash.attention(q, k, v))).all()
    if "bfloat16" not in _ffi.cuda_dtypes():
        return
    with jax.default_matmul_precision("highest"):
        o = jax_flash.attention(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16))
        assert np.isfinite(np.asarray(o, np.float32)).all()


def test_float32_full_precision_runs_on_cpu():
    cpu = jax.devices("cpu")[0]
    q, k, v, _ = (jax.device_put(jnp.asarray(x), cpu) for x in _inputs(2, 1, 40, 40, 2, 2, 32))
    with jax.default_matmul_precision("highest"):
        o = jax_flash.attention(q, k, v, causal=True)
    ref, _ = attention_reference_np(*(np.asarray(x) for x in (q, k, v)), causal=True)
    assert np.max(np.abs(np.asarray(o) - ref)) < 1e-5


def test_nnx_multihead_attention_float32_default_runs_on_gpu():
    nnx = pytest.importorskip("flax.nnx")
    import jax_flash.flax as jf

    x = np.random.default_rng(4).standard_normal((2, 200, 128), dtype=np.float32)
    with jax.default_device(_GPUS[0]):
        x = jnp.asarray(x)
        ours = nnx.MultiHeadAttention(4, 128, 256, num_kv_heads=2, decode=False, rngs=nnx.Rngs(0),
                                      attention_fn=jf.attention_fn)
        stock = nnx.MultiHeadAttention(4, 128, 256, num_kv_heads=2, decode=False, rngs=nnx.Rngs(0))

        def loss_and_out(model, **kw):
            gd, st = nnx.split(model)

            def f(st):
                y = nnx.merge(gd, st)(x, **kw)
                return jnp.sum(y * y), y

            (_, y), g = jax.jit(jax.value_and_grad(f, has_aux=True))(st)
            return y, g

        y, g = loss_and_out(ours, is_causal=True)
        y_s, g_s = loss_and_out(stock, mask=nnx.make_causal_mask(x[..., 0]))
    assert y.dtype == F32
    assert np.allclose(np.asarray(y), np.asarray(y_s), atol=5e-3, rtol=5e-3)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_s)):
        a, b = np.asarray(a), np.asarray(b)
        assert np.all(np.isfinite(a))
        assert np.max(np.abs(a - b)) <= 2e-2 * max(1.0, np.max(np.abs(b)))
