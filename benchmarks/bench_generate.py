"""Generation throughput of jax_flash.flax.DecoderLM with a KV cache: the same
randomly initialised model decoding on jax_flash (attention_with_kvcache,
contiguous and paged) and on jax.nn.dot_product_attention.

    python benchmarks/bench_generate.py --out gen.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    from flax import nnx

    import jax_flash.flax as jf

    dtype = jnp.dtype(args.dtype) if jax.devices()[0].platform == "gpu" else jnp.float32
    prompt = jnp.asarray(np.random.default_rng(0).integers(0, 256, (args.batch, args.prompt)),
                         jnp.int32)
    records, outs = [], {}
    for impl, page in (("jax_flash", None), ("jax_flash", 64), ("jax.nn", None)):
        model = jf.DecoderLM(256, d_model=args.d_model, num_layers=args.layers,
                             num_heads=args.heads, num_kv_heads=args.kv_heads, dtype=dtype,
                             attention_impl=impl, rngs=nnx.Rngs(0))
        out = jax.block_until_ready(model.generate(prompt, args.new, page_size=page))
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            out = jax.block_until_ready(model.generate(prompt, args.new, page_size=page))
            times.append(time.perf_counter() - t0)
        t = float(np.median(times))
        name = impl + (f" paged{page}" if page else "")
        outs[name] = np.asarray(out)
        rec = dict(impl=name, batch=args.batch, prompt=args.prompt, new=args.new,
                   d_model=args.d_model, heads=args.heads, kv_heads=args.kv_heads,
                   layers=args.layers, dtype=jnp.dtype(dtype).name, s=t,
                   tokens_per_s=args.batch * args.new / t, device=jax.devices()[0].device_kind)
        records.append(rec)
        print(f"{name:18} {rec['tokens_per_s']:10.0f} tokens/s  ({t * 1e3:.1f} ms for "
              f"{args.batch}x{args.new} tokens after a {args.prompt}-token prompt)", flush=True)
    base = outs["jax.nn"]
    for name, o in outs.items():
        print(f"{name:18} tokens equal to jax.nn's: {np.mean(o == base):.1%}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
