"""A plain, materialising attention in jnp: the reference the kernels are tested against."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np


def _visible(sq, sk, causal, local_window_size, query_offset, xp):
    """[Sq, Sk] boolean mask of the keys each query sees (None: all)."""
    if not causal and local_window_size is None:
        return None
    pos = xp.arange(sq)[:, None] + query_offset
    j = xp.arange(sk)[None, :]
    vis = xp.ones((sq, sk), dtype=bool)
    if causal:
        vis = vis & (j <= pos)
    if local_window_size is not None:
        left, right = (local_window_size if isinstance(local_window_size, (tuple, list))
                       else (local_window_size, local_window_size))
        vis = vis & (j >= pos - left) & (j <= pos + right)
    return vis


def attention_reference(q, k, v, *, causal=False, scale=None, dtype=jnp.float32,
                        local_window_size=None, logits_soft_cap=None, query_offset=0):
    """Returns (o, lse) computed naively in `dtype` (default float32).

    Same layout and meaning as jax_flash.attention: q [..., Sq, Hq, D], k/v
    [..., Sk, Hkv, D], causal top-left, lse [..., Hq, Sq] in natural log. A
    row that sees no key gives o = 0 and lse = -inf.
    """
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, k, v = (jnp.asarray(x).astype(dtype) for x in (q, k, v))
    group = q.shape[-2] // k.shape[-2]
    k = jnp.repeat(k, group, axis=-2)
    v = jnp.repeat(v, group, axis=-2)
    s = jnp.einsum("...qhd,...khd->...hqk", q, k) * jnp.asarray(scale, dtype)
    if logits_soft_cap is not None:
        s = logits_soft_cap * jnp.tanh(s / logits_soft_cap)
    vis = _visible(q.shape[-3], k.shape[-3], causal, local_window_size, query_offset, jnp)
    if vis is not None:
        s = jnp.where(vis, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m_safe = jnp.where(jnp.isfinite(m), m, 0)
    p = jnp.exp(s - m_safe)
    l = jnp.sum(p, axis=-1, keepdims=True)
    lse = jnp.where(l > 0, jnp.log(jnp.where(l > 0, l, 1)) + m_safe, -jnp.inf)[..., 0]
    p = jnp.where(l > 0, p / jnp.where(l > 0, l, 1), 0)
    o = jnp.einsum("...hqk,...khd->...qhd", p.astype(dtype), v)
    return o, lse


def _softmax_np(q, k, v, causal, scale, local_window_size=None, logits_soft_cap=None,
                query_offset=0):
    """float64 probabilities P [..., Hq, Sq, Sk], lse, and k/v repeated to Hq heads."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[-2] // k.shape[-2]
    kr = np.repeat(k, group, axis=-2)
    vr = np.repeat(v, group, axis=-2)
    s = np.einsum("...qhd,...khd->...hqk", q, kr) * scale
    if logits_soft_cap is not None:
        s = logits_soft_cap * np.tanh(s / logits_soft_cap)
    vis = _visible(q.shape[-3], k.shape[-3], causal, local_window_size, query_offset, np)
    if vis is not None:
        s = np.where(vis, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(l > 0, np.log(l) + m, -np.inf)[..., 0]
        p = np.where(l > 0, p / l, 0.0)
    return p, lse, kr, vr, scale, s


def attention_reference_np(q, k, v, *, causal=False, scale=None, **variants):
    """float64 NumPy version of attention_reference (o, lse); variants are
    local_window_size, logits_soft_cap and query_offset."""
    p, lse, _, vr, _, _ = _softmax_np(q, k, v, causal, scale, **variants)
    return np.einsum("...hqk,...khd->...qhd", p, vr), lse


def attention_reference_grad_np(q, k, v, do, *, causal=False, scale=None, **variants):
    """float64 NumPy gradients (dq, dk, dv) of sum(o * do) for attention_reference_np."""
    p, _, kr, vr, scale, s = _softmax_np(q, k, v, causal, scale, **variants)
    q, do = np.asarray(q, dtype=np.float64), np.asarray(do, dtype=np.float64)
    hkv, d = np.shape(k)[-2], q.shape[-1]
    group = q.shape[-2] // hkv
    o = np.einsum("...hqk,...khd->...qhd", p, vr)
    dv = np.einsum("...hqk,...qhd->...khd", p, do)
    dp = np.einsum("...qhd,...khd->...hqk", do, vr)
    delta = np.einsum("...qhd,...qhd->...hq", do, o)[..., None]
    ds = p * (dp - delta)
    cap = variants.get("logits_soft_cap")
    if cap is not None:  # d(c tanh(x / c))/dx = 1 - tanh^2
        ds = ds * np.where(np.isfinite(s), 1.0 - (s / cap) ** 2, 0.0)
    dq = np.einsum("...hqk,...khd->...qhd", ds, kr) * scale
    dk = np.einsum("...hqk,...qhd->...khd", ds, q) * scale

    def fold(x):  # sum the q heads of each group back onto their kv head
        return x.reshape(x.shape[:-2] + (hkv, group, d)).sum(-2)

    return dq, fold(dk), fold(dv)
