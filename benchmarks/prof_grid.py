"""One forward+backward (jax.grad, as bench_attention.py times it) of one
FlashAttention-2 grid point per implementation, for ncu: every kernel of each
call is one launch, so a profile puts jax_flash's backward kernel beside
cuDNN's at the same shape (gpu_session.sh's ncu-grid stage; NOTES "Open
questions" cites what the profiles showed).
    ncu --section SpeedOfLight ... python -P benchmarks/prof_grid.py --head-dim 256 --seqlen 4096
"""

import argparse
import pathlib
import sys

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # python -P leaves the script's folder off the path
from bench_attention import build, make_impls


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--impls", nargs="+", default=["jax_flash", "cudnn"])
    a = ap.parse_args()
    d, s = a.head_dim, a.seqlen
    heads, batch = a.hidden // d, max(1, a.tokens // s)
    rng = np.random.default_rng(0)
    q, k, v = (jax.numpy.asarray(rng.standard_normal((batch, s, heads, d), dtype=np.float32), a.dtype)
               for _ in range(3))
    impls = make_impls(jax.default_backend() == "gpu", a.impls)
    for name in a.impls:
        f = build(impls[name], a.causal, "fwd_bwd")
        jax.block_until_ready(f(q, k, v))
        print("ran", name, f"d={d} s={s} b={batch} h={heads} causal={a.causal}", flush=True)


if __name__ == "__main__":
    main()
