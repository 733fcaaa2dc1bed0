"""Decode benchmark: attention of a few queries against a long KV cache.

jax_flash.attention_with_kvcache (contiguous and paged caches), jax_flash.attention
(which routes decode shapes to the same split-KV kernel), cuDNN and XLA through
jax.nn.dot_product_attention, in one run. Bandwidth is the bytes of K and V
read once (batch x cache length x kv heads x head dim x 2 tensors x element
size) over the median time; every shape's K/V exceed the 50 MB L2, so
back-to-back calls on one buffer do not time the cache. All calls attend the
full cache without a causal mask (a 16-query causal block changes 15 keys of
32k; it keeps the comparison the same function everywhere).

    python benchmarks/bench_decode.py --runs 2 --out benchmarks/results/h100_decode.json

--calls N (default 8) runs N calls, on N different query arrays, inside each
timed jitted function and reports the time a call: at the 4k cache a call is
~30 us of GPU time, under the host's dispatch, which then set the figure (one
H200 run read 961 and 2118 GB/s for the same kernel while XLA's slower one
read 1108 both times).

--runs N times every shape N times, one pass over all shapes after another, and
ends with each point's best: on the H100 a point sometimes reads far below its
other runs (e.g. 701 against 2046 GB/s) for no change of code, for jax_flash and
the others alike, so the README quotes each point's better of two runs.

--read-ceiling FILE takes benchmarks/hbm_read.cu's records (a plain streaming
read's best GB/s on the GPU at each size) and prints jax_flash's and cuDNN's
share of it: decode is a read of the cache, so that is the bound.
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash
from jax_flash.timing import time_fn, warn_if_xla_untuned

# (batch, seqlen_q, cache length, heads_q, heads_kv, head_dim): the six,
# head dims 64 / 256, MQA.
SHAPES = [
    (8, 1, 4096, 32, 8, 128),
    (8, 1, 32768, 32, 8, 128),
    (1, 1, 131072, 32, 8, 128),
    (64, 1, 8192, 32, 8, 128),
    (8, 16, 32768, 32, 8, 128),
    (1, 1, 32768, 32, 32, 128),
    (8, 1, 32768, 32, 8, 64),
    (8, 1, 32768, 32, 8, 256),
    (8, 1, 32768, 32, 1, 128),
]
PAGE_SIZES = (16, 256)


def _paged(kc, vc, page_size, rng):
    b, s, h, d = kc.shape
    per = s // page_size
    perm = rng.permutation(b * per).astype(np.int32)
    table = jnp.asarray(perm.reshape(b, per))
    inv = np.argsort(perm)  # physical page p holds logical page inv[p]
    kp = kc.reshape(b * per, page_size, h, d)[inv]
    vp = vc.reshape(b * per, page_size, h, d)[inv]
    return kp, vp, table


def _line(key, row, dtype_name, ceiling=None):
    b, sq, sk, hq, hkv, d = key
    ref = row.get("cudnn")
    cells = [f"{n}={v:7.0f}" for n, v in row.items()]
    ratio = f"  jf/cudnn={row['jax_flash'] / ref:.2f}" if ref and "jax_flash" in row else ""
    if ceiling:
        ratio += f"  read ceiling {ceiling:.0f}: " + " ".join(
            f"{n}={row[n] / ceiling:.2f}" for n in ("jax_flash", "cudnn") if n in row)
    return (f"b={b:3d} sq={sq:2d} sk={sk:6d} h={hq}:{hkv} d={d:3d} {dtype_name}  GB/s "
            + " ".join(cells) + ratio)


def read_ceiling(ceiling_records, device, kv_bytes):
    """The plain-read GB/s that benchmarks/hbm_read.cu measured on `device` at
    the buffer size nearest kv_bytes (None without a record for the device)."""
    recs = [r for r in ceiling_records if r["device"] == device]
    if not recs:
        return None
    return min(recs, key=lambda r: abs(np.log(r["bytes"] / kv_bytes)))["read_gbps"]


def best_of_runs(records):
    """Each (dtype, shape, impl)'s highest GB/s over the runs, as table lines."""
    rows, ceilings = {}, {}
    for r in records:
        if "gbps" not in r or "sweep" in r:
            continue
        key = (r["dtype"], (r["batch"], r["seqlen_q"], r["seqlen_k"], r["heads"], r["heads_kv"], r["head_dim"]))
        row = rows.setdefault(key, {})
        row[r["impl"]] = max(row.get(r["impl"], 0.0), r["gbps"])
        if r.get("read_ceiling_gbps"):
            ceilings[key] = r["read_ceiling_gbps"]
    return [_line(shape, row, dtype, ceilings.get((dtype, shape))) for (dtype, shape), row in rows.items()]


def _calls(fn, n):
    """fn(q, *rest) n times in one jitted function, on n query arrays, each call
    ordered after the previous one by an optimization barrier (free at run
    time): without it XLA merges the XLA implementation's n dots that share K
    into one and reads the cache once."""
    def many(qs, *rest):
        outs = []
        for q in qs:
            if outs:
                q, _ = jax.lax.optimization_barrier((q, outs[-1]))
            outs.append(fn(q, *rest))
        return outs
    return jax.jit(many)


def run(shapes, dtype, impls, reps_s, page_sizes, calls=1, ceiling_records=()):
    rng = np.random.default_rng(0)
    records = []
    dev = jax.devices()[0]
    for (b, sq, sk, hq, hkv, d) in shapes:
        key = jax.random.key(b * 7 + sk + d)
        k1, k2, k3 = jax.random.split(key, 3)
        qs = tuple(jax.random.normal(jax.random.fold_in(k1, i), (b, sq, hq, d), dtype)
                   for i in range(calls))
        kc = jax.random.normal(k2, (b, sk, hkv, d), dtype)
        vc = jax.random.normal(k3, (b, sk, hkv, d), dtype)
        lens = jnp.full((b,), sk, jnp.int32)
        kv_bytes = 2 * b * sk * hkv * d * jnp.dtype(dtype).itemsize
        ceiling = read_ceiling(ceiling_records, dev.device_kind, kv_bytes)
        fns = {}
        if "jax_flash" in impls:
            fns["jax_flash"] = (lambda q, kc, vc, lens: jax_flash.attention_with_kvcache(
                q, kc, vc, lens, causal=False), (kc, vc, lens))
        if "jax_flash_paged" in impls:
            for ps in page_sizes:
                kp, vp, table = _paged(kc, vc, ps, rng)
                fns[f"jax_flash_paged{ps}"] = (
                    lambda q, kp, vp, lens, t: jax_flash.attention_with_kvcache(
                        q, kp, vp, lens, page_table=t, causal=False), (kp, vp, lens, table))
        if "jax_flash_attention" in impls:
            fns["jax_flash_attention"] = (lambda q, k, v: jax_flash.attention(q, k, v), (kc, vc))
        for name in ("cudnn", "xla"):
            if name in impls:
                fns[name] = (lambda q, k, v, name=name: jax.nn.dot_product_attention(
                    q, k, v, implementation=name), (kc, vc))
        row = {}
        for name, (fn, rest) in fns.items():
            rec = dict(impl=name, device=dev.device_kind, dtype=jnp.dtype(dtype).name, batch=b,
                       seqlen_q=sq, seqlen_k=sk, heads=hq, heads_kv=hkv, head_dim=d,
                       kv_bytes=int(kv_bytes), calls=calls)
            if ceiling:
                rec["read_ceiling_gbps"] = ceiling
            fn = _calls(fn, calls)
            try:
                t = time_fn(fn, qs, *rest, target_s=reps_s) / calls
                rec.update(ms=t * 1e3, gbps=kv_bytes / t / 1e9)
                row[name] = rec["gbps"]
            except Exception as e:  # an implementation that refuses the shape
                rec.update(error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
            records.append(rec)
            del fn
        print(_line((b, sq, sk, hq, hkv, d), row, jnp.dtype(dtype).name, ceiling), flush=True)
    return records


def split_sweep(shapes, dtype, splits, reps_s, calls=1):
    """jax_flash contiguous at forced split counts (JAX_FLASH_DECODE_SPLITS is
    read when tracing): where the automatic choice sits against the others."""
    import os

    from jax_flash.kvcache import cuda_splits

    records = []
    for (b, sq, sk, hq, hkv, d) in shapes:
        k1, k2, k3 = jax.random.split(jax.random.key(sk + d), 3)
        qs = tuple(jax.random.normal(jax.random.fold_in(k1, i), (b, sq, hq, d), dtype)
                   for i in range(calls))
        kc = jax.random.normal(k2, (b, sk, hkv, d), dtype)
        vc = jax.random.normal(k3, (b, sk, hkv, d), dtype)
        lens = jnp.full((b,), sk, jnp.int32)
        kv_bytes = 2 * b * sk * hkv * d * jnp.dtype(dtype).itemsize
        auto = cuda_splits(b, sq, hq, hkv, d, sk)
        cells = []
        for n in sorted(set(splits) | {auto}):
            os.environ["JAX_FLASH_DECODE_SPLITS"] = str(n)
            try:
                fn = _calls(lambda q, kc, vc, lens: jax_flash.attention_with_kvcache(
                    q, kc, vc, lens, causal=False), calls)
                t = time_fn(fn, qs, kc, vc, lens, target_s=reps_s) / calls
            finally:
                del os.environ["JAX_FLASH_DECODE_SPLITS"]
            gbps = kv_bytes / t / 1e9
            records.append(dict(impl="jax_flash", sweep="splits", splits=n, auto=n == auto, batch=b,
                                seqlen_q=sq, seqlen_k=sk, heads=hq, heads_kv=hkv, head_dim=d,
                                dtype=jnp.dtype(dtype).name, ms=t * 1e3, gbps=gbps))
            cells.append(f"{n}{'*' if n == auto else ''}:{gbps:.0f}")
        print(f"splits b={b} sq={sq} sk={sk} h={hq}:{hkv} d={d}  GB/s " + " ".join(cells), flush=True)
    return records


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write JSON records here")
    ap.add_argument("--dtypes", default="bfloat16", help="comma-separated: bfloat16,float16")
    ap.add_argument("--impls", default="jax_flash,jax_flash_paged,jax_flash_attention,cudnn,xla")
    ap.add_argument("--shapes", default="all", help="'all', 'quick', or indices into SHAPES (0,1,..)")
    ap.add_argument("--time", type=float, default=0.3, help="seconds of timing per measurement")
    ap.add_argument("--runs", type=int, default=1,
                    help="time every shape this many times (records carry `run`); a last table "
                         "gives each point's best")
    ap.add_argument("--calls", type=int, default=8,
                    help="calls of each implementation inside one timed jitted function "
                         "(different queries): the host's dispatch stays out of short calls")
    ap.add_argument("--read-ceiling", metavar="JSON",
                    help="benchmarks/hbm_read.cu's records: print each point's share of this GPU's "
                         "plain-read GB/s at that size (and keep it in the records)")
    ap.add_argument("--split-sweep", default="",
                    help="comma-separated SHAPES indices: also time forced split counts there")
    args = ap.parse_args(argv)
    warn_if_xla_untuned()
    on_gpu = jax.devices()[0].platform == "gpu"
    if args.shapes == "all":
        shapes = SHAPES
    elif args.shapes == "quick":
        shapes = [(2, 1, 2048, 8, 2, 64), (1, 4, 4096, 4, 4, 64)]
    else:
        shapes = [SHAPES[int(i)] for i in args.shapes.split(",")]
    impls = args.impls.split(",")
    if not on_gpu:
        impls = [i for i in impls if i != "cudnn"]
        shapes = [s for s in shapes if s[0] * s[2] * s[4] * s[5] <= 1 << 22] or \
            [(2, 1, 2048, 8, 2, 64)]
    ceiling_records = []
    if args.read_ceiling:
        with open(args.read_ceiling) as f:
            ceiling_records = json.load(f)
    records = []
    for run_index in range(1, max(1, args.runs) + 1):
        if args.runs > 1:
            print(f"run {run_index} of {args.runs}", flush=True)
        for name in args.dtypes.split(","):
            dtype = jnp.dtype(name)
            if not on_gpu:
                dtype = jnp.dtype(jnp.float32)
            recs = run(shapes, dtype, impls, args.time, PAGE_SIZES, max(1, args.calls), ceiling_records)
            if args.split_sweep and on_gpu and run_index == 1:
                sweep = [SHAPES[int(i)] for i in args.split_sweep.split(",")]
                recs += split_sweep(sweep, dtype, (1, 2, 4, 8, 16, 32, 64), args.time, max(1, args.calls))
            for r in recs:
                r["run"] = run_index
            records += recs
    if args.runs > 1:
        print(f"best of {args.runs} runs")
        for line in best_of_runs(records):
            print(line)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)
        print(f"wrote {len(records)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
