"""One causal forward per variant option (bench_variants.py's (c) set: 8k, 16 heads,
d128, bf16 by default), for ncu: each launch is one kernel to profile, in the order
given, so the per-option reports line up with --options (gpu_session.sh's ncu-options
stage; NOTES says what each profile was for)."""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--options", nargs="+", default=["plain", "window", "lengths", "alibi"])
    a = ap.parse_args()
    s, h = a.seqlen, a.heads
    ks = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk, (1, s, h, a.head_dim), jnp.bfloat16) for kk in ks)
    full = jnp.full((1,), s, jnp.int32)
    slopes = jnp.asarray(2.0 ** (-8.0 * np.arange(1, h + 1) / h), jnp.float32)
    table = {
        "plain": dict(),
        "window": dict(local_window_size=(s, 0)),  # covers everything: the masks kernel's own cost
        "lengths": dict(query_seq_lengths=full, key_value_seq_lengths=full),
        "alibi": dict(alibi_slopes=slopes),
        "softcap": dict(logits_soft_cap=30.0),
        "dropout": dict(dropout_rate=0.1, dropout_rng=jax.random.key(1)),
    }
    for name in a.options:
        f = jax.jit(lambda q, k, v, o=table[name]: jax_flash.attention(q, k, v, causal=True, **o))
        jax.block_until_ready(f(q, k, v))
        print("ran", name, flush=True)


if __name__ == "__main__":
    main()
