"""CUDA backward kernels (through jax_flash.attention's custom_vjp) vs float32
jnp reference gradients.

Runs only where a CUDA GPU is visible (`pytest -m gpu` on the device).
Tolerance the FlashAttention way: the kernel's max gradient error against the
float32 reference must stay within 3x the error of naive attention
differentiated in the inputs' 16-bit dtype, plus a small slack relative to the
gradient's magnitude.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_flash
from jax_flash import _ffi
from helpers import gpu_devices, skip_unless_cuda_head_dim

_GPUS = gpu_devices()
# conftest.py skips tests marked gpu where JAX sees no GPU.
pytestmark = pytest.mark.gpu

REL_SLACK = 1e-4


def _mask(sq, sk, causal):
    if not causal:
        return None
    return jnp.arange(sk)[None, :] <= jnp.arange(sq)[:, None]  # top-left: key j <= query i


@functools.partial(jax.jit, static_argnums=(3, 4))
def _reference(q, k, v, causal, compute_dtype):
    """Plain attention in compute_dtype (float32 = reference, 16-bit = naive)."""
    group = q.shape[-2] // k.shape[-2]
    scale = 1.0 / np.sqrt(q.shape[-1])
    q, k, v = (x.astype(compute_dtype) for x in (q, k, v))
    if group > 1:
        k, v = jnp.repeat(k, group, axis=-2), jnp.repeat(v, group, axis=-2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest") * jnp.asarray(scale, compute_dtype)
    m = _mask(q.shape[1], k.shape[1], causal)
    if m is not None:
        s = jnp.where(m, s, -jnp.inf)
    p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(compute_dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v, precision="highest")


def _inputs(seed, b, sq, sk, hq, hkv, d, dtype):
    rng = np.random.default_rng(seed)
    mk = lambda *shape: jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype=dtype)
    return mk(b, sq, hq, d), mk(b, sk, hkv, d), mk(b, sk, hkv, d), mk(b, sq, hq, d)


def _grads(fn, q, k, v, do):
    _, vjp = jax.vjp(fn, q, k, v)
    return [g.astype(jnp.float32) for g in vjp(do.astype(jnp.result_type(q)))]


def _ref_grads(q, k, v, do, causal, compute_dtype):
    cast = lambda x: x.astype(compute_dtype)
    fn = lambda a, b, c: _reference(a, b, c, causal, compute_dtype)
    return _grads(fn, cast(q), cast(k), cast(v), cast(do))


def _check(got, ref, naive, what):
    for name, g, r, n in zip(("dq", "dk", "dv"), got, ref, naive):
        g, r, n = (np.asarray(x, dtype=np.float64) for x in (g, r, n))
        assert np.isfinite(g).all(), f"{what} {name}: non-finite gradient"
        err = np.abs(g - r).max(initial=0.0)
        err_naive = np.abs(n - r).max(initial=0.0)
        tol = 3.0 * err_naive + REL_SLACK * np.abs(r).max(initial=0.0) + 1e-6
        assert err <= tol, f"{what} {name}: err {err:.3e} > tol {tol:.3e} (naive {err_naive:.3e})"


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
_SHAPES = [
    (2, 128, 128, 4, 4, 64),
    (1, 17, 129, 8, 2, 128),     # GQA 8/2, Sq < Sk
    (2, 129, 17, 4, 1, 32),      # MQA, Sq > Sk
    (1, 1000, 1000, 2, 1, 128),
    (2, 1, 129, 2, 2, 96),
    (1, 257, 1000, 4, 2, 256),
    (2, 97, 61, 4, 2, 256),      # d256, Sq > Sk, odd: the wgmma wide-head kernel on sm_90a builds
    (1, 1531, 701, 4, 1, 256),   # d256 GQA 4:1: many steps a CTA through the Q / dO rings and dQ parts
    (2, 1000, 129, 2, 2, 40),
    (1, 129, 128, 8, 8, 80),
    (1, 128, 17, 2, 1, 160),
    (1, 65, 130, 4, 2, 192),
    (1, 130, 65, 2, 2, 224),
    (2, 77, 93, 4, 2, 36),       # not a multiple of 8: the scalar preprocess / dQ convert kernels
]


@pytest.mark.parametrize("shape", _SHAPES, ids=lambda s: "b{}_sq{}_sk{}_h{}-{}_d{}".format(*s))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
def test_backward_grads_match_reference(shape, causal, dtype):
    b, sq, sk, hq, hkv, d = shape
    skip_unless_cuda_head_dim(d, variants=d % 8 != 0)  # (element-wise rows: the variants kernels)
    q, k, v, do = _inputs(sum(shape) + causal, b, sq, sk, hq, hkv, d, dtype)
    fn = lambda a, bb, c: jax_flash.attention(a, bb, c, causal=causal)
    got = _grads(fn, q, k, v, do)
    ref = _ref_grads(q, k, v, do, causal, jnp.float32)
    naive = _ref_grads(q, k, v, do, causal, dtype)
    _check(got, ref, naive, f"{shape} causal={causal} {jnp.dtype(dtype).name}")


# The Hopper kernels (head dims exactly 64, 128 and 256) order their dQ
# reduces across key tiles: many key tiles, GQA, Sq != Sk (causal: key tiles
# past the last query see nothing) exercise that order (2 x 8 kv heads x 17
# key tiles at 2049: more CTAs than an H100 holds at once; 1100 x 640 at 256:
# the rotated order, 10 key tiles starting at different query tiles).
@pytest.mark.parametrize("shape", [(2, 515, 515, 8, 2, 128), (1, 1031, 2053, 4, 4, 64), (1, 2053, 777, 6, 3, 64),
                                   (2, 2049, 2049, 8, 8, 128), (2, 333, 517, 8, 2, 256), (1, 1100, 640, 4, 2, 256)],
                         ids=lambda s: "b{}_sq{}_sk{}_h{}-{}_d{}".format(*s))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_deterministic_backward_is_bitwise_reproducible_and_close_to_atomic(shape, causal):
    skip_unless_cuda_head_dim(shape[5])
    q, k, v, do = _inputs(3, *shape, jnp.bfloat16)

    def grads(deterministic):
        fn = lambda a, b, c: jax_flash.attention(a, b, c, causal=causal, deterministic=deterministic)
        return [np.asarray(g) for g in _grads(fn, q, k, v, do)]

    first, second = grads(True), grads(True)
    for a, b in zip(first, second):
        assert np.array_equal(a, b), "deterministic backward differs between runs"
    atomic = grads(False)
    ref = _ref_grads(q, k, v, do, causal, jnp.float32)
    naive = _ref_grads(q, k, v, do, causal, jnp.bfloat16)
    _check(first, ref, naive, "deterministic")
    _check(atomic, ref, naive, "atomic")
    for a, b in zip(first, atomic):
        np.testing.assert_allclose(a, b, atol=3e-2 * np.abs(b).max(), rtol=0)


# Atomic mode runs the ordered path on large grids of plain rows (causal <= 1k,
# non-causal <= 4k at d64 / d128: bwd_prefers_order, >= 8 CTAs an SM): these
# grids (2048 CTAs) take it on an H100 / H200, so atomic mode must then give
# exactly the deterministic result, and both match the reference.
@pytest.mark.parametrize("shape", [(16, 1024, 1024, 16, 16, 128), (16, 1024, 1024, 16, 16, 64),
                                   (4, 4000, 4000, 16, 16, 128)],
                         ids=lambda s: "b{}_sq{}_sk{}_h{}-{}_d{}".format(*s))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_atomic_mode_on_large_plain_grids_runs_ordered(shape, causal):
    skip_unless_cuda_head_dim(shape[5])
    if causal and shape[1] > 1024:
        pytest.skip("causal rows over 1k run atomic")
    q, k, v, do = _inputs(7, *shape, jnp.bfloat16)

    def grads(deterministic):
        fn = lambda a, b, c: jax_flash.attention(a, b, c, causal=causal, deterministic=deterministic)
        return [np.asarray(g) for g in _grads(fn, q, k, v, do)]

    atomic, det = grads(False), grads(True)
    # The Hopper kernels' ordered path: sm_90a builds, head dims built exactly
    # (a d128-only build runs d64 on the SM80 kernels, with real atomics).
    hopper = "90a" in (_ffi.cuda_archs() or "").split(";") and shape[5] in _ffi.cuda_head_dims()
    if gpu_devices()[0].compute_capability == "9.0" and hopper:
        for name, a, b in zip("qkv", atomic, det):
            assert np.array_equal(a, b), f"atomic d{name} is not the ordered (deterministic) result"
    ref = _ref_grads(q, k, v, do, causal, jnp.float32)
    naive = _ref_grads(q, k, v, do, causal, jnp.bfloat16)
    _check(atomic, ref, naive, "atomic, ordered")


# Long causal rows, many key tiles (2 x 20 pairs of 65 key tiles: more CTAs
# than an H100 holds at once), run ten times: every run bitwise equal to the
# first. Too long for an S x S reference here; the atomic mode is checked
# against one above.
@pytest.mark.parametrize("shape", [(2, 8193, 8193, 20, 20, 64), (2, 8200, 8100, 4, 2, 128),
                                   (1, 4097, 4097, 16, 8, 256)],
                         ids=lambda s: "b{}_sq{}_sk{}_h{}-{}_d{}".format(*s))
def test_deterministic_long_causal_is_reproducible_and_matches_atomic(shape):
    skip_unless_cuda_head_dim(shape[5])
    q, k, v, do = _inputs(5, *shape, jnp.bfloat16)

    def grads(deterministic):
        fn = lambda a, b, c: jax_flash.attention(a, b, c, causal=True, deterministic=deterministic)
        return [np.asarray(g).astype(np.float32) for g in _grads(fn, q, k, v, do)]

    first, atomic = grads(True), grads(False)
    for run in range(9):
        again = grads(True)
        for name, a, b in zip("qkv", first, again):
            assert np.array_equal(a, b), f"deterministic d{name} differs between runs 0 and {run + 1}"
    for name, a, c in zip("qkv", first, atomic):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, c, atol=2e-2 * np.abs(c).max(), rtol=0, err_msg=f"d{name}")


def test_jitted_grad_of_small_loss_matches_reference():
    q, k, v, _ = _inputs(11, 2, 77, 91, 4, 2, 64, jnp.bfloat16)

    def loss(fn):
        return lambda a, b, c: jnp.sum(fn(a, b, c).astype(jnp.float32) ** 2)

    flash = loss(lambda a, b, c: jax_flash.attention(a, b, c, causal=True))
    got = jax.jit(jax.grad(flash, argnums=(0, 1, 2)))(q, k, v)
    f32 = lambda x: x.astype(jnp.float32)
    ref = jax.grad(loss(lambda a, b, c: _reference(a, b, c, True, jnp.float32)), argnums=(0, 1, 2))(
        f32(q), f32(k), f32(v))
    naive = jax.grad(loss(lambda a, b, c: _reference(a, b, c, True, jnp.bfloat16)),
                     argnums=(0, 1, 2))(q, k, v)
    _check([f32(g) for g in got], ref, [f32(g) for g in naive], "jit(grad)")


def test_fully_masked_free_rows_have_finite_grads():
    # Sq > Sk with causal: every query row sees at least key 0; grads finite.
    q, k, v, do = _inputs(5, 1, 64, 8, 2, 1, 64, jnp.bfloat16)
    fn = lambda a, b, c: jax_flash.attention(a, b, c, causal=True)
    for g in _grads(fn, q, k, v, do):
        assert np.isfinite(np.asarray(g)).all()


def test_cuda_backward_compiles_to_one_kernel_call_without_a_conditional():
    """ffi_bwd picks the workspace size per platform (jax.lax.platform_dependent):
    on the GPU the compiled program must hold the backward custom call alone,
    no conditional around it (a conditional would read its branch index back
    to the host on every call)."""
    dev = _GPUS[0]
    q = jax.device_put(jnp.ones((2, 300, 4, 64), jnp.bfloat16), dev)
    f = jax.jit(jax.grad(lambda q, k, v: jnp.sum(jax_flash.attention(q, k, v, causal=True).astype(jnp.float32)),
                         argnums=(0, 1, 2)))
    hlo = f.lower(q, q, q).compile().as_text()
    assert hlo.count('custom_call_target="jax_flash_bwd"') == 1, hlo
    assert "conditional(" not in hlo, hlo
