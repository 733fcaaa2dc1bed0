"""CUDA forward kernel vs a float32 jnp reference (and vs the CPU target).

Runs only where a CUDA GPU is visible (`pytest -m gpu` on the device).
Tolerance the FlashAttention way: the kernel's max error against the float32
reference must stay within 2x the error of naive attention computed in the
inputs' 16-bit dtype (plus a small absolute slack).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_flash
from helpers import gpu_devices, rising_max, skip_unless_cuda_head_dim

_GPUS = gpu_devices()
# conftest.py skips tests marked gpu where JAX sees no GPU.
pytestmark = pytest.mark.gpu

ABS_SLACK = 1e-4


def _repeat_kv(x, group):
    return jnp.repeat(x, group, axis=-2) if group > 1 else x


def _mask(sq, sk, causal):
    if not causal:
        return None
    return jnp.arange(sk)[None, :] <= jnp.arange(sq)[:, None]  # top-left: key j <= query i


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _reference(q, k, v, causal, scale, compute_dtype):
    """Plain attention; compute_dtype float32 = reference, 16-bit = naive."""
    group = q.shape[-2] // k.shape[-2]
    q, k, v = (x.astype(compute_dtype) for x in (q, k, v))
    k, v = _repeat_kv(k, group), _repeat_kv(v, group)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest").astype(compute_dtype) * jnp.asarray(scale, compute_dtype)
    m = _mask(q.shape[1], k.shape[1], causal)
    if m is not None:
        s = jnp.where(m, s, -jnp.inf)
    s32 = s.astype(jnp.float32)
    lse = jax.nn.logsumexp(s32, axis=-1)
    p = jax.nn.softmax(s32, axis=-1).astype(compute_dtype)
    o = jnp.einsum("bhqk,bkhd->bqhd", p, v, precision="highest").astype(compute_dtype)
    return o.astype(jnp.float32), lse


def _inputs(seed, b, sq, sk, hq, hkv, d, dtype):
    rng = np.random.default_rng(seed)
    mk = lambda *shape: jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype=dtype)
    return mk(b, sq, hq, d), mk(b, sk, hkv, d), mk(b, sk, hkv, d)


def _check(b, sq, sk, hq, hkv, d, dtype, causal, seed=0, compare_cpu=True, rising_slope=None, scale=None, q_mul=1.0):
    gpu = _GPUS[0]
    q, k, v = _inputs(seed, b, sq, sk, hq, hkv, d, dtype)
    if q_mul != 1.0:
        q = (q.astype(jnp.float32) * q_mul).astype(dtype)
    if rising_slope is not None:
        q, k = rising_max(q, k, rising_slope)
    q, k, v = (jax.device_put(x, gpu) for x in (q, k, v))
    arg_scale = scale
    scale = 1.0 / np.sqrt(d) if scale is None else scale

    o, lse = jax_flash.attention(q, k, v, causal=causal, scale=arg_scale, return_lse=True)
    o = np.asarray(o.astype(jnp.float32))
    lse = np.asarray(lse)
    assert o.shape == (b, sq, hq, d) and lse.shape == (b, hq, sq)
    assert np.isfinite(o).all(), "non-finite output"
    assert np.isfinite(lse).all(), "non-finite lse"

    o_ref, lse_ref = (np.asarray(x) for x in _reference(q, k, v, causal, scale, jnp.float32))
    o_naive, _ = (np.asarray(x) for x in _reference(q, k, v, causal, scale, dtype))
    err = np.abs(o - o_ref).max()
    err_naive = np.abs(o_naive - o_ref).max()
    assert err <= 2 * err_naive + ABS_SLACK, f"o error {err:.3e} > 2 x naive {err_naive:.3e}"
    lse_err = (np.abs(lse - lse_ref) / (1 + np.abs(lse_ref))).max()
    assert lse_err <= 1e-4, f"lse relative error {lse_err:.3e}"

    if compare_cpu:
        cpu = jax.devices("cpu")[0]
        qc, kc, vc = (jax.device_put(x, cpu) for x in (q, k, v))
        oc, lsec = jax_flash.attention(qc, kc, vc, causal=causal, scale=arg_scale, return_lse=True)
        oc = np.asarray(oc.astype(jnp.float32))
        err_cpu = np.abs(oc - o_ref).max()
        assert err_cpu <= 2 * err_naive + ABS_SLACK, f"cpu o error {err_cpu:.3e}"
        assert np.abs(o - oc).max() <= 4 * err_naive + 2 * ABS_SLACK
        assert np.abs(lse - np.asarray(lsec)).max() <= 1e-3 * (1 + np.abs(lse_ref).max())


HEAD_DIMS = [32, 40, 64, 80, 96, 128, 160, 192, 224, 256, 33]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_cuda_forward_matches_reference_every_head_dim(head_dim, dtype, causal):
    skip_unless_cuda_head_dim(head_dim, variants=head_dim % 8 != 0)  # (element-wise rows: the variants kernels)
    _check(2, 129, 200, 4, 2, head_dim, dtype, causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "sq,sk",
    [(1, 1), (1, 17), (17, 1), (17, 128), (128, 17), (128, 129), (129, 128), (129, 1000),
     (1000, 129), (1000, 1000), (4097, 129), (129, 4097), (4097, 4097)],
)
def test_cuda_forward_matches_reference_odd_seqlens(sq, sk, causal):
    _check(1, sq, sk, 2, 2, 128, jnp.bfloat16, causal, compare_cpu=max(sq, sk) <= 1000)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hkv", [2, 1], ids=["gqa", "mqa"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_cuda_forward_gqa_mqa_batch(head_dim, hkv, causal):
    _check(3, 257, 301, 8, hkv, head_dim, jnp.bfloat16, causal)


# More work tiles than SMs, so each persistent CTA walks several; at d256
# the two consumer warpgroups take turns with one shared-memory O buffer
# across those tiles.
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_cuda_forward_more_tiles_than_sms(head_dim, dtype, causal):
    skip_unless_cuda_head_dim(head_dim)
    _check(3, 1100, 300, 8, 2, head_dim, dtype, causal, compare_cpu=False)


# A consumer warpgroup skips the key tiles its 64 rows do not see: the
# causal tile's last ones, or all of them for rows past seqlen_q (d64's
# three warpgroups take 192-row tiles: 1024 rows leave a last tile of 64,
# 2113 one of 1). It still keeps its ping-pong turns and frees the stages.
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1024, 1024), (1090, 700), (1031, 2049), (2113, 2113)])
@pytest.mark.parametrize("head_dim", [64, 256])
def test_cuda_forward_warpgroups_skip_key_tiles(head_dim, sq, sk, causal):
    skip_unless_cuda_head_dim(head_dim)
    _check(2, sq, sk, 4, 2, head_dim, jnp.bfloat16, causal, compare_cpu=False)


# Rows whose max keeps rising over the visited key tiles: the kernels rescale
# O only when a row's max moves by more than 2^8, so random scores (whose max
# settles in the first tile) never reach that branch; these do, every tile
# (slope 0.3), every few tiles (0.02) or every other tile with P near 2^7
# stored in 16 bits (0.08 at 64-key tiles).
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("slope", [0.02, 0.08, 0.3])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_cuda_forward_rising_row_max(head_dim, slope, causal):
    skip_unless_cuda_head_dim(head_dim)
    _check(1, 333, 701, 2, 1, head_dim, jnp.bfloat16, causal, rising_slope=slope)


# (dtype as a parameter: conftest skips it in a build without float16 kernels)
@pytest.mark.parametrize("dtype", [jnp.float16], ids=["fp16"])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_forward_rising_row_max_fp16(causal, dtype):
    _check(2, 700, 700, 2, 2, 128, dtype, causal, rising_slope=0.08)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_cuda_forward_negative_scale(head_dim, causal):
    # Large scores under a negative scale: a softmax that subtracts the
    # running max of the raw scores (not of the scaled ones) overflows exp2.
    _check(2, 300, 333, 2, 1, head_dim, jnp.bfloat16, causal, scale=-0.3, q_mul=4.0, compare_cpu=False)


@pytest.mark.parametrize("dtype", [jnp.float16], ids=["fp16"])
def test_cuda_forward_fp16_long_causal(dtype):
    _check(2, 1031, 2049, 4, 4, 64, dtype, True, compare_cpu=False)
