"""`python -m jax_flash.demo`: train a small byte-level decoder-only LM on jax_flash.

The corpus is real text that is already on every machine and that nobody here
wrote: the Python standard library's own source files (found through
``sysconfig.get_paths()["stdlib"]``, read in sorted path order; every
``val_every``-th file goes to the validation split). Tokens are bytes (vocab 256).

The model (``jax_flash.flax.DecoderLM``: RoPE, causal, pre-norm blocks) is trained
twice from the same initial parameters on the same batches: once with
``jax_flash.attention`` and once with ``jax.nn.dot_product_attention``. The demo
prints both final losses, checks they agree within ``--tol`` (exit status 1 when
they do not) and saves a loss-curve PNG when matplotlib is installed.

Runs on the default JAX device (the GPU when there is one); ``--device cpu`` forces CPU.
Computes in bfloat16 on a GPU (float32 parameters, the usual mixed precision)
and in float32 on the CPU; ``--dtype float32`` runs float32 on the GPU too
(jax_flash's TF32 kernels). Prints the step time of both runs.
Needs flax and optax (``pip install 'jax_flash[flax]'``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

VOCAB_SIZE = 256  # byte-level tokens

# ---------------------------------------------------------------------------
# Data: the standard library's own source, byte-level.


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_source_files(root: str | os.PathLike | None = None) -> list[Path]:
    """All ``*.py`` files under the stdlib directory, sorted by relative path.

    Skips installed third-party packages (site-packages/dist-packages) so the
    corpus is the standard library only, and the order is the same on every run.
    """
    root = Path(root) if root is not None else stdlib_dir()
    if not root.is_dir():
        raise FileNotFoundError(f"standard library directory not found: {root}")
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames
            if d not in ("site-packages", "dist-packages", "__pycache__") and not d.startswith(".")
        )
        for f in filenames:
            if f.endswith(".py"):
                files.append(Path(dirpath) / f)
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    return files


@dataclasses.dataclass
class Corpus:
    train: np.ndarray  # uint8 tokens
    val: np.ndarray
    train_files: int
    val_files: int
    root: Path

    def describe(self) -> str:
        return (
            f"{self.train_files + self.val_files} stdlib .py files under {self.root}: "
            f"train {self.train_files} files / {self.train.size / 1e6:.2f} MB, "
            f"val {self.val_files} files / {self.val.size / 1e6:.2f} MB"
        )


def load_corpus(
    max_bytes: int = 8 << 20, val_every: int = 10, root: str | os.PathLike | None = None
) -> Corpus:
    """Reads stdlib sources in sorted order until ``max_bytes``; file i goes to val when i % val_every == 0.

    Files are joined with a NUL byte as document separator.
    """
    if val_every < 2:
        raise ValueError(f"val_every must be >= 2, got {val_every}")
    root = Path(root) if root is not None else stdlib_dir()
    train, val = [], []
    total = 0
    for i, path in enumerate(stdlib_source_files(root)):
        try:
            data = path.read_bytes()
        except OSError:
            continue  # unreadable file: skip it (deterministically, on this machine)
        if not data:
            continue
        if total + len(data) > max_bytes and (train and val):
            break
        total += len(data) + 1
        (val if i % val_every == 0 else train).append(data)
    if not train or not val:
        raise RuntimeError(f"too little stdlib source under {root} for a train/val split")
    return Corpus(
        train=np.frombuffer(b"\0".join(train), np.uint8),
        val=np.frombuffer(b"\0".join(val), np.uint8),
        train_files=len(train), val_files=len(val), root=root,
    )


def sample_batch(data: np.ndarray, batch: int, seq_len: int, rng: np.random.Generator):
    """Random windows: inputs [batch, seq_len] and next-byte targets, int32."""
    if data.size < seq_len + 2:
        raise ValueError(f"corpus split too small ({data.size} bytes) for seq_len={seq_len}")
    starts = rng.integers(0, data.size - seq_len - 1, size=batch)
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    w = data[idx].astype(np.int32)
    return w[:, :-1], w[:, 1:]


def eval_batches(data: np.ndarray, n: int, batch: int, seq_len: int):
    """n fixed, evenly spaced validation batches."""
    starts = np.linspace(0, data.size - seq_len - 2, n * batch).astype(np.int64)
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    w = data[idx].astype(np.int32).reshape(n, batch, seq_len + 1)
    return [(b[:, :-1], b[:, 1:]) for b in w]


# ---------------------------------------------------------------------------
# Progress bar (plain text).


class Progress:
    def __init__(self, total: int, label: str, stream=None, width: int = 24):
        self.total, self.label, self.width = total, label, width
        self.stream = stream or sys.stdout
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last_print = 0.0
        self._last_line_step = 0

    def update(self, step: int, loss: float, tok_per_s: float | None):
        now = time.perf_counter()
        done = step == self.total
        if self.tty:
            if not done and now - self._last_print < 0.1:
                return
        elif not done and step - self._last_line_step < max(1, self.total // 10):
            return
        self._last_print, self._last_line_step = now, step
        fill = int(self.width * step / self.total)
        bar = "#" * fill + "-" * (self.width - fill)
        tps = f"{tok_per_s / 1e3:7.1f}k tok/s" if tok_per_s else "  (compiling)"
        line = f"{self.label:>9} [{bar}] {step:>4}/{self.total} loss {loss:6.3f} {tps}"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if done else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


# ---------------------------------------------------------------------------
# Training.


@dataclasses.dataclass
class RunResult:
    impl: str
    losses: list  # train loss per step
    val_loss: float
    final_train_loss: float  # mean of the last few steps
    tokens_per_s: float
    compile_s: float
    wall_s: float
    step_ms: float = 0.0  # mean step time after the first (compiling) step
    model: object = None  # the trained DecoderLM (for the generation report)


def compute_dtype(args, device):
    """--dtype auto: bfloat16 on a GPU (float32 parameters), float32 elsewhere."""
    import jax.numpy as jnp

    name = args.dtype
    if name == "auto":
        name = "bfloat16" if device.platform == "gpu" else "float32"
    return jnp.dtype(name)


def make_model(args, impl: str, dtype=None):
    from flax import nnx

    import jax_flash.flax as jf

    return jf.DecoderLM(
        VOCAB_SIZE, d_model=args.d_model, num_layers=args.layers, num_heads=args.heads,
        num_kv_heads=args.kv_heads, attention_impl=impl, dtype=dtype, rngs=nnx.Rngs(args.seed),
    )


def make_optimizer(args):
    import optax

    sched = optax.warmup_cosine_decay_schedule(
        0.0, args.lr, min(args.warmup, max(1, args.steps // 2)), max(args.steps, 2), args.lr * 0.1
    )
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.01))


def train(args, corpus: Corpus, impl: str, device, stream=None) -> RunResult:
    """Trains from the seed's initial parameters on the seed's batches; returns losses."""
    import jax
    import optax
    from flax import nnx

    with jax.default_device(device):
        model = make_model(args, impl, compute_dtype(args, device))
        graphdef, params = nnx.split(model)
        tx = make_optimizer(args)
        opt_state = tx.init(params)

        def loss_fn(p, x, y):
            logits = nnx.merge(graphdef, p)(x).astype(jax.numpy.float32)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        @jax.jit
        def step(p, s, x, y):
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            updates, s = tx.update(g, s, p)
            return optax.apply_updates(p, updates), s, loss

        eval_loss = jax.jit(loss_fn)

        rng = np.random.default_rng(args.seed)
        bar = Progress(args.steps, impl, stream)
        losses = []
        tokens = args.batch * args.seq_len
        t0 = time.perf_counter()
        compile_s = 0.0
        t_after_first = None
        for i in range(args.steps):
            x, y = sample_batch(corpus.train, args.batch, args.seq_len, rng)
            params, opt_state, loss = step(params, opt_state, x, y)
            loss = float(loss)  # syncs
            losses.append(loss)
            now = time.perf_counter()
            if i == 0:
                compile_s = now - t0
                t_after_first = now
                tps = None
            else:
                tps = tokens * i / (now - t_after_first)
            bar.update(i + 1, loss, tps)
        train_s = time.perf_counter() - t0
        tps = tokens * (args.steps - 1) / (time.perf_counter() - t_after_first) if args.steps > 1 else 0.0
        vb = eval_batches(corpus.val, args.val_batches, args.batch, args.seq_len)
        val = float(np.mean([float(eval_loss(params, x, y)) for x, y in vb]))
    tail = losses[-min(len(losses), 20):]
    step_ms = 1e3 * (train_s - compile_s) / (args.steps - 1) if args.steps > 1 else 0.0
    return RunResult(impl, losses, val, float(np.mean(tail)), tps, compile_s, train_s, step_ms,
                     nnx.merge(graphdef, params))


def save_plot(results: list[RunResult], path: str, stream) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the loss-curve plot "
              "(pip install matplotlib to get it)", file=stream)
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for r, style in zip(results, ("-", "--")):
        ax.plot(np.arange(1, len(r.losses) + 1), r.losses, style, lw=1.2,
                label=f"{r.impl} (val {r.val_loss:.3f})")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (nats/byte)")
    ax.set_title("byte-level LM on the Python stdlib sources")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m jax_flash.demo",
        description="Train a small byte-level LM on the Python stdlib sources with jax_flash "
        "attention, and compare with the same run on jax.nn.dot_product_attention.",
    )
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--batch", type=int, default=8, help="sequences per batch (default 8)")
    p.add_argument("--seq-len", type=int, default=128, help="sequence length in bytes (default 128)")
    p.add_argument("--d-model", type=int, default=128, help="model width (default 128)")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks (default 2)")
    p.add_argument("--heads", type=int, default=4, help="query heads (default 4)")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads, GQA (default 2)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    p.add_argument("--warmup", type=int, default=30, help="warm-up steps (default 30)")
    p.add_argument("--seed", type=int, default=0, help="init and data seed (default 0)")
    p.add_argument("--max-bytes", type=int, default=8 << 20, help="corpus bytes to read (default 8 MiB)")
    p.add_argument("--val-batches", type=int, default=8, help="validation batches (default 8)")
    p.add_argument("--tol", type=float, default=None,
                   help="max |loss difference| allowed between jax_flash and jax.nn runs "
                   "(default 0.05 in float32, 0.1 in bfloat16)")
    p.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                   help="compute dtype (parameters stay float32); auto: bfloat16 on a GPU, "
                   "float32 on the CPU")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="auto: JAX's default device (the GPU when present)")
    p.add_argument("--plot", default="jax_flash_demo_loss.png", help="loss-curve PNG path")
    p.add_argument("--no-plot", action="store_true", help="do not save the plot")
    p.add_argument("--no-reference", action="store_true",
                   help="skip the jax.nn.dot_product_attention run (and the comparison)")
    p.add_argument("--generate", type=int, default=64,
                   help="bytes to generate with the KV cache at the end (default 64; 0: skip)")
    args = p.parse_args(argv)
    for name in ("steps", "batch", "seq_len", "d_model", "layers", "heads", "kv_heads", "val_batches"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.heads % args.kv_heads:
        p.error("--heads must be a multiple of --kv-heads")
    if args.d_model % args.heads or (args.d_model // args.heads) % 2:
        p.error("--d-model / --heads must be an even integer (RoPE head_dim)")
    return args


def main(argv=None, stream=None) -> int:
    stream = stream or sys.stdout
    args = parse_args(argv)
    t_start = time.perf_counter()
    import jax

    try:
        import flax  # noqa: F401
        import optax  # noqa: F401
    except ImportError:
        print("the demo needs flax and optax: pip install 'jax_flash[flax]'", file=sys.stderr)
        return 2
    if args.device == "auto":
        device = next(iter(jax.numpy.zeros(()).devices()))  # the current default device
    else:
        try:
            device = jax.devices(args.device)[0]
        except RuntimeError as e:
            print(f"no {args.device} device: {e}", file=sys.stderr)
            return 2

    dtype = compute_dtype(args, device)
    if args.tol is None:
        args.tol = 0.1 if dtype == jax.numpy.bfloat16 else 0.05
    corpus = load_corpus(args.max_bytes)
    print(f"data: {corpus.describe()}", file=stream)
    print(
        f"model: DecoderLM d_model={args.d_model} layers={args.layers} heads={args.heads}/"
        f"{args.kv_heads} (q/kv), seq_len={args.seq_len}, batch={args.batch}, "
        f"{args.steps} steps on {device.platform.upper()} ({device.device_kind}), {dtype.name} compute",
        file=stream,
    )
    impls = ["jax_flash"] + ([] if args.no_reference else ["jax.nn"])
    results = [train(args, corpus, impl, device, stream) for impl in impls]

    print("", file=stream)
    head = f"{'':28}" + "".join(f"{r.impl:>12}" for r in results)
    if len(results) == 2:
        head += f"{'|diff|':>12}"
    print(head, file=stream)
    rows = [("final train loss (last 20)", "final_train_loss"), ("val loss", "val_loss")]
    ok = True
    for label, attr in rows:
        vals = [getattr(r, attr) for r in results]
        line = f"{label:28}" + "".join(f"{v:12.4f}" for v in vals)
        if len(vals) == 2:
            d = abs(vals[0] - vals[1])
            ok &= d <= args.tol
            line += f"{d:12.2e}"
        print(line, file=stream)
    print(f"{'tokens/s (after compile)':28}" + "".join(f"{r.tokens_per_s:12.0f}" for r in results),
          file=stream)
    print(f"{'step time (ms, after compile)':28}" + "".join(f"{r.step_ms:12.2f}" for r in results),
          file=stream)
    print(f"{'compile + first step (s)':28}" + "".join(f"{r.compile_s:12.1f}" for r in results),
          file=stream)
    if len(results) == 2:
        verdict = "OK" if ok else "MISMATCH"
        print(f"jax_flash vs jax.nn: {verdict} (tolerance |diff| <= {args.tol:g})", file=stream)
    if args.generate:
        from jax_flash.demo_generate import generation_report

        with jax.default_device(device):
            generation_report(results, corpus, stream, new_tokens=args.generate)
    if not args.no_plot:
        path = save_plot(results, args.plot, stream)
        if path:
            print(f"loss curve saved to {os.path.abspath(path)}", file=stream)
    print(f"total time {time.perf_counter() - t_start:.1f} s", file=stream)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
