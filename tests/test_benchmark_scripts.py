"""The benchmark scripts start the way gpu_session.sh starts them: `python -P`
from the repository root, which leaves the script's folder off sys.path (a
sibling import once failed only on the device). Tiny CPU runs check that they
time something and write the records they promise."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script, *args, cwd):
    return subprocess.run([sys.executable, "-P", str(BENCH / script), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("script", ["bench_attention.py", "bench_variants.py", "bench_ring.py",
                                    "bench_decode.py", "bench_generate.py",
                                    "prof_packed.py", "prof_options.py", "prof_grid.py", "schedule_model.py"])
def test_benchmark_script_starts_under_python_dash_p(script, tmp_path):
    out = _run(script, "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout


def test_bench_variants_times_packed_documents_and_options_on_cpu(tmp_path):
    path = tmp_path / "variants.json"
    out = _run("bench_variants.py", "--benches", "packed", "option", "--modes", "fwd", "--heads", "2",
               "--head-dim", "32", "--packed-seqlen", "512", "--packed-docs", "32", "256",
               "--option-seqlen", "256", "--option-batch", "2", "--options", "soft", "--dtype", "float32",
               "--out", path, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    records = json.loads(path.read_text())
    benches = {r["bench"] for r in records}
    assert benches == {"packed", "option"}, benches
    assert {r["batch"] for r in records if r["bench"] == "option"} == {2}, records
    timed = [r for r in records if r["ms"] is not None]
    assert timed and all(r["ms"] > 0 and r["tflops"] > 0 for r in timed), records
    assert not [r for r in records if r.get("error")], records


def test_prof_packed_runs_both_batches_on_cpu(tmp_path):
    out = _run("prof_packed.py", "--seqlen", "512", "--heads", "2", "--head-dim", "32", "--docs", "32", "256",
               cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ran packed" in out.stdout and "ran equal documents" in out.stdout


def test_prof_packed_backward_runs_on_cpu(tmp_path):
    out = _run("prof_packed.py", "--seqlen", "384", "--heads", "2", "--head-dim", "32", "--docs", "32", "200",
               "--seed", "0", "--backward", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ran packed" in out.stdout and "ran equal documents" in out.stdout


def test_prof_options_runs_every_option_on_cpu(tmp_path):
    names = ["plain", "window", "lengths", "alibi", "softcap", "dropout"]
    out = _run("prof_options.py", "--seqlen", "256", "--heads", "2", "--head-dim", "32", "--options", *names,
               cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [l.split()[1] for l in out.stdout.splitlines() if l.startswith("ran ")] == names


def test_prof_grid_runs_the_point_per_implementation_on_cpu(tmp_path):
    out = _run("prof_grid.py", "--head-dim", "32", "--seqlen", "128", "--tokens", "256", "--hidden", "64",
               "--dtype", "float32", "--causal", "--impls", "jax_flash", "jax_flash_det", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    ran = [l.split()[1:] for l in out.stdout.splitlines() if l.startswith("ran ")]
    assert ran == [["jax_flash", "d=32", "s=128", "b=2", "h=2", "causal=True"],
                   ["jax_flash_det", "d=32", "s=128", "b=2", "h=2", "causal=True"]], ran


def test_plot_results_charts_the_chosen_implementations(tmp_path):
    pytest.importorskip("matplotlib")
    records = [dict(impl=impl, device="gpu:Test GPU", dtype="bfloat16", batch=16384 // s, seqlen_q=s, seqlen_k=s,
                    heads=2048 // d, heads_kv=2048 // d, head_dim=d, causal=causal, mode=mode, ms=1.0,
                    tflops=100.0 + s / 100 + (50 if impl == "cudnn" else 0))
               for impl in ("jax_flash", "cudnn", "xla") for d in (64, 128) for s in (512, 1024, 2048)
               for causal in (False, True) for mode in ("fwd", "fwd_bwd")]
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps(records))
    png = tmp_path / "grid.png"
    out = _run("plot_results.py", grid, "--impls", "jax_flash", "cudnn", "-o", png, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    none = _run("plot_results.py", grid, "--impls", "pallas", "-o", tmp_path / "none.png", cwd=tmp_path)
    assert none.returncode != 0 and "no timed records" in none.stderr


def test_bench_attention_runs_keeps_each_implementations_best_on_cpu(tmp_path):
    path = tmp_path / "grid.json"
    out = _run("bench_attention.py", "--tokens", "256", "--hidden", "64", "--head-dims", "32", "--seqlens", "128",
               "--causal", "yes", "--impls", "jax_flash", "xla", "--runs", "3", "--out", path, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    records = json.loads(path.read_text())
    assert {(r["impl"], r["mode"]) for r in records} == {(i, m) for i in ("jax_flash", "xla")
                                                          for m in ("fwd", "fwd_bwd")}, records
    for r in records:
        assert len(r["runs_ms"]) == 3 and all(t > 0 for t in r["runs_ms"]), r
        assert r["ms"] == min(r["runs_ms"]) and r["tflops"] > 0, r


@pytest.mark.parametrize("flags, warns", [("", False), ("--xla_gpu_autotune_level=0", True),
                                          ("--foo --xla_gpu_autotune_level=2", True),
                                          ("--xla_gpu_autotune_level=4", False)])
def test_benchmarks_warn_when_xla_autotuning_is_turned_down(monkeypatch, capsys, flags, warns):
    """The GPU tests' --xla_gpu_autotune_level=0 left in a benchmark's
    environment halves XLA's figures: the benchmarks say so on stderr."""
    from jax_flash.timing import warn_if_xla_untuned

    monkeypatch.setenv("XLA_FLAGS", flags)
    assert warn_if_xla_untuned() is warns
    assert ("autotune_level" in capsys.readouterr().err) is warns
