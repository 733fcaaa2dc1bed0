"""The mask/logit policy every kernel call carries: one hashable static value
(`Mask`) instead of a flag per variant threaded through every function, plus
the optional per-batch arrays (`Extras`) that travel as extra FFI operands."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

# FwdParams::kSegmentBlock: rows/keys per [min, max] segment-id range.
SEGMENT_BLOCK = 16


class Mask(NamedTuple):
    """Which keys query row i (absolute position i + query_offset) sees, and how
    its logits are shaped. Defaults are plain full attention.

    causal: keys j <= position. window_left / window_right (-1: unbounded):
    keys with position - window_left <= j <= position + window_right.
    softcap (0: off): scaled logits become softcap * tanh(logits / softcap).
    dropout_rate (0: off): probabilities dropped with the Philox keep mask
    (needs Extras.dropout_seed).
    f32_full: float32 inputs under a full-float32 matmul precision request
    (jax_default_matmul_precision "highest" / "float32"): the CUDA kernels,
    which compute float32 in TF32, refuse the call instead.
    """

    causal: bool = False
    query_offset: int = 0
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    dropout_rate: float = 0.0
    f32_full: bool = False

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
            dropout_rate=np.float32(self.dropout_rate),
            f32_full=bool(self.f32_full),
        )


class Extras(NamedTuple):
    """Optional operands of the FFI calls, in the FFI order (cpp/ffi/common.h
    OptionalInput); None = absent. Shapes use q's leading batch axes `B...`:

    q_seqlens, kv_seqlens, query_offsets: int32 [B...]
    q_segment_ids [B..., Sq], kv_segment_ids [B..., Sk]: int32
    q_segment_ranges [B..., ceil(Sq/16), 2], kv_segment_ranges [B..., ceil(Sk/16), 2]:
      int32 inclusive [min, max] id per block of 16
    alibi_slopes: float32 [B..., Hq]
    dropout_seed: uint32 [2] (never batched, never sharded)
    """

    q_seqlens: Any = None
    kv_seqlens: Any = None
    query_offsets: Any = None
    q_segment_ids: Any = None
    kv_segment_ids: Any = None
    q_segment_ranges: Any = None
    kv_segment_ranges: Any = None
    alibi_slopes: Any = None
    dropout_seed: Any = None

    def present(self) -> int:
        """The `optional_inputs` bitmask attribute."""
        return sum(1 << i for i, x in enumerate(self) if x is not None)

    def arrays(self) -> list:
        return [x for x in self if x is not None]

    @classmethod
    def from_arrays(cls, present: int, arrays) -> "Extras":
        it = iter(arrays)
        return cls(*(next(it) if (present >> i) & 1 else None for i in range(len(cls._fields))))

    @staticmethod
    def kinds(present: int) -> list[str]:
        """Layout kind of each present operand: 'b' [B...], 'bq' [B..., Sq],
        'bk' [B..., Sk], 'bqr'/'bkr' ranges, 'bh' [B..., Hq], 'seed' [2]."""
        all_kinds = ("b", "b", "b", "bq", "bk", "bqr", "bkr", "bh", "seed")
        return [k for i, k in enumerate(all_kinds) if (present >> i) & 1]


NO_EXTRAS = Extras()
