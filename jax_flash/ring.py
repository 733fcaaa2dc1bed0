"""Sequence parallelism: ring attention over a named mesh axis (inside shard_map).

Each device holds a contiguous shard of the sequence of q, k and v (or, for
load-balanced causal attention, the zigzag shards made by `zigzag_permute`).
K/V shards travel once around the ring with `jax.lax.ppermute`; at every step
the forward kernel computes a partial (o, lse) of the local queries against the
visiting K/V shard, and the partials are merged in float32 through their
log-sum-exps. The next step's ppermute is issued before the current step's
kernel, so XLA may overlap the transfer with the computation.

The backward pass is a second ring: the K/V shards travel again, now with their
float32 dK/dV accumulators, and every step runs the backward kernel with the
*final* o and the *global* lse (so the kernel's D = rowsum(dO * O) and
P = exp(S - lse) are the global ones). After the last step one more ppermute
brings every dK/dV home.

Causal masking per step (n devices, device i, visiting shard j = (i - t) mod n):

* contiguous layout: step 0 (j = i) is the causal diagonal block; j < i is
  fully visible; j > i is skipped. Device n-1 does n blocks, device 0 one.
* zigzag layout (`zigzag=True`): device i holds chunks i and 2n-1-i of 2n equal
  chunks, in that order. Step 0 is again plain top-left causal on the local
  sequence (the local order is increasing in global position). For j != i, per
  half chunk (q0 = chunk i, q1 = chunk 2n-1-i, k0 = chunk j, k1 = chunk 2n-1-j):
  q0 x k1 is never visible and q1 x k0 always is; q0 x k0 is visible iff j < i
  and q1 x k1 iff j > i. So j < i computes all of q against k0 and j > i
  computes q1 against all of k: half a block either way, on every device.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

import numpy as np

from jax_flash.attention import (
    _bwd_call,
    _check_inputs,
    _check_scale,
    _fwd_call,
    _int_array,
    _make_mask,
    _zero_cotangent,
    segment_ranges,
)
from jax_flash.mask import NO_EXTRAS, Extras, Mask

__all__ = ["ring_attention", "zigzag_permute", "zigzag_unpermute", "shard_map"]


# ---------------------------------------------------------------------------
# shard_map across JAX versions, and zigzag token order.


def shard_map(f, *, mesh, in_specs, out_specs, check_vma=True):
    """`jax.shard_map` where it exists (JAX >= 0.7), else
    `jax.experimental.shard_map.shard_map` (check_vma is then check_rep)."""
    sm = getattr(jax, "shard_map", None)
    if sm is not None:
        return sm(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma)
    from jax.experimental.shard_map import shard_map as old_sm  # pragma: no cover

    return old_sm(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=check_vma)


def _zigzag_order(n: int):
    order = []
    for i in range(n):
        order += [i, 2 * n - 1 - i]
    return order


def _check_zigzag(x, n, axis):
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"zigzag: n must be a positive int (the ring size), got {n!r}")
    length = x.shape[axis]
    if length % (2 * n):
        raise ValueError(
            f"zigzag: the sequence length ({length}, axis {axis}) must be divisible by 2*n = {2 * n}"
        )


def zigzag_permute(x, n: int, axis: int = -3):
    """Reorders a sequence axis into zigzag order for a ring of `n` devices.

    The axis is cut into 2n equal chunks c_0 .. c_{2n-1} and reordered as
    c_0, c_{2n-1}, c_1, c_{2n-2}, ..., so that sharding the result evenly over
    n devices gives device i the chunks i and 2n-1-i. `axis` defaults to the
    sequence axis of the [batch..., seqlen, heads, head_dim] layout.
    """
    _check_zigzag(x, n, axis)
    chunks = jnp.split(x, 2 * n, axis=axis)
    return jnp.concatenate([chunks[c] for c in _zigzag_order(n)], axis=axis)


def zigzag_unpermute(x, n: int, axis: int = -3):
    """Inverse of `zigzag_permute`."""
    _check_zigzag(x, n, axis)
    chunks = jnp.split(x, 2 * n, axis=axis)
    inv = [0] * (2 * n)
    for pos, c in enumerate(_zigzag_order(n)):
        inv[c] = pos
    return jnp.concatenate([chunks[inv[c]] for c in range(2 * n)], axis=axis)


# ---------------------------------------------------------------------------
# Per-step blocks. Sequence axis of q/k/v/o is -3; of lse it is -1.


def _axis_size(axis_name) -> int:
    size = getattr(jax.lax, "axis_size", None)
    if size is not None:
        return int(size(axis_name))
    return int(jax.lax.psum(1, axis_name))  # pragma: no cover - old JAX


def _seq_slice(x, start, stop, axis=-3):
    return jax.lax.slice_in_dim(x, start, stop, axis=x.ndim + axis)


def _pad_front(x, n, axis=-3, value=0.0):
    """Prepends n entries of `value` along axis (built from x so it stays
    device-varying inside shard_map)."""
    filler = jnp.full_like(_seq_slice(x, 0, n, axis), value)
    return jnp.concatenate([filler, x], axis=x.ndim + axis)


def _pad_back(x, n, axis=-3, value=0.0):
    filler = jnp.full_like(_seq_slice(x, 0, n, axis), value)
    return jnp.concatenate([x, filler], axis=x.ndim + axis)


def _rows(w):
    """[..., H, S] weights -> [..., S, H, 1] to scale o rows."""
    return jnp.swapaxes(w, -1, -2)[..., None]


def _merge(o_acc, lse_acc, o, lse):
    """Merges a partial (o, lse) into float32 accumulators through the LSE."""
    new = jnp.logaddexp(lse_acc, lse)
    safe = jnp.where(jnp.isfinite(new), new, 0.0)
    w_acc = jnp.exp(lse_acc - safe)
    w = jnp.exp(lse - safe)
    return o_acc * _rows(w_acc) + o.astype(jnp.float32) * _rows(w), new


def _step_kind(t: int, causal: bool, zigzag: bool, idx, n: int):
    """(static kind, traced predicate): what step t computes on this device.

    kind "full": one unmasked block; "causal": the diagonal block; "lower_or_skip":
    full if the visiting shard is earlier else skipped (contiguous causal);
    "zigzag": earlier shard -> q x k0, later shard -> q1 x k (zigzag causal).
    """
    if not causal:
        return "full", None
    if t == 0:
        return "causal", None
    src = (idx - t) % n
    return ("zigzag" if zigzag else "lower_or_skip"), src < idx


def _seg_extras(seg, q_range=None, k_range=None):
    """The kernel's optional operands for segment ids `seg` = (local q ids,
    visiting kv ids) or None, restricted to the [start, stop) ranges of q and k
    rows when given; the per-16 [min, max] ranges are built from the slices."""
    if seg is None:
        return NO_EXTRAS
    qid, kid = seg
    if q_range is not None:
        qid = _seq_slice(qid, *q_range, axis=-1)
    if k_range is not None:
        kid = _seq_slice(kid, *k_range, axis=-1)
    return Extras(q_segment_ids=qid, kv_segment_ids=kid, q_segment_ranges=segment_ranges(qid),
                  kv_segment_ranges=segment_ranges(kid))


def _block_fwd(kind, pred, q, k, v, scale, seg=None):
    """Partial (o, lse) of the local q against one visiting K/V shard (`seg`:
    None or the (local q, visiting kv) segment ids)."""
    if kind in ("full", "causal"):
        return _fwd_call(q, k, v, scale, kind == "causal", _seg_extras(seg))
    if kind == "lower_or_skip":

        def skip(q, k, v, seg):  # (zeros_like keeps q's shard_map varying-ness)
            return jnp.zeros_like(q), jnp.full_like(_rows_t(q), -jnp.inf)

        def full(q, k, v, seg):
            return _fwd_call(q, k, v, scale, False, _seg_extras(seg))

        return jax.lax.cond(pred, full, skip, q, k, v, seg)
    # zigzag
    c = q.shape[-3] // 2

    def earlier(q, k, v, seg):  # all of q sees the first half of the visiting shard
        return _fwd_call(q, _seq_slice(k, 0, c), _seq_slice(v, 0, c), scale, False,
                         _seg_extras(seg, k_range=(0, c)))

    def later(q, k, v, seg):  # the second half of q sees all of the visiting shard
        o1, lse1 = _fwd_call(_seq_slice(q, c, 2 * c), k, v, scale, False,
                             _seg_extras(seg, q_range=(c, 2 * c)))
        return _pad_front(o1, c), _pad_front(lse1, c, axis=-1, value=-jnp.inf)

    return jax.lax.cond(pred, earlier, later, q, k, v, seg)


def _rows_t(q):
    """A zero [..., H, S] float32 array derived from q (for the lse shape)."""
    return jnp.swapaxes(jnp.zeros_like(q[..., 0], dtype=jnp.float32), -1, -2)


def _block_bwd(kind, pred, q, k, v, o, lse, do, scale, deterministic, seg=None):
    """(dq, dk, dv) of one block, with the global lse and the final o."""
    if kind in ("full", "causal"):
        return _bwd_call(q, k, v, o, lse, do, scale, kind == "causal", deterministic,
                         _seg_extras(seg))
    if kind == "lower_or_skip":

        def skip(q, k, v, o, lse, do, seg):
            return jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v)

        def full(q, k, v, o, lse, do, seg):
            return _bwd_call(q, k, v, o, lse, do, scale, False, deterministic, _seg_extras(seg))

        return jax.lax.cond(pred, full, skip, q, k, v, o, lse, do, seg)
    c = q.shape[-3] // 2

    def earlier(q, k, v, o, lse, do, seg):
        dq, dk0, dv0 = _bwd_call(
            q, _seq_slice(k, 0, c), _seq_slice(v, 0, c), o, lse, do, scale, False, deterministic,
            _seg_extras(seg, k_range=(0, c)))
        return dq, _pad_back(dk0, c), _pad_back(dv0, c)

    def later(q, k, v, o, lse, do, seg):
        hi = lambda x: _seq_slice(x, c, 2 * c)
        dq1, dk, dv = _bwd_call(
            hi(q), k, v, hi(o), _seq_slice(lse, c, 2 * c, axis=-1), hi(do), scale, False, deterministic,
            _seg_extras(seg, q_range=(c, 2 * c)))
        return _pad_front(dq1, c), dk, dv

    return jax.lax.cond(pred, earlier, later, q, k, v, o, lse, do, seg)



# ---------------------------------------------------------------------------
# Local windows (local_window_size): every step's K/V shard sits at a global
# offset from the local queries that depends on the (traced) device index. The
# set of (device, step) pairs is static and finite, so each step enumerates it:
# for every device the plan of kernel calls is worked out in Python (which q/k
# pieces meet, and the static Mask with the pieces' relative query_offset),
# equal plans are shared, and `lax.switch` on the device index picks the plan.
# Pieces entirely outside the band make no kernel call.

_INF = float("inf")


class _Seg(tuple):
    """(local start, length, global start) of a piece of a local shard."""

    __slots__ = ()

    def __new__(cls, start, length, pos):
        return super().__new__(cls, (int(start), int(length), int(pos)))


def _segments(device, length, n, zigzag):
    """The pieces of device `device`'s shard with their global positions."""
    if not zigzag:
        return (_Seg(0, length, device * length),)
    c = length // 2
    return (_Seg(0, c, device * c), _Seg(c, c, (2 * n - 1 - device) * c))


def _bounds(causal, window):
    """(left, right) reach of a query as numbers (inf: unbounded)."""
    left, right = window
    lo = _INF if left < 0 else left
    hi = _INF if right < 0 else right
    if causal:
        hi = min(hi, 0)
    return lo, hi


def _status(qs, ks, causal, window):
    """"empty", "full" or "partial": how much of q piece x k piece is visible."""
    lo, hi = _bounds(causal, window)
    p0, p1 = qs[2], qs[2] + qs[1] - 1
    g0, g1 = ks[2], ks[2] + ks[1] - 1
    if g0 > p1 + hi or g1 < p0 - lo:
        return "empty"
    if g0 >= p1 - lo and g1 <= p0 + hi:
        return "full"
    return "partial"


def _contiguous(segs):
    """One piece spanning `segs` when they are adjacent in global order, else None."""
    for a, b in zip(segs, segs[1:]):
        if b[0] != a[0] + a[1] or b[2] != a[2] + a[1]:
            return None
    return _Seg(segs[0][0], sum(s[1] for s in segs), segs[0][2])


def _local_span(segs):
    """(local start, length) of adjacent local pieces, else None."""
    if any(b[0] != a[0] + a[1] for a, b in zip(segs, segs[1:])):
        return None
    return segs[0][0], sum(s[1] for s in segs)


def _call_for(q_segs, k_segs, causal, window):
    """One kernel call covering q_segs x k_segs (local ranges, static Mask), or
    None when no single Mask describes them."""
    if all(_status(a, b, causal, window) == "full" for a in q_segs for b in k_segs):
        qa, ka = _local_span(q_segs), _local_span(k_segs)
        return None if qa is None or ka is None else (*qa, *ka, Mask())
    qa, ka = _contiguous(q_segs), _contiguous(k_segs)
    if qa is None or ka is None:
        return None
    mask = Mask(causal=causal, query_offset=qa[2] - ka[2], window_left=window[0],
                window_right=window[1])
    return (qa[0], qa[1], ka[0], ka[1], mask)


def _plan(device, t, n, lq, lk, causal, window, zigzag):
    """The static kernel calls of step t on `device`: a tuple of
    (q_start, q_len, k_start, k_len, Mask), empty when the block is skipped."""
    src = (device - t) % n
    qsegs = _segments(device, lq, n, zigzag)
    ksegs = _segments(src, lk, n, zigzag)
    live = [[_status(a, b, causal, window) != "empty" for b in ksegs] for a in qsegs]
    if not any(any(r) for r in live):
        return ()
    whole = _call_for(qsegs, ksegs, causal, window)
    if whole is not None:
        return (whole,)
    # By rows (each q piece against the k pieces it meets) or by columns; fewer calls wins.
    plans = []
    for by_rows in (True, False):
        calls = []
        outer, inner = (qsegs, ksegs) if by_rows else (ksegs, qsegs)
        for a_i, a in enumerate(outer):
            hits = [b for b_i, b in enumerate(inner) if (live[a_i][b_i] if by_rows else live[b_i][a_i])]
            if not hits:
                continue
            pair = lambda a, b: ([a], b) if by_rows else (b, [a])
            c = _call_for(*pair(a, hits), causal, window)
            if c is not None:
                calls.append(c)
            else:
                calls += [_call_for(*pair(a, [b]), causal, window) for b in hits]
        plans.append(tuple(calls))
    return min(plans, key=len)


def _switch_plans(t, n, lq, lk, causal, window, zigzag, idx):
    """(plans, branch index): the distinct plans of step t and which one this device runs."""
    per_device = [_plan(d, t, n, lq, lk, causal, window, zigzag) for d in range(n)]
    plans = list(dict.fromkeys(per_device))
    which = np.array([plans.index(p) for p in per_device], np.int32)
    return plans, (None if len(plans) == 1 else jnp.asarray(which)[idx])


def _pad_to(x, start, total, axis=-3, value=0.0):
    """Places x (the rows [start, start + len) of a length-`total` axis) in a
    length-`total` array filled with `value`."""
    length = x.shape[axis]
    if start:
        x = _pad_front(x, start, axis, value)
    if total - start - length:
        x = _pad_back(x, total - start - length, axis, value)
    return x


def _plan_fwd(plan, q, k, v, seg, scale):
    """float32 partial (o, lse) of the local q against one visiting K/V shard."""
    lq = q.shape[-3]
    o_acc = jnp.zeros_like(q, dtype=jnp.float32)
    lse_acc = jnp.full_like(_rows_t(q), -jnp.inf)
    for qs, ql, ks, kl, mask in plan:
        o, lse = _fwd_call(_seq_slice(q, qs, qs + ql), _seq_slice(k, ks, ks + kl),
                           _seq_slice(v, ks, ks + kl), scale, mask,
                           _seg_extras(seg, (qs, qs + ql), (ks, ks + kl)))
        o = _pad_to(o.astype(jnp.float32), qs, lq)
        lse = _pad_to(lse, qs, lq, axis=-1, value=-jnp.inf)
        if len(plan) == 1:
            return o, lse
        o_acc, lse_acc = _merge(o_acc, lse_acc, o, lse)
    return o_acc, lse_acc


def _plan_bwd(plan, q, k, v, o, lse, do, seg, scale, deterministic):
    """float32 (dq, dk, dv) of one visiting K/V shard, with the global lse and final o."""
    lq, lk = q.shape[-3], k.shape[-3]
    f32 = jnp.float32
    dq, dk, dv = (jnp.zeros_like(x, dtype=f32) for x in (q, k, v))
    for qs, ql, ks, kl, mask in plan:
        rq = lambda x: _seq_slice(x, qs, qs + ql)
        rk = lambda x: _seq_slice(x, ks, ks + kl)
        dq_c, dk_c, dv_c = _bwd_call(rq(q), rk(k), rk(v), rq(o), _seq_slice(lse, qs, qs + ql, axis=-1),
                                     rq(do), scale, mask, deterministic,
                                     _seg_extras(seg, (qs, qs + ql), (ks, ks + kl)))
        dq = dq + _pad_to(dq_c.astype(f32), qs, lq)
        dk = dk + _pad_to(dk_c.astype(f32), ks, lk)
        dv = dv + _pad_to(dv_c.astype(f32), ks, lk)
    return dq, dk, dv


def _windowed_fwd(t, n, idx, q, k, v, seg=None, *, scale, causal, window, zigzag):
    plans, which = _switch_plans(t, n, q.shape[-3], k.shape[-3], causal, window, zigzag, idx)
    branches = [functools.partial(_plan_fwd, p, scale=scale) for p in plans]
    if which is None:
        return branches[0](q, k, v, seg)
    return jax.lax.switch(which, branches, q, k, v, seg)


def _windowed_bwd(t, n, idx, q, k, v, o, lse, do, seg=None, *, scale, causal, window, zigzag,
                  deterministic):
    plans, which = _switch_plans(t, n, q.shape[-3], k.shape[-3], causal, window, zigzag, idx)
    branches = [functools.partial(_plan_bwd, p, scale=scale, deterministic=deterministic)
                for p in plans]
    if which is None:
        return branches[0](q, k, v, o, lse, do, seg)
    return jax.lax.switch(which, branches, q, k, v, o, lse, do, seg)


# ---------------------------------------------------------------------------
# The ring passes.


def _ring_perm(n):
    return [(i, (i + 1) % n) for i in range(n)]


def _visiting(seg, kv):
    """(local q ids, visiting kv ids) of a step, or None without segment ids."""
    return None if seg is None else (seg[0], kv[2])


def _ring_forward(q, k, v, seg, scale, causal, zigzag, window, axis_name):
    n = _axis_size(axis_name)
    idx = jax.lax.axis_index(axis_name)
    perm = _ring_perm(n)
    o_acc = jnp.zeros_like(q, dtype=jnp.float32)
    lse_acc = jnp.full_like(_rows_t(q), -jnp.inf)
    # The kv segment ids (if any) travel with their K/V shard.
    kv = (k, v) if seg is None else (k, v, seg[1])
    for t in range(n):
        # Issue the transfer of the next shard before this step's kernel.
        nxt = jax.lax.ppermute(kv, axis_name, perm) if t < n - 1 else None
        seg_t = _visiting(seg, kv)
        if window is None:
            kind, pred = _step_kind(t, causal, zigzag, idx, n)
            o_t, lse_t = _block_fwd(kind, pred, q, kv[0], kv[1], scale, seg_t)
        else:
            o_t, lse_t = _windowed_fwd(t, n, idx, q, kv[0], kv[1], seg_t, scale=scale,
                                       causal=causal, window=window, zigzag=zigzag)
        o_acc, lse_acc = _merge(o_acc, lse_acc, o_t, lse_t)
        kv = nxt
    return o_acc.astype(q.dtype), lse_acc


def _ring_backward(q, k, v, seg, o, lse, do, dlse, scale, causal, zigzag, window, deterministic,
                   axis_name):
    n = _axis_size(axis_name)
    idx = jax.lax.axis_index(axis_name)
    perm = _ring_perm(n)
    f32 = jnp.float32
    dq = jnp.zeros_like(q, dtype=f32)
    dk = jnp.zeros_like(k, dtype=f32)
    dv = jnp.zeros_like(v, dtype=f32)
    if dlse is not None:
        # lse cotangent g: dq_i += scale g_i sum_j P_ij k_j and dk_j += scale sum_i P_ij g_i q_i.
        g = jnp.where(jnp.isfinite(lse), dlse, 0.0).astype(f32)
        gq = (_rows(g) * q.astype(f32)).astype(q.dtype)
        zeros_o = jnp.zeros_like(q)
        pk_acc = jnp.zeros_like(q, dtype=f32)
    kv = (k, v) if seg is None else (k, v, seg[1])
    for t in range(n):
        nxt = jax.lax.ppermute(kv, axis_name, perm) if t < n - 1 else None
        seg_t = _visiting(seg, kv)
        if window is None:
            kind, pred = _step_kind(t, causal, zigzag, idx, n)
            block_fwd = lambda q, k, v, seg: _block_fwd(kind, pred, q, k, v, scale, seg)
            block_bwd = lambda q, k, v, o, lse, do, seg: _block_bwd(
                kind, pred, q, k, v, o, lse, do, scale, deterministic, seg)
        else:
            block_fwd = functools.partial(_windowed_fwd, t, n, idx, scale=scale, causal=causal,
                                          window=window, zigzag=zigzag)
            block_bwd = functools.partial(_windowed_bwd, t, n, idx, scale=scale, causal=causal,
                                          window=window, zigzag=zigzag, deterministic=deterministic)
        dq_t, dk_t, dv_t = block_bwd(q, kv[0], kv[1], o, lse, do, seg_t)
        dq = dq + dq_t.astype(f32)
        dk = dk + dk_t.astype(f32)
        dv = dv + dv_t.astype(f32)
        if dlse is not None:
            pk_t, lse_t = block_fwd(q, kv[0], kv[0], seg_t)
            safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
            pk_acc = pk_acc + pk_t.astype(f32) * _rows(jnp.exp(lse_t - safe))
            _, _, pt_gq = block_bwd(q, kv[0], kv[0], zeros_o, lse, gq, seg_t)
            dk = dk + scale * pt_gq.astype(f32)
        # dK/dV travel with their shard; the n-th transfer brings them home.
        dk, dv = jax.lax.ppermute((dk, dv), axis_name, perm)
        kv = nxt
    if dlse is not None:
        dq = dq + scale * _rows(g) * pk_acc
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8, 9))
def _ring(q, k, v, seg, scale, causal, zigzag, window, deterministic, axis_name):
    return _ring_forward(q, k, v, seg, scale, causal, zigzag, window, axis_name)


def _ring_fwd_rule(q, k, v, seg, scale, causal, zigzag, window, deterministic, axis_name):
    q, k, v = q.value, k.value, v.value
    seg = jax.tree.map(lambda x: x.value, seg)
    o, lse = _ring_forward(q, k, v, seg, scale, causal, zigzag, window, axis_name)
    return (o, lse), (q, k, v, seg, o, lse)


def _ring_bwd_rule(scale, causal, zigzag, window, deterministic, axis_name, residuals, cotangents):
    q, k, v, seg, o, lse = residuals
    do, dlse = cotangents
    sym_zero = jax.custom_derivatives.SymbolicZero
    if isinstance(do, sym_zero):
        do = jnp.zeros_like(o)
    dlse = None if isinstance(dlse, sym_zero) else dlse
    dq, dk, dv = _ring_backward(q, k, v, seg, o, lse, do.astype(o.dtype), dlse, scale, causal,
                                zigzag, window, deterministic, axis_name)
    return dq, dk, dv, jax.tree.map(_zero_cotangent, seg)


_ring.defvjp(_ring_fwd_rule, _ring_bwd_rule, symbolic_zeros=True)


# ---------------------------------------------------------------------------
# Public API.


def _ring_segments(q, k, q_segment_ids, kv_segment_ids):
    """(q ids, kv ids) as int32 local shards, or None without segment ids."""
    if kv_segment_ids is not None and q_segment_ids is None:
        raise ValueError("jax_flash.ring_attention: kv_segment_ids needs q_segment_ids")
    if q_segment_ids is None:
        return None
    batch, sq, sk = tuple(q.shape[:-3]), q.shape[-3], k.shape[-3]
    qs = _int_array(q_segment_ids, "q_segment_ids", batch + (sq,),
                    "q.shape[:-3] + (local seqlen_q,)")
    if kv_segment_ids is None:
        if sq != sk:
            raise ValueError(
                "jax_flash.ring_attention: kv_segment_ids is required when the q and k/v shards "
                f"have different lengths (got q_segment_ids.shape={tuple(qs.shape)} and k/v shard "
                f"length {sk})")
        kv_segment_ids = qs
    ks = _int_array(kv_segment_ids, "kv_segment_ids", batch + (sk,),
                    "k.shape[:-3] + (local seqlen_k,)")
    return jnp.asarray(qs, jnp.int32), jnp.asarray(ks, jnp.int32)


def ring_attention(
    q,
    k,
    v,
    *,
    axis_name,
    causal: bool = False,
    zigzag: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    deterministic: bool = False,
    local_window_size: int | tuple[int, int] | None = None,
    q_segment_ids=None,
    kv_segment_ids=None,
):
    """Sequence-parallel (ring) attention; call it inside `shard_map`.

    q, k and v are this device's shards of the sequence, in jax_flash's layout:
    q [batch..., seqlen_q / n, heads, head_dim], k/v [batch..., seqlen_k / n,
    heads_kv, head_dim] (GQA as in `jax_flash.attention`), the sequence split
    over the mesh axis `axis_name` of size n. K/V shards circulate with
    `jax.lax.ppermute`; the result is this device's shard of the output.

    Args:
      axis_name: the mesh axis (or tuple of axes) the sequence is sharded over.
      causal: top-left causal mask over the *global* positions; needs equal
        q and k/v shard lengths.
      zigzag: the shards are in zigzag order (`zigzag_permute(x, n)` before
        sharding, `zigzag_unpermute` after): balanced causal work on every
        device. Without it the shards are contiguous and, when causal, device i
        does i+1 of the n blocks.
      scale, return_lse, deterministic: as in `jax_flash.attention`; lse is the
        global log-sum-exp of this device's rows, [batch..., heads, seqlen_q / n].
      local_window_size: w or (left, right), as in `jax_flash.attention`, over
        the *global* positions (global query i sees global keys i-left .. i+right;
        combines with causal, contiguous or zigzag shards). Each step works out,
        for the device's position in the ring, which pieces of the visiting shard
        lie in the band: pieces outside it make no kernel call, the others call
        the kernel with a static mask offset (`lax.switch` over the devices'
        distinct plans). The K/V shards still travel the whole ring. The
        windowed calls run on the variants kernels of either target.
      q_segment_ids, kv_segment_ids: int32 [batch..., seqlen_q / n] and
        [batch..., seqlen_k / n], this device's shards of the segment ids
        (packed documents), in the same token order as q and k/v (zigzag or
        contiguous): as in `jax_flash.attention`, query i sees key j only when
        their ids are equal (and, with causal, j is not after i; combines with
        local_window_size). kv_segment_ids defaults to q_segment_ids when the
        shards have equal lengths. The kv ids travel around the ring with their
        K/V shard; without segment ids nothing extra is sent.

    Returns:
      o shaped like q, or (o, lse) when return_lse.
    """
    _check_inputs(q, k, v)
    s = _check_scale(scale, q.shape[-1])
    window = None
    if local_window_size is not None:
        m = _make_mask(causal, local_window_size, None, 0)
        window = (m.window_left, m.window_right)
    if causal and q.shape[-3] != k.shape[-3]:
        raise ValueError(
            "jax_flash.ring_attention: causal needs equal q and k/v shard lengths, got "
            f"q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}"
        )
    # Without a window, non-causal attention does not depend on the token order.
    zigzag = bool(zigzag and (causal or window is not None))
    if zigzag and (q.shape[-3] % 2 or k.shape[-3] % 2):
        raise ValueError(
            "jax_flash.ring_attention: zigzag shards hold two equal chunks, so the local "
            f"sequence lengths must be even, got q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}"
        )
    seg = _ring_segments(q, k, q_segment_ids, kv_segment_ids)
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    o, lse = _ring(q, k, v, seg, s, bool(causal), zigzag, window, bool(deterministic), axis_name)
    return (o, lse) if return_lse else o
