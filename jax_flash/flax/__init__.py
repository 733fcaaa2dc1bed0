"""Flax integration of jax_flash (NNX; the Linen twins live in ``jax_flash.flax.linen``).

* :func:`attention_fn` -- a drop-in ``attention_fn`` for
  ``flax.nnx.MultiHeadAttention`` and ``flax.linen.MultiHeadDotProductAttention``.
  It runs ``jax_flash.attention`` (fused FlashAttention-2 kernels). Causality
  comes from ``is_causal`` (what ``nnx.MultiHeadAttention(...)(x, is_causal=True)``
  passes) or from :func:`make_attention_fn` ``(causal=True)`` (needed for Linen,
  whose module never passes ``is_causal``). Grouped-query inputs (fewer k/v heads
  than q heads, e.g. ``nnx.MultiHeadAttention(num_kv_heads=...)``) go to the
  kernels' GQA path without repeating k/v.
  Attention dropout in training mode (``dropout_rate > 0``, ``deterministic=False``)
  runs inside the kernels (``jax_flash.attention(dropout_rate=, dropout_rng=)``): the
  keep mask is independent per batch element and head, so flax's
  ``broadcast_dropout`` (one mask shared over the batch axes) is not applied.
  Anything the kernels cannot fuse -- an explicit ``mask`` or ``bias``, a traced
  dropout rate, sowing the attention weights, custom einsums -- raises
  :class:`UnsupportedAttentionArgument` saying what to do instead, unless you
  opt in to the unfused fallback with ``make_attention_fn(fallback=True)``, which
  then runs flax's own ``dot_product_attention`` for those calls only.
* :class:`MultiHeadAttention`, :class:`TransformerBlock`, :class:`DecoderLM` --
  small NNX modules built directly on ``jax_flash.attention`` (GQA, causal, RoPE),
  with a KV cache (:class:`KVCache`, contiguous or paged) for decoding:
  ``DecoderLM.generate(prompt_tokens, max_new_tokens)`` prefills the prompt with
  the regular kernel, then decodes token by token with
  ``jax_flash.attention_with_kvcache``.

Requires flax (``pip install jax_flash[flax]``); ``import jax_flash`` itself does
not import flax.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

import jax_flash
from jax_flash.attention import is_traced

try:
    from flax import nnx
except ImportError as e:  # pragma: no cover - exercised only without flax
    raise ImportError(
        "jax_flash.flax needs flax (and optax for training): pip install 'jax_flash[flax]'"
    ) from e

__all__ = [
    "ATTENTION_IMPLS",
    "DecoderLM",
    "KVCache",
    "MultiHeadAttention",
    "TransformerBlock",
    "UnsupportedAttentionArgument",
    "apply_rope",
    "attention_fn",
    "make_attention_fn",
]


class UnsupportedAttentionArgument(ValueError):
    """An attention_fn argument that the fused kernels cannot honour."""


_HOW_TO_FALLBACK = (
    "To run such calls unfused instead, use "
    "jax_flash.flax.make_attention_fn(fallback=True) (flax's own dot_product_attention "
    "for those calls only), or flax's dot_product_attention directly."
)


def _is_tracer(x) -> bool:
    return is_traced(x)


def _unsupported_reason(
    *, bias, mask, dropout_rate, deterministic, module, einsum_dot_general,
    qk_attn_weights_einsum, attn_weights_value_einsum,
) -> str | None:
    """Why this call cannot run on the fused kernels (None when it can)."""
    if mask is not None:
        return (
            "jax_flash attention_fn got a `mask`, but the FlashAttention kernels only fuse "
            "causal masking. For causal attention pass mask=None and request causality instead: "
            "NNX: `nnx.MultiHeadAttention(..., attention_fn=jax_flash.flax.attention_fn)(x, "
            "is_causal=True)`; Linen (whose module has no is_causal): "
            "`attention_fn=jax_flash.flax.make_attention_fn(causal=True)`. Padding or other "
            "masks, and the cache mask that decode=True builds, are not supported by the kernels. "
            + _HOW_TO_FALLBACK
        )
    if bias is not None:
        return (
            "jax_flash attention_fn got an attention `bias`; the FlashAttention kernels have no "
            "bias input (for causal masking use is_causal=True / make_attention_fn(causal=True); "
            "for position information use RoPE, e.g. jax_flash.flax.MultiHeadAttention(rope=True)). "
            + _HOW_TO_FALLBACK
        )
    try:
        rate = float(dropout_rate)
    except TypeError:  # a traced rate
        rate = None
    if rate is None:
        return (
            "jax_flash attention_fn got a traced dropout_rate; the kernels take the rate as a "
            "static number. Pass a Python float. " + _HOW_TO_FALLBACK
        )
    if rate != 0.0 and _is_tracer(deterministic):
        return (
            "jax_flash attention_fn got a traced `deterministic` flag with dropout_rate="
            f"{dropout_rate}; whether dropout runs must be known when tracing. Pass a Python "
            "bool. " + _HOW_TO_FALLBACK
        )
    if module is not None:
        return (
            "jax_flash attention_fn was asked to sow the attention weights (sow_weights=True / "
            "module=...), but FlashAttention never materialises the attention matrix. Call the "
            "module with sow_weights=False. " + _HOW_TO_FALLBACK
        )
    if (
        einsum_dot_general is not None
        or qk_attn_weights_einsum is not None
        or attn_weights_value_einsum is not None
    ):
        return (
            "jax_flash attention_fn got a custom einsum / dot_general (e.g. quantized AQT "
            "einsums via qk_attn_weights_einsum_cls); the fused kernels compute both products "
            "themselves and cannot use it. Leave those unset. " + _HOW_TO_FALLBACK
        )
    return None


def _promote(query, key, value, dtype, promote_dtype):
    if promote_dtype is not None:
        return promote_dtype((query, key, value), dtype=dtype)
    if dtype is None:
        dtype = jnp.result_type(query, key, value)
    return tuple(jnp.asarray(x, dtype) for x in (query, key, value))


def _fallback_call(
    query, key, value, *, bias, mask, broadcast_dropout, dropout_rng, dropout_rate,
    deterministic, dtype, precision, module, causal, force_fp32_for_softmax,
    einsum_dot_general, qk_attn_weights_einsum, attn_weights_value_einsum,
):
    """flax's own (unfused) dot_product_attention, for what the kernels cannot do."""
    import flax.linen as nn

    linen_only = (
        force_fp32_for_softmax
        or einsum_dot_general is not None
        or qk_attn_weights_einsum is not None
        or attn_weights_value_einsum is not None
    )
    if isinstance(module, nn.Module) or linen_only:
        # Linen's version: sows into a Linen module; has no is_causal and no GQA.
        hq, hkv = query.shape[-2], key.shape[-2]
        if hq != hkv and hkv and hq % hkv == 0:
            key = jnp.repeat(key, hq // hkv, axis=-2)
            value = jnp.repeat(value, hq // hkv, axis=-2)
        if causal:
            sq, sk = query.shape[-3], key.shape[-3]
            cm = jnp.tril(jnp.ones((sq, sk), jnp.bool_))
            cm = cm.reshape((1,) * (query.ndim - 3) + (1, sq, sk))
            mask = cm if mask is None else jnp.logical_and(mask, cm)
        return nn.dot_product_attention(
            query, key, value, bias=bias, mask=mask, broadcast_dropout=broadcast_dropout,
            dropout_rng=dropout_rng, dropout_rate=dropout_rate, deterministic=deterministic,
            dtype=dtype, precision=precision, module=module,
            force_fp32_for_softmax=force_fp32_for_softmax,
            einsum_dot_general=einsum_dot_general,
            qk_attn_weights_einsum=qk_attn_weights_einsum,
            attn_weights_value_einsum=attn_weights_value_einsum,
        )
    return nnx.dot_product_attention(
        query, key, value, bias, mask, broadcast_dropout, dropout_rng, dropout_rate,
        deterministic, dtype, precision, module, is_causal=causal,
    )


def _attention_fn_impl(
    query,
    key,
    value,
    bias=None,
    mask=None,
    broadcast_dropout: bool = True,
    dropout_rng=None,
    dropout_rate: float = 0.0,
    deterministic: bool = False,
    dtype=None,
    precision=None,
    module=None,
    promote_dtype=None,
    is_causal: bool = False,
    force_fp32_for_softmax: bool = False,
    einsum_dot_general=None,
    qk_attn_weights_einsum=None,
    attn_weights_value_einsum=None,
    *,
    _causal: bool = False,
    _fallback: bool = False,
    _deterministic_grads: bool = False,
):
    causal = bool(_causal) or bool(is_causal)
    reason = _unsupported_reason(
        bias=bias, mask=mask, dropout_rate=dropout_rate, deterministic=deterministic,
        module=module, einsum_dot_general=einsum_dot_general,
        qk_attn_weights_einsum=qk_attn_weights_einsum,
        attn_weights_value_einsum=attn_weights_value_einsum,
    )
    if reason is not None and not _fallback:
        raise UnsupportedAttentionArgument(reason)
    if reason is not None:
        return _fallback_call(
            query, key, value, bias=bias, mask=mask, broadcast_dropout=broadcast_dropout,
            dropout_rng=dropout_rng, dropout_rate=dropout_rate, deterministic=deterministic,
            dtype=dtype, precision=precision, module=module, causal=causal,
            force_fp32_for_softmax=force_fp32_for_softmax,
            einsum_dot_general=einsum_dot_general,
            qk_attn_weights_einsum=qk_attn_weights_einsum,
            attn_weights_value_einsum=attn_weights_value_einsum,
        )
    # `force_fp32_for_softmax` needs nothing: the kernels always accumulate
    # QK^T, the softmax and PV in float32. `precision` matters for float32
    # inputs only, which CUDA computes in TF32 (JAX's default on GPU): a
    # full-float32 request (Precision.HIGHEST, "highest", "float32") is passed
    # on as jax_default_matmul_precision, so the CUDA kernels refuse it rather
    # than run TF32 silently (the CPU computes float32 in float32 anyway).
    query, key, value = _promote(query, key, value, dtype, promote_dtype)
    if _full_f32_precision(precision):
        with jax.default_matmul_precision("highest"):
            return _fused_call(query, key, value, causal, dropout_rate, deterministic, dropout_rng,
                               _deterministic_grads)
    return _fused_call(query, key, value, causal, dropout_rate, deterministic, dropout_rng,
                       _deterministic_grads)


def _full_f32_precision(precision) -> bool:
    """Whether a flax `precision` argument (None, a lax.Precision, a string,
    a DotAlgorithmPreset or a pair of them) asks for full float32."""
    if precision is None:
        return False
    if isinstance(precision, (tuple, list)):
        return any(_full_f32_precision(p) for p in precision)
    from jax_flash.attention import _FULL_F32_PRECISIONS

    return str(getattr(precision, "name", precision)).lower() in _FULL_F32_PRECISIONS


def _fused_call(query, key, value, causal, dropout_rate, deterministic, dropout_rng,
                _deterministic_grads):
    dropout = {}
    if float(dropout_rate) != 0.0 and not bool(deterministic):
        if dropout_rng is None:
            raise UnsupportedAttentionArgument(
                f"jax_flash attention_fn got dropout_rate={dropout_rate} with "
                "deterministic=False but no dropout_rng; give the module a dropout stream "
                "(NNX: rngs=nnx.Rngs(..., dropout=...); Linen: apply(..., rngs={'dropout': key}))."
            )
        # The fused kernels draw an independent keep mask per (batch, head, row,
        # column); flax's broadcast_dropout (one mask shared over the batch axes)
        # has no fused equivalent and is not applied.
        dropout = dict(dropout_rate=float(dropout_rate), dropout_rng=dropout_rng)
    return jax_flash.attention(
        query, key, value, causal=causal, deterministic=_deterministic_grads, **dropout
    )


def make_attention_fn(
    *, causal: bool = False, fallback: bool = False, deterministic_grads: bool = False
) -> Callable[..., jax.Array]:
    """Builds a flax-compatible ``attention_fn`` running on jax_flash.

    Args:
      causal: always apply top-left causal masking, whatever ``is_causal`` the module
        passes (``causal or is_causal``). Use this with
        ``flax.linen.MultiHeadDotProductAttention``, which never passes ``is_causal``
        (and then call it with ``mask=None``).
      fallback: when a call has something the kernels cannot fuse (a ``mask`` or
        ``bias``, a traced dropout rate, ``sow_weights``, custom
        einsums), run flax's own unfused ``dot_product_attention`` for that call
        (honouring ``causal``) instead of raising
        :class:`UnsupportedAttentionArgument`. Calls that can be fused still are.
      deterministic_grads: passed to ``jax_flash.attention(deterministic=...)``:
        bitwise-reproducible gradients on CUDA (the CPU backward always is).

    The returned function takes the arguments of flax's
    ``nnx.dot_product_attention`` / ``linen.dot_product_attention``: (query, key,
    value, bias, mask, broadcast_dropout, dropout_rng, dropout_rate, deterministic,
    dtype, precision, module, promote_dtype, is_causal, force_fp32_for_softmax,
    einsum_dot_general, qk_attn_weights_einsum, attn_weights_value_einsum).
    ``dtype`` (or ``promote_dtype``) casts q/k/v as flax does; ``precision`` and
    ``force_fp32_for_softmax`` are accepted and have no effect (float32
    accumulation and softmax always).
    """
    fn = functools.partial(
        _attention_fn_impl,
        _causal=bool(causal),
        _fallback=bool(fallback),
        _deterministic_grads=bool(deterministic_grads),
    )
    fn.__name__ = fn.__qualname__ = "attention_fn"
    fn.__module__ = __name__
    fn.__doc__ = (
        f"jax_flash attention_fn (causal={bool(causal)}, fallback={bool(fallback)}, "
        f"deterministic_grads={bool(deterministic_grads)}); see jax_flash.flax.make_attention_fn."
    )
    return fn


#: The default attention_fn: causal only through ``is_causal``; unsupported arguments raise.
attention_fn = make_attention_fn()


# ---------------------------------------------------------------------------
# Rotary position embedding.


def apply_rope(x: jax.Array, positions: jax.Array, base: float = 10000.0) -> jax.Array:
    """Rotary position embedding (rotate-half / GPT-NeoX layout).

    x: [batch..., seq, heads, head_dim] (head_dim even); positions: integer array
    broadcastable to [batch..., seq]. Computed in float32, returned in x.dtype.
    """
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {d}")
    half = d // 2
    inv_freq = 1.0 / (base ** (jnp.arange(half, dtype=jnp.float32) / half))
    ang = jnp.asarray(positions, jnp.float32)[..., None] * inv_freq  # [..., S, half]
    cos = jnp.cos(ang)[..., None, :]
    sin = jnp.sin(ang)[..., None, :]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., :half], xf[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


# ---------------------------------------------------------------------------
# Modules.

#: attention_impl values of the modules: the fused kernels, or jax.nn (for comparisons).
ATTENTION_IMPLS = ("jax_flash", "jax.nn")


def _attend(q, k, v, *, causal: bool, impl: str, deterministic_grads: bool = False):
    if impl == "jax_flash":
        return jax_flash.attention(q, k, v, causal=causal, deterministic=deterministic_grads)
    if impl == "jax.nn":
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal)
    raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {impl!r}")


def _check_heads(num_heads, num_kv_heads, qkv_features, rope):
    if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})"
        )
    if qkv_features % num_heads:
        raise ValueError(
            f"qkv_features ({qkv_features}) must be divisible by num_heads ({num_heads})"
        )
    head_dim = qkv_features // num_heads
    if rope and head_dim % 2:
        raise ValueError(f"rope=True needs an even head_dim, got {head_dim}")
    return head_dim


def _positions(positions, length):
    return jnp.arange(length) if positions is None else positions


default_kernel_init = nnx.initializers.lecun_normal()


class KVCache(NamedTuple):
    """One attention layer's key/value cache (a pytree; pass it through jit).

    k, v: contiguous [batch, max_len, num_kv_heads, head_dim], or paged
    [num_pages, page_size, num_kv_heads, head_dim] with page_table int32
    [batch, pages_per_sequence] (see jax_flash.attention_with_kvcache);
    lengths: int32 [batch], the tokens already cached.
    """

    k: Any
    v: Any
    lengths: Any
    page_table: Any = None

    @staticmethod
    def create(batch: int, max_len: int, num_kv_heads: int, head_dim: int, dtype,
               page_size: int | None = None) -> "KVCache":
        lengths = jnp.zeros((batch,), jnp.int32)
        if page_size is None:
            shape = (batch, max_len, num_kv_heads, head_dim)
            return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), lengths)
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        per_seq = -(-max_len // page_size)
        n = batch * per_seq
        # Pages handed out last to first: any layout works, this one is not the identity.
        table = (n - 1 - jnp.arange(n, dtype=jnp.int32)).reshape(batch, per_seq)
        shape = (n, page_size, num_kv_heads, head_dim)
        return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), lengths, table)

    def write(self, k, v) -> "KVCache":
        """k, v [batch, n, num_kv_heads, head_dim] stored at positions lengths + i
        (rows past the capacity are dropped); lengths advance by n."""
        b, n = k.shape[0], k.shape[1]
        pos = self.lengths[:, None] + jnp.arange(n, dtype=jnp.int32)
        if self.page_table is None:
            slab, row = jnp.broadcast_to(jnp.arange(b)[:, None], pos.shape), pos
        else:
            ps = self.k.shape[1]
            col = jnp.clip(pos // ps, 0, self.page_table.shape[1] - 1)
            slab = jnp.where(pos // ps < self.page_table.shape[1],
                             jnp.take_along_axis(self.page_table, col, axis=1), self.k.shape[0])
            row = pos % ps
        kc = self.k.at[slab, row].set(k.astype(self.k.dtype), mode="drop")
        vc = self.v.at[slab, row].set(v.astype(self.v.dtype), mode="drop")
        return KVCache(kc, vc, self.lengths + n, self.page_table)


def _attend_cached(q, k, v, cache: KVCache, impl: str):
    """Attention of new tokens (q, k, v) against the cache plus themselves,
    bottom-right causal; returns (o, updated cache)."""
    sq = q.shape[1]
    if impl == "jax_flash":
        o, kc, vc = jax_flash.attention_with_kvcache(
            q, cache.k, cache.v, cache.lengths, k=k, v=v, page_table=cache.page_table, causal=True)
        return o, KVCache(kc, vc, cache.lengths + sq, cache.page_table)
    if impl != "jax.nn":
        raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {impl!r}")
    if cache.page_table is not None:
        raise ValueError("attention_impl='jax.nn' supports contiguous caches only (page_size=None)")
    new = cache.write(k, v)
    if sq == 1:
        o = jax.nn.dot_product_attention(q, new.k, new.v, key_value_seq_lengths=new.lengths)
    else:
        last = cache.lengths[:, None] + jnp.arange(sq)  # each query's position
        mask = jnp.arange(new.k.shape[1])[None, None, :] <= last[:, :, None]
        o = jax.nn.dot_product_attention(q, new.k, new.v, mask=mask[:, None])
    return o, new


class MultiHeadAttention(nnx.Module):
    """Multi-head (grouped-query) attention on jax_flash.

    Projections q: in_features -> (num_heads, head_dim), k/v: in_kv_features ->
    (num_kv_heads, head_dim), out: (num_heads, head_dim) -> out_features, with
    head_dim = qkv_features // num_heads. Optional RoPE on q and k, then
    ``jax_flash.attention(causal=causal)``. ``attention_impl="jax.nn"`` swaps in
    ``jax.nn.dot_product_attention`` (same parameters; for comparisons).

    Call: ``mha(inputs_q, inputs_kv=None, *, positions=None)``; positions (RoPE,
    self-attention only) default to 0..seq-1.
    """

    def __init__(
        self,
        num_heads: int,
        in_features: int,
        qkv_features: int | None = None,
        out_features: int | None = None,
        *,
        num_kv_heads: int | None = None,
        in_kv_features: int | None = None,
        causal: bool = False,
        rope: bool = False,
        rope_base: float = 10000.0,
        use_bias: bool = True,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        kernel_init=default_kernel_init,
        bias_init=nnx.initializers.zeros_init(),
        attention_impl: str = "jax_flash",
        deterministic_grads: bool = False,
        rngs: nnx.Rngs,
    ):
        qkv_features = qkv_features or in_features
        out_features = out_features or in_features
        in_kv_features = in_kv_features or in_features
        num_kv_heads = num_kv_heads or num_heads
        self.head_dim = _check_heads(num_heads, num_kv_heads, qkv_features, rope)
        if attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {attention_impl!r}")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.causal, self.rope, self.rope_base = bool(causal), bool(rope), float(rope_base)
        self.dtype, self.param_dtype, self.attention_impl = dtype, param_dtype, attention_impl
        self.deterministic_grads = bool(deterministic_grads)
        lin = functools.partial(
            nnx.LinearGeneral, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
            kernel_init=kernel_init, bias_init=bias_init, rngs=rngs,
        )
        self.query = lin(in_features, (num_heads, self.head_dim))
        self.key = lin(in_kv_features, (num_kv_heads, self.head_dim))
        self.value = lin(in_kv_features, (num_kv_heads, self.head_dim))
        self.out = lin((num_heads, self.head_dim), out_features, axis=(-2, -1))

    def init_cache(self, batch: int, max_len: int, *, page_size: int | None = None,
                   dtype: Any = None) -> KVCache:
        """An empty KV cache for decoding (contiguous, or paged with page_size)."""
        dt = dtype or self.dtype or self.param_dtype
        return KVCache.create(batch, max_len, self.num_kv_heads, self.head_dim, dt, page_size)

    def __call__(self, inputs_q, inputs_kv=None, *, positions=None, cache: KVCache | None = None,
                 prefill: bool = False):
        """Without `cache`: attention over inputs. With a KVCache (decode mode,
        causal self-attention, inputs [batch, n, features]): the n new tokens
        sit at positions cache.lengths + i (RoPE included); `prefill=True`
        runs the regular kernel over them alone (a prompt into an empty cache),
        otherwise jax_flash.attention_with_kvcache attends the cache too.
        Returns (out, updated cache)."""
        if positions is not None and inputs_kv is not None:
            raise ValueError("positions is only supported for self-attention (inputs_kv=None)")
        if cache is not None:
            if inputs_kv is not None or not self.causal:
                raise ValueError("a KV cache needs causal self-attention (inputs_kv=None)")
            if positions is None:
                positions = cache.lengths[:, None] + jnp.arange(inputs_q.shape[-2])
        kv = inputs_q if inputs_kv is None else inputs_kv
        q, k, v = self.query(inputs_q), self.key(kv), self.value(kv)
        if self.rope:
            q = apply_rope(q, _positions(positions, q.shape[-3]), self.rope_base)
            k = apply_rope(k, _positions(positions, k.shape[-3]), self.rope_base)
        dt = self.dtype or jnp.result_type(q, k, v)
        q, k, v = (x.astype(dt) for x in (q, k, v))
        if cache is None:
            o = _attend(q, k, v, causal=self.causal, impl=self.attention_impl,
                        deterministic_grads=self.deterministic_grads)
            return self.out(o)
        if prefill:
            o = _attend(q, k, v, causal=True, impl=self.attention_impl)
            return self.out(o), cache.write(k, v)
        o, cache = _attend_cached(q, k, v, cache, self.attention_impl)
        return self.out(o), cache


class MLP(nnx.Module):
    """Linear -> GELU -> Linear."""

    def __init__(self, d_model, hidden, *, dtype=None, param_dtype=jnp.float32, rngs):
        lin = functools.partial(nnx.Linear, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.up = lin(d_model, hidden)
        self.down = lin(hidden, d_model)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x)))


class TransformerBlock(nnx.Module):
    """Pre-norm block: x + attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        mlp_dim: int | None = None,
        causal: bool = True,
        rope: bool = True,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        attention_impl: str = "jax_flash",
        rngs: nnx.Rngs,
    ):
        norm = functools.partial(nnx.LayerNorm, d_model, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.ln1 = norm()
        self.attn = MultiHeadAttention(
            num_heads, d_model, num_kv_heads=num_kv_heads, causal=causal, rope=rope,
            use_bias=False, dtype=dtype, param_dtype=param_dtype,
            attention_impl=attention_impl, rngs=rngs,
        )
        self.ln2 = norm()
        self.mlp = MLP(d_model, mlp_dim or 4 * d_model, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x, *, positions=None, cache: KVCache | None = None, prefill: bool = False):
        """x -> x, or with a KV cache (see MultiHeadAttention) (x, cache)."""
        if cache is None:
            x = x + self.attn(self.ln1(x), positions=positions)
            return x + self.mlp(self.ln2(x))
        a, cache = self.attn(self.ln1(x), positions=positions, cache=cache, prefill=prefill)
        x = x + a
        return x + self.mlp(self.ln2(x)), cache


class DecoderLM(nnx.Module):
    """Small decoder-only LM: token embedding, causal RoPE blocks, final LN, tied unembedding.

    ``model(tokens)`` with integer tokens [batch..., seq] returns float32 logits
    [batch..., seq, vocab_size].
    """

    def __init__(
        self,
        vocab_size: int = 256,
        *,
        d_model: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
        num_kv_heads: int | None = None,
        mlp_dim: int | None = None,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        attention_impl: str = "jax_flash",
        rngs: nnx.Rngs,
    ):
        self.embed = nnx.Embed(
            vocab_size, d_model, dtype=dtype, param_dtype=param_dtype,
            embedding_init=nnx.initializers.normal(stddev=1.0 / math.sqrt(d_model)), rngs=rngs,
        )
        self.blocks = nnx.List([
            TransformerBlock(
                d_model, num_heads, num_kv_heads=num_kv_heads, mlp_dim=mlp_dim, causal=True,
                rope=True, dtype=dtype, param_dtype=param_dtype,
                attention_impl=attention_impl, rngs=rngs,
            )
            for _ in range(num_layers)
        ])
        self.ln_f = nnx.LayerNorm(d_model, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def init_cache(self, batch: int, max_len: int, *, page_size: int | None = None,
                   dtype: Any = None) -> list[KVCache]:
        """Empty per-layer KV caches holding up to max_len tokens a sequence."""
        return [blk.attn.init_cache(batch, max_len, page_size=page_size, dtype=dtype)
                for blk in self.blocks]

    def __call__(self, tokens, *, positions=None, cache: list[KVCache] | None = None,
                 prefill: bool = False):
        """Logits [batch..., seq, vocab]; with per-layer caches (init_cache),
        tokens [batch, n] are appended at the caches' lengths and
        (logits, caches) is returned (prefill=True: the regular kernel over
        a prompt into empty caches)."""
        x = self.embed(tokens)
        if cache is None:
            for block in self.blocks:
                x = block(x, positions=positions)
            return self.embed.attend(self.ln_f(x)).astype(jnp.float32)
        if len(cache) != len(self.blocks):
            raise ValueError(f"cache has {len(cache)} layers, the model {len(self.blocks)}")
        new = []
        for block, c in zip(self.blocks, cache):
            x, c = block(x, positions=positions, cache=c, prefill=prefill)
            new.append(c)
        return self.embed.attend(self.ln_f(x)).astype(jnp.float32), new

    def generate(self, prompt_tokens, max_new_tokens: int, *, temperature: float = 0.0,
                 rng=None, page_size: int | None = None):
        """Autoregressive sampling: int32 [batch, prompt_len + max_new_tokens].

        The prompt is prefilled with the regular kernel (causal), then each new
        token is decoded against the KV cache (jax_flash.attention_with_kvcache
        for attention_impl="jax_flash"). temperature 0 is greedy; otherwise
        tokens are drawn from softmax(logits / temperature) with `rng` (a JAX
        PRNG key). page_size: use a paged cache instead of a contiguous one.
        The whole loop is one jitted computation.
        """
        prompt = jnp.asarray(prompt_tokens)
        if prompt.ndim != 2 or not jnp.issubdtype(prompt.dtype, jnp.integer):
            raise ValueError("prompt_tokens must be an integer array [batch, prompt_len], got "
                             f"shape {tuple(prompt.shape)} and dtype {prompt.dtype}")
        if prompt.shape[1] < 1:
            raise ValueError("prompt_tokens needs at least one token a sequence")
        n = int(max_new_tokens)
        if n < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        temperature = float(temperature)
        if not temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if temperature > 0.0 and rng is None:
            raise ValueError("temperature > 0 samples tokens: pass rng (e.g. jax.random.key(0))")
        prompt = prompt.astype(jnp.int32)
        if n == 0:
            return prompt
        if rng is None:
            rng = jax.random.key(0)
        elif not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
            rng = jax.random.wrap_key_data(rng)
        graphdef, state = nnx.split(self)
        return _generate(graphdef, state, prompt, rng, max_new=n, temperature=temperature,
                         page_size=page_size)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new", "temperature", "page_size"))
def _generate(graphdef, state, prompt, rng, *, max_new, temperature, page_size):
    model = nnx.merge(graphdef, state)
    b, p = prompt.shape
    cache = model.init_cache(b, p + max_new, page_size=page_size)
    logits, cache = model(prompt, cache=cache, prefill=True)
    keys = jax.random.split(rng, max_new)

    def pick(logits, key):
        if temperature == 0.0:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return jax.random.categorical(key, logits / temperature, axis=-1).astype(jnp.int32)

    tok = pick(logits[:, -1], keys[0])
    out = jnp.zeros((b, max_new), jnp.int32).at[:, 0].set(tok)

    # Every layer's cache advances by the same token, so the loop carries one
    # lengths array for all of them: a carried lengths a layer cost one tiny
    # add kernel a layer a step (H200 trace of this loop: 4 x ~1 us).
    def step(t, carry):
        out, tok, kv, lengths = carry
        cache = [KVCache(k, v, lengths, pt) for k, v, pt in kv]
        logits, cache = model(tok[:, None], cache=cache)
        tok = pick(logits[:, -1], keys[t])
        return out.at[:, t].set(tok), tok, [(c.k, c.v, c.page_table) for c in cache], lengths + 1

    kv = [(c.k, c.v, c.page_table) for c in cache]
    out, _, _, _ = jax.lax.fori_loop(1, max_new, step, (out, tok, kv, cache[0].lengths))
    return jnp.concatenate([prompt, out], axis=1)
