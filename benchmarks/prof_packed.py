"""One forward each of the packed-documents batch (causal segment ids, 16k tokens,
documents of 256-4096 tokens) and of the unpacked batch of equal documents with the
same tokens and causal work, for ncu (gpu_session.sh's ncu-packed stage; NOTES
"Causal forward: the tail of the launch order" says what to look for)."""

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash
from packed_docs import equal_work_batch, packed_ids

S, H, D = 16384, 16, 128
ids, lengths = packed_ids(np.random.default_rng(1), S, 256, 4096)
b_eq, n_eq = equal_work_batch(lengths, S)
print(f"{len(lengths)} documents {lengths}; equal-work batch {b_eq} x {n_eq}", flush=True)


def qkv(b, s):
    ks = jax.random.split(jax.random.key(0), 3)
    return [jax.random.normal(k, (b, s, H, D), jnp.bfloat16) for k in ks]


seg = jnp.asarray(ids[None])
packed = jax.jit(lambda q, k, v: jax_flash.attention(q, k, v, causal=True, q_segment_ids=seg, kv_segment_ids=seg))
plain = jax.jit(lambda q, k, v: jax_flash.attention(q, k, v, causal=True))
jax.block_until_ready(packed(*qkv(1, S)))
print("ran packed", flush=True)
jax.block_until_ready(plain(*qkv(b_eq, n_eq)))
print("ran equal documents", flush=True)
