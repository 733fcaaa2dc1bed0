"""Shared test utilities: random inputs and FlashAttention-style tolerances."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash.reference import attention_reference, attention_reference_grad_np, attention_reference_np


def random_qkv(seed, batch, sq, sk, hq, hkv, d, dtype, device=None):
    """Fresh standard-normal q, k, v (never zeros) in `dtype`."""
    rng = np.random.default_rng(seed)
    shapes = ((batch, sq, hq, d), (batch, sk, hkv, d), (batch, sk, hkv, d))
    arrays = [jnp.asarray(rng.standard_normal(s, dtype=np.float32), dtype=dtype) for s in shapes]
    if device is not None:
        arrays = [jax.device_put(a, device) for a in arrays]
    return arrays


def rising_max(q, k, slope):
    """q, k with scores that rise by `slope` (natural-log units, at the default
    scale) a key toward key 0: the kernels visit key tiles from the last to the
    first, so every row's running max keeps rising, per tile by less or more
    than the online softmax's rescale slack (2^8 in exp2 units) depending on
    the slope and the tile width."""
    scale = 1.0 / np.sqrt(q.shape[-1])
    bias = (-slope / scale * np.arange(k.shape[1])).astype(np.float32)
    return q.at[..., 0].set(1), k.at[..., 0].set(jnp.asarray(bias, k.dtype)[None, :, None])


def max_err(a, ref) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(ref, dtype=np.float64))))


def assert_fa_close(name, out, ref64, naive, factor=3.0, atol=1e-5, magnitude=None, design_err=0.0):
    """FlashAttention's criterion: the kernel's error against the float64
    reference stays within `factor` x the error of a naive attention computed
    in the same precision, plus a small absolute slack for exact cases.
    `magnitude` sets the scale of that slack where the exact result is ~0 by
    cancellation (e.g. dq, dk with one key): the size of the cancelling terms.
    `design_err`: error the algorithm itself implies beyond the naive one
    (e.g. design_grad_errors), allowed `factor` times too."""
    out64 = np.asarray(out, dtype=np.float64)
    assert np.all(np.isfinite(out64)), f"{name}: non-finite values"
    err = max_err(out64, ref64)
    naive_err = max_err(naive, ref64)
    scale = max(1.0, float(np.max(np.abs(ref64))), magnitude or 0.0)
    assert err <= factor * (naive_err + design_err) + atol * scale, (
        f"{name}: error {err:.3e} vs naive {naive_err:.3e} + design {design_err:.3e} "
        f"(factor {factor}, atol {atol * scale:.1e})"
    )


def design_grad_errors(q, k, v, do, causal, scale=None):
    """How far the float64 gradients move when D = rowsum(dO * O) is taken
    from O rounded to q's dtype, as the backward takes it (FlashAttention's
    design: O is the saved residual). Where a row's dS cancels (dq of a row
    whose keys nearly coincide, e.g. two keys) this exceeds the naive
    attention's error, which never rounds O before D."""
    f64 = [np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64) for x in (q, k, v)]
    do = np.asarray(do, np.float64)
    o, _ = attention_reference_np(*f64, causal=causal, scale=scale)
    o_saved = np.asarray(jnp.asarray(o, q.dtype).astype(jnp.float32), np.float64)
    d_exact = np.einsum("...qhd,...qhd->...hq", do, o)
    d_saved = np.einsum("...qhd,...qhd->...hq", do, o_saved)
    exact = attention_reference_grad_np(*f64, do, causal=causal, scale=scale)
    # dlse enters as D - dlse: dlse = D_exact - D_saved gives D_saved.
    saved = attention_reference_grad_np(*f64, do, causal=causal, scale=scale, dlse=d_exact - d_saved)
    return [max_err(a, b) if a.size else 0.0 for a, b in zip(saved, exact)]


def naive_in_dtype(q, k, v, causal, scale=None):
    """The naive attention in q's own dtype (the precision baseline)."""
    return attention_reference(q, k, v, causal=causal, scale=scale, dtype=q.dtype)


def naive_grads_in_dtype(q, k, v, do, causal, scale=None):
    def loss(q, k, v):
        o, _ = attention_reference(q, k, v, causal=causal, scale=scale, dtype=q.dtype)
        return jnp.sum(o.astype(jnp.float32) * do)

    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)


def gpu_devices():
    """The CUDA devices JAX sees (empty without a GPU)."""
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


def skip_unless_cuda_head_dim(d, variants=False):
    """Skip a GPU case whose head dim has no kernel in this build (builds for
    a subset of head dims, JAX_FLASH_CUDA_HEAD_DIMS / _VARIANT_HEAD_DIMS: a
    head dim runs on the smallest compiled one >= it). Full builds skip
    nothing."""
    import pytest
    from jax_flash import _ffi

    built = _ffi.cuda_head_dims(variants)
    # (a CUDA build has plain kernels; its variants ones may be none at all)
    if _ffi.cuda_head_dims(False) and not any(x >= d for x in built):
        pytest.skip(f"head_dim {d}: no {'variants ' if variants else ''}CUDA kernel in this build {built}")


def unbuilt_cuda_kernels(params, keywords, built, float32_built) -> str | None:
    """What a GPU test needs that this build has no CUDA kernels for, or None:
    float32 (TF32) for tests marked tf32, else unbuilt_cuda_dtype. `built`:
    jax_flash._ffi.cuda_dtypes(); empty (a CPU-only build) means nothing to
    check; float32_built: jax_flash._ffi.cuda_float32()."""
    if not built and not float32_built:
        return None
    if "tf32" in keywords and not float32_built:
        return "float32 (tf32)"
    return unbuilt_cuda_dtype(params or {}, built)


def unbuilt_cuda_dtype(params, built) -> str | None:
    """The 16-bit dtype among a test's parameters that this build has no CUDA
    kernels for (JAX_FLASH_CUDA_DTYPES left it out), or None. `built`:
    jax_flash._ffi.cuda_dtypes() ("bfloat16", "float16"); empty (a CPU-only
    build) means nothing to check."""
    if not built:
        return None
    for value in params.values():
        try:
            name = jnp.dtype(value).name
        except (TypeError, ValueError):
            continue
        if name in ("bfloat16", "float16") and name not in built:
            return name
    return None
