"""Chart TFLOP/s against seqlen, one panel per (head_dim, causal, mode), from
bench_attention.py JSON records.

    python benchmarks/plot_results.py benchmarks/results/h100_fa2_grid.json -o benchmarks/results/h100_fa2_grid.png
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


COLORS = {"jax_flash": "tab:orange", "jax_flash_det": "tab:brown", "cudnn": "tab:blue", "pallas": "tab:green",
          "xla": "tab:red"}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("json", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args(argv)
    recs = [r for path in args.json for r in json.load(open(path)) if r.get("tflops")]
    panels = sorted({(r["head_dim"], r["causal"], r["mode"]) for r in recs})
    cols = 4
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, (d, causal, mode) in zip(axes.flat, panels):
        series = defaultdict(list)
        for r in recs:
            if (r["head_dim"], r["causal"], r["mode"]) == (d, causal, mode):
                series[r["impl"]].append((r["seqlen_q"], r["tflops"]))
        for impl, pts in sorted(series.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl,
                    color=COLORS.get(impl),
                    linewidth=2.5 if impl == "jax_flash" else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_title(f"d={d} {'causal' if causal else 'non-causal'} {mode}", fontsize=9)
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
