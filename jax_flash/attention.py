"""jax_flash.attention: validation, the custom_vjp, and the FFI calls."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_flash import _ffi  # noqa: F401  (registers the FFI targets)
from jax_flash import partitioning as _partitioning
from jax_flash.mask import NO_EXTRAS, SEGMENT_BLOCK, Extras, Mask

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


def _static_float(value, name: str) -> float:
    """A static Python number as float: traced values and non-numbers raise TypeError."""
    if is_traced(value):
        raise TypeError(f"jax_flash.attention: {name} must be a static Python number, not a traced value")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"jax_flash.attention: {name} must be a number, got {value!r}") from None


def _check_scale(scale, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    s = _static_float(scale, "scale")
    if not math.isfinite(s):
        raise ValueError(f"jax_flash.attention: scale must be finite, got {s}")
    return s


def _static_int(value, name: str) -> int:
    if is_traced(value) or getattr(value, "ndim", 0) > 0:
        raise TypeError(f"jax_flash.attention: {name} must be a static Python int, "
                        f"got {type(value).__name__}")
    if isinstance(value, jax.Array):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"jax_flash.attention: {name} must be an int, got {value!r}")
    return int(value)


def _make_mask(causal, local_window_size, logits_soft_cap, query_offset, dropout_rate=0.0) -> Mask:
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
        cap = _static_float(logits_soft_cap, "logits_soft_cap")
        if not (math.isfinite(cap) and cap > 0):
            raise ValueError(f"jax_flash.attention: logits_soft_cap must be a positive finite "
                             f"number, got {logits_soft_cap!r}")
    return Mask(causal=bool(causal), query_offset=_static_int(query_offset, "query_offset"),
                window_left=left, window_right=right, softcap=cap,
                dropout_rate=float(np.float32(dropout_rate)))


# ---------------------------------------------------------------------------
# The per-batch options (lengths, per-batch offsets, segment ids, ALiBi,
# dropout): checked on shapes and dtypes, range-checked when concrete, and
# turned into the Extras operands of the FFI calls.


def _is_per_batch_array(x) -> bool:
    """An array query_offset (per batch) rather than a static int."""
    return (isinstance(x, (np.ndarray, jax.Array)) and getattr(x, "ndim", 0) > 0) or is_traced(x)


def _concrete(x):
    """x as a NumPy array when its value is known now, else None (traced)."""
    try:
        return np.asarray(x)
    except Exception:  # a tracer
        return None


def _int_array(x, name: str, shape: tuple, what: str):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        try:
            x = np.asarray(x)
        except Exception:
            raise TypeError(f"jax_flash.attention: {name} must be an integer array, "
                            f"got {type(x).__name__}") from None
    if not jnp.issubdtype(jnp.dtype(x.dtype), jnp.integer) or jnp.dtype(x.dtype) == jnp.dtype(bool):
        raise TypeError(f"jax_flash.attention: {name} must have an integer dtype (int32), "
                        f"got {name}.dtype={jnp.dtype(x.dtype)}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"jax_flash.attention: {name} must have shape {what} = {tuple(shape)}, "
                         f"got {name}.shape={tuple(x.shape)}")
    return x


def _check_range(x, name: str, lo: int, hi: int):
    c = _concrete(x)
    if c is not None and c.size and (c.min() < lo or c.max() > hi):
        raise ValueError(f"jax_flash.attention: {name} must lie in [{lo}, {hi}], got values in "
                         f"[{c.min()}, {c.max()}]")


def segment_ranges(ids, block: int = SEGMENT_BLOCK):
    """Inclusive [min, max] segment id of each block of `block` positions:
    [..., S] -> [..., ceil(S / block), 2] int32. The tail block is padded with
    its last id, so it covers the real positions only."""
    s = ids.shape[-1]
    n = -(-s // block)
    x = jnp.pad(ids.astype(jnp.int32), [(0, 0)] * (ids.ndim - 1) + [(0, n * block - s)], mode="edge")
    x = x.reshape(ids.shape[:-1] + (n, block))
    return jnp.stack([x.min(-1), x.max(-1)], axis=-1)


def _dropout_seed(dropout_rng):
    """The two uint32 key words of the kernels' Philox from a JAX PRNG key
    (new-style typed key or raw uint32 key data)."""
    if dropout_rng is None:
        raise ValueError("jax_flash.attention: dropout_rate > 0 needs dropout_rng (a JAX PRNG "
                         "key, e.g. jax.random.key(0))")
    if not hasattr(dropout_rng, "dtype"):
        raise TypeError("jax_flash.attention: dropout_rng must be a JAX PRNG key, got "
                        f"{type(dropout_rng).__name__}")
    if jnp.issubdtype(dropout_rng.dtype, jax.dtypes.prng_key):
        if dropout_rng.ndim != 0:
            raise ValueError("jax_flash.attention: dropout_rng must be a single key, got "
                             f"shape {tuple(dropout_rng.shape)}")
    elif jnp.dtype(dropout_rng.dtype) != jnp.dtype(jnp.uint32) or dropout_rng.ndim != 1:
        raise TypeError("jax_flash.attention: dropout_rng must be a JAX PRNG key (jax.random.key "
                        "or a raw uint32 key such as jax.random.PRNGKey(0)), got dtype "
                        f"{jnp.dtype(dropout_rng.dtype)} and shape {tuple(dropout_rng.shape)}")
    return jax.random.bits(dropout_rng, (2,), jnp.uint32)


def _check_dropout_rate(dropout_rate) -> float:
    if dropout_rate is None:
        return 0.0
    rate = _static_float(dropout_rate, "dropout_rate")
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"jax_flash.attention: dropout_rate must be in [0, 1), got {dropout_rate!r}")
    return rate


def _make_extras(q, k, *, query_offset, query_seq_lengths, key_value_seq_lengths,
                 q_segment_ids, kv_segment_ids, alibi_slopes, dropout_rate, dropout_rng) -> Extras:
    batch = tuple(q.shape[:-3])
    sq, hq, sk = q.shape[-3], q.shape[-2], k.shape[-3]
    fields = {}
    if query_seq_lengths is not None:
        x = _int_array(query_seq_lengths, "query_seq_lengths", batch, "q.shape[:-3]")
        _check_range(x, "query_seq_lengths", 0, sq)
        fields["q_seqlens"] = jnp.asarray(x, jnp.int32)
    if key_value_seq_lengths is not None:
        x = _int_array(key_value_seq_lengths, "key_value_seq_lengths", batch, "k.shape[:-3]")
        _check_range(x, "key_value_seq_lengths", 0, sk)
        fields["kv_seqlens"] = jnp.asarray(x, jnp.int32)
    if _is_per_batch_array(query_offset):
        x = query_offset
        if getattr(x, "ndim", 0) == 0:  # a traced scalar: the same for every batch element
            x = jnp.broadcast_to(jnp.asarray(x), batch)
        x = _int_array(x, "query_offset", batch, "q.shape[:-3] (per batch) or a static int")
        fields["query_offsets"] = jnp.asarray(x, jnp.int32)
    if kv_segment_ids is not None and q_segment_ids is None:
        raise ValueError("jax_flash.attention: kv_segment_ids needs q_segment_ids")
    if q_segment_ids is not None:
        qs = _int_array(q_segment_ids, "q_segment_ids", batch + (sq,), "q.shape[:-3] + (seqlen_q,)")
        if kv_segment_ids is None:
            if sq != sk:
                raise ValueError(
                    "jax_flash.attention: kv_segment_ids is required when seqlen_q != seqlen_k "
                    f"(got q_segment_ids.shape={tuple(qs.shape)} and seqlen_k={sk})")
            kv_segment_ids = qs
        ks = _int_array(kv_segment_ids, "kv_segment_ids", batch + (sk,), "k.shape[:-3] + (seqlen_k,)")
        qs, ks = jnp.asarray(qs, jnp.int32), jnp.asarray(ks, jnp.int32)
        fields.update(q_segment_ids=qs, kv_segment_ids=ks, q_segment_ranges=segment_ranges(qs),
                      kv_segment_ranges=segment_ranges(ks))
    if alibi_slopes is not None:
        a = alibi_slopes
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            a = np.asarray(a)
        if not jnp.issubdtype(jnp.dtype(a.dtype), jnp.floating):
            raise TypeError("jax_flash.attention: alibi_slopes must be floating point, got "
                            f"alibi_slopes.dtype={jnp.dtype(a.dtype)}")
        if tuple(a.shape) not in ((hq,), batch + (hq,)):
            raise ValueError(f"jax_flash.attention: alibi_slopes must have shape (num_heads,) = "
                             f"{(hq,)} or q.shape[:-3] + (num_heads,) = {batch + (hq,)}, got "
                             f"alibi_slopes.shape={tuple(a.shape)}")
        fields["alibi_slopes"] = jnp.broadcast_to(jnp.asarray(a, jnp.float32), batch + (hq,))
    if dropout_rate > 0.0:
        fields["dropout_seed"] = _dropout_seed(dropout_rng)
    return Extras(**fields)


# jax_default_matmul_precision values that ask for (about) full float32
# dot products; the others (None / "default", "high", "tensorfloat32",
# "bfloat16", ...) allow TF32, which is JAX's default for float32 on GPU.
_FULL_F32_PRECISIONS = frozenset({
    "highest", "float32", "f32_f32_f32", "tf32_tf32_f32_x3", "bf16_bf16_f32_x6",
    "bf16_bf16_f32_x9", "f64_f64_f64"})


def _full_f32_requested() -> bool:
    """Whether jax_default_matmul_precision (read at trace time) asks for full
    float32 precision."""
    value = jax.config.jax_default_matmul_precision
    if value is None:
        return False
    return str(getattr(value, "name", value)).lower() in _FULL_F32_PRECISIONS


def _with_precision(mask: Mask, q) -> Mask:
    """The mask with f32_full set for float32 inputs under a full-float32
    precision request: the CUDA kernels (TF32) then refuse the call rather
    than compute it in TF32 silently; the CPU ones compute float32 anyway."""
    if jnp.dtype(q.dtype) == jnp.dtype(jnp.float32) and _full_f32_requested():
        return mask._replace(f32_full=True)
    return mask


def _without_dropout(mask: Mask, extras: Extras):
    return mask._replace(dropout_rate=0.0), extras._replace(dropout_seed=None)


# ---------------------------------------------------------------------------
# The raw FFI calls. Each is wrapped in a custom_jvp whose rule raises, so a
# second derivative gives a clear error instead of XLA's generic one.


def _no_higher_order(*_args, **_kwargs):
    raise NotImplementedError(
        "jax_flash.attention supports first-order gradients only (jax.grad, jax.vjp); "
        "higher-order derivatives (grad of grad, jacfwd, jvp) are not implemented. "
        "Use jax.nn.dot_product_attention for those."
    )


@functools.partial(jax.custom_jvp, nondiff_argnums=(4, 5))
def _fwd_call_x(q, k, v, extras, scale: float, mask):
    # Batch/head sharding under jit: see jax_flash/partitioning.py.
    from jax_flash import kvcache as _kvcache  # (imports this module)

    if _kvcache.decode_route_applies(q, k, Mask.of(mask), extras):
        # Decode shapes: the split-KV kernel on CUDA (forward only).
        return _kvcache.decode_route_fwd(
            q, k, v, extras, scale, Mask.of(mask),
            lambda q, k, v: _partitioning.fwd(q, k, v, scale, mask, extras))
    return _partitioning.fwd(q, k, v, scale, mask, extras)


@_fwd_call_x.defjvp
def _fwd_call_jvp(scale, mask, primals, tangents):
    _no_higher_order()


@functools.partial(jax.custom_jvp, nondiff_argnums=(7, 8, 9))
def _bwd_call_x(q, k, v, o, lse, do, extras, scale: float, mask, deterministic: bool):
    return _partitioning.bwd(q, k, v, o, lse, do, scale, mask, deterministic, extras)


@_bwd_call_x.defjvp
def _bwd_call_jvp(scale, mask, deterministic, primals, tangents):
    _no_higher_order()


def _fwd_call(q, k, v, scale: float, causal, extras: Extras = NO_EXTRAS):
    """Forward kernel (ring attention's building block); `extras` the optional
    operands (the ring passes segment ids and ranges only)."""
    return _fwd_call_x(q, k, v, extras, scale, _with_precision(Mask.of(causal), q))


def _bwd_call(q, k, v, o, lse, do, scale: float, causal, deterministic: bool,
              extras: Extras = NO_EXTRAS):
    """Backward kernel (ring attention's building block); `extras` as in `_fwd_call`."""
    return _bwd_call_x(q, k, v, o, lse, do, extras, scale, _with_precision(Mask.of(causal), q),
                       deterministic)


# ---------------------------------------------------------------------------
# The differentiable core. Residuals are exactly (q, k, v, o, lse) plus the
# optional operands, which are not differentiated (zero cotangents).


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _flash(q, k, v, extras, scale, mask, deterministic):
    return _fwd_call_x(q, k, v, extras, scale, mask)


def _flash_fwd(q, k, v, extras, scale, mask, deterministic):
    q, k, v = q.value, k.value, v.value
    extras = jax.tree.map(lambda x: x.value, extras)
    o, lse = _fwd_call_x(q, k, v, extras, scale, mask)
    return (o, lse), (q, k, v, o, lse, extras)


def _zero_cotangent(x):
    dt = jnp.dtype(x.dtype)
    if jnp.issubdtype(dt, jnp.floating):
        return jnp.zeros(x.shape, dt)
    return np.zeros(x.shape, dtype=jax.dtypes.float0)


def _flash_bwd(scale, mask, deterministic, residuals, cotangents):
    q, k, v, o, lse, extras = residuals
    do, dlse = cotangents
    sym_zero = jax.custom_derivatives.SymbolicZero
    if isinstance(do, sym_zero):
        do = jnp.zeros_like(o)
    dq, dk, dv = _bwd_call_x(q, k, v, o, lse, do.astype(o.dtype), extras, scale, mask, deterministic)
    if not isinstance(dlse, sym_zero):
        # lse is the log-sum-exp of the un-dropped probabilities.
        mask0, extras0 = _without_dropout(mask, extras)
        dq, dk = _add_lse_cotangent(q, k, v, lse, dlse, dq, dk, scale, mask0, extras0, deterministic)
    return dq, dk, dv, jax.tree.map(_zero_cotangent, extras)


def _add_lse_cotangent(q, k, v, lse, dlse, dq, dk, scale, mask, extras, deterministic):
    """Adds the gradient of sum(dlse * lse) to dq and dk with one backward call.

    d lse_i / d s_ij = P_ij, so the lse cotangent g adds g_i P_ij to dS (times
    the soft-cap derivative, which the kernel applies). The backward kernel
    computes dS_ij = P_ij (dO_i . V_j - rowsum(dO_i * O_i)) (cap derivative
    included): with V := ones, O := 0 and dO_i := (g_i, 0, ..., 0) that is
    exactly g_i P_ij, and its dq, dk are the wanted terms (dv is discarded).
    """
    g = jnp.where(jnp.isfinite(lse), dlse, 0.0).astype(jnp.float32)
    g_rows = jnp.swapaxes(g, -1, -2)  # [..., Sq, Hq]
    do = jnp.zeros_like(q).at[..., 0].set(g_rows.astype(q.dtype))
    dq_l, dk_l, _ = _bwd_call_x(q, k, jnp.ones_like(k), jnp.zeros_like(q), lse, do, extras,
                                scale, mask, deterministic)
    dq = (dq.astype(jnp.float32) + dq_l.astype(jnp.float32)).astype(dq.dtype)
    dk = (dk.astype(jnp.float32) + dk_l.astype(jnp.float32)).astype(dk.dtype)
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
    query_offset=0,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    q_segment_ids=None,
    kv_segment_ids=None,
    alibi_slopes=None,
    dropout_rate: float = 0.0,
    dropout_rng=None,
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
        (float32, natural log; -inf for a row that sees no key). With dropout
        it is the log-sum-exp of the un-dropped probabilities (FlashAttention's
        convention).
      deterministic: bitwise reproducible gradients on CUDA (no atomics); the
        CPU backward is always deterministic.
      local_window_size: int w or (left, right): query i sees keys in
        [i - left, i + right] (jax.nn's meaning; combines with causal). Tiles
        outside the band are skipped.
      logits_soft_cap: c > 0: scaled logits become c * tanh(logits / c).
      query_offset: a static int, or an int32 array [batch...] (per-batch
        cache positions): query i of batch b sits at absolute position
        query_offset + i (+ query_offset[b]) for the causal mask, the window
        and ALiBi (seqlen_k - seqlen_q gives bottom-right alignment for a
        block of new queries against a key/value cache).
      query_seq_lengths: int32 [batch...]: query rows at or past the length
        are padding: o = 0, lse = -inf and zero gradient.
      key_value_seq_lengths: int32 [batch...]: keys at or past the length are
        masked. Tiles entirely in padding are skipped. On the valid rows the
        result equals jax.nn.dot_product_attention with the same lengths.
      q_segment_ids, kv_segment_ids: int32 [batch..., seqlen_q] and
        [batch..., seqlen_k] (packed documents): query i sees key j only when
        the ids are equal (and, with causal, j is not after i). kv_segment_ids
        defaults to q_segment_ids when seqlen_q == seqlen_k. Tiles whose id
        ranges cannot meet are skipped, so sort ids within a row for speed.
        A row that sees no key gives o = 0, lse = -inf.
      alibi_slopes: float32 [num_heads] or [batch..., num_heads]: adds
        -slope * |pos_q - j| to the scaled (and soft-capped) logits, pos_q the
        absolute query position (i + query_offset). Slopes get no gradient.
      dropout_rate: static float in [0, 1): attention-probability dropout,
        kept values scaled by 1 / (1 - rate). The keep mask is generated inside
        the kernels (Philox4x32-10, cpp/dropout.h) and regenerated in the
        backward, never stored; jax_flash.dropout_mask(dropout_rng, ...)
        returns the same mask for testing. Element (b, h, i, j) uses the folded
        (flattened leading axes) batch index b and the q head h. Under vmap the
        mapped axis is folded into the batch too (so instances sharing one key
        get different masks); under batch/head sharding each shard counts its
        local batch/head indices, so shards holding the same local indices
        share a dropout pattern (fold a shard-dependent value into the key if
        that matters).
      dropout_rng: a JAX PRNG key (jax.random.key or raw uint32 key data);
        required when dropout_rate > 0; two uint32 seed words are drawn from it
        with jax.random.bits.
      Every option runs on both targets (CPU and CUDA) and in the backward pass.

    Returns:
      o shaped like q, or (o, lse) when return_lse.
    """
    _check_inputs(q, k, v)
    s = _check_scale(scale, q.shape[-1])
    rate = _check_dropout_rate(dropout_rate)
    per_batch_offset = _is_per_batch_array(query_offset)
    mask = _make_mask(causal, local_window_size, logits_soft_cap,
                      0 if per_batch_offset else query_offset, rate)
    mask = _with_precision(mask, q)
    extras = _make_extras(
        q, k, query_offset=query_offset, query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths, q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids, alibi_slopes=alibi_slopes, dropout_rate=rate,
        dropout_rng=dropout_rng)
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    o, lse = _flash(q, k, v, extras, s, mask, bool(deterministic))
    return (o, lse) if return_lse else o
