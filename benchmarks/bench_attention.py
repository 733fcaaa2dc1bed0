"""Attention benchmark: jax_flash against jax.nn.dot_product_attention (xla, and
cudnn on GPU) and Pallas, forward and forward+backward, in one run.

GPU default: the FlashAttention-2 paper grid (bf16, batch x seqlen = 16k tokens,
hidden 2048, head dims 64/128/256, seqlens 512..16k, causal and not).
CPU default: a small float32 grid.

Prints a table (TFLOP/s and the ratio of jax_flash to each alternative) and
writes JSON records with keys impl, device, dtype, batch, seqlen_q, seqlen_k,
heads, heads_kv, head_dim, causal, mode, ms, tflops (plus temp_mib for fwd_bwd
where XLA reports it).

--runs N times every point N times, the implementations in turn each time (every
other time in reverse order: the one timed first after a pause can read a few %
high), and keeps each implementation's best (ms, tflops; every run's ms in
runs_ms): the same kernel can read ~5% apart from one timing to the next on a
shared H100 / H200, for every implementation alike.

    python benchmarks/bench_attention.py --out benchmarks/results/h100_grid.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash
from jax_flash.timing import attention_flops, time_fn, warn_if_xla_untuned


def _pallas_mha():
    try:
        from jax.experimental.pallas.ops.gpu import attention as pallas_attention
    except Exception:  # pragma: no cover - depends on the jax install
        return None
    return pallas_attention.mha


def _pallas_mgpu():
    """Pallas Mosaic GPU (FlashAttention-3-style Hopper kernel shipped with
    jax; float16, head_dim a multiple of 64, forward and non-causal backward)."""
    try:
        from jax.experimental.pallas.ops.gpu import attention_mgpu
    except Exception:  # pragma: no cover - depends on the jax install
        return None

    def run(q, k, v, causal):
        cfg = attention_mgpu.TuningConfig(block_q=128, block_kv=128, max_concurrent_steps=2, causal=causal)
        return attention_mgpu.attention(q, k, v, cfg)

    return run


def make_impls(on_gpu: bool, wanted: list[str]):
    impls = {
        "jax_flash": lambda q, k, v, causal: jax_flash.attention(q, k, v, causal=causal),
        # Atomic-free backward (bitwise reproducible); opt-in: --impls ... jax_flash_det
        "jax_flash_det": lambda q, k, v, causal: jax_flash.attention(q, k, v, causal=causal,
                                                                     deterministic=True),
        "xla": lambda q, k, v, causal: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla"),
    }
    if on_gpu:
        impls["cudnn"] = lambda q, k, v, causal: jax.nn.dot_product_attention(
            q, k, v, is_causal=causal, implementation="cudnn")
        mgpu = _pallas_mgpu()
        if mgpu is not None:
            impls["pallas_mgpu"] = mgpu
        mha = _pallas_mha()
        if mha is not None:
            impls["pallas"] = lambda q, k, v, causal: mha(
                q, k, v, None, sm_scale=1.0 / math.sqrt(q.shape[-1]), causal=causal)
    return {name: fn for name, fn in impls.items() if name in wanted}


def build(fn, causal, mode):
    if mode == "fwd":
        return jax.jit(lambda q, k, v: fn(q, k, v, causal))
    loss = lambda q, k, v: jnp.sum(fn(q, k, v, causal).astype(jnp.float32))
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def temp_mib(f, args):
    try:
        mem = f.lower(*args).compile().memory_analysis()
        return None if mem is None else mem.temp_size_in_bytes / 2**20
    except Exception:
        return None


def main(argv=None):
    on_gpu = jax.default_backend() == "gpu"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16" if on_gpu else "float32")
    ap.add_argument("--tokens", type=int, default=16384 if on_gpu else 2048, help="batch x seqlen")
    ap.add_argument("--hidden", type=int, default=2048 if on_gpu else 512, help="heads x head_dim")
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256] if on_gpu else [64])
    ap.add_argument("--seqlens", type=int, nargs="+",
                    default=[512, 1024, 2048, 4096, 8192, 16384] if on_gpu else [256, 512, 1024, 2048])
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--modes", nargs="+", default=["fwd", "fwd_bwd"], choices=["fwd", "fwd_bwd"])
    ap.add_argument("--impls", nargs="+", default=["jax_flash", "cudnn", "xla", "pallas"],
                    help="of jax_flash, jax_flash_det (deterministic backward), cudnn, xla, pallas, "
                         "pallas_mgpu (Mosaic GPU, float16)")
    ap.add_argument("--xla-max-seqlen", type=int, default=4096,
                    help="skip the materialising XLA path above this (it runs out of memory)")
    ap.add_argument("--runs", type=int, default=1,
                    help="time each point this many times, implementations interleaved; keep each one's best")
    ap.add_argument("--out", help="write JSON records here")
    args = ap.parse_args(argv)
    warn_if_xla_untuned()
    runs = max(1, args.runs)

    dtype = jnp.dtype(args.dtype)
    impls = make_impls(on_gpu, args.impls)
    device = jax.devices()[0]
    device_name = f"{device.platform}:{getattr(device, 'device_kind', '')}"
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    print(f"# {device_name}, {dtype.name}, {args.tokens} tokens, hidden {args.hidden}, impls {list(impls)}",
          flush=True)

    records = []
    rng = np.random.default_rng(0)
    for d in args.head_dims:
        heads = args.hidden // d
        for s in args.seqlens:
            batch = max(1, args.tokens // s)
            q, k, v = (jnp.asarray(rng.standard_normal((batch, s, heads, d), dtype=np.float32), dtype)
                       for _ in range(3))
            for causal in causals:
                for mode in args.modes:
                    row, timed = {}, {}
                    for name, fn in impls.items():
                        if name == "xla" and s > args.xla_max_seqlen:
                            continue
                        rec = dict(impl=name, device=device_name, dtype=dtype.name, batch=batch, seqlen_q=s,
                                   seqlen_k=s, heads=heads, heads_kv=heads, head_dim=d, causal=causal,
                                   mode=mode)
                        try:
                            f = build(fn, causal, mode)
                            rec["ms"] = time_fn(f, q, k, v) * 1e3
                            timed[name] = f
                        except Exception as e:  # a competitor refusing a shape is a result too
                            rec["ms"] = None
                            rec["tflops"] = None
                            rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                        records.append(rec)
                        row[name] = rec
                    if runs > 1:
                        for name in timed:
                            row[name]["runs_ms"] = [row[name]["ms"]]
                        for r in range(1, runs):
                            # (every other run in reverse order: see --runs above)
                            order = list(timed.items())
                            for name, f in (reversed(order) if r % 2 else order):
                                row[name]["runs_ms"].append(time_fn(f, q, k, v) * 1e3)
                    for name, f in timed.items():
                        rec = row[name]
                        if runs > 1:
                            rec["ms"] = min(rec["runs_ms"])
                        rec["tflops"] = attention_flops(batch, s, s, heads, d, causal, mode) / rec["ms"] * 1e3 / 1e12
                        if mode == "fwd_bwd":
                            rec["temp_mib"] = temp_mib(f, (q, k, v))
                    ours = row.get("jax_flash", {}).get("tflops")
                    cells = []
                    for name, rec in row.items():
                        tf = rec.get("tflops")
                        cell = f"{name}={tf:7.2f}" if tf else f"{name}=  fail "
                        if name != "jax_flash" and tf and ours:
                            cell += f" ({ours / tf:4.2f}x)"
                        cells.append(cell)
                    print(f"d={d:3d} s={s:5d} b={batch:3d} h={heads:2d} {'causal' if causal else 'full  '} "
                          f"{mode:7s} TFLOP/s: " + "  ".join(cells), flush=True)
                    if args.out:
                        with open(args.out, "w") as fh:
                            json.dump(records, fh, indent=1)
            del q, k, v
    return records


if __name__ == "__main__":
    main(sys.argv[1:])
