"""`python -m jax_flash` (the README's main job): it checks only the dtypes the
build has CUDA kernels for, and fails plainly on a GPU with a CPU-only build."""

from __future__ import annotations

import jax

from jax_flash import __main__ as selfcheck
from jax_flash import _ffi


def _run_as_if_on_gpu(monkeypatch, capsys, built):
    # The GPU branch with the kernels' dtype list faked; the arrays still live
    # on the CPU here, whose kernels take bfloat16 too.
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(_ffi, "cuda_dtypes", lambda: built)
    rc = selfcheck.main(["--no-timing"])
    return rc, capsys.readouterr().out


def test_selfcheck_skips_a_dtype_the_build_left_out(monkeypatch, capsys):
    rc, out = _run_as_if_on_gpu(monkeypatch, capsys, ("bfloat16",))
    assert rc == 0, out
    assert "float16: no CUDA kernels in this build" in out
    assert "bfloat16  causal=True" in out
    assert "float16   causal" not in out
    assert "self-check passed" in out


def test_selfcheck_fails_on_a_gpu_without_cuda_kernels(monkeypatch, capsys):
    rc, out = _run_as_if_on_gpu(monkeypatch, capsys, ())
    assert rc == 1
    assert "no CUDA kernels to check" in out
    assert "self-check FAILED" in out


def test_cpu_only_build_reports_no_cuda_dtypes():
    if _ffi.cuda_archs() is None:
        assert _ffi.cuda_dtypes() == ()
    else:
        assert set(_ffi.cuda_dtypes()) <= {"bfloat16", "float16"} and _ffi.cuda_dtypes()
