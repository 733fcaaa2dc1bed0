import jax, jax.numpy as jnp
import jax_flash
d, s, h = 128, 8192, 16
ks = jax.random.split(jax.random.key(0), 3)
q, k, v = (jax.random.normal(kk, (1, s, h, d), jnp.bfloat16) for kk in ks)
for name, o in {"plain": dict(), "window-noop": dict(local_window_size=(s, 0))}.items():
    f = jax.jit(jax.grad(lambda q, k, v, o=o: jnp.sum(jax_flash.attention(q, k, v, causal=True, **o).astype(jnp.float32)), argnums=(0, 1, 2)))
    jax.block_until_ready(f(q, k, v))
    print("ran", name, flush=True)
