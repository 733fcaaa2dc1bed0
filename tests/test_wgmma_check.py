"""cmake/wgmma_check.sh, the compiler launcher of JAX_FLASH_CUDA_WGMMA_CHECK=ON: it fails a
unit whose wgmmas ptxas serialised, passes other diagnostics through, and keeps the
compiler's exit status otherwise. A fake compiler stands in for nvcc."""

from __future__ import annotations

import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHECK = ROOT / "cmake" / "wgmma_check.sh"
SERIALISED = ("ptxas info    : (C7513) Potential Performance Loss: wgmma.mma_async instructions are "
              "serialized due to non wgmma instructions defining input registers of a wgmma between "
              "start and end of the pipeline stage in the function 'k'")


def _launch(tmp_path, stderr_lines, rc=0):
    fake = tmp_path / "nvcc"
    body = "".join(f"echo '{line}' >&2\n" for line in stderr_lines)
    # The launcher appends -Xptxas -v: record the arguments to check it did.
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\n{body}exit {rc}\n')
    fake.chmod(0o755)
    out = subprocess.run(["sh", str(CHECK), str(fake), "-c", "unit.cu"], capture_output=True, text=True)
    return out, (tmp_path / "args").read_text().split()


def test_serialised_wgmmas_fail_the_unit(tmp_path):
    out, args = _launch(tmp_path, ["ptxas info    : Used 168 registers", SERIALISED])
    assert out.returncode == 1
    assert "C7513" in out.stderr and "Used 168 registers" not in out.stderr
    assert args[-2:] == ["-Xptxas", "-v"]


def test_clean_unit_passes_and_keeps_other_diagnostics(tmp_path):
    out, _ = _launch(tmp_path, ["ptxas info    : Used 90 registers",
                                "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
                                "unit.cu(3): warning #177-D: variable x was declared but never referenced"])
    assert out.returncode == 0
    assert out.stderr.strip() == "unit.cu(3): warning #177-D: variable x was declared but never referenced"


def test_compiler_failure_is_kept(tmp_path):
    out, _ = _launch(tmp_path, ["unit.cu(1): error: expected a ;"], rc=2)
    assert out.returncode == 2 and "expected a ;" in out.stderr
