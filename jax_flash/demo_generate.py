"""The demo's last act: generate text from the trained models with the KV cache
(DecoderLM.generate) and compare decoding speed, jax_flash against the same
model on jax.nn.dot_product_attention."""

from __future__ import annotations

import time

import numpy as np


def _as_text(tokens) -> str:
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def generation_report(results, corpus, stream, *, new_tokens: int = 64, batch: int = 4,
                      prompt_len: int = 32) -> dict:
    """Greedy-generates `new_tokens` bytes after `batch` validation prompts with
    each trained model; prints the jax_flash samples and tokens/s per model
    (timed after a compile run). Returns {impl: tokens/s}."""
    import jax
    import jax.numpy as jnp

    if new_tokens < 1:
        return {}
    val = corpus.val
    starts = np.linspace(0, max(0, val.size - prompt_len - 1), batch).astype(int)
    prompt = jnp.asarray(np.stack([val[s:s + prompt_len] for s in starts]).astype(np.int32))
    speeds, samples = {}, {}
    for r in results:
        model = getattr(r, "model", None)
        if model is None:
            continue
        out = jax.block_until_ready(model.generate(prompt, new_tokens))  # compiles
        t0 = time.perf_counter()
        out = jax.block_until_ready(model.generate(prompt, new_tokens))
        speeds[r.impl] = batch * new_tokens / (time.perf_counter() - t0)
        samples[r.impl] = np.asarray(out)
    if not speeds:
        return speeds
    first = "jax_flash" if "jax_flash" in samples else next(iter(samples))
    print(f"\ngreedy generation ({first}, KV cache; prompt | continuation):", file=stream)
    for row in samples[first][: min(batch, 3)]:
        p = _as_text(row[:prompt_len]).replace("\n", "\\n")
        c = _as_text(row[prompt_len:]).replace("\n", "\\n")
        print(f"  {p[-40:]!s} | {c}", file=stream)
    print(f"{'generation tokens/s':28}" + "".join(f"{speeds.get(r.impl, 0.0):12.0f}" for r in results),
          file=stream)
    if len(samples) == 2:
        a, b = samples.values()
        agree = float(np.mean(a == b))
        print(f"{'generated tokens agreeing':28}{agree:12.1%}", file=stream)
    return speeds
