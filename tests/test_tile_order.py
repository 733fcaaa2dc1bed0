"""The Hopper kernels' CTA -> (tile, head, batch) mapping (cpp/cuda/common/tile_order.h),
checked on the host: every order covers each tile exactly once, head-major is the
original mapping, the sectioned order runs longest first within each section, and
JAX_FLASH_FWD_ORDER / JAX_FLASH_BWD_ORDER select the section sizes they document."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler on PATH")


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    exe = tmp_path_factory.mktemp("tile_order") / "tile_order_check"
    subprocess.run([CXX, "-std=c++17", "-O1", "-Wall", "-Werror", "-I", str(ROOT / "cpp"),
                    str(ROOT / "tests" / "cuda" / "tile_order_check.cc"), "-o", str(exe)], check=True)
    return exe


def _run(exe, *args, order=None, var="JAX_FLASH_FWD_ORDER"):
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_FLASH_FWD_ORDER", "JAX_FLASH_BWD_ORDER")}
    if order is not None:
        env[var] = order
    return subprocess.run([str(exe), *map(str, args)], env=env, capture_output=True, text=True)


def test_every_order_maps_the_grid_onto_each_tile_once(checker):
    out = _run(checker)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 failures" in out.stdout


# shape: num_m, heads_q, batch, seqlen_k, head_dim, heads_kv, element bytes, segment ids (0 / 1)
@pytest.mark.parametrize(
    "order,shape,group",
    [
        (None, (128, 16, 1, 16384, 128, 16, 2, 0), 4),       # default (auto): sectioned from 8 tiles
        ("auto", (128, 16, 1, 16384, 128, 16, 2, 0), 4),
        (None, (7, 16, 32, 896, 128, 16, 2, 0), 0),          # auto below 8 tiles a pair: head-major
        (None, (4, 16, 32, 512, 128, 16, 2, 0), 0),
        ("lpt", (4, 16, 32, 512, 128, 16, 2, 0), 128),
        ("heads", (128, 16, 1, 16384, 128, 16, 2, 0), 0),
        ("lpt", (128, 16, 1, 16384, 128, 16, 2, 0), 4),      # 32 MiB / (16k x 128 x 2 B x K,V)
        ("lpt", (8, 16, 2, 1024, 128, 2, 2, 0), 32),         # GQA: 64 kv heads' worth, capped at the 32 pairs
        ("lpt", (8, 16, 64, 1024, 128, 2, 2, 0), 512),       # a kv head's 8 q heads stay together
        ("lpt", (1, 4, 1, 1 << 22, 256, 4, 2, 0), 1),        # K/V larger than the budget: one pair
        ("lpt", (1 << 16, 1 << 10, 64, 64, 64, 1, 2, 0), 0),  # 2^32 CTAs: head-major
        ("lpt:6", (8, 16, 2, 1024, 128, 2, 2, 0), 6),
        ("lpt:100", (8, 16, 2, 1024, 128, 2, 2, 0), 32),     # capped at the pairs
        ("lpt:0", (8, 16, 2, 1024, 128, 2, 2, 0), 32),       # not a size: the default
        ("fastest", (8, 16, 2, 1024, 128, 2, 2, 0), 32),     # unknown: the default
        ("heads", (8, 16, 2, 1024, 128, 2, 2, 0), 0),
        # segment ids (packed documents): a pair's K/V sized as 4096 rows
        (None, (128, 16, 1, 16384, 128, 16, 2, 1), 16),   # 32 MiB / (4k x 128 x 2 B x K,V)
        (None, (128, 16, 4, 16384, 128, 16, 2, 1), 16),   # not every pair
        ("lpt", (128, 16, 1, 16384, 128, 16, 2, 1), 16),
        (None, (16, 16, 8, 2048, 128, 16, 2, 1), 32),     # sequences under 4k: as without ids
        (None, (8, 16, 2, 1024, 128, 2, 2, 1), 32),
        (None, (7, 16, 32, 896, 128, 16, 2, 1), 0),       # below 8 tiles a pair: still head-major
        ("lpt:2", (128, 16, 1, 16384, 128, 16, 2, 1), 2),
        ("heads", (128, 16, 1, 16384, 128, 16, 2, 1), 0),
    ],
)
def test_forward_order_knob(checker, order, shape, group):
    out = _run(checker, "fwd", *shape, order=order)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == group
    # The backward's setting is another variable.
    other = _run(checker, "fwd", *shape, order=order, var="JAX_FLASH_BWD_ORDER")
    assert other.stdout == _run(checker, "fwd", *shape).stdout


# shape: key_tiles, heads_kv, batch, seqlen_q, head_dim, heads_q, element bytes, segment ids (0 / 1)
@pytest.mark.parametrize(
    "order,shape,group",
    [
        (None, (64, 16, 2, 8192, 128, 16, 2, 0), 4),         # default (auto): sectioned from 8 tiles
        (None, (4, 16, 32, 512, 128, 16, 2, 0), 0),
        ("lpt", (64, 16, 2, 8192, 128, 16, 2, 0), 4),        # 32 MiB / (8k x 128 x (2 + 2 + 4) B)
        ("lpt", (64, 2, 2, 8192, 128, 16, 2, 0), 1),         # GQA: a kv pair carries 8 q heads' Q, dO, dQ
        ("lpt", (8, 16, 16, 1024, 64, 16, 2, 0), 64),
        ("lpt:3", (8, 16, 16, 1024, 64, 16, 2, 0), 3),
        ("heads", (8, 16, 16, 1024, 64, 16, 2, 0), 0),
        (None, (128, 16, 1, 16384, 128, 16, 2, 1), 8),    # segment ids: 32 MiB / (4k x 128 x 8 B)
        (None, (128, 2, 3, 16384, 128, 16, 2, 1), 1),     # GQA: 8 q heads' worth a pair
        ("lpt", (128, 16, 1, 16384, 128, 16, 2, 1), 8),
        (None, (16, 16, 8, 2048, 128, 16, 2, 1), 16),     # sequences under 4k: as without ids
        ("heads", (128, 16, 1, 16384, 128, 16, 2, 1), 0),
    ],
)
def test_backward_order_knob(checker, order, shape, group):
    out = _run(checker, "bwd", *shape, order=order, var="JAX_FLASH_BWD_ORDER")
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == group
    assert _run(checker, "bwd", *shape, order=order).stdout == _run(checker, "bwd", *shape).stdout
