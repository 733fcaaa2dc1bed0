"""A plain, materialising attention in jnp: the reference the kernels are tested against."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np


def _visible(sq, sk, causal, local_window_size, query_offset, xp):
    """[Sq, Sk] boolean mask of the keys each query sees (None: all), for a
    static query_offset (kept for callers of the plain variants)."""
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


def variant_mask_and_bias(batch_shape, sq, sk, hq, *, causal=False, local_window_size=None,
                          query_offset=0, query_seq_lengths=None, key_value_seq_lengths=None,
                          q_segment_ids=None, kv_segment_ids=None, alibi_slopes=None, xp=np):
    """Explicit mask and bias of every variant: (visible, bias), broadcastable
    to [batch..., Hq, Sq, Sk]; visible is a bool array (None: all keys), bias a
    float array (None: no ALiBi). query_offset is an int or an array
    [batch...]; a query row at or past its length sees no key."""
    nb = len(batch_shape)
    off = xp.asarray(query_offset)
    off = off.reshape(off.shape + (1, 1, 1)) if off.ndim else off  # [B..., 1, 1, 1]
    pos = xp.arange(sq)[:, None] + off                               # [B..., 1, Sq, 1] or [Sq, 1]
    j = xp.arange(sk)[None, :]
    vis = None

    def both(a, b):
        return b if a is None else a & b

    if causal:
        vis = both(vis, j <= pos)
    if local_window_size is not None:
        left, right = (local_window_size if isinstance(local_window_size, (tuple, list))
                       else (local_window_size, local_window_size))
        vis = both(vis, (j >= pos - left) & (j <= pos + right))
    if query_seq_lengths is not None:
        ql = xp.asarray(query_seq_lengths).reshape(tuple(batch_shape) + (1, 1, 1))
        vis = both(vis, xp.arange(sq)[:, None] < ql)
    if key_value_seq_lengths is not None:
        kl = xp.asarray(key_value_seq_lengths).reshape(tuple(batch_shape) + (1, 1, 1))
        vis = both(vis, j < kl)
    if q_segment_ids is not None:
        kv_ids = q_segment_ids if kv_segment_ids is None else kv_segment_ids
        qi = xp.asarray(q_segment_ids)[..., None, :, None]
        ki = xp.asarray(kv_ids)[..., None, None, :]
        vis = both(vis, qi == ki)
    bias = None
    if alibi_slopes is not None:
        slopes = xp.asarray(alibi_slopes)
        if slopes.ndim == 1:
            slopes = xp.broadcast_to(slopes, tuple(batch_shape) + (hq,))
        bias = -slopes[..., :, None, None] * xp.abs(pos - j)
    del nb
    return vis, bias


def _variant_kwargs(kw):
    names = ("local_window_size", "query_offset", "query_seq_lengths", "key_value_seq_lengths",
             "q_segment_ids", "kv_segment_ids", "alibi_slopes")
    return {n: kw[n] for n in names if kw.get(n) is not None}


def _dropout_multipliers(dropout_mask, dropout_rate, batch_shape, xp, dtype):
    """Z = keep / (1 - rate) shaped [batch..., Hq, Sq, Sk], or None."""
    if dropout_mask is None or not dropout_rate:
        return None
    m = xp.asarray(dropout_mask)
    m = m.reshape(tuple(batch_shape) + m.shape[-3:])
    return m.astype(dtype) / xp.asarray(1.0 - dropout_rate, dtype)


def attention_reference(q, k, v, *, causal=False, scale=None, dtype=jnp.float32,
                        local_window_size=None, logits_soft_cap=None, query_offset=0,
                        query_seq_lengths=None, key_value_seq_lengths=None, q_segment_ids=None,
                        kv_segment_ids=None, alibi_slopes=None, dropout_rate=0.0,
                        dropout_mask=None):
    """Returns (o, lse) computed naively in `dtype` (default float32) from
    explicit masks and biases.

    Same layout and meaning as jax_flash.attention: q [..., Sq, Hq, D], k/v
    [..., Sk, Hkv, D], causal top-left, lse [..., Hq, Sq] in natural log. A
    row that sees no key (or a padding row past query_seq_lengths) gives o = 0
    and lse = -inf. dropout_mask: the keep mask [batch, Hq, Sq, Sk] (e.g.
    jax_flash.dropout_mask) applied with dropout_rate; lse stays un-dropped.
    """
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, k, v = (jnp.asarray(x).astype(dtype) for x in (q, k, v))
    batch = q.shape[:-3]
    group = q.shape[-2] // k.shape[-2]
    k = jnp.repeat(k, group, axis=-2)
    v = jnp.repeat(v, group, axis=-2)
    s = jnp.einsum("...qhd,...khd->...hqk", q, k) * jnp.asarray(scale, dtype)
    if logits_soft_cap is not None:
        s = logits_soft_cap * jnp.tanh(s / logits_soft_cap)
    vis, bias = variant_mask_and_bias(
        batch, q.shape[-3], k.shape[-3], q.shape[-2], causal=causal,
        local_window_size=local_window_size, query_offset=query_offset,
        query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, alibi_slopes=alibi_slopes,
        xp=jnp)
    if bias is not None:
        s = s + bias.astype(dtype)
    if vis is not None:
        s = jnp.where(vis, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m_safe = jnp.where(jnp.isfinite(m), m, 0)
    p = jnp.exp(s - m_safe)
    l = jnp.sum(p, axis=-1, keepdims=True)
    lse = jnp.where(l > 0, jnp.log(jnp.where(l > 0, l, 1)) + m_safe, -jnp.inf)[..., 0]
    p = jnp.where(l > 0, p / jnp.where(l > 0, l, 1), 0)
    z = _dropout_multipliers(dropout_mask, dropout_rate, batch, jnp, dtype)
    if z is not None:
        p = p * z
    o = jnp.einsum("...hqk,...khd->...qhd", p.astype(dtype), v)
    return o, lse


def _softmax_np(q, k, v, causal, scale, local_window_size=None, logits_soft_cap=None,
                query_offset=0, **more):
    """float64 probabilities P [..., Hq, Sq, Sk], lse, and k/v repeated to Hq heads."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[-2] // k.shape[-2]
    kr = np.repeat(k, group, axis=-2)
    vr = np.repeat(v, group, axis=-2)
    s = np.einsum("...qhd,...khd->...hqk", q, kr) * scale
    if logits_soft_cap is not None:
        s = logits_soft_cap * np.tanh(s / logits_soft_cap)
    more = {n: (None if x is None else np.asarray(x)) for n, x in more.items()}
    vis, bias = variant_mask_and_bias(
        q.shape[:-3], q.shape[-3], k.shape[-3], q.shape[-2], causal=causal,
        local_window_size=local_window_size, query_offset=np.asarray(query_offset), xp=np, **more)
    if bias is not None:
        s = s + bias
    if vis is not None:
        s = np.where(vis, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(l > 0, np.log(l) + m, -np.inf)[..., 0]
        p = np.where(l > 0, p / l, 0.0)
    capped = s - bias if bias is not None else s  # the soft-capped logits (for the cap derivative)
    return p, lse, kr, vr, scale, capped


def attention_reference_np(q, k, v, *, causal=False, scale=None, dropout_rate=0.0,
                           dropout_mask=None, **variants):
    """float64 NumPy version of attention_reference (o, lse); variants are its
    keyword arguments (local_window_size, logits_soft_cap, query_offset,
    lengths, segment ids, alibi_slopes)."""
    p, lse, _, vr, _, _ = _softmax_np(q, k, v, causal, scale, **variants)
    z = _dropout_multipliers(dropout_mask, dropout_rate, np.shape(q)[:-3], np, np.float64)
    if z is not None:
        p = p * z
    return np.einsum("...hqk,...khd->...qhd", p, vr), lse


def attention_reference_grad_np(q, k, v, do, *, causal=False, scale=None, dropout_rate=0.0,
                                dropout_mask=None, dlse=None, **variants):
    """float64 NumPy gradients (dq, dk, dv) of sum(o * do) (+ sum(lse * dlse)
    when dlse is given) for attention_reference_np."""
    p, lse, kr, vr, scale, s = _softmax_np(q, k, v, causal, scale, **variants)
    q, do = np.asarray(q, dtype=np.float64), np.asarray(do, dtype=np.float64)
    hkv, d = np.shape(k)[-2], q.shape[-1]
    group = q.shape[-2] // hkv
    z = _dropout_multipliers(dropout_mask, dropout_rate, q.shape[:-3], np, np.float64)
    pz = p if z is None else p * z
    o = np.einsum("...hqk,...khd->...qhd", pz, vr)
    dv = np.einsum("...hqk,...qhd->...khd", pz, do)
    dp = np.einsum("...qhd,...khd->...hqk", do, vr)
    if z is not None:
        dp = dp * z
    delta = np.einsum("...qhd,...qhd->...hq", do, o)[..., None]
    if dlse is not None:  # d lse_i / d s_ij = p_ij
        delta = delta - np.where(np.isfinite(lse), np.asarray(dlse, np.float64), 0.0)[..., None]
    ds = p * (dp - delta)
    cap = variants.get("logits_soft_cap")
    if cap is not None:  # d(c tanh(x / c))/dx = 1 - tanh^2
        ds = ds * np.where(np.isfinite(s), 1.0 - (s / cap) ** 2, 0.0)
    dq = np.einsum("...hqk,...khd->...qhd", ds, kr) * scale
    dk = np.einsum("...hqk,...qhd->...khd", ds, q) * scale

    def fold(x):  # sum the q heads of each group back onto their kv head
        return x.reshape(x.shape[:-2] + (hkv, group, d)).sum(-2)

    return dq, fold(dk), fold(dv)
