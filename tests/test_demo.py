"""Smoke test of `python -m jax_flash.demo`: stdlib corpus loading and a few training steps."""

from __future__ import annotations

import io

import numpy as np
import pytest

pytest.importorskip("flax")
pytest.importorskip("optax")

from jax_flash import demo  # noqa: E402


def test_stdlib_files_sorted_and_without_third_party(tmp_path):
    for rel in ("b.py", "a/z.py", "a/b.py", "site-packages/x.py", "a/__pycache__/c.py",
                "notes.txt", "dist-packages/y.py"):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"# {rel}\n")
    files = [f.relative_to(tmp_path).as_posix() for f in demo.stdlib_source_files(tmp_path)]
    assert files == ["a/b.py", "a/z.py", "b.py"]


def test_load_corpus_is_real_stdlib_deterministic_and_split():
    files = demo.stdlib_source_files()
    assert len(files) > 100 and any(f.name == "os.py" for f in files)
    assert not any("site-packages" in f.parts for f in files)
    c1 = demo.load_corpus(max_bytes=400_000, val_every=5)
    c2 = demo.load_corpus(max_bytes=400_000, val_every=5)
    assert np.array_equal(c1.train, c2.train) and np.array_equal(c1.val, c2.val)
    assert c1.train.dtype == np.uint8 and c1.train.size + c1.val.size <= 400_000 + 2 * len(files)
    assert c1.train_files > c1.val_files > 0
    assert b"import" in c1.train.tobytes() and b"def " in c1.val.tobytes()
    # The first file in sorted order goes to val; the train split starts with the second.
    assert c1.val.tobytes().startswith(files[0].read_bytes())
    assert c1.train.tobytes().startswith(files[1].read_bytes())


def test_batches_are_next_byte_targets():
    data = np.arange(1000, dtype=np.int64).astype(np.uint8)
    x, y = demo.sample_batch(data, 4, 16, np.random.default_rng(0))
    assert x.shape == y.shape == (4, 16) and x.dtype == np.int32
    assert np.array_equal(x[:, 1:], y[:, :-1])
    vb = demo.eval_batches(data, 3, 2, 16)
    assert len(vb) == 3 and vb[0][0].shape == (2, 16)


def test_demo_main_runs_a_few_steps_and_compares(tmp_path):
    out = io.StringIO()
    png = tmp_path / "loss.png"
    rc = demo.main(
        ["--steps", "4", "--batch", "2", "--seq-len", "32", "--d-model", "32", "--layers", "1",
         "--heads", "2", "--kv-heads", "1", "--val-batches", "1", "--max-bytes", "300000",
         "--plot", str(png)],
        stream=out,
    )
    text = out.getvalue()
    assert rc == 0, text
    assert "stdlib .py files" in text and "4/4 loss" in text and "tok/s" in text
    assert "jax_flash vs jax.nn: OK" in text
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in text
    else:
        assert png.exists() and png.stat().st_size > 0


def test_demo_rejects_bad_flags():
    with pytest.raises(SystemExit):
        demo.parse_args(["--heads", "3", "--kv-heads", "2"])
    with pytest.raises(SystemExit):
        demo.parse_args(["--steps", "0"])
