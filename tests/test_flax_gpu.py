"""jax_flash.flax on the GPU (issue #7): the tests of test_flax.py that pin the
numbers -- attention_fn inside flax's NNX/Linen attention against the stock causal
mask (GQA), our MHA / TransformerBlock against jax.nn references, a jitted training
step lowering the loss -- run on a CUDA GPU (`pytest -m gpu`).

CUDA takes float16/bfloat16 only, so these run in bfloat16 (float32 parameters,
bfloat16 compute) with FlashAttention's tolerance: our error against a float32
reference (computed on the same GPU at matmul precision "highest") stays within a
small factor of the error of the stock bfloat16 implementation. Head dim 128 (the
size every CUDA build has; JAX_FLASH_CUDA_HEAD_DIMS=128 builds only that).
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flax")
optax = pytest.importorskip("optax")

import flax.linen as nn  # noqa: E402
from flax import nnx  # noqa: E402

import jax_flash.flax as jf  # noqa: E402
import jax_flash.flax.linen as jfl  # noqa: E402
from helpers import gpu_devices  # noqa: E402
from test_flax import (  # noqa: E402  (shared helpers; no tests are imported)
    _assert_fa_style,
    _linen_out_and_grads,
    _nnx_apply,
    _nnx_out_and_grads,
)

pytestmark = pytest.mark.gpu

# head_dim 128: QKV / H. GQA: 4 query heads over 2 k/v heads. S is not a tile multiple.
B, S, F, H, HKV, QKV = 2, 200, 128, 4, 2, 512
BF16 = jnp.bfloat16


@pytest.fixture
def gpu():
    """Runs the test with the first GPU as the default device."""
    devs = gpu_devices()
    if not devs:
        pytest.skip("needs a CUDA GPU")
    with jax.default_device(devs[0]):
        yield devs[0]


def _ref_precision():
    """float32 references at full precision (no TF32) for the error baseline."""
    return jax.default_matmul_precision("highest")


def _x(seed, shape=(B, S, F)):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32))


def _nnx_mha(attention_fn=None, dtype=None):
    kw = {} if attention_fn is None else {"attention_fn": attention_fn}
    return nnx.MultiHeadAttention(H, F, QKV, num_kv_heads=HKV, dtype=dtype, decode=False,
                                  rngs=nnx.Rngs(0), **kw)


# ---------------------------------------------------------------------------
# attention_fn inside flax's modules, against the stock causal mask.


def test_gpu_nnx_mha_attention_fn_bf16_equals_stock_causal_mask_gqa(gpu):
    x, ct = _x(0), _x(1)
    mask = nnx.make_causal_mask(x[..., 0])
    out, g = _nnx_out_and_grads(_nnx_mha(jf.attention_fn, BF16), x.astype(BF16), ct, is_causal=True)
    out_s, g_s = _nnx_out_and_grads(_nnx_mha(None, BF16), x.astype(BF16), ct, mask=mask)
    with _ref_precision():
        out_r, g_r = _nnx_out_and_grads(_nnx_mha(None), x, ct, mask=mask)
    assert out.dtype == out_s.dtype == BF16
    assert list(out.devices())[0] == gpu
    _assert_fa_style("output", out, out_s, out_r, factor=2.0)
    _assert_fa_style("param grads", g, g_s, g_r, factor=3.0)


def test_gpu_linen_mhdpa_attention_fn_bf16_equals_stock_causal_mask(gpu):
    x, ct = _x(2), _x(3)
    mask = nn.make_causal_mask(x[..., 0])
    kw = dict(num_heads=H, qkv_features=QKV)
    ours = nn.MultiHeadDotProductAttention(**kw, dtype=BF16,
                                           attention_fn=jf.make_attention_fn(causal=True))
    stock = nn.MultiHeadDotProductAttention(**kw, dtype=BF16)
    params = stock.init(jax.random.key(0), x)["params"]
    out, g = _linen_out_and_grads(ours, params, x.astype(BF16), ct)
    out_s, g_s = _linen_out_and_grads(stock, params, x.astype(BF16), ct, mask=mask)
    with _ref_precision():
        out_r, g_r = _linen_out_and_grads(nn.MultiHeadDotProductAttention(**kw), params, x, ct,
                                          mask=mask)
    assert out.dtype == BF16
    _assert_fa_style("output", out, out_s, out_r, factor=2.0)
    _assert_fa_style("param grads", g, g_s, g_r, factor=3.0)


def test_gpu_attention_fn_gqa_bf16_matches_stock_with_repeated_heads(gpu):
    rng = np.random.default_rng(4)
    mk = lambda h: jnp.asarray(rng.standard_normal((2, 333, h, 128), np.float32))
    q, k, v = mk(6), mk(2), mk(2)
    do = jnp.asarray(rng.standard_normal(q.shape, np.float32))
    mask = nn.make_causal_mask(jnp.ones((2, 333)))

    def stock(q, k, v):
        k, v = jnp.repeat(k, 3, axis=-2), jnp.repeat(v, 3, axis=-2)
        return nn.dot_product_attention(q, k, v, mask=mask)

    def run(f, q, k, v):
        loss = lambda *a: jnp.sum(f(*a).astype(jnp.float32) * do)
        return jax.jit(lambda *a: (f(*a), jax.grad(loss, argnums=(0, 1, 2))(*a)))(q, k, v)

    ours = lambda q, k, v: jf.attention_fn(q, k, v, is_causal=True)
    lo = [a.astype(BF16) for a in (q, k, v)]
    with _ref_precision():
        ref = run(stock, q, k, v)
    _assert_fa_style("o, dq, dk, dv", run(ours, *lo), run(stock, *lo), ref, factor=3.0)


# ---------------------------------------------------------------------------
# Our modules: jax_flash inside vs jax.nn.dot_product_attention inside (same params).


def _three_ways(make, x):
    """(ours bf16, jax.nn bf16, jax.nn float32) outputs and param grads of a module
    family built by make(attention_impl, dtype) -> apply(params, x), params."""
    ct = _x(9, jax.eval_shape(make("jax.nn", None)[0], make("jax.nn", None)[1], x).shape)

    def run(impl, dtype):
        apply, params = make(impl, dtype)

        def loss(p):
            out = apply(p, x)
            return jnp.sum(out.astype(jnp.float32) * ct), out

        (_, out), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        return out, g

    ours, stock = run("jax_flash", BF16), run("jax.nn", BF16)
    with _ref_precision():
        ref = run("jax.nn", None)
    return ours, stock, ref


def _assert_three_ways(ours, stock, ref):
    _assert_fa_style("output", ours[0], stock[0], ref[0], factor=2.0)
    _assert_fa_style("param grads", ours[1], stock[1], ref[1], factor=3.0)


@pytest.mark.parametrize("causal,rope,kv", [(True, True, HKV), (False, False, H)])
def test_gpu_our_nnx_and_linen_mha_bf16_match_jax_nn(gpu, causal, rope, kv):
    def nnx_make(impl, dtype):
        return _nnx_apply(jf.MultiHeadAttention(H, F, QKV, num_kv_heads=kv, causal=causal, rope=rope,
                                                dtype=dtype, attention_impl=impl, rngs=nnx.Rngs(1)))

    x = _x(6)
    _assert_three_ways(*_three_ways(nnx_make, x))

    lin = lambda impl, dtype: jfl.MultiHeadAttention(H, qkv_features=QKV, num_kv_heads=kv,
                                                     causal=causal, rope=rope, dtype=dtype,
                                                     attention_impl=impl)
    params = lin("jax.nn", None).init(jax.random.key(1), x)["params"]

    def linen_make(impl, dtype):
        m = lin(impl, dtype)
        return (lambda p, x: m.apply({"params": p}, x)), params

    _assert_three_ways(*_three_ways(linen_make, x))


def test_gpu_our_nnx_and_linen_transformer_block_bf16_match_jax_nn(gpu):
    # The block's head_dim is d_model / num_heads: 512 / 4 = 128.
    def nnx_make(impl, dtype):
        return _nnx_apply(jf.TransformerBlock(QKV, H, num_kv_heads=HKV, dtype=dtype,
                                              attention_impl=impl, rngs=nnx.Rngs(2)))

    x = _x(8, (B, S, QKV))
    _assert_three_ways(*_three_ways(nnx_make, x))

    lin = lambda impl, dtype: jfl.TransformerBlock(H, num_kv_heads=HKV, dtype=dtype,
                                                   attention_impl=impl)
    params = lin("jax.nn", None).init(jax.random.key(2), x)["params"]

    def linen_make(impl, dtype):
        m = lin(impl, dtype)
        return (lambda p, x: m.apply({"params": p}, x)), params

    _assert_three_ways(*_three_ways(linen_make, x))


# ---------------------------------------------------------------------------
# Training: a jitted optax step on the GPU lowers the loss, close to jax.nn's.


def test_gpu_jitted_train_step_bf16_lowers_the_loss(gpu):
    text = np.frombuffer((jf.__doc__ * 8).encode(), np.uint8)
    w = text[np.arange(8)[:, None] * 97 + np.arange(257)].astype(np.int32)
    x, y = jnp.asarray(w[:, :-1]), jnp.asarray(w[:, 1:])

    def train(impl):
        model = jf.DecoderLM(256, d_model=256, num_layers=2, num_heads=2, num_kv_heads=1,
                             dtype=BF16, attention_impl=impl, rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model)
        tx = optax.adam(3e-3)

        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(x).astype(jnp.float32)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        @jax.jit
        def step(p, s):
            loss, g = jax.value_and_grad(loss_fn)(p)
            updates, s = tx.update(g, s, p)
            return optax.apply_updates(p, updates), s, loss

        p, s, losses = params, tx.init(params), []
        for _ in range(10):
            p, s, loss = step(p, s)
            losses.append(float(loss))
        return losses

    ours, stock = train("jax_flash"), train("jax.nn")
    assert all(np.isfinite(ours)), ours
    assert ours[-1] < ours[0] - 0.5, ours
    # Same trajectory as the unfused model up to bf16 noise.
    np.testing.assert_allclose(ours, stock, rtol=0.05, atol=0.05)


@pytest.mark.tf32
def test_gpu_attention_fn_runs_float32_and_dropout(gpu):
    q = _x(20, (1, 16, 2, 128))
    o = jf.attention_fn(q, q, q)  # float32 on the TF32 kernels (issue 29)
    assert o.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(o)))
    m = nnx.MultiHeadAttention(H, F, QKV, num_kv_heads=HKV, dropout_rate=0.1, dtype=BF16,
                               attention_fn=jf.attention_fn, decode=False,
                               rngs=nnx.Rngs(0, dropout=1))
    y_train = m(_x(21).astype(BF16), deterministic=False, is_causal=True)  # dropout in-kernel
    y_eval = m(_x(21).astype(BF16), deterministic=True, is_causal=True)
    assert y_eval.dtype == y_train.dtype == BF16
    assert np.all(np.isfinite(np.asarray(y_train, np.float32)))
    assert not np.allclose(np.asarray(y_train, np.float32), np.asarray(y_eval, np.float32))
