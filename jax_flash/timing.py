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


def time_fn(fn, *args, warmup=2, repeats=10, min_time=0.0) -> float:
    """Median wall time in seconds of fn(*args), synchronised on its outputs."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    start = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
        if len(times) >= 1000:
            break
    return statistics.median(times)
