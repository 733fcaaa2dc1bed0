"""Chart TFLOP/s against seqlen from bench_attention.py JSON records: one row of
panels per mode (forward, forward+backward), one column per head dim; solid
lines non-causal, dashed causal. The README's chart:

    python benchmarks/plot_results.py benchmarks/results/h100_grid.json --impls jax_flash cudnn \\
        -o benchmarks/results/h100_grid.png
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
LABELS = {"jax_flash": "jax_flash", "jax_flash_det": "jax_flash deterministic", "cudnn": "cuDNN",
          "pallas": "Pallas", "xla": "XLA"}
MODES = {"fwd": "forward", "fwd_bwd": "forward + backward", "bwd": "backward"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--impls", nargs="+", help="only these implementations (default: every one in the records)")
    args = ap.parse_args(argv)
    recs = [r for path in args.json for r in json.load(open(path)) if r.get("tflops")]
    if args.impls:
        recs = [r for r in recs if r["impl"] in args.impls]
    if not recs:
        ap.error("no timed records to plot")
    modes = [m for m in MODES if any(r["mode"] == m for r in recs)]
    dims = sorted({r["head_dim"] for r in recs})
    fig, axes = plt.subplots(len(modes), len(dims), figsize=(4.4 * len(dims), 3.4 * len(modes)), squeeze=False,
                             sharey="row")
    for row, mode in enumerate(modes):
        for col, d in enumerate(dims):
            ax = axes[row][col]
            series = defaultdict(list)
            for r in recs:
                if r["mode"] == mode and r["head_dim"] == d:
                    series[(r["impl"], r["causal"])].append((r["seqlen_q"], r["tflops"]))
            order = list(COLORS)  # jax_flash first in the legend
            for (impl, causal), pts in sorted(series.items(), key=lambda kv: (
                    order.index(kv[0][0]) if kv[0][0] in order else len(order), kv[0])):
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                        color=COLORS.get(impl), linestyle="--" if causal else "-",
                        linewidth=2.2 if impl == "jax_flash" else 1.3,
                        label=f"{LABELS.get(impl, impl)}{', causal' if causal else ''}")
            ax.set_xscale("log", base=2)
            seqlens = sorted({p[0] for pts in series.values() for p in pts})
            ax.set_xticks(seqlens, [f"{s // 1024}k" if s >= 1024 else str(s) for s in seqlens])
            ax.minorticks_off()
            ax.set_title(f"{MODES[mode]}, head_dim {d}", fontsize=10)
            ax.set_xlabel("sequence length")
            if col == 0:
                ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
        top = max(r["tflops"] for r in recs if r["mode"] == mode)
        axes[row][0].set_ylim(0, top * 1.08)  # the row shares its y axis
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=9, frameon=False)
    devices = sorted({r.get("device", "").split(":", 1)[-1] for r in recs} - {""})
    dtypes = sorted({r.get("dtype", "") for r in recs} - {""})
    shape = []
    tokens = {r["batch"] * r["seqlen_q"] for r in recs}
    hidden = {r["heads"] * r["head_dim"] for r in recs}
    if len(tokens) == 1:
        shape.append(f"batch x seqlen = {tokens.pop()} tokens")
    if len(hidden) == 1:
        shape.append(f"heads x head_dim = {hidden.pop()}")
    fig.suptitle(", ".join(devices + dtypes + shape), fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
