"""The CUDA target choice of the build (cmake/cuda_archs.cmake): JAX_FLASH_CUDA_ARCHS=auto
builds for the GPUs nvidia-smi lists, and for 80;90a when there is none."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CMAKE = shutil.which("cmake")
pytestmark = pytest.mark.skipif(CMAKE is None, reason="cmake not on PATH")


def _detect(tmp_path, smi_script: str | None) -> list[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    if smi_script is not None:
        smi = bindir / "nvidia-smi"
        smi.write_text("#!/bin/sh\n" + smi_script)
        smi.chmod(0o755)
    driver = tmp_path / "detect.cmake"
    driver.write_text(f'include("{ROOT / "cmake" / "cuda_archs.cmake"}")\n'
                      'jax_flash_detect_archs(A)\nmessage("ARCHS=${A}")\n')
    # Only our fake bin dir and the system dirs: a real nvidia-smi elsewhere must not answer.
    env = dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin")
    out = subprocess.run([CMAKE, "-P", str(driver)], env=env, capture_output=True, text=True, check=True)
    line = next(l for l in out.stderr.splitlines() if l.startswith("ARCHS="))
    return line[len("ARCHS="):].split(";")


@pytest.mark.parametrize(
    "caps,expected",
    [
        ("9.0", ["90a"]),
        ("9.0\\n9.0", ["90a"]),
        ("8.0\\n8.6", ["80"]),
        ("9.0\\n8.9", ["90a", "80"]),
        ("12.0", ["80"]),  # newer than every target: the embedded sm_80 PTX
    ],
)
def test_auto_targets_follow_the_visible_gpus(tmp_path, caps, expected):
    assert _detect(tmp_path, f'printf "{caps}\\n"\n') == expected


@pytest.mark.parametrize("smi", [None, "exit 9\n", 'printf "7.5\\n"\n'])
def test_auto_targets_without_a_usable_gpu(tmp_path, smi):
    if smi is None and os.path.exists("/usr/bin/nvidia-smi"):
        pytest.skip("a system nvidia-smi would answer")
    assert _detect(tmp_path, smi) == ["80", "90a"]


_UNITS = ["i/fwd_hdim64_bf16.cu", "i/fwd_hdim64_fp16.cu", "i/bwd_sm90_hdim128_bf16.cu",
          "i/bwd_sm90_hdim128_fp16.cu", "i/fwd_var_hdim256_fp16.cu", "i/bwd_var_hdim32_bf16.cu",
          "t/bwd_hdim64_tf32.cu"]


def _units(tmp_path, call: str) -> tuple[subprocess.CompletedProcess, dict[str, list[str]]]:
    """Runs one cmake/cuda_units.cmake filter over _UNITS; returns the
    process and the printed lists (U: kept units, M: missing dtypes)."""
    driver = tmp_path / "units.cmake"
    driver.write_text(f'include("{ROOT / "cmake" / "cuda_units.cmake"}")\n'
                      f'set(U {" ".join(_UNITS)})\n{call}\n'
                      'message("U=${U}")\nmessage("M=${M}")\n')
    out = subprocess.run([CMAKE, "-P", str(driver)], capture_output=True, text=True)
    lists = {l[0]: [x for x in l[2:].split(";") if x] for l in out.stderr.splitlines() if l[:2] in ("U=", "M=")}
    return out, lists


@pytest.mark.parametrize(
    "dtypes,kept,missing",
    [("bf16", ["bf16"], ["fp16", "tf32"]), ("fp16", ["fp16"], ["bf16", "tf32"]),
     ("bf16;fp16", ["bf16", "fp16"], ["tf32"]), ("bf16;tf32", ["bf16", "tf32"], ["fp16"]),
     ("fp32", ["tf32"], ["bf16", "fp16"]), ("", None, [])],
)
def test_dtype_filter_keeps_the_listed_dtypes_units(tmp_path, dtypes, kept, missing):
    out, lists = _units(tmp_path, f'jf_keep_dtypes(U "{dtypes}" M)')
    assert out.returncode == 0, out.stderr
    want = [u for u in _UNITS if kept is None or any(u.endswith(f"_{t}.cu") for t in kept)]
    assert lists["U"] == want and lists.get("M", []) == missing


def test_dtype_filter_rejects_an_unknown_dtype(tmp_path):
    out, _ = _units(tmp_path, 'jf_keep_dtypes(U "bfloat16" M)')
    assert out.returncode != 0 and "unknown dtype 'bfloat16'" in out.stderr


@pytest.mark.parametrize(
    "pattern,dims,want",
    [(".", "64;128", [0, 1, 2, 3, 6]), (".", "256", [4]), ("^(fwd|bwd)_var", "32", [0, 1, 2, 3, 5, 6])],
)
def test_head_dim_filter_keeps_matching_units_of_the_listed_dims(tmp_path, pattern, dims, want):
    out, lists = _units(tmp_path, f'jf_keep_head_dims(U "{pattern}" "{dims}")')
    assert out.returncode == 0, out.stderr
    assert lists["U"] == [_UNITS[i] for i in want]


# The backward's workspace is sized in Python for the head dim of the kernel
# that will run; the variants kernels exist for fewer head dims
# (JAX_FLASH_CUDA_VARIANT_HEAD_DIMS), so a padded head dim needs more room.
@pytest.mark.parametrize(
    "d,variants,expected",
    [(8, False, 32), (40, False, 64), (96, False, 96), (96, True, 128), (129, True, 256),
     (160, False, 160), (200, True, 256), (256, True, 256), (33, True, 64)],
)
def test_workspace_head_dim_follows_the_kernel_that_runs(monkeypatch, d, variants, expected):
    from jax_flash import _ffi, partitioning

    built = {False: (32, 64, 96, 128, 160, 192, 224, 256), True: (32, 64, 128, 256)}
    monkeypatch.setattr(_ffi, "cuda_head_dims", lambda v=False: built[bool(v)])
    assert partitioning._kernel_head_dim(d, variants) == expected


# A sm_90a build runs calls at head dims between the Hopper kernels' (64 /
# 128 / 256; with options only 32 has a kernel of its own below them)
# zero-padded on the next one: its accumulator is that wide.
@pytest.mark.parametrize(
    "d,variants,archs,expected",
    [(96, False, "80;90a", 128), (96, False, "80", 96), (96, True, "80;90a", 128), (80, False, "90a", 128),
     (40, False, "90a", 64), (20, False, "90a", 64), (192, False, "90a", 256), (160, False, "90a", 256),
     (192, True, "90a", 256), (128, False, "90a", 128), (256, False, "90a", 256), (32, True, "90a", 64),
     (20, True, "80;90a", 64), (32, True, "80", 32)],
)
def test_accumulator_head_dim_follows_the_widest_kernel_that_may_run(monkeypatch, d, variants, archs, expected):
    from jax_flash import _ffi, partitioning

    built = {False: (32, 64, 96, 128, 160, 192, 224, 256), True: (32, 64, 128, 256)}
    monkeypatch.setattr(_ffi, "cuda_head_dims", lambda v=False: built[bool(v)])
    monkeypatch.setattr(_ffi, "cuda_archs", lambda: archs)
    assert partitioning._accum_head_dim(d, variants) == expected


def test_accumulator_head_dim_without_the_padded_hopper_kernel(monkeypatch):
    from jax_flash import _ffi, partitioning

    built = (32, 96, 192)  # no 64 / 128 / 256: the SM80 kernels of 32 / 96 / 192 run
    monkeypatch.setattr(_ffi, "cuda_head_dims", lambda v=False: built)
    monkeypatch.setattr(_ffi, "cuda_archs", lambda: "90a")
    assert [partitioning._accum_head_dim(d, False) for d in (20, 96, 150)] == [32, 96, 192]


def test_workspace_head_dim_without_cuda_is_the_32_multiple(monkeypatch):
    from jax_flash import _ffi, partitioning

    monkeypatch.setattr(_ffi, "cuda_head_dims", lambda v=False: ())
    assert [partitioning._kernel_head_dim(d, True) for d in (1, 32, 33, 100, 256)] == [32, 32, 64, 128, 256]


def test_gpu_tests_skip_head_dims_this_build_lacks(monkeypatch):
    from helpers import skip_unless_cuda_head_dim
    from jax_flash import _ffi

    built = {False: (64, 128), True: (64, 128)}
    monkeypatch.setattr(_ffi, "cuda_head_dims", lambda v=False: built[bool(v)])
    skip_unless_cuda_head_dim(96)  # runs padded on 128
    skip_unless_cuda_head_dim(128, variants=True)
    with pytest.raises(pytest.skip.Exception, match="head_dim 160"):
        skip_unless_cuda_head_dim(160)
    with pytest.raises(pytest.skip.Exception, match="variants"):
        skip_unless_cuda_head_dim(256, variants=True)


def test_gpu_tests_skip_dtypes_this_build_lacks():
    import jax.numpy as jnp
    from helpers import unbuilt_cuda_dtype, unbuilt_cuda_kernels

    f16 = {"dtype": jnp.float16}
    assert unbuilt_cuda_kernels(None, {"gpu", "tf32"}, ("bfloat16",), False) == "float32 (tf32)"
    assert unbuilt_cuda_kernels(None, {"gpu", "tf32"}, ("bfloat16",), True) is None
    assert unbuilt_cuda_kernels(f16, {"gpu"}, ("bfloat16",), False) == "float16"  # a 16-bit parameter, unmarked
    assert unbuilt_cuda_kernels(f16, {"gpu", "tf32"}, ("bfloat16", "float16"), True) is None
    assert unbuilt_cuda_kernels(None, {"gpu", "tf32"}, (), False) is None  # CPU-only build

    assert unbuilt_cuda_dtype({"dtype": jnp.float16, "causal": True}, ("bfloat16",)) == "float16"
    assert unbuilt_cuda_dtype({"dtype": "bfloat16"}, ("float16",)) == "bfloat16"
    assert unbuilt_cuda_dtype({"dtype": jnp.float16, "d": 64}, ("bfloat16", "float16")) is None
    assert unbuilt_cuda_dtype({"dtype": jnp.float32}, ("bfloat16",)) is None  # float32: not a 16-bit build dtype
    assert unbuilt_cuda_dtype({"dtype": jnp.float16}, ()) is None  # CPU-only build
    assert unbuilt_cuda_dtype({"case": "window", "sq": 7}, ("bfloat16",)) is None


def _cuda_workspace_bytes(batch, hq, sq, d_pad, deterministic, variants):
    """cpp/cuda/bwd_dispatch.h: each region rounded up to 256 B over the batch;
    deterministic mode keeps the accumulator at 64/128/256 (its order
    counters live in dq's buffer, not here); the
    accumulator's rows are padded per head to whole 128-row tiles."""
    up = lambda n: (n + 255) // 256 * 256
    rows = batch * hq * sq
    det_ordered = d_pad in (64, 128, 256)
    accum = up(4 * batch * hq * -(-sq // 128) * 128 * d_pad) if (det_ordered or not deterministic) else 0
    return up(4 * rows) + accum


@pytest.mark.parametrize("lead", [(), (1,), (3,), (2, 5)])
@pytest.mark.parametrize("sq,hq,d", [(16384, 16, 128), (4096, 16, 128), (1, 1, 64), (17, 3, 40), (129, 4, 256),
                                     (64, 1, 96)])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("variants", [False, True])
def test_workspace_covers_the_cuda_layout_with_no_slack_when_aligned(lead, sq, hq, d, deterministic, variants):
    """Whatever path runs (atomic, ordered or deterministic), the scratch is
    D plus the accumulator: when the rows are whole 64-float runs (the FA2
    grid's shapes), exactly that, as cuDNN's."""
    import math

    import jax
    import jax.numpy as jnp

    from jax_flash import partitioning

    q = jax.ShapeDtypeStruct(lead + (sq, hq, d), jnp.bfloat16)
    batch = math.prod(lead)
    d_pad = partitioning._accum_head_dim(d, variants)
    have = 4 * batch * partitioning._bwd_workspace_floats(q, deterministic, variants)
    need = _cuda_workspace_bytes(batch, hq, sq, d_pad, deterministic, variants)
    assert have >= need
    if (batch * hq * sq) % 64 == 0:
        assert have == need
    # vmap adds a leading axis XLA multiplies in; the slack must still cover it
    assert 7 * have >= _cuda_workspace_bytes(7 * batch, hq, sq, d_pad, deterministic, variants)


def _tf32_scratch_bytes(batch, sq, sk, hq, hkv, d):
    """The Hopper TF32 kernels' scratch (cpp/cuda/sm90/tf32_operands.cuh), each
    region rounded up to 256 B over the batch: the forward's Tf32KvScratch
    (counter, K, V^T) and, past the D rows, the backward's Tf32BwdScratch
    (counter, K, V, K^T, Q, dO, Q^T, dO^T)."""
    up = lambda n: (n + 255) // 256 * 256  # noqa: E731
    pad8 = lambda n: -(-n // 8) * 8  # noqa: E731
    kv, qo = 4 * batch * hkv * d, 4 * batch * hq * d
    fwd = 256 + up(kv * sk) + up(kv * pad8(sk))
    bwd = up(4 * batch * hq * sq) + 256 + 2 * up(kv * sk) + up(kv * pad8(sk)) + 2 * up(qo * sq) + 2 * up(qo * pad8(sq))
    return fwd, bwd


@pytest.mark.parametrize("lead", [(), (3,), (2, 5)])
@pytest.mark.parametrize("sq,sk,hq,hkv,d", [(1, 1, 1, 1, 64), (131, 263, 4, 2, 128), (257, 77, 6, 2, 36),
                                            (1000, 1021, 2, 2, 96), (4096, 4096, 16, 16, 64)])
def test_float32_scratch_covers_the_hopper_tf32_copies(lead, sq, sk, hq, hkv, d):
    """float32 on CUDA: the forward's scratch and the backward's workspace that
    the Python side allocates hold the rounded / transposed operand copies the
    Hopper TF32 kernels make (head dims 33-128, multiples of 4), also under a
    vmap that multiplies the leading batch; calls those kernels never take get
    the minimum (C++ asks for what Python gives: an error otherwise)."""
    import math

    import jax
    import jax.numpy as jnp

    from jax_flash import partitioning
    from jax_flash.mask import NO_EXTRAS, Mask

    q = jax.ShapeDtypeStruct(lead + (sq, hq, d), jnp.float32)
    k = jax.ShapeDtypeStruct(lead + (sk, hkv, d), jnp.float32)
    batch = math.prod(lead)
    fwd_ints = partitioning._fwd_scratch_ints(q, k, Mask(causal=True), NO_EXTRAS)
    bwd_floats = partitioning._bwd_workspace_floats(q, False, False, k.shape)
    for factor in (1, 7):
        need_fwd, need_bwd = _tf32_scratch_bytes(factor * batch, sq, sk, hq, hkv, d)
        assert 4 * factor * batch * fwd_ints >= need_fwd
        assert 4 * factor * batch * bwd_floats >= need_bwd
    # Soft-cap (forward) and any option (backward) keep the mma.sync kernels.
    assert partitioning._fwd_scratch_ints(q, k, Mask(softcap=5.0), NO_EXTRAS) == 1
    assert partitioning._bwd_workspace_floats(q, False, True, k.shape) == hq * sq


@pytest.mark.parametrize("d", [32, 30, 130, 256])
def test_float32_scratch_is_minimal_where_the_tf32_wgmma_kernels_never_run(d):
    import jax
    import jax.numpy as jnp

    from jax_flash import partitioning
    from jax_flash.mask import NO_EXTRAS, Mask

    q = jax.ShapeDtypeStruct((2, 100, 4, d), jnp.float32)
    assert partitioning._fwd_scratch_ints(q, q, Mask(), NO_EXTRAS) == 1
    assert partitioning._bwd_workspace_floats(q, False, False, q.shape) == 4 * 100
