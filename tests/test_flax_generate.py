"""DecoderLM decoding with a KV cache (CPU): each decode step's logits equal
those of one full forward pass over the same tokens, and greedy generate
follows them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

nnx = pytest.importorskip("flax.nnx")
jf = pytest.importorskip("jax_flash.flax")


def _model(impl="jax_flash", kv_heads=2):
    return jf.DecoderLM(64, d_model=64, num_layers=2, num_heads=4, num_kv_heads=kv_heads,
                        attention_impl=impl, rngs=nnx.Rngs(3))


@pytest.mark.parametrize("page_size", [None, 4])
@pytest.mark.parametrize("impl", ["jax_flash", "jax.nn"])
def test_decode_step_logits_equal_full_forward(impl, page_size):
    if impl == "jax.nn" and page_size:
        pytest.skip("jax.nn decoding takes contiguous caches")
    model = _model(impl)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 64, (2, 11)), jnp.int32)
    full = model(tokens)  # [2, 11, 64]
    cache = model.init_cache(2, 13, page_size=page_size)
    logits, cache = model(tokens[:, :5], cache=cache, prefill=True)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(full[:, :5]), atol=2e-4)
    step = jax.jit(lambda tok, cache: model(tok, cache=cache))
    for t in range(5, 11):
        logits, cache = step(tokens[:, t:t + 1], cache)
        np.testing.assert_allclose(np.asarray(logits[:, 0]), np.asarray(full[:, t]), atol=2e-4,
                                   err_msg=f"step {t}")
    assert np.asarray(cache[0].lengths).tolist() == [11, 11]
    # Several tokens at once (bottom-right causal inside the block).
    cache = model.init_cache(2, 13, page_size=page_size)
    _, cache = model(tokens[:, :4], cache=cache, prefill=True)
    logits, _ = model(tokens[:, 4:9], cache=cache)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(full[:, 4:9]), atol=2e-4)


@pytest.mark.parametrize("page_size", [None, 8])
def test_greedy_generate_follows_the_full_forward(page_size):
    model = _model()
    prompt = jnp.asarray(np.random.default_rng(1).integers(0, 64, (3, 6)), jnp.int32)
    out = model.generate(prompt, 7, page_size=page_size)
    assert out.shape == (3, 13) and out.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(out[:, :6]), np.asarray(prompt))
    full = model(out[:, :-1])
    np.testing.assert_array_equal(np.asarray(out[:, 6:]), np.asarray(jnp.argmax(full[:, 5:], -1)))
    ref = _model("jax.nn").generate(prompt, 7)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


def test_sampling_needs_rng_and_is_reproducible():
    model = _model(kv_heads=1)
    prompt = jnp.zeros((2, 3), jnp.int32)
    with pytest.raises(ValueError, match="rng"):
        model.generate(prompt, 4, temperature=1.0)
    a = model.generate(prompt, 5, temperature=0.8, rng=jax.random.key(7))
    b = model.generate(prompt, 5, temperature=0.8, rng=jax.random.key(7))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(a.min()) >= 0 and int(a.max()) < 64
    assert model.generate(prompt, 0).shape == (2, 3)
