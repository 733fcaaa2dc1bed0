"""Timing and FLOP counting shared by `python -m jax_flash` and the benchmarks."""

from __future__ import annotations

import os
import re
import statistics
import sys
import time

import jax


def attention_flops(batch, seqlen_q, seqlen_k, heads, head_dim, causal, mode="fwd") -> float:
    """FLOPs counted the FlashAttention way: 4*Sq*Sk*D*H*B forward (halved when
    causal), and 3.5x that for forward+backward."""
    f = 4.0 * batch * seqlen_q * seqlen_k * heads * head_dim
    if causal:
        f /= 2
    return f * (3.5 if mode == "fwd_bwd" else 1.0)


def time_fn(fn, *args, min_repeats=5, target_s=0.3, max_per_round=50) -> float:
    """Median seconds per call of fn(*args), after a compile/warm-up call.

    Each sample launches fn back to back and synchronises once, so dispatch
    overlaps execution and host overhead stays out of sub-millisecond timings.
    """
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    one = max(time.perf_counter() - t0, 1e-6)
    per_round = max(1, min(max_per_round, int(0.05 / one)))
    rounds = max(min_repeats, min(20, int(target_s / (one * per_round))))
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(per_round):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t0) / per_round)
    return statistics.median(samples)


def warn_if_xla_untuned() -> bool:
    """Print a warning (stderr) when XLA_FLAGS turns GPU autotuning down: the
    tests' --xla_gpu_autotune_level=0 left in a benchmark's environment halves
    XLA's own attention (an H200 decode run read 1.2-1.7 TB/s against 2.5-3.1
    with autotuning), so its figures would not be XLA's. Returns whether it warned."""
    m = re.search(r"--xla_gpu_autotune_level=(\d+)", os.environ.get("XLA_FLAGS", ""))
    if m is None or int(m.group(1)) >= 4:
        return False
    print(f"warning: XLA_FLAGS sets --xla_gpu_autotune_level={m.group(1)}: XLA's (and cuDNN "
          "fusions') figures in this run are not what XLA reaches by default", file=sys.stderr)
    return True
