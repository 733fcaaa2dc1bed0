"""The dropout keep mask of the kernels, in jnp (any backend, no x64 needed).

Mirrors cpp/dropout.h exactly: Philox4x32-10 (Salmon et al., SC'11) keyed by
two uint32 seed words, counter (j // 4, row_pair(i), head, batch) with
row_pair(i) = (i // 16) * 8 + i % 8; element (b, h, i, j) is kept when the
(i // 8) % 2 half (0: low 16 bits) of word j % 4 >= threshold(rate), a keep
probability of 1 - threshold / 65536.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85


def _u32(x):
    return jnp.asarray(x, jnp.uint32)


def _mulhilo32(a, b):
    """(hi, lo) of the 64-bit product of uint32 a and b, via 16-bit halves."""
    a, b = _u32(a), _u32(b)
    mask = _u32(0xFFFF)
    a_lo, a_hi = a & mask, a >> 16
    b_lo, b_hi = b & mask, b >> 16
    ll, lh, hl, hh = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi
    mid = (ll >> 16) + (lh & mask) + (hl & mask)  # < 3 * 2^16: no overflow
    hi = hh + (lh >> 16) + (hl >> 16) + (mid >> 16)
    return hi, a * b


def philox4x32_10(ctr, key):
    """Philox4x32-10 of the counter words ctr = (c0, c1, c2, c3) (uint32
    arrays, broadcast together) under key = (k0, k1); returns four words."""
    x, y, z, w = (_u32(c) for c in ctr)
    k0, k1 = _u32(key[0]), _u32(key[1])
    for _ in range(10):
        hi0, lo0 = _mulhilo32(_M0, x)
        hi1, lo1 = _mulhilo32(_M1, z)
        x, y, z, w = hi1 ^ y ^ k0, lo1, hi0 ^ w ^ k1, lo0
        k0 = k0 + _u32(_W0)
        k1 = k1 + _u32(_W1)
    return x, y, z, w


def dropout_threshold(rate: float) -> int:
    """16-bit draws below the threshold are dropped (dropout.h's dropout_threshold)."""
    t = float(np.float32(rate)) * 65536.0 + 0.5
    return 65536 if t >= 65536.0 else int(t)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5))
def dropout_mask_from_seed(seed, dropout_rate: float, batch: int, num_heads: int,
                           seqlen_q: int, seqlen_k: int):
    """Keep mask [batch, num_heads, seqlen_q, seqlen_k] (bool) for the seed words."""
    seed = _u32(seed)
    n4 = -(-seqlen_k // 4)
    rows = np.arange(seqlen_q)
    pair = (rows // 16) * 8 + rows % 8            # the counter's row word
    n_pairs = int(pair.max()) + 1 if seqlen_q else 0
    b = jnp.arange(batch, dtype=jnp.uint32)[:, None, None, None]
    h = jnp.arange(num_heads, dtype=jnp.uint32)[None, :, None, None]
    r = jnp.arange(n_pairs, dtype=jnp.uint32)[None, None, :, None]
    c = jnp.arange(n4, dtype=jnp.uint32)[None, None, None, :]
    shape = (batch, num_heads, n_pairs, n4)
    words = philox4x32_10(tuple(jnp.broadcast_to(x, shape) for x in (c, r, h, b)), (seed[0], seed[1]))
    words = jnp.stack(words, axis=-1).reshape(batch, num_heads, n_pairs, 4 * n4)
    words = words[:, :, pair][..., :seqlen_k]     # [batch, heads, seqlen_q, seqlen_k]
    high = jnp.asarray((rows // 8) % 2 == 1)[None, None, :, None]
    draws = jnp.where(high, words >> 16, words & _u32(0xFFFF))
    return draws >= _u32(dropout_threshold(dropout_rate))


def dropout_mask(dropout_rng, dropout_rate: float, batch: int, num_heads: int, seqlen_q: int,
                 seqlen_k: int):
    """The boolean keep mask [batch, num_heads, seqlen_q, seqlen_k] that
    jax_flash.attention(..., dropout_rate=dropout_rate, dropout_rng=dropout_rng)
    applies: batch is the folded batch (leading axes flattened), heads the q
    heads. Kept probabilities are scaled by 1 / (1 - dropout_rate)."""
    from jax_flash.attention import _check_dropout_rate, _dropout_seed

    rate = _check_dropout_rate(dropout_rate)
    return dropout_mask_from_seed(_dropout_seed(dropout_rng), rate, int(batch), int(num_heads),
                                  int(seqlen_q), int(seqlen_k))
