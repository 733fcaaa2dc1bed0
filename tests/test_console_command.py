"""The `jax-flash` console command (the README's main command): installed with
the package, it is the self-check's main() and runs from any directory."""

from __future__ import annotations

import importlib.metadata
import pathlib
import shutil
import subprocess

import pytest

from jax_flash import __main__ as selfcheck


def _entry_points():
    return list(importlib.metadata.entry_points(group="console_scripts", name="jax-flash"))


def _installed_script() -> pathlib.Path | None:
    # The installed files list the script (RECORD); PATH is the fallback.
    dist = importlib.metadata.distribution("jax_flash")
    for f in dist.files or ():
        if f.name in ("jax-flash", "jax-flash.exe") and f.parent.name in ("bin", "Scripts"):
            path = pathlib.Path(dist.locate_file(f)).resolve()
            if path.exists():
                return path
    found = shutil.which("jax-flash")
    return pathlib.Path(found) if found else None


def test_console_command_entry_point_is_the_selfcheck_main():
    eps = _entry_points()
    assert len(eps) == 1, eps
    assert eps[0].value == "jax_flash.__main__:main"
    assert eps[0].load() is selfcheck.main


def test_console_command_runs_the_selfcheck_outside_the_repository(tmp_path):
    script = _installed_script()
    assert script is not None, "the jax-flash script was not installed with the package"
    out = subprocess.run([str(script), "--no-timing"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "correctness (GQA" in out.stdout
    assert "self-check passed" in out.stdout
    assert "timing:" not in out.stdout


def test_console_command_help_names_itself(capsys):
    with pytest.raises(SystemExit) as e:
        selfcheck.main(["--help"])
    assert e.value.code == 0
    assert "usage: jax-flash" in capsys.readouterr().out
