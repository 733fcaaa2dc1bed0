"""jax_flash.attention_with_kvcache: attention of new queries against a KV cache.

The serving path (forward only). Two FFI targets, registered for "cpu" and
"CUDA" like the training ones: "jax_flash_kvcache_fwd" reads the cache;
"jax_flash_kvcache_append_fwd" first writes the new k/v into it and returns
the caches through input/output aliasing, so a donated cache is updated in
place and never copied. On CUDA the keys are split over CTAs (split-KV) and
the partial results merged in float32; the number of splits is chosen here,
from the static shapes, because it sizes the scratch output.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash import _ffi  # noqa: F401  (registers the FFI targets)
from jax_flash.attention import SUPPORTED_DTYPES, _check_scale, _concrete, _make_mask

KVCACHE_TARGET = "jax_flash_kvcache_fwd"
KVCACHE_APPEND_TARGET = "jax_flash_kvcache_append_fwd"

_NEW_KV, _PAGE_TABLE, _ALIBI = 1, 2, 4  # the optional_inputs bits (cpp/ffi/kvcache_common.h)
_FORCE_XLA = False  # tests set it to check kvcache_xla against the kernels
KEY_BLOCK = 64  # keys per pipeline stage of the CUDA kernel (cpp/cuda/decode/decode_kernel.cuh)


def _err(msg: str) -> str:
    return "jax_flash.attention_with_kvcache: " + msg


def _shape(x) -> tuple:
    return tuple(int(d) for d in x.shape)


def _check_array(x, name: str):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(_err(f"{name} must be an array, got {type(x).__name__}"))


def _check_int32(x, name: str, shape: tuple, what: str):
    _check_array(x, name)
    if jnp.dtype(x.dtype) != jnp.dtype(jnp.int32):
        raise TypeError(_err(f"{name} must be int32, got {name}.dtype={jnp.dtype(x.dtype)}"))
    if _shape(x) != shape:
        raise ValueError(_err(f"{name} must have shape {what} = {shape}, got {name}.shape={_shape(x)}"))


def _validate(q, k_cache, v_cache, cache_seqlens, k, v, page_table, alibi_slopes):
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_array(x, name)
        if x.ndim != 4:
            raise ValueError(_err(f"{name} must have rank 4, got {name}.shape={_shape(x)}"))
        if jnp.dtype(x.dtype) not in SUPPORTED_DTYPES:
            raise TypeError(_err(f"{name}.dtype={jnp.dtype(x.dtype)} is not supported; use "
                                 "float32, float16 or bfloat16"))
        if 0 in x.shape:
            raise ValueError(_err(f"{name} has an empty axis: {name}.shape={_shape(x)}"))
    if not q.dtype == k_cache.dtype == v_cache.dtype:
        raise TypeError(_err(f"q, k_cache and v_cache must share one dtype, got {q.dtype}, "
                             f"{k_cache.dtype}, {v_cache.dtype}"))
    if k_cache.shape != v_cache.shape:
        raise ValueError(_err(f"k_cache and v_cache must have the same shape, got "
                              f"{_shape(k_cache)} and {_shape(v_cache)}"))
    batch, sq, hq, d = _shape(q)
    hkv = int(k_cache.shape[2])
    if k_cache.shape[3] != d:
        raise ValueError(_err(f"q and the cache must have the same head_dim, got "
                              f"q.shape={_shape(q)}, k_cache.shape={_shape(k_cache)}"))
    if hq % hkv:
        raise ValueError(_err(f"the number of q heads ({hq}) must be a multiple of the cache's "
                              f"kv heads ({hkv}); q.shape={_shape(q)}, k_cache.shape={_shape(k_cache)}"))
    if d > 256:
        raise ValueError(_err(f"head_dim must be at most 256, got {d}"))
    _check_int32(cache_seqlens, "cache_seqlens", (batch,), "(batch,)")
    if page_table is None:
        if k_cache.shape[0] != batch:
            raise ValueError(_err(f"a contiguous cache must have q's batch: q.shape={_shape(q)}, "
                                  f"k_cache.shape={_shape(k_cache)}"))
        capacity = int(k_cache.shape[1])
    else:
        _check_array(page_table, "page_table")
        if jnp.dtype(page_table.dtype) != jnp.dtype(jnp.int32):
            raise TypeError(_err(f"page_table must be int32, got page_table.dtype="
                                 f"{jnp.dtype(page_table.dtype)}"))
        if page_table.ndim != 2 or page_table.shape[0] != batch or page_table.shape[1] == 0:
            raise ValueError(_err(f"page_table must have shape (batch, pages_per_sequence) with "
                                  f"batch={batch}, got page_table.shape={_shape(page_table)}"))
        capacity = int(page_table.shape[1]) * int(k_cache.shape[1])
    if (k is None) != (v is None):
        raise ValueError(_err("k and v must be given together (to append) or both omitted"))
    if k is not None:
        for name, x in (("k", k), ("v", v)):
            _check_array(x, name)
            if _shape(x) != (batch, sq, hkv, d):
                raise ValueError(_err(f"{name} must have shape (batch, seqlen_q, num_heads_kv, "
                                      f"head_dim) = {(batch, sq, hkv, d)}, got {name}.shape={_shape(x)}"))
            if x.dtype != q.dtype:
                raise TypeError(_err(f"{name} must have q's dtype {q.dtype}, got {x.dtype}"))
    lens = _concrete(cache_seqlens)
    if lens is not None and lens.size:
        if lens.min() < 0:
            raise ValueError(_err(f"cache_seqlens must be >= 0, got min {lens.min()}"))
        need = int(lens.max()) + (sq if k is not None else 0)
        if need > capacity:
            raise ValueError(_err(
                f"cache_seqlens{' + seqlen_q' if k is not None else ''} = {need} exceeds the "
                f"cache capacity {capacity} (k_cache.shape={_shape(k_cache)}"
                + (f", page_table.shape={_shape(page_table)})" if page_table is not None else ")")))
    if alibi_slopes is not None:
        a = alibi_slopes if hasattr(alibi_slopes, "shape") else np.asarray(alibi_slopes)
        if not jnp.issubdtype(jnp.dtype(a.dtype), jnp.floating):
            raise TypeError(_err(f"alibi_slopes must be floating point, got {jnp.dtype(a.dtype)}"))
        if _shape(a) not in ((hq,), (batch, hq)):
            raise ValueError(_err(f"alibi_slopes must have shape (num_heads,) = {(hq,)} or "
                                  f"(batch, num_heads) = {(batch, hq)}, got {_shape(a)}"))
    return capacity


def _cta_slots_per_sm(head_dim: int, warps_m: int) -> int:
    """CTAs of the decode kernel one SM holds (shared memory bound; mirrors
    decode_smem_bytes in cpp/cuda/decode/decode_kernel.cuh)."""
    d = max(64, 1 << (head_dim - 1).bit_length())
    stages = {64: 4, 128: 3, 256: 2}[d]
    # K/V stages, Q rows, row tables (a slot more than the stages); 1 KB a
    # CTA the hardware reserves.
    smem = stages * KEY_BLOCK * d * 2 * 2 + 16 * warps_m * d * 2 + (stages + 1) * KEY_BLOCK * 4
    return max(1, (228 * 1024) // (smem + 1024))


def num_splits(batch: int, seqlen_q: int, heads_q: int, heads_kv: int, head_dim: int,
               capacity: int, num_sms: int = 132) -> int:
    """Key splits per (batch, kv head, row block) for the CUDA kernel: the
    fewest that fill the SMs' CTA slots to >= 95% of the last wave (else the
    best fill), each split keeping at least 4 key blocks (256 keys).
    JAX_FLASH_DECODE_SPLITS=n (read when tracing) forces n."""
    import os

    forced = os.environ.get("JAX_FLASH_DECODE_SPLITS")  # benchmarks' split sweeps
    if forced:
        return max(1, min(1024, int(forced)))
    rows = (heads_q // heads_kv) * seqlen_q
    wm = 1 if rows <= 16 else (2 if rows <= 32 else 4)
    base = batch * heads_kv * -(-rows // (16 * wm))
    slots = num_sms * _cta_slots_per_sm(head_dim, wm)
    max_splits = max(1, min(128, -(-capacity // KEY_BLOCK) // 4))
    if base >= slots or max_splits == 1:
        return 1
    best, best_eff = 1, 0.0
    for s in range(1, max_splits + 1):
        ctas = base * s
        eff = ctas / (-(-ctas // slots) * slots)
        if eff >= 0.95:
            return s
        if eff > best_eff + 1e-9:
            best, best_eff = s, eff
    return best


def _pairs_heads(seqlen_q: int, heads_q: int, heads_kv: int, head_dim: int) -> bool:
    """Whether the CUDA kernel runs two d64 kv heads as one of d128 (mirrors
    pairs_heads in cpp/cuda/decode/decode_launch.cu)."""
    return (head_dim == 64 and 128 in _ffi.cuda_kvcache_head_dims()
            and heads_kv % 2 == 0 and 2 * (heads_q // heads_kv) * seqlen_q <= 16)


def cuda_splits(batch: int, seqlen_q: int, heads_q: int, heads_kv: int, head_dim: int,
                capacity: int) -> int:
    """The split count the CUDA kernel runs with on this GPU: num_splits of
    the kernel's own view (paired d64 kv heads: half the heads at twice the
    head dim)."""
    pair = _pairs_heads(seqlen_q, heads_q, heads_kv, head_dim)
    view = (heads_kv // 2, 2 * head_dim) if pair else (heads_kv, head_dim)
    return num_splits(batch, seqlen_q, heads_q, *view, capacity, _num_sms())


def _num_sms() -> int:
    try:
        dev = jax.devices("gpu")[0]
        return int(getattr(dev, "core_count", 132) or 132)
    except Exception:
        return 132


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None, page_table=None,
                           causal: bool = True, scale: float | None = None,
                           local_window_size=None, logits_soft_cap=None, alibi_slopes=None,
                           return_lse: bool = False):
    """Attention of new queries against a (contiguous or paged) KV cache.

    Args:
      q: [batch, seqlen_q, num_heads, head_dim], float32/float16/bfloat16
        (CUDA: 16-bit, head_dim 64, 128 or 256).
      k_cache, v_cache: contiguous [batch, max_seqlen, num_heads_kv, head_dim]
        or, with page_table, paged [num_pages, page_size, num_heads_kv, head_dim].
      cache_seqlens: int32 [batch], the tokens already in the cache.
      k, v: optional [batch, seqlen_q, num_heads_kv, head_dim]: written at
        positions cache_seqlens[b] + i before attending; the call then also
        returns the updated caches (in place when donated).
      page_table: int32 [batch, pages_per_sequence]: position p of sequence b
        lives in page page_table[b, p // page_size] at row p % page_size.
        Keys in pages with an id outside [0, num_pages) are masked (never
        read), appends into them are dropped; a row that sees no key gets
        o = 0 and lse = -inf.
      causal: bottom-right aligned: query i of sequence b sits at position
        L_b - seqlen_q + i (L_b = cache_seqlens[b], plus seqlen_q when
        appending) and sees keys up to there. Without causal every one of the
        L_b keys is visible.
      scale, local_window_size, logits_soft_cap, alibi_slopes, return_lse:
        as in jax_flash.attention (positions as above).

    Returns:
      o (or (o, lse) with return_lse); with k/v: (o, k_cache, v_cache).
    """
    _check_array(q, "q")
    _check_array(k_cache, "k_cache")
    _check_array(v_cache, "v_cache")
    capacity = _validate(q, k_cache, v_cache, cache_seqlens, k, v, page_table, alibi_slopes)
    s = _check_scale(scale, int(q.shape[3]))
    mask = _make_mask(causal, local_window_size, logits_soft_cap, 0)
    append = k is not None
    extras, bits = [], 0
    if append:
        extras += [jnp.asarray(k), jnp.asarray(v)]
        bits |= _NEW_KV
    if page_table is not None:
        extras.append(jnp.asarray(page_table))
        bits |= _PAGE_TABLE
    if alibi_slopes is not None:
        extras.append(jnp.asarray(alibi_slopes, jnp.float32))
        bits |= _ALIBI
    out = kvcache_call(q, k_cache, v_cache, cache_seqlens, extras, bits, scale=s, mask=mask,
                       capacity=capacity)
    o, lse = out[0], out[1]
    res = (o, lse) if return_lse else o
    if append:
        return res, out[2], out[3]
    return res


_POSITIONS, _QUERY_OFFSETS = 16, 8


def kvcache_call(q, k_cache, v_cache, cache_seqlens, extras, bits, *, scale, mask, capacity,
                 query_offset=0):
    """The FFI call on checked operands: `extras` in KvcacheInput order,
    `bits` the optional_inputs mask; returns (o, lse[, k_cache, v_cache])."""
    batch, sq, hq, d = _shape(q)
    hkv = int(k_cache.shape[2])
    append = bool(bits & _NEW_KV)
    q, k_cache, v_cache = jnp.asarray(q), jnp.asarray(k_cache), jnp.asarray(v_cache)
    cache_seqlens = jnp.asarray(cache_seqlens)
    attrs = dict(scale=np.float32(scale), causal=bool(mask.causal),
                 window_left=np.int64(mask.window_left), window_right=np.int64(mask.window_right),
                 softcap=np.float32(mask.softcap), optional_inputs=np.int64(bits),
                 query_offset=np.int64(query_offset))
    gpu_splits = cuda_splits(batch, sq, hq, hkv, d, capacity)

    def call(splits):
        floats = splits * batch * hq * sq * (d + 1) if splits > 1 else 1

        def run(q, k_cache, v_cache, cache_seqlens, *extras):
            o_type = jax.ShapeDtypeStruct(q.shape, q.dtype)
            lse_type = jax.ShapeDtypeStruct((batch, hq, sq), jnp.float32)
            ws_type = jax.ShapeDtypeStruct((floats,), jnp.float32)
            if append:
                f = jax.ffi.ffi_call(
                    KVCACHE_APPEND_TARGET,
                    (o_type, lse_type, jax.ShapeDtypeStruct(k_cache.shape, k_cache.dtype),
                     jax.ShapeDtypeStruct(v_cache.shape, v_cache.dtype), ws_type),
                    input_output_aliases={1: 2, 2: 3}, vmap_method="sequential")
                o, lse, kc, vc, _ = f(q, k_cache, v_cache, cache_seqlens, *extras,
                                      num_splits=np.int64(splits), **attrs)
                return o, lse, kc, vc
            f = jax.ffi.ffi_call(KVCACHE_TARGET, (o_type, lse_type, ws_type),
                                 vmap_method="sequential")
            o, lse, _ = f(q, k_cache, v_cache, cache_seqlens, *extras,
                          num_splits=np.int64(splits), **attrs)
            return o, lse

        return run

    def unfused(q, k_cache, v_cache, cache_seqlens, *extras):
        return kvcache_xla(q, k_cache, v_cache, cache_seqlens, list(extras), bits, scale=scale,
                           mask=mask, query_offset=query_offset)

    # The CPU kernel picks its own splits (host scratch); CUDA's are sized here.
    # Where no CUDA decode kernel serves the dtype / head dim (float32, head
    # dims other than 64/128/256, or left out of the build), the CUDA lowering
    # runs the same function in plain XLA.
    if _FORCE_XLA:  # tests: the fallback on every platform
        return unfused(q, k_cache, v_cache, cache_seqlens, *extras)
    cuda = call(gpu_splits) if cuda_kernel_serves(q.dtype, d) else unfused
    return jax.lax.platform_dependent(q, k_cache, v_cache, cache_seqlens, *extras,
                                      cpu=call(1), default=cuda)


def cuda_kernel_serves(dtype, head_dim: int) -> bool:
    """Whether this build has a CUDA decode kernel for the dtype and head dim."""
    names = {jnp.dtype(jnp.bfloat16): "bfloat16", jnp.dtype(jnp.float16): "float16"}
    return (names.get(jnp.dtype(dtype)) in _ffi.cuda_dtypes()
            and head_dim in _ffi.cuda_kvcache_head_dims())


def kvcache_xla(q, k_cache, v_cache, cache_seqlens, extras, bits, *, scale, mask, query_offset=0):
    """attention_with_kvcache in plain jnp (same semantics as the kernels):
    the CUDA fallback for what no decode kernel serves, and a reference."""
    batch, sq, hq, d = _shape(q)
    hkv = int(k_cache.shape[2])
    ex = iter(extras)
    kn = vn = pt = alibi = qoffs = None
    if bits & _NEW_KV:
        kn, vn = next(ex), next(ex)
    if bits & _PAGE_TABLE:
        pt = next(ex)
    if bits & _ALIBI:
        alibi = next(ex)
    if bits & _QUERY_OFFSETS:
        qoffs = next(ex)
    rows = int(k_cache.shape[1])
    cap = rows * int(pt.shape[1]) if pt is not None else rows
    raw = jnp.maximum(cache_seqlens, 0) + (sq if kn is not None else 0)
    length = jnp.minimum(raw, cap)
    bidx = jnp.arange(batch)[:, None]

    def slot(pos):  # cache index of positions [B, n]: (slab, row, valid)
        if pt is None:
            return jnp.broadcast_to(bidx, pos.shape), pos, pos < cap
        page = jnp.take_along_axis(pt, jnp.clip(pos // rows, 0, pt.shape[1] - 1), axis=1)
        ok = (pos < cap) & (page >= 0) & (page < k_cache.shape[0])
        return page, pos % rows, ok

    if kn is not None:
        slab, row, ok = slot(raw[:, None] - sq + jnp.arange(sq))
        slab = jnp.where(ok, slab, k_cache.shape[0])  # out of range: dropped
        k_cache = k_cache.at[slab, row].set(kn, mode="drop")
        v_cache = v_cache.at[slab, row].set(vn, mode="drop")
    j = jnp.arange(cap)
    slab, row, ok = slot(jnp.broadcast_to(j, (batch, cap)))
    slab = jnp.clip(slab, 0, k_cache.shape[0] - 1)
    kd, vd = k_cache[slab, row], v_cache[slab, row]  # [B, cap, hkv, d]
    if bits & _POSITIONS:
        pos0 = query_offset + (qoffs if qoffs is not None else 0) + jnp.zeros((batch,), jnp.int32)
    else:
        pos0 = raw - sq
    qpos = pos0[:, None] + jnp.arange(sq)  # [B, sq]
    vis = ok[:, None, :] & (j[None, None, :] < length[:, None, None])
    if mask.causal:
        vis &= j[None, None, :] <= qpos[:, :, None]
    if mask.window_left >= 0:
        vis &= j[None, None, :] >= qpos[:, :, None] - mask.window_left
    if mask.window_right >= 0:
        vis &= j[None, None, :] <= qpos[:, :, None] + mask.window_right
    g = hq // hkv
    qg = q.reshape(batch, sq, hkv, g, d).astype(jnp.float32)
    s = jnp.einsum("bqhgd,bkhd->bhgqk", qg, kd.astype(jnp.float32)) * scale
    if mask.softcap:
        s = mask.softcap * jnp.tanh(s / mask.softcap)
    if alibi is not None:
        slopes = jnp.broadcast_to(alibi, (batch, hq)).reshape(batch, hkv, g)
        dist = jnp.abs(qpos[:, :, None] - j[None, None, :]).astype(jnp.float32)  # [B, sq, cap]
        s = s - slopes[:, :, :, None, None] * dist[:, None, None]
    s = jnp.where(vis[:, None, None], s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(s - m_safe)
    tot = jnp.sum(e, axis=-1, keepdims=True)
    pr = e / jnp.where(tot > 0, tot, 1.0)
    o = jnp.einsum("bhgqk,bkhd->bqhgd", pr, vd.astype(jnp.float32)).reshape(batch, sq, hq, d)
    lse = jnp.where(tot[..., 0] > 0, m_safe[..., 0] + jnp.log(tot[..., 0]), -jnp.inf)
    lse = lse.reshape(batch, hq, sq)
    out = (o.astype(q.dtype), lse)
    if kn is not None:
        out += (k_cache, v_cache)
    return out


# ---------------------------------------------------------------------------
# jax_flash.attention's decode route: small-query, long-key forwards run the
# split-KV kernel on CUDA (the backward keeps the training kernels).

ROUTE_MAX_QUERIES = 16
ROUTE_MIN_KEYS = 2048


def _route_mode() -> str:
    import os

    return os.environ.get("JAX_FLASH_DECODE_ROUTE", "1")


def decode_route_applies(q, k, mask, extras) -> bool:
    """Whether attention()'s forward takes the decode kernel on CUDA: at most
    16 queries against at least 2048 keys, no option the decode kernel lacks
    (dropout, query lengths, segment ids), a 16-bit dtype and head dim with
    decode kernels in this build. JAX_FLASH_DECODE_ROUTE=0 turns it off;
    =force takes it for every shape and on the CPU too (tests)."""
    mode = _route_mode()
    if mode == "0":
        return False
    if mask.dropout_rate or extras.q_seqlens is not None or extras.q_segment_ids is not None:
        return False
    if mode == "force":
        return True
    if "CUDA" not in _ffi.compiled_platforms():
        return False
    sq, d = int(q.shape[-3]), int(q.shape[-1])
    if sq > ROUTE_MAX_QUERIES or int(k.shape[-3]) < ROUTE_MIN_KEYS:
        return False
    names = {"bfloat16": jnp.dtype(jnp.bfloat16), "float16": jnp.dtype(jnp.float16)}
    if jnp.dtype(q.dtype) not in [names[n] for n in _ffi.cuda_dtypes()]:
        return False
    return d in _ffi.cuda_kvcache_head_dims()


def decode_route_fwd(q, k, v, extras, scale, mask, regular):
    """(o, lse) of attention's forward through the decode kernel on CUDA and
    `regular(q, k, v)` elsewhere. Leading batch axes are folded; positions
    are attention()'s (query_offset + query_offsets[b] + i); the keys past
    kv_seqlens are the cache's unused rows."""
    lead = tuple(q.shape[:-3])
    sq, hq, d = (int(x) for x in q.shape[-3:])
    sk, hkv = int(k.shape[-3]), int(k.shape[-2])
    batch = int(np.prod(lead)) if lead else 1
    q4, k4, v4 = (x.reshape((batch,) + tuple(x.shape[-3:])) for x in (q, k, v))
    lens = (jnp.full((batch,), sk, jnp.int32) if extras.kv_seqlens is None
            else extras.kv_seqlens.reshape(batch).astype(jnp.int32))
    ops, bits = [], _POSITIONS
    if extras.alibi_slopes is not None:
        ops.append(jnp.broadcast_to(extras.alibi_slopes, lead + (hq,)).reshape(batch, hq))
        bits |= _ALIBI
    if extras.query_offsets is not None:
        ops.append(extras.query_offsets.reshape(batch).astype(jnp.int32))
        bits |= _QUERY_OFFSETS

    def decode(q4, k4, v4, lens, *ops):
        o, lse = kvcache_call(q4, k4, v4, lens, list(ops), bits, scale=scale,
                              mask=mask._replace(query_offset=0), capacity=sk,
                              query_offset=mask.query_offset)
        return o.reshape(q.shape), lse.reshape(lead + (hq, sq))

    def other(q4, k4, v4, lens, *ops):
        return regular(q, k, v)

    cpu = decode if _route_mode() == "force" else other
    return jax.lax.platform_dependent(q4, k4, v4, lens, *ops, cpu=cpu, cuda=decode, default=other)


__all__ = ["attention_with_kvcache", "num_splits"]
