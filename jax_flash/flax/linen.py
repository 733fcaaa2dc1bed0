"""Linen twins of the jax_flash.flax NNX modules, plus the same attention_fn.

``flax.linen.MultiHeadDotProductAttention`` never passes ``is_causal`` (causality
is a ``mask`` there), so use it with ``attention_fn=make_attention_fn(causal=True)``
and ``mask=None`` for causal attention; a mask raises
:class:`~jax_flash.flax.UnsupportedAttentionArgument`. It also has no
``num_kv_heads``: for GQA use :class:`MultiHeadAttention` below.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

import flax.linen as nn

from jax_flash.flax import (
    ATTENTION_IMPLS,
    UnsupportedAttentionArgument,
    _attend,
    _check_heads,
    _positions,
    apply_rope,
    attention_fn,
    make_attention_fn,
)

__all__ = [
    "DecoderLM",
    "MultiHeadAttention",
    "TransformerBlock",
    "UnsupportedAttentionArgument",
    "apply_rope",
    "attention_fn",
    "make_attention_fn",
]


class MultiHeadAttention(nn.Module):
    """Linen twin of :class:`jax_flash.flax.MultiHeadAttention`.

    Params: query/key/value (DenseGeneral to (heads, head_dim)) and out
    (DenseGeneral over the last two axes). qkv_features and out_features default
    to the input's feature size. Call: ``mha(inputs_q, inputs_kv=None, *, positions=None)``.
    """

    num_heads: int
    qkv_features: int | None = None
    out_features: int | None = None
    num_kv_heads: int | None = None
    causal: bool = False
    rope: bool = False
    rope_base: float = 10000.0
    use_bias: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32
    kernel_init: Any = nn.initializers.lecun_normal()
    bias_init: Any = nn.initializers.zeros_init()
    attention_impl: str = "jax_flash"
    deterministic_grads: bool = False

    @nn.compact
    def __call__(self, inputs_q, inputs_kv=None, *, positions=None):
        if positions is not None and inputs_kv is not None:
            raise ValueError("positions is only supported for self-attention (inputs_kv=None)")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}"
            )
        kv = inputs_q if inputs_kv is None else inputs_kv
        qkv_features = self.qkv_features or inputs_q.shape[-1]
        out_features = self.out_features or inputs_q.shape[-1]
        num_kv_heads = self.num_kv_heads or self.num_heads
        head_dim = _check_heads(self.num_heads, num_kv_heads, qkv_features, self.rope)

        def dense(features, name, axis=-1):
            return nn.DenseGeneral(
                features, axis=axis, use_bias=self.use_bias, dtype=self.dtype,
                param_dtype=self.param_dtype, kernel_init=self.kernel_init,
                bias_init=self.bias_init, name=name,
            )

        q = dense((self.num_heads, head_dim), "query")(inputs_q)
        k = dense((num_kv_heads, head_dim), "key")(kv)
        v = dense((num_kv_heads, head_dim), "value")(kv)
        if self.rope:
            q = apply_rope(q, _positions(positions, q.shape[-3]), self.rope_base)
            k = apply_rope(k, _positions(positions, k.shape[-3]), self.rope_base)
        dt = self.dtype or jnp.result_type(q, k, v)
        q, k, v = (x.astype(dt) for x in (q, k, v))
        o = _attend(q, k, v, causal=self.causal, impl=self.attention_impl,
                    deterministic_grads=self.deterministic_grads)
        return dense(out_features, "out", axis=(-2, -1))(o)


class MLP(nn.Module):
    hidden: int
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        h = nn.Dense(self.hidden, dtype=self.dtype, param_dtype=self.param_dtype, name="up")(x)
        return nn.Dense(d, dtype=self.dtype, param_dtype=self.param_dtype, name="down")(
            jax.nn.gelu(h)
        )


class TransformerBlock(nn.Module):
    """Linen twin of :class:`jax_flash.flax.TransformerBlock` (pre-norm attention + MLP)."""

    num_heads: int
    num_kv_heads: int | None = None
    mlp_dim: int | None = None
    causal: bool = True
    rope: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32
    attention_impl: str = "jax_flash"

    @nn.compact
    def __call__(self, x, *, positions=None):
        d = x.shape[-1]
        norm = lambda name: nn.LayerNorm(dtype=self.dtype, param_dtype=self.param_dtype, name=name)
        h = MultiHeadAttention(
            self.num_heads, num_kv_heads=self.num_kv_heads, causal=self.causal, rope=self.rope,
            use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype,
            attention_impl=self.attention_impl, name="attn",
        )(norm("ln1")(x), positions=positions)
        x = x + h
        mlp = MLP(self.mlp_dim or 4 * d, dtype=self.dtype, param_dtype=self.param_dtype, name="mlp")
        return x + mlp(norm("ln2")(x))


class DecoderLM(nn.Module):
    """Linen twin of :class:`jax_flash.flax.DecoderLM`."""

    vocab_size: int = 256
    d_model: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int | None = None
    mlp_dim: int | None = None
    dtype: Any = None
    param_dtype: Any = jnp.float32
    attention_impl: str = "jax_flash"

    @nn.compact
    def __call__(self, tokens, *, positions=None):
        embed = nn.Embed(
            self.vocab_size, self.d_model, dtype=self.dtype, param_dtype=self.param_dtype,
            embedding_init=nn.initializers.normal(stddev=1.0 / math.sqrt(self.d_model)),
            name="embed",
        )
        x = embed(tokens)
        for i in range(self.num_layers):
            x = TransformerBlock(
                self.num_heads, num_kv_heads=self.num_kv_heads, mlp_dim=self.mlp_dim,
                dtype=self.dtype, param_dtype=self.param_dtype,
                attention_impl=self.attention_impl, name=f"block_{i}",
            )(x, positions=positions)
        x = nn.LayerNorm(dtype=self.dtype, param_dtype=self.param_dtype, name="ln_f")(x)
        return embed.attend(x).astype(jnp.float32)
