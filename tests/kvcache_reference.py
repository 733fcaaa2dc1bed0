"""A float32 NumPy reference for attention_with_kvcache, built from the
dense cache, and helpers that lay a contiguous cache out in random pages.
Shared by the CPU and GPU KV-cache tests."""

from __future__ import annotations

import numpy as np


def to_paged(cache, page_size, rng, spare_pages=3):
    """A contiguous cache [B, S, H, D] (S a multiple of page_size) as a paged
    cache [num_pages, page_size, H, D] with a random page permutation (and a
    few spare pages of noise), plus its int32 page table [B, S / page_size]."""
    cache = np.asarray(cache)
    b, s, h, d = cache.shape
    per_seq = s // page_size
    n = b * per_seq + spare_pages
    perm = rng.permutation(n)[: b * per_seq].reshape(b, per_seq).astype(np.int32)
    paged = rng.standard_normal((n, page_size, h, d)).astype(cache.dtype)
    for bi in range(b):
        for j in range(per_seq):
            paged[perm[bi, j]] = cache[bi, j * page_size:(j + 1) * page_size]
    return paged, perm


def paged_with_table(cache, page_table, page_size, base):
    """`cache` [batch, capacity, ...] written into the pages of `page_table` (as
    to_paged laid out another cache) over a copy of `base` (the pool, whose
    pages outside the table keep its contents)."""
    out = np.array(base, copy=True)
    for bi in range(page_table.shape[0]):
        for j in range(page_table.shape[1]):
            out[page_table[bi, j]] = cache[bi, j * page_size:(j + 1) * page_size]
    return out


def dense_view(cache, page_table, capacity):
    """[B, capacity, H, D] float32 view of a paged cache (zeros, and a False
    `valid` flag, for positions in out-of-range pages)."""
    cache = np.asarray(cache, np.float32)
    pt = np.asarray(page_table)
    n, ps, h, d = cache.shape
    b = pt.shape[0]
    out = np.zeros((b, capacity, h, d), np.float32)
    valid = np.zeros((b, capacity), bool)
    for bi in range(b):
        for p in range(capacity):
            page = pt[bi, p // ps]
            if 0 <= page < n:
                out[bi, p] = cache[page, p % ps]
                valid[bi, p] = True
    return out, valid


def reference(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None, page_table=None, causal=True,
              scale=None, window=None, softcap=None, alibi=None):
    """(o [B, Sq, Hq, D], lse [B, Hq, Sq]) in float32, and the dense float32
    caches after the append."""
    q = np.asarray(q, np.float32)
    b, sq, hq, d = q.shape
    lens = np.maximum(np.asarray(cache_seqlens, np.int64), 0)
    if page_table is None:
        kd = np.array(k_cache, np.float32)
        vd = np.array(v_cache, np.float32)
        valid = np.ones(kd.shape[:2], bool)
    else:
        cap = np.asarray(page_table).shape[1] * np.asarray(k_cache).shape[1]
        kd, valid = dense_view(k_cache, page_table, cap)
        vd, _ = dense_view(v_cache, page_table, cap)
    cap = kd.shape[1]
    hkv = kd.shape[2]
    raw = lens + (sq if k is not None else 0)
    if k is not None:
        kn, vn = np.asarray(k, np.float32), np.asarray(v, np.float32)
        for bi in range(b):
            for i in range(sq):
                p = lens[bi] + i
                if p < cap and valid[bi, p]:
                    kd[bi, p], vd[bi, p] = kn[bi, i], vn[bi, i]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    left, right = (-1, -1) if window is None else (window if isinstance(window, tuple) else (window, window))
    o = np.zeros((b, sq, hq, d), np.float32)
    lse = np.full((b, hq, sq), -np.inf, np.float32)
    g = hq // hkv
    al = None if alibi is None else np.broadcast_to(np.asarray(alibi, np.float32), (b, hq))
    for bi in range(b):
        length = min(raw[bi], cap)
        j = np.arange(length)
        for i in range(sq):
            pos = raw[bi] - sq + i
            vis = valid[bi, :length].copy()
            if causal:
                vis &= j <= pos
            if left >= 0:
                vis &= j >= pos - left
            if right >= 0:
                vis &= j <= pos + right
            if not vis.any():
                continue
            for h in range(hq):
                s = kd[bi, :length, h // g] @ q[bi, i, h] * scale
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                if al is not None:
                    s = s - al[bi, h] * np.abs(pos - j)
                s = np.where(vis, s, -np.inf)
                m = s.max()
                e = np.exp(s - m)
                o[bi, i, h] = e @ vd[bi, :length, h // g] / e.sum()
                lse[bi, h, i] = m + np.log(e.sum())
    return o, lse, kd, vd
