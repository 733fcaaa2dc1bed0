"""Ring attention benchmark: sequence parallelism over n GPUs against one GPU.

Default (the issue's setting): 2 GPUs, global seqlen 64k, head_dim 128, bf16,
causal with zigzag load balancing. The ring's throughput per GPU (the global
causal FLOPs / n / time) is compared with one GPU running jax_flash.attention
at the same per-device length (seqlen / n); efficiency = ring / single, target
0.85. Forward and forward+backward.

Before timing, the same ring is checked against jax_flash.attention on one
device at a smaller global length (--check-seqlen, default 4096): forward output
and dq/dk/dv, max error relative to the largest single-device value.

Writes JSON records with keys impl ("ring" or "single"), device, n_devices,
dtype, batch, seqlen (global), seqlen_per_device, heads, heads_kv, head_dim,
causal, zigzag, jax, mode, ms, tflops_per_device and, on ring records, efficiency
and check (that mode's correctness check).

    python benchmarks/bench_ring.py --out benchmarks/results/h200x2_ring.json
    # CPU smoke test (tiny sizes, 2 host devices):
    python benchmarks/bench_ring.py --seqlen 512 --heads 2 --head-dim 64 --cpu-devices 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=2, help="ring size n")
    ap.add_argument("--seqlen", type=int, default=65536, help="global sequence length")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--heads-kv", type=int, default=None, help="default: --heads")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default=None, help="default bfloat16 on GPU, float32 on CPU")
    ap.add_argument("--causal", choices=["yes", "no"], default="yes")
    ap.add_argument("--no-zigzag", action="store_true", help="contiguous shards (unbalanced when causal)")
    ap.add_argument("--modes", nargs="+", default=["fwd", "fwd_bwd"], choices=["fwd", "fwd_bwd"])
    ap.add_argument("--cpu-devices", type=int, default=0,
                    help="run on this many host CPU devices instead of GPUs (smoke test)")
    ap.add_argument("--check", choices=["yes", "no"], default="yes",
                    help="first compare the ring with single-device attention (fwd and grads)")
    ap.add_argument("--check-seqlen", type=int, default=4096,
                    help="global seqlen of that check (at most --seqlen; the timed runs "
                         "use --seqlen)")
    ap.add_argument("--check-tol", type=float, default=2e-2,
                    help="check passes when max|ring - single| <= tol * max|single| per output")
    ap.add_argument("--target", type=float, default=0.85, help="efficiency target to report against")
    ap.add_argument("--out", help="write JSON records here")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.cpu_devices:
        # Must happen before JAX initialises its backends.
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.cpu_devices}"
        os.environ["JAX_PLATFORMS"] = "cpu"

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import jax_flash
    from jax_flash.ring import shard_map
    from jax_flash.timing import attention_flops, time_fn

    n = args.devices
    devices = jax.devices("cpu") if args.cpu_devices else jax.devices()
    if len(devices) < n:
        sys.exit(f"bench_ring: needs {n} devices, found {len(devices)} ({devices[0].platform})")
    devices = devices[:n]
    on_gpu = devices[0].platform == "gpu"
    dtype = jnp.dtype(args.dtype or ("bfloat16" if on_gpu else "float32"))
    causal = args.causal == "yes"
    zigzag = causal and not args.no_zigzag
    b, s, h, d = args.batch, args.seqlen, args.heads, args.head_dim
    hkv = args.heads_kv or h
    if s % (2 * n if zigzag else n):
        sys.exit(f"bench_ring: seqlen {s} must be divisible by {2 * n if zigzag else n}")
    s_loc = s // n
    device_name = f"{devices[0].platform}:{getattr(devices[0], 'device_kind', '')}"
    print(f"# {n} x {device_name}, jax {jax.__version__}, {dtype.name}, batch {b}, seqlen {s} "
          f"({s_loc} per device), heads {h}/{hkv}, head_dim {d}, causal={causal}, zigzag={zigzag}")

    mesh = Mesh(np.array(devices), ("sp",))
    spec = P(None, "sp")
    seq_sharding = NamedSharding(mesh, spec)

    def local(q, k, v):
        return jax_flash.ring_attention(q, k, v, axis_name="sp", causal=causal, zigzag=zigzag)

    ring = shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)

    def build(attn, mode):
        if mode == "fwd":
            return jax.jit(attn)
        loss = lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32))
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))

    def make_inputs(seqlen, sharding):
        # Random data generated in place (the global arrays never sit on one device).
        keys = jax.random.split(jax.random.key(0), 3)
        shapes = ((b, seqlen, h, d), (b, seqlen, hkv, d), (b, seqlen, hkv, d))
        gen = jax.jit(lambda key, shape: jax.random.normal(key, shape, dtype),
                      static_argnums=1, out_shardings=sharding)
        return [gen(key, shape) for key, shape in zip(keys, shapes)]

    checks = []
    if args.check == "yes":
        # The same ring (mesh, layout, dtype) at a smaller size against jax_flash.attention
        # on one device: forward output and the three gradients.
        sc = min(args.check_seqlen, s)
        sc -= sc % (2 * n)
        qf, kf, vf = make_inputs(sc, NamedSharding(mesh, P()))
        w = jax.random.normal(jax.random.key(1), qf.shape, jnp.float32)
        perm = (lambda x: jax_flash.zigzag_permute(x, n)) if zigzag else (lambda x: x)
        unperm = (lambda x: jax_flash.zigzag_unpermute(x, n)) if zigzag else (lambda x: x)
        ring_global = lambda q, k, v: unperm(ring(perm(q), perm(k), perm(v)))
        ref = lambda q, k, v: jax_flash.attention(q, k, v, causal=causal)
        one = [jax.device_put(x, devices[0]) for x in (qf, kf, vf)]
        for mode in args.modes:
            def wrap(attn):
                if mode == "fwd":
                    return jax.jit(attn)
                loss = lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32) * w)
                return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
            got = jax.tree.leaves(wrap(ring_global)(qf, kf, vf))
            want = jax.tree.leaves(wrap(ref)(*one))
            rel = [float(jnp.max(jnp.abs(a.astype(jnp.float32) - np.asarray(b_, np.float32))))
                   / max(float(jnp.max(jnp.abs(b_.astype(jnp.float32)))), 1e-30)
                   for a, b_ in zip(got, want)]
            ok = all(np.isfinite(r) and r <= args.check_tol for r in rel)
            print(f"check {mode} at seqlen {sc}: max|ring - single| / max|single| = "
                  f"{', '.join(f'{r:.2e}' for r in rel)} ({'ok' if ok else 'FAILED'}, tol {args.check_tol})")
            checks.append(dict(mode=mode, seqlen=sc, rel_err=rel, ok=ok))

    base = dict(device=device_name, n_devices=n, dtype=dtype.name, batch=b, seqlen=s,
                seqlen_per_device=s_loc, heads=h, heads_kv=hkv, head_dim=d, causal=causal,
                zigzag=zigzag, jax=jax.__version__)
    records = []
    ring_args = make_inputs(s, seq_sharding)
    single_args = [jax.device_put(x, devices[0]) for x in make_inputs(s_loc, NamedSharding(
        Mesh(np.array(devices[:1]), ("one",)), P()))]
    single = lambda q, k, v: jax_flash.attention(q, k, v, causal=causal)
    print(f"{'mode':8} {'ring ms':>10} {'TF/s/dev':>9} {'single ms':>10} {'TF/s':>8} {'efficiency':>10}")
    for mode in args.modes:
        t_ring = time_fn(build(ring, mode), *ring_args, target_s=1.0, max_per_round=20)
        t_single = time_fn(build(single, mode), *single_args, target_s=1.0, max_per_round=20)
        tf_ring = attention_flops(b, s, s, h, d, causal, mode) / n / t_ring / 1e12
        tf_single = attention_flops(b, s_loc, s_loc, h, d, causal, mode) / t_single / 1e12
        eff = tf_ring / tf_single
        print(f"{mode:8} {t_ring * 1e3:10.3f} {tf_ring:9.2f} {t_single * 1e3:10.3f} {tf_single:8.2f} "
              f"{eff:10.3f}{'' if eff >= args.target else f'  (< target {args.target})'}")
        records.append(dict(base, impl="ring", mode=mode, ms=t_ring * 1e3,
                            tflops_per_device=tf_ring, efficiency=eff,
                            check=[c for c in checks if c["mode"] == mode]))
        records.append(dict(base, impl="single", mode=mode, ms=t_single * 1e3,
                            tflops_per_device=tf_single))
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as fh:
                json.dump(records, fh, indent=1)
    return records


if __name__ == "__main__":
    main()
