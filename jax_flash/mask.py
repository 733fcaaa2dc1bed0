"""The mask/logit policy every kernel call carries: one hashable static value
instead of a flag per variant threaded through every function."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Mask(NamedTuple):
    """Which keys query row i (absolute position i + query_offset) sees, and how
    its logits are shaped. Defaults are plain full attention.

    causal: keys j <= position. window_left / window_right (-1: unbounded):
    keys with position - window_left <= j <= position + window_right.
    softcap (0: off): scaled logits become softcap * tanh(logits / softcap).
    """

    causal: bool = False
    query_offset: int = 0
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0

    @staticmethod
    def of(value) -> "Mask":
        """A Mask from a Mask or a plain causal flag."""
        return value if isinstance(value, Mask) else Mask(causal=bool(value))

    def ffi_attrs(self) -> dict:
        return dict(
            causal=bool(self.causal),
            query_offset=np.int64(self.query_offset),
            window_left=np.int64(self.window_left),
            window_right=np.int64(self.window_right),
            softcap=np.float32(self.softcap),
        )
