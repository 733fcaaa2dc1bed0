"""One forward (or, with --backward, one forward and backward) each of the
packed-documents batch (causal segment ids, 16k tokens, documents of 256-4096 tokens)
and of the unpacked batch of equal documents with the same tokens and causal work, for
ncu (gpu_session.sh's ncu-packed and ncu-packed-bwd stages; NOTES "Causal forward: the
tail of the launch order" says what to look for)."""

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # python -P leaves the script's folder off the path
from packed_docs import equal_work_batch, packed_ids


def qkv(b, s, h, d):
    ks = jax.random.split(jax.random.key(0), 3)
    return [jax.random.normal(k, (b, s, h, d), jnp.bfloat16) for k in ks]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--docs", type=int, nargs=2, default=[256, 4096], help="min/max document length")
    ap.add_argument("--seed", type=int, default=1, help="seed of the document lengths (bench_variants: 0)")
    ap.add_argument("--backward", action="store_true", help="run the gradients too")
    a = ap.parse_args()
    ids, lengths = packed_ids(np.random.default_rng(a.seed), a.seqlen, *a.docs)
    b_eq, n_eq = equal_work_batch(lengths, a.seqlen)
    print(f"{len(lengths)} documents {lengths}; equal-work batch {b_eq} x {n_eq}", flush=True)
    seg = jnp.asarray(ids[None])

    def run(f):
        if not a.backward:
            return jax.jit(f)
        # The gradient of <o, o>: one forward and the whole backward.
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(jnp.square(f(q, k, v).astype(jnp.float32))), (0, 1, 2)))

    packed = run(lambda q, k, v: jax_flash.attention(q, k, v, causal=True, q_segment_ids=seg, kv_segment_ids=seg))
    plain = run(lambda q, k, v: jax_flash.attention(q, k, v, causal=True))
    jax.block_until_ready(packed(*qkv(1, a.seqlen, a.heads, a.head_dim)))
    print("ran packed", flush=True)
    jax.block_until_ready(plain(*qkv(b_eq, n_eq, a.heads, a.head_dim)))
    print("ran equal documents", flush=True)


if __name__ == "__main__":
    main()
