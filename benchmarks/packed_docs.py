"""The packed-documents batch of bench_variants.py: one sequence of documents with
random lengths, and its unpacked comparison batch (shared with schedule_model.py,
which models the same batch, and prof_packed.py, which profiles both)."""

from __future__ import annotations

import numpy as np


def packed_ids(rng, seqlen: int, lo: int, hi: int):
    """(segment ids [seqlen] int32, document lengths): lengths uniform in [lo, hi],
    the last one cut to fill exactly `seqlen` tokens."""
    lengths = []
    while sum(lengths) < seqlen:
        lengths.append(int(rng.integers(lo, hi + 1)))
    lengths[-1] -= sum(lengths) - seqlen
    if lengths[-1] == 0:
        lengths.pop()
    ids = np.concatenate([np.full(n, i, np.int32) for i, n in enumerate(lengths)])
    return ids, lengths


def equal_work_batch(lengths, seqlen: int):
    """(batch, seqlen) of equal documents with the same tokens and the same causal
    work (sum of squared lengths) as the packed `lengths`."""
    n = max(1, round(sum(x * x for x in lengths) / seqlen))
    return max(1, round(seqlen / n)), n
