"""float32 attention on one GPU: jax_flash (TF32 tensor-core kernels, float32
accumulation) against jax.nn.dot_product_attention(implementation="xla") on
the same float32 inputs at JAX's default matmul precision (TF32 on NVIDIA
GPUs), forward and forward+backward, in one run. Writes a JSON record.

    python -P benchmarks/bench_float32.py --out benchmarks/results/h100_float32.json
"""

from __future__ import annotations

import argparse
import json
import platform

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash
from jax_flash.timing import attention_flops, time_fn


def _fns(impl, causal):
    if impl == "jax_flash":
        attn = lambda q, k, v: jax_flash.attention(q, k, v, causal=causal)  # noqa: E731
    else:
        attn = lambda q, k, v: jax.nn.dot_product_attention(  # noqa: E731
            q, k, v, is_causal=causal, implementation="xla")

    fwd = jax.jit(attn)

    @jax.jit
    def fwd_bwd(q, k, v, do):
        o, vjp = jax.vjp(attn, q, k, v)
        return o, vjp(do)

    return fwd, fwd_bwd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16384, help="batch * seqlen")
    ap.add_argument("--causal", choices=["yes", "no", "both"], default="both")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    causals = {"yes": [True], "no": [False], "both": [False, True]}[args.causal]
    dev = jax.devices()[0]
    rows = []
    for d in args.head_dims:
        for s in args.seqlens:
            b = max(1, args.tokens // s)
            rng = np.random.default_rng(0)
            q, k, v, do = (jnp.asarray(rng.standard_normal((b, s, args.heads, d), dtype=np.float32))
                           for _ in range(4))
            for causal in causals:
                row = dict(batch=b, seqlen=s, heads=args.heads, head_dim=d, causal=causal)
                for impl in ("jax_flash", "xla"):
                    fwd, fwd_bwd = _fns(impl, causal)
                    for mode, fn, fargs in (("fwd", fwd, (q, k, v)), ("fwd_bwd", fwd_bwd, (q, k, v, do))):
                        try:
                            t = time_fn(fn, *fargs)
                            flops = attention_flops(b, s, s, args.heads, d, causal, mode)
                            row[f"{impl}_{mode}_ms"] = round(t * 1e3, 4)
                            row[f"{impl}_{mode}_tflops"] = round(flops / t / 1e12, 2)
                        except Exception as e:  # XLA's S x S buffers can run out of memory
                            row[f"{impl}_{mode}_ms"] = None
                            row[f"{impl}_{mode}_error"] = str(e).splitlines()[0][:200]
                for mode in ("fwd", "fwd_bwd"):
                    a, x = row.get(f"jax_flash_{mode}_ms"), row.get(f"xla_{mode}_ms")
                    row[f"speedup_{mode}"] = round(x / a, 3) if a and x else None
                rows.append(row)
                print(json.dumps(row), flush=True)

    record = dict(
        what="float32 attention, jax_flash (TF32 kernels) vs jax.nn xla float32, default precision",
        device=dev.device_kind, platform=dev.platform, jax=jax.__version__,
        python=platform.python_version(), matmul_precision=str(jax.config.jax_default_matmul_precision),
        command="python -P benchmarks/bench_float32.py " + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items() if k != "out" and v is not None),
        rows=rows,
    )
    print("\n  d  seqlen causal |  fwd ms flash / xla (x)  | fwd+bwd ms flash / xla (x)")
    for r in rows:
        print(f"{r['head_dim']:3d} {r['seqlen']:7d} {str(r['causal']):6s} | "
              f"{r.get('jax_flash_fwd_ms')} / {r.get('xla_fwd_ms')} ({r.get('speedup_fwd')}) | "
              f"{r.get('jax_flash_fwd_bwd_ms')} / {r.get('xla_fwd_bwd_ms')} ({r.get('speedup_fwd_bwd')})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
