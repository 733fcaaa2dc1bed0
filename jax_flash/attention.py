"""jax_flash.attention: validation, the custom_vjp, and the FFI calls."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash import _ffi  # noqa: F401  (registers the FFI targets)
from jax_flash import partitioning as _partitioning
from jax_flash.mask import Mask

SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
MAX_HEAD_DIM = 256


# ---------------------------------------------------------------------------
# Argument checks: run on shapes and dtypes only, before anything is traced.


def _shape_str(x) -> str:
    return "(" + ", ".join(str(d) for d in x.shape) + ")"


def _check_inputs(q, k, v) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"jax_flash.attention: {name} must be an array, got {type(x).__name__}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim < 3:
            raise ValueError(
                f"jax_flash.attention: {name} must have shape [batch..., seqlen, heads, head_dim] "
                f"(rank >= 3), got {name}.shape={_shape_str(x)}"
            )
    for name, x in (("q", q), ("k", k), ("v", v)):
        dt = jnp.dtype(x.dtype)
        if not jnp.issubdtype(dt, jnp.floating):
            raise TypeError(
                f"jax_flash.attention: {name} must be floating point "
                f"(float32, float16 or bfloat16), got {name}.dtype={dt}"
            )
        if dt not in SUPPORTED_DTYPES:
            raise TypeError(
                f"jax_flash.attention: {name}.dtype={dt} is not supported; "
                "use float32, float16 or bfloat16"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            "jax_flash.attention: q, k and v must have the same dtype, got "
            f"q.dtype={jnp.dtype(q.dtype)}, k.dtype={jnp.dtype(k.dtype)}, v.dtype={jnp.dtype(v.dtype)}"
        )
    for name, x in (("q", q), ("k", k), ("v", v)):
        if 0 in x.shape:
            raise ValueError(f"jax_flash.attention: {name} has an empty axis: {name}.shape={_shape_str(x)}")
    if k.shape != v.shape:
        raise ValueError(
            f"jax_flash.attention: k and v must have the same shape, got "
            f"k.shape={_shape_str(k)}, v.shape={_shape_str(v)}"
        )
    if k.ndim != q.ndim or k.shape[:-3] != q.shape[:-3]:
        raise ValueError(
            "jax_flash.attention: q and k/v must have the same batch axes, got "
            f"q.shape={_shape_str(q)}, k.shape={_shape_str(k)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            "jax_flash.attention: q and k/v must have the same head_dim (last axis), got "
            f"q.shape={_shape_str(q)}, k.shape={_shape_str(k)}"
        )
    hq, hkv = q.shape[-2], k.shape[-2]
    if hq % hkv != 0:
        raise ValueError(
            f"jax_flash.attention: the number of q heads ({hq}) must be a multiple of the number "
            f"of k/v heads ({hkv}); got q.shape={_shape_str(q)}, k.shape={_shape_str(k)}"
        )
    d = q.shape[-1]
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(
            f"jax_flash.attention: head_dim must be in [1, {MAX_HEAD_DIM}], got {d} "
            f"(q.shape={_shape_str(q)})"
        )


def is_traced(x) -> bool:
    """True for a value only known at run time (a tracer under jit/vmap/grad),
    using public APIs only: a concrete array converts to a Python scalar."""
    if not isinstance(x, jax.Array) or getattr(x, "ndim", 0) != 0:
        return False
    try:
        x.item()
    except Exception:  # ConcretizationTypeError and friends
        return True
    return False


def _check_scale(scale, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if is_traced(scale):
        raise TypeError("jax_flash.attention: scale must be a static Python number, not a traced value")
    try:
        s = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"jax_flash.attention: scale must be a number, got {scale!r}") from None
    if not math.isfinite(s):
        raise ValueError(f"jax_flash.attention: scale must be finite, got {s}")
    return s


def _static_int(value, name: str) -> int:
    if is_traced(value) or getattr(value, "ndim", 0) > 0:
        raise TypeError(f"jax_flash.attention: {name} must be a static Python int "
                        f"(per-batch arrays are not supported yet), got {type(value).__name__}")
    if isinstance(value, jax.Array):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"jax_flash.attention: {name} must be an int, got {value!r}")
    return int(value)


def _make_mask(causal, local_window_size, logits_soft_cap, query_offset) -> Mask:
    left = right = -1
    if local_window_size is not None:
        if isinstance(local_window_size, (tuple, list)):
            if len(local_window_size) != 2:
                raise ValueError("jax_flash.attention: local_window_size must be an int or a "
                                 f"(left, right) pair, got {local_window_size!r}")
            left, right = (_static_int(w, "local_window_size") for w in local_window_size)
        else:
            left = right = _static_int(local_window_size, "local_window_size")
        if left < 0 or right < 0:
            raise ValueError("jax_flash.attention: local_window_size entries must be >= 0, "
                             f"got {local_window_size!r}")
    cap = 0.0
    if logits_soft_cap is not None:
        if is_traced(logits_soft_cap):
            raise TypeError("jax_flash.attention: logits_soft_cap must be a static Python number")
        cap = float(logits_soft_cap)
        if not (math.isfinite(cap) and cap > 0):
            raise ValueError(f"jax_flash.attention: logits_soft_cap must be a positive finite "
                             f"number, got {logits_soft_cap!r}")
    return Mask(causal=bool(causal), query_offset=_static_int(query_offset, "query_offset"),
                window_left=left, window_right=right, softcap=cap)


# ---------------------------------------------------------------------------
# The raw FFI calls. Each is wrapped in a custom_jvp whose rule raises, so a
# second derivative gives a clear error instead of XLA's generic one.


def _no_higher_order(*_args, **_kwargs):
    raise NotImplementedError(
        "jax_flash.attention supports first-order gradients only (jax.grad, jax.vjp); "
        "higher-order derivatives (grad of grad, jacfwd, jvp) are not implemented. "
        "Use jax.nn.dot_product_attention for those."
    )


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _fwd_call(q, k, v, scale: float, causal: bool):
    # Batch/head sharding under jit: see jax_flash/partitioning.py.
    return _partitioning.fwd(q, k, v, scale, causal)


@_fwd_call.defjvp
def _fwd_call_jvp(scale, causal, primals, tangents):
    _no_higher_order()


@functools.partial(jax.custom_jvp, nondiff_argnums=(6, 7, 8))
def _bwd_call(q, k, v, o, lse, do, scale: float, causal: bool, deterministic: bool):
    return _partitioning.bwd(q, k, v, o, lse, do, scale, causal, deterministic)


@_bwd_call.defjvp
def _bwd_call_jvp(scale, causal, deterministic, primals, tangents):
    _no_higher_order()


# ---------------------------------------------------------------------------
# The differentiable core. Residuals are exactly (q, k, v, o, lse).


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _flash(q, k, v, scale, causal, deterministic):
    return _fwd_call(q, k, v, scale, causal)


def _flash_fwd(q, k, v, scale, causal, deterministic):
    q, k, v = q.value, k.value, v.value
    o, lse = _fwd_call(q, k, v, scale, causal)
    return (o, lse), (q, k, v, o, lse)


def _flash_bwd(scale, causal, deterministic, residuals, cotangents):
    q, k, v, o, lse = residuals
    do, dlse = cotangents
    sym_zero = jax.custom_derivatives.SymbolicZero
    if isinstance(do, sym_zero):
        do = jnp.zeros_like(o)
    dq, dk, dv = _bwd_call(q, k, v, o, lse, do.astype(o.dtype), scale, causal, deterministic)
    if not isinstance(dlse, sym_zero):
        dq, dk = _add_lse_cotangent(q, k, v, lse, dlse, dq, dk, scale, causal, deterministic)
    return dq, dk, dv


def _add_lse_cotangent(q, k, v, lse, dlse, dq, dk, scale, causal, deterministic):
    """Adds the gradient of sum(dlse * lse) to dq and dk, using the kernels.

    d lse_i / d s_ij = P_ij, so with g = dlse: dq_i += scale * g_i * sum_j P_ij k_j
    (attention with v := k) and dk_j += scale * sum_i P_ij g_i q_i (the dV of a
    backward pass whose output cotangent is g * q).
    """
    g = jnp.where(jnp.isfinite(lse), dlse, 0.0).astype(jnp.float32)
    g_rows = jnp.swapaxes(g, -1, -2)[..., None]  # [..., Sq, Hq, 1]
    pk, _ = _fwd_call(q, k, k, scale, causal)
    dq = (dq.astype(jnp.float32) + scale * g_rows * pk.astype(jnp.float32)).astype(dq.dtype)
    gq = (g_rows * q.astype(jnp.float32)).astype(q.dtype)
    # Cotangent gq against "output" o' = P k: its D term must vanish, so pass o' = 0.
    _, _, pt_gq = _bwd_call(q, k, k, jnp.zeros_like(q), lse, gq, scale, causal, deterministic)
    dk = (dk.astype(jnp.float32) + scale * pt_gq.astype(jnp.float32)).astype(dk.dtype)
    return dq, dk


_flash.defvjp(_flash_fwd, _flash_bwd, symbolic_zeros=True)


# ---------------------------------------------------------------------------
# Public API.


def attention(
    q,
    k,
    v,
    *,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    deterministic: bool = False,
    local_window_size: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    query_offset: int = 0,
):
    """Fused scaled dot-product attention (FlashAttention-2).

    Args:
      q: [batch..., seqlen_q, num_heads, head_dim], float32/float16/bfloat16.
      k, v: [batch..., seqlen_k, num_heads_kv, head_dim], q's dtype; num_heads
        must be a multiple of num_heads_kv (GQA/MQA).
      causal: query i attends keys j <= i (top-left aligned, as
        jax.nn.dot_product_attention(is_causal=True)).
      scale: softmax scale; default 1/sqrt(head_dim).
      return_lse: also return the log-sum-exp [batch..., num_heads, seqlen_q]
        (float32, natural log; -inf for a row that sees no key).
      deterministic: bitwise reproducible gradients on CUDA (no atomics); the
        CPU backward is always deterministic.
      local_window_size: int w or (left, right): query i sees keys in
        [i - left, i + right] (jax.nn's meaning; combines with causal). Tiles
        outside the band are skipped.
      logits_soft_cap: c > 0: scaled logits become c * tanh(logits / c).
      query_offset: query i sits at absolute position query_offset + i for the
        causal mask and the window (seqlen_k - seqlen_q gives bottom-right
        alignment for a block of new queries against a key/value cache).
      The last three run on the CPU kernels so far; the CUDA target raises.

    Returns:
      o shaped like q, or (o, lse) when return_lse.
    """
    _check_inputs(q, k, v)
    s = _check_scale(scale, q.shape[-1])
    mask = _make_mask(causal, local_window_size, logits_soft_cap, query_offset)
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    o, lse = _flash(q, k, v, s, mask, bool(deterministic))
    return (o, lse) if return_lse else o
