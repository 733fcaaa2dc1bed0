"""The packed-documents batch of bench_variants.py: one sequence of documents with
random lengths (shared with schedule_model.py, which models the same batch)."""

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
