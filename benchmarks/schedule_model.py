"""Launch-order model of the Hopper forward (benchmarks/NOTES.md, "Causal forward: the
tail of the launch order").

A CTA takes (key tiles it visits + a) tile-steps; the GPU's CTA slots take CTAs in
linear block order, each slot the next CTA when its last one ends. The script fits the
per-CTA cost `a` to a measured grid (default: h100_grid.json, jax_flash d128
forward, normalised to non-causal at the longest seqlen), prints model against
measurement for the head-major order the kernels use by default and for the sectioned
longest-first order (JAX_FLASH_FWD_ORDER=lpt), and the packed-documents case of
bench_variants.py. Host only (numpy):

    python benchmarks/schedule_model.py [--grid benchmarks/results/h100_grid.json]
"""

from __future__ import annotations

import argparse
import heapq
import json
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # python -P leaves the script's folder off the path
from packed_docs import packed_ids

HERE = pathlib.Path(__file__).resolve().parent


def makespan(durations, slots: int) -> float:
    """Greedy list scheduling in the given order."""
    free = [0.0] * slots
    for d in durations:
        t = heapq.heappop(free)
        heapq.heappush(free, t + d)
    return max(free)


def launch_order(work, pairs: int, group: int):
    """Per-CTA durations in launch order. work[m]: query tile m's duration (the same
    for every (batch, head) pair). group 0: head-major (each pair's tiles, longest
    first); else sections of `group` pairs, each section's tiles longest first with
    its pairs side by side (cpp/cuda/common/tile_order.h)."""
    tiles = range(len(work) - 1, -1, -1)
    if group <= 0:
        return [work[m] for _ in range(pairs) for m in tiles]
    out = []
    for first in range(0, pairs, group):
        out += [work[m] for m in tiles for _ in range(min(group, pairs - first))]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", default=str(HERE / "results" / "h100_grid.json"))
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-m", type=int, default=128)
    ap.add_argument("--block-n", type=int, default=64, help="the d128 forward's key tile")
    ap.add_argument("--slots", type=int, default=264, help="SMs x CTAs per SM")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--l2-bytes", type=int, default=32 << 20, help="K + V bytes a section may keep")
    args = ap.parse_args(argv)
    bm, bn, slots = args.block_m, args.block_n, args.slots

    meas = {}
    for r in json.load(open(args.grid)):
        if (r.get("impl") == "jax_flash" and r.get("mode") == "fwd" and r.get("head_dim") == args.head_dim
                and r.get("tflops")):
            meas[(r["seqlen_q"], bool(r["causal"]))] = r["tflops"]
    seqlens = sorted({s for s, _ in meas})
    top = max(seqlens)

    def rate(s, causal, a, group=0):
        pairs = args.heads * (args.tokens // s)
        work = [((m + 1) * bm // bn if causal else s // bn) + a for m in range(s // bm)]
        real = (s * (s + 1) / 2 if causal else s * s) / (bm * bn)
        return real * pairs / makespan(launch_order(work, pairs, group), slots)

    def section(s):
        return max(1, args.l2_bytes // (s * args.head_dim * 2 * 2))

    best = None
    for a in np.arange(0.5, 8.01, 0.25):
        ref = rate(top, False, a)
        err = max(abs(rate(s, c, a) / ref - meas[(s, c)] / meas[(top, False)]) for (s, c) in meas)
        if best is None or err < best[1]:
            best = (a, err)
    a = best[0]
    ref = rate(top, False, a)
    print(f"fitted a = {a:.2f} tile-steps a CTA (worst error {best[1]:.3f}), {len(meas)} points of {args.grid}")
    print("seqlen causal  model  measured  sectioned(model)  gain")
    for s in seqlens:
        for c in (False, True):
            if (s, c) not in meas:
                continue
            head_major = rate(s, c, a) / ref
            sectioned = rate(s, c, a, section(s)) / ref if c else head_major
            print(f"{s:6d} {str(c):6s} {head_major:6.3f}  {meas[(s, c)] / meas[(top, False)]:8.3f}  "
                  f"{sectioned:16.3f}  {100 * (sectioned / head_major - 1):+5.1f}%")

    # Packed documents (bench_variants defaults): real-work rate / plain causal rate.
    s = args.tokens
    work_plain = [(m + 1) * bm // bn + a for m in range(s // bm)]
    real_plain = s * (s + 1) / 2 / (bm * bn)
    span_plain = makespan(launch_order(work_plain, args.heads, 0), slots)
    for seed in range(4):
        lengths = packed_ids(np.random.default_rng(seed), s, 256, 4096)[1]
        starts = np.repeat(np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
        work = [(m * bm + bm - 1) // bn - starts[m * bm] // bn + 1 + a for m in range(s // bm)]
        real = sum(n * (n + 1) / 2 for n in lengths) / (bm * bn)
        visited = sum(w - a for w in work)
        head_major = real / makespan(launch_order(work, args.heads, 0), slots)
        sectioned = real / makespan(launch_order(work, args.heads, section(s)), slots)
        print(f"packed seed {seed} ({len(lengths)} docs): real / visited tiles {real / visited:.2f}; "
              f"real-work rate / plain causal {head_major / (real_plain / span_plain):.2f} (head-major), "
              f"{sectioned / (real_plain / span_plain):.2f} (packed sectioned)")


if __name__ == "__main__":
    main()
