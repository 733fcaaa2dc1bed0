# One forward launch per option (8k causal, d128, 16 heads, bf16) for ncu to profile.
import sys
import jax, jax.numpy as jnp
import jax_flash
d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
s, h = 8192, 16
ks = jax.random.split(jax.random.key(0), 3)
q, k, v = (jax.random.normal(kk, (1, s, h, d), jnp.bfloat16) for kk in ks)
slopes = (2.0 ** (-8.0 * jnp.arange(1, h + 1) / h)).astype(jnp.float32)
opts = {
    "plain": dict(),
    "window-noop": dict(local_window_size=(s, 0)),
    "alibi": dict(alibi_slopes=slopes),
    "softcap": dict(logits_soft_cap=30.0),
    "dropout": dict(dropout_rate=0.1, dropout_rng=jax.random.key(1)),
}
for name, o in opts.items():
    f = jax.jit(lambda q, k, v, o=o: jax_flash.attention(q, k, v, causal=True, **o))
    f(q, k, v).block_until_ready()
    print("ran", name, flush=True)
