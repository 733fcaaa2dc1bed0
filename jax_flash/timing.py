"""Timing and FLOP counting shared by `python -m jax_flash` and the benchmarks."""

from __future__ import annotations

import statistics
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
