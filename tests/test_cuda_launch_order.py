"""The Hopper kernels' CTA launch order (JAX_FLASH_FWD_ORDER / JAX_FLASH_BWD_ORDER,
cpp/cuda/common/tile_order.h) changes when a tile runs, never its result.

Runs only where a CUDA GPU is visible (`pytest -m gpu` on the device); the mapping
itself is checked on the host by tests/test_tile_order.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


# Each case: (name, head_dim, variants, batch, seqlen, heads_q, heads_kv, attention kwargs).
_ORDER_CASES = [
    ("plain d128 gqa", 128, False, 2, 777, 8, 2, {}),
    ("plain d64", 64, False, 3, 300, 4, 4, {}),
    ("plain d256 mqa", 256, False, 1, 400, 5, 1, {}),
    ("segments", 128, True, 2, 600, 4, 2, {"segments": True}),
    ("softcap", 128, True, 2, 333, 4, 2, {"logits_soft_cap": 20.0}),
    ("dropout", 128, True, 2, 333, 4, 2, {"dropout_rate": 0.1}),
]

_ORDER_SCRIPT = r"""
import sys, numpy as np, jax, jax.numpy as jnp, jax_flash
from jax_flash import _ffi
cases = eval(sys.argv[2])
out = {}
for name, d, variants, b, s, hq, hkv, kw in cases:
    built = _ffi.cuda_head_dims(variants)
    if built and not any(x >= d for x in built):
        continue
    rng = np.random.default_rng(len(name))
    mk = lambda *shape: jnp.asarray(rng.standard_normal(shape, dtype=np.float32), jnp.bfloat16)
    q, k, v, do = mk(b, s, hq, d), mk(b, s, hkv, d), mk(b, s, hkv, d), mk(b, s, hq, d)
    kw = dict(kw)
    if kw.pop("segments", False):
        ids = jnp.asarray(np.sort(rng.integers(0, 5, (b, s))), jnp.int32)
        kw.update(q_segment_ids=ids, kv_segment_ids=ids)
    if "dropout_rate" in kw:
        kw["dropout_rng"] = jax.random.key(7)
    f = lambda q, k, v: jax_flash.attention(q, k, v, causal=True, return_lse=True, **kw)
    (o, lse), pull = jax.vjp(f, q, k, v)
    grads = pull((do, jnp.zeros_like(lse)))
    for key, x in zip(("o", "lse", "dq", "dk", "dv"), (o, lse) + tuple(grads)):
        out[name + "/" + key] = np.asarray(x.astype(jnp.float32))
np.savez(sys.argv[1], **out)
"""


def test_cuda_launch_order_changes_no_result(tmp_path):
    """JAX_FLASH_FWD_ORDER / JAX_FLASH_BWD_ORDER (cpp/cuda/common/tile_order.h) change
    which CTA computes which causal tile, never what a tile computes: under
    head-major, L2-sized sections and sections of 3 pairs (a partial last
    section), o, lse, dk and dv are bitwise equal on the plain, masks and
    logits kernels, and dq (float atomics, in any order) equal to an ulp. The
    orders are read once a process, so each runs in its own."""
    results = {}
    for order in ("heads", "lpt", "lpt:3"):
        path = tmp_path / f"{order.replace(':', '_')}.npz"
        env = dict(os.environ, JAX_FLASH_FWD_ORDER=order, JAX_FLASH_BWD_ORDER=order,
                   XLA_PYTHON_CLIENT_PREALLOCATE="false")
        run = subprocess.run([sys.executable, "-P", "-c", _ORDER_SCRIPT, str(path), repr(_ORDER_CASES)],
                             env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        results[order] = dict(np.load(path))
    base = results["heads"]
    assert base, "no case has a kernel in this build"
    for order in ("lpt", "lpt:3"):
        assert results[order].keys() == base.keys()
        for key, want in base.items():
            assert np.isfinite(want).any(), key
            if key.endswith("/dq"):
                np.testing.assert_allclose(results[order][key], want, rtol=1e-2, atol=1e-2,
                                           err_msg=f"{key} under {order}")
            else:
                np.testing.assert_array_equal(results[order][key], want, err_msg=f"{key} under {order}")
