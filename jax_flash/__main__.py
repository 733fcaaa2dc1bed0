"""`jax-flash` (or `python -m jax_flash`): build info, devices, a correctness
check and a short timing table against jax.nn.dot_product_attention on the
default device."""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash
from jax_flash import _ffi
from jax_flash.reference import attention_reference_grad_np, attention_reference_np
from jax_flash.timing import attention_flops, time_fn


def _rand(shape, dtype, seed):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32), dtype)


def correctness_check(dtype) -> bool:
    """Small odd-sized GQA case, fwd and grads, against the float64 reference."""
    ok = True
    for causal in (False, True):
        q = _rand((2, 77, 8, 64), dtype, 1)
        k = _rand((2, 93, 2, 64), dtype, 2)
        v = _rand((2, 93, 2, 64), dtype, 3)
        do = _rand(q.shape, jnp.float32, 4)
        o, vjp = jax.vjp(lambda q, k, v: jax_flash.attention(q, k, v, causal=causal), q, k, v)
        grads = vjp(do.astype(dtype))
        f64 = [np.asarray(x.astype(jnp.float32), np.float64) for x in (q, k, v)]
        ref_o, _ = attention_reference_np(*f64, causal=causal)
        ref_g = attention_reference_grad_np(*f64, np.asarray(do.astype(dtype).astype(jnp.float32)), causal=causal)
        tol = 1e-4 if dtype == jnp.float32 else 3e-2
        errs = [np.max(np.abs(np.asarray(a.astype(jnp.float32)) - b)) / max(1.0, np.max(np.abs(b)))
                for a, b in zip((o, *grads), (ref_o, *ref_g))]
        good = all(e < tol for e in errs)
        ok &= good
        print(f"  {jnp.dtype(dtype).name:9s} causal={causal!s:5s} max rel err o/dq/dk/dv = "
              + " ".join(f"{e:.1e}" for e in errs) + ("  ok" if good else "  FAILED"))
    return ok


def timing_table(dtype, seqlens, batch_tokens, heads, head_dim):
    print(f"\n  {'seqlen':>6} {'causal':>6} {'mode':>7} {'jax_flash ms':>12} {'TFLOP/s':>8} "
          f"{'jax.nn ms':>10} {'TFLOP/s':>8} {'speedup':>7}")
    impl = "cudnn" if jax.default_backend() == "gpu" else "xla"
    for s in seqlens:
        b = max(1, batch_tokens // s)
        q = _rand((b, s, heads, head_dim), dtype, 5)
        k = _rand((b, s, heads, head_dim), dtype, 6)
        v = _rand((b, s, heads, head_dim), dtype, 7)
        for causal in (False, True):
            ours = lambda q, k, v: jax_flash.attention(q, k, v, causal=causal)
            theirs = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=impl)
            for mode in ("fwd", "fwd_bwd"):
                def build(f):
                    if mode == "fwd":
                        return jax.jit(f)
                    return jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))
                t_ours = time_fn(build(ours), q, k, v)
                try:
                    t_ref = time_fn(build(theirs), q, k, v)
                except Exception:  # e.g. cuDNN refusing a shape
                    t_ref = float("nan")
                fl = attention_flops(b, s, s, heads, head_dim, causal, mode)
                print(f"  {s:>6} {str(causal):>6} {mode:>7} {t_ours * 1e3:>12.2f} {fl / t_ours / 1e12:>8.3f} "
                      f"{t_ref * 1e3:>10.2f} {fl / t_ref / 1e12:>8.3f} {t_ref / t_ours:>6.2f}x")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="jax-flash", description=__doc__)
    ap.add_argument("--no-timing", action="store_true", help="skip the timing table")
    args = ap.parse_args(argv)

    print(f"jax_flash {jax_flash.__version__} (jax {jax.__version__})")
    archs = jax_flash.cuda_archs()
    print(f"  compiled kernels: CPU ({jax_flash.cpu_isa()})"
          + (f", CUDA (archs {archs})" if archs else ", no CUDA (CPU-only build)"))
    print(f"  default backend: {jax.default_backend()}; devices: "
          + ", ".join(f"{d.platform}:{d.id} {getattr(d, 'device_kind', '')}".strip() for d in jax.devices()))
    on_gpu = jax.default_backend() == "gpu"
    dtypes = [jnp.float32, jnp.bfloat16]
    if on_gpu:
        built = _ffi.cuda_dtypes()
        dtypes = []
        for dt in (jnp.bfloat16, jnp.float16):
            if jnp.dtype(dt).name in built:
                dtypes.append(dt)
            else:
                print(f"  ({jnp.dtype(dt).name}: no CUDA kernels in this build, see JAX_FLASH_CUDA_DTYPES)")
    print("\ncorrectness (GQA 8/2 heads, seqlens 77 x 93, head_dim 64, vs float64 reference):")
    ok = all([correctness_check(dt) for dt in dtypes])
    if not dtypes:
        print("  no CUDA kernels to check: this build has none, but JAX's default device is a GPU")
        ok = False
    if not args.no_timing and dtypes:
        if on_gpu:
            dt = dtypes[0]
            print(f"\ntiming: {jnp.dtype(dt).name}, 16k tokens, 16 heads x 128 (the FlashAttention-2 grid's middle row)")
            timing_table(dt, [1024, 4096], 16384, 16, 128)
        else:
            print("\ntiming: float32, batch 1, 8 heads x 64 (CPU)")
            timing_table(jnp.float32, [512, 2048], 2048, 8, 64)
    print("\nself-check " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
