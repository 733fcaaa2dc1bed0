"""jax_flash.flax: attention_fn inside flax's own attention modules, our NNX/Linen
modules against jax.nn references, training under jit/pmap/sharding, and the
errors promised for what the kernels cannot fuse."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

flax = pytest.importorskip("flax")
optax = pytest.importorskip("optax")

import flax.linen as nn  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_flash  # noqa: E402
import jax_flash.flax as jf  # noqa: E402
import jax_flash.flax.linen as jfl  # noqa: E402
from jax_flash.flax import UnsupportedAttentionArgument  # noqa: E402

B, S, F, H, HKV, QKV = 2, 24, 32, 4, 2, 64  # head_dim 16, GQA 4 q heads / 2 kv heads


def _x(seed=0, shape=(B, S, F)):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32))


def _max_err(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _leaves(tree):
    return [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]


def _assert_trees_close(a, b, atol, rtol=1e-5, what=""):
    la, lb = _leaves(a), _leaves(b)
    assert len(la) == len(lb) and la, what
    for i, (x, y) in enumerate(zip(la, lb)):
        np.testing.assert_allclose(x, y, atol=atol, rtol=rtol, err_msg=f"{what} leaf {i}")


def _assert_fa_style(name, ours, stock, ref32, factor):
    """FlashAttention's low-precision criterion, leaf by leaf: our error against the
    float32 reference is within `factor` x the stock module's error in the same dtype."""
    for i, (o, s, r) in enumerate(zip(_leaves(ours), _leaves(stock), _leaves(ref32))):
        assert np.all(np.isfinite(o)), f"{name} leaf {i}: non-finite"
        err, stock_err = _max_err(o, r), _max_err(s, r)
        slack = 1e-3 * max(1e-3, float(np.max(np.abs(r))))
        assert err <= factor * stock_err + slack, (
            f"{name} leaf {i}: error {err:.3e} vs stock {stock_err:.3e} (factor {factor})"
        )


# ---------------------------------------------------------------------------
# attention_fn inside flax.nnx.MultiHeadAttention (GQA via num_kv_heads, is_causal).


def _nnx_mha(attention_fn=None, dtype=None):
    kw = {} if attention_fn is None else {"attention_fn": attention_fn}
    return nnx.MultiHeadAttention(
        H, F, QKV, num_kv_heads=HKV, dtype=dtype, decode=False, rngs=nnx.Rngs(0), **kw
    )


def _nnx_out_and_grads(model, x, ct, **call_kw):
    graphdef, state = nnx.split(model)

    def f(state):
        out = nnx.merge(graphdef, state)(x, **call_kw)
        return jnp.sum(out.astype(jnp.float32) * ct), out

    (_, out), g = jax.jit(jax.value_and_grad(f, has_aux=True))(state)
    return out, g


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_nnx_mha_attention_fn_equals_stock_causal_mask(dtype):
    x, ct = _x(0), _x(1)
    mask = nnx.make_causal_mask(x[..., 0])
    ours_m, stock_m = _nnx_mha(jf.attention_fn, dtype), _nnx_mha(None, dtype)
    _assert_trees_close(nnx.state(ours_m), nnx.state(stock_m), atol=0, what="same init")
    out, g = _nnx_out_and_grads(ours_m, x.astype(dtype), ct, is_causal=True)
    out_s, g_s = _nnx_out_and_grads(stock_m, x.astype(dtype), ct, mask=mask)
    assert out.dtype == out_s.dtype == dtype
    if dtype == jnp.float32:
        np.testing.assert_allclose(out, out_s, atol=2e-5, rtol=1e-5)
        _assert_trees_close(g, g_s, atol=1e-4, rtol=1e-4, what="param grads")
    else:
        out_r, g_r = _nnx_out_and_grads(_nnx_mha(None), x, ct, mask=mask)
        _assert_fa_style("output", out, out_s, out_r, factor=2.0)
        _assert_fa_style("param grads", g, g_s, g_r, factor=3.0)


# ---------------------------------------------------------------------------
# attention_fn inside flax.linen.MultiHeadDotProductAttention: Linen never passes
# is_causal, so causality comes from make_attention_fn(causal=True); no num_kv_heads
# there (GQA through attention_fn is tested directly below).


def _linen_out_and_grads(module, params, x, ct, **call_kw):
    def f(params):
        out = module.apply({"params": params}, x, **call_kw)
        return jnp.sum(out.astype(jnp.float32) * ct), out

    (_, out), g = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
    return out, g


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_linen_mhdpa_attention_fn_equals_stock_causal_mask(dtype):
    x, ct = _x(2), _x(3)
    mask = nn.make_causal_mask(x[..., 0])
    ours = nn.MultiHeadDotProductAttention(
        num_heads=H, qkv_features=QKV, dtype=dtype, attention_fn=jf.make_attention_fn(causal=True)
    )
    stock = nn.MultiHeadDotProductAttention(num_heads=H, qkv_features=QKV, dtype=dtype)
    params = stock.init(jax.random.key(0), x)["params"]
    out, g = _linen_out_and_grads(ours, params, x.astype(dtype), ct)
    out_s, g_s = _linen_out_and_grads(stock, params, x.astype(dtype), ct, mask=mask)
    assert out.dtype == out_s.dtype == dtype
    if dtype == jnp.float32:
        np.testing.assert_allclose(out, out_s, atol=2e-5, rtol=1e-5)
        _assert_trees_close(g, g_s, atol=1e-4, rtol=1e-4, what="param grads")
    else:
        ref = nn.MultiHeadDotProductAttention(num_heads=H, qkv_features=QKV)
        out_r, g_r = _linen_out_and_grads(ref, params, x, ct, mask=mask)
        _assert_fa_style("output", out, out_s, out_r, factor=2.0)
        _assert_fa_style("param grads", g, g_s, g_r, factor=3.0)


def test_attention_fn_gqa_matches_linen_dot_product_attention_with_repeated_heads():
    rng = np.random.default_rng(4)
    q = jnp.asarray(rng.standard_normal((2, 19, 6, 8), np.float32))
    k = jnp.asarray(rng.standard_normal((2, 19, 2, 8), np.float32))
    v = jnp.asarray(rng.standard_normal((2, 19, 2, 8), np.float32))
    mask = nn.make_causal_mask(jnp.ones((2, 19)))

    def ours(q, k, v):
        return jf.attention_fn(q, k, v, is_causal=True)

    def stock(q, k, v):
        k, v = jnp.repeat(k, 3, axis=-2), jnp.repeat(v, 3, axis=-2)
        return nn.dot_product_attention(q, k, v, mask=mask)

    np.testing.assert_allclose(ours(q, k, v), stock(q, k, v), atol=2e-5)
    loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))
    g = jax.grad(loss(ours), argnums=(0, 1, 2))(q, k, v)
    g_s = jax.grad(loss(stock), argnums=(0, 1, 2))(q, k, v)
    _assert_trees_close(g, g_s, atol=5e-5, rtol=1e-4, what="dq dk dv")


def test_attention_fn_dtype_casts_like_flax():
    q = _x(5, (1, 8, 2, 8))
    out = jf.attention_fn(q, q, q, dtype=jnp.bfloat16)
    assert out.dtype == jnp.bfloat16
    ref = nnx.dot_product_attention(q, q, q, dtype=jnp.bfloat16)
    assert _max_err(out, ref) < 3e-2


# ---------------------------------------------------------------------------
# Our modules against references written with jax.nn.dot_product_attention.


def _rope_ref(x, base=10000.0):
    """RoPE written as complex rotation of (x_i, x_{i+D/2}) pairs."""
    s, d = x.shape[-3], x.shape[-1]
    half = d // 2
    freq = base ** (-np.arange(half) / half)
    rot = np.exp(1j * np.arange(s)[:, None] * freq)[:, None, :]  # [S, 1, half]
    xf = x.astype(jnp.float32)
    z = (xf[..., :half] + 1j * xf[..., half:]) * rot
    return jnp.concatenate([z.real, z.imag], axis=-1).astype(x.dtype)


def _mha_ref(p, x, *, causal, rope):
    def proj(name, eq):
        y = jnp.einsum(eq, x, p[name]["kernel"])
        return y + p[name]["bias"] if "bias" in p[name] else y

    q, k, v = (proj(n, "bsf,fhd->bshd") for n in ("query", "key", "value"))
    if rope:
        q, k = _rope_ref(q), _rope_ref(k)
    o = jax.nn.dot_product_attention(q, k, v, is_causal=causal)
    y = jnp.einsum("bshd,hdf->bsf", o, p["out"]["kernel"])
    return y + p["out"]["bias"] if "bias" in p["out"] else y


def _ln_ref(p, x, eps=1e-6):
    m = x.mean(-1, keepdims=True)
    var = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(var + eps) * p["scale"] + p["bias"]


def _block_ref(p, x):
    x = x + _mha_ref(p["attn"], _ln_ref(p["ln1"], x), causal=True, rope=True)
    h = _ln_ref(p["ln2"], x)
    h = jax.nn.gelu(h @ p["mlp"]["up"]["kernel"] + p["mlp"]["up"]["bias"])
    return x + h @ p["mlp"]["down"]["kernel"] + p["mlp"]["down"]["bias"]


def _check_against_ref(apply, ref, params, x):
    ct = _x(9, jax.eval_shape(apply, params, x).shape)

    def run(f):
        def loss(p):
            out = f(p, x)
            return jnp.sum(out * ct), out

        return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

    (_, out), g = run(apply)
    (_, out_r), g_r = run(ref)
    np.testing.assert_allclose(out, out_r, atol=3e-5, rtol=1e-5)
    assert jax.tree.structure(g) == jax.tree.structure(g_r)
    _assert_trees_close(g, g_r, atol=1e-4, rtol=1e-4, what="param grads")


def _nnx_apply(model):
    graphdef, state = nnx.split(model)
    params = nnx.to_pure_dict(state)

    def apply(p, x):
        st = jax.tree.map(lambda a: a, state)  # a fresh State to fill in
        nnx.replace_by_pure_dict(st, p)
        return nnx.merge(graphdef, st)(x)

    return apply, params


@pytest.mark.parametrize("causal,rope,kv", [(True, True, HKV), (False, False, H)])
def test_our_nnx_mha_matches_jax_nn_reference(causal, rope, kv):
    m = jf.MultiHeadAttention(H, F, QKV, num_kv_heads=kv, causal=causal, rope=rope, rngs=nnx.Rngs(1))
    apply, params = _nnx_apply(m)
    ref = functools.partial(_mha_ref, causal=causal, rope=rope)
    _check_against_ref(apply, ref, params, _x(6))


@pytest.mark.parametrize("causal,rope,kv", [(True, True, HKV), (False, False, H)])
def test_our_linen_mha_matches_jax_nn_reference(causal, rope, kv):
    m = jfl.MultiHeadAttention(H, qkv_features=QKV, num_kv_heads=kv, causal=causal, rope=rope)
    x = _x(7)
    params = m.init(jax.random.key(1), x)["params"]
    apply = lambda p, x: m.apply({"params": p}, x)
    _check_against_ref(apply, functools.partial(_mha_ref, causal=causal, rope=rope), params, x)


def test_our_nnx_transformer_block_matches_jax_nn_reference():
    blk = jf.TransformerBlock(F, H, num_kv_heads=HKV, rngs=nnx.Rngs(2))
    apply, params = _nnx_apply(blk)
    _check_against_ref(apply, _block_ref, params, _x(8))


def test_our_linen_transformer_block_matches_jax_nn_reference():
    blk = jfl.TransformerBlock(H, num_kv_heads=HKV)
    x = _x(10)
    params = blk.init(jax.random.key(2), x)["params"]
    _check_against_ref(lambda p, x: blk.apply({"params": p}, x), _block_ref, params, x)


def test_lm_attention_impls_and_linen_twin_agree():
    tokens = jnp.asarray(np.random.default_rng(11).integers(0, 256, (2, 20)), jnp.int32)
    kw = dict(d_model=32, num_layers=2, num_heads=4, num_kv_heads=2)
    flash = jf.DecoderLM(256, **kw, rngs=nnx.Rngs(3))
    xla = jf.DecoderLM(256, **kw, attention_impl="jax.nn", rngs=nnx.Rngs(3))
    run = nnx.jit(lambda m, t: m(t))
    out = run(flash, tokens)
    assert out.shape == (2, 20, 256) and out.dtype == jnp.float32
    np.testing.assert_allclose(out, run(xla, tokens), atol=5e-5, rtol=1e-5)
    # Causality: changing the last token leaves every earlier position's logits unchanged.
    out2 = run(flash, tokens.at[:, -1].set((tokens[:, -1] + 1) % 256))
    np.testing.assert_allclose(out2[:, :-1], out[:, :-1], atol=1e-6)
    lin = jfl.DecoderLM(256, **kw)
    v = lin.init(jax.random.key(0), tokens)
    out_l = jax.jit(lin.apply)(v, tokens)
    np.testing.assert_allclose(
        out_l, jax.jit(lin.clone(attention_impl="jax.nn").apply)(v, tokens), atol=5e-5, rtol=1e-5)


# ---------------------------------------------------------------------------
# Training: jit + optax lowers the loss; pmap and batch-sharded jit reproduce it.


def _lm_and_data():
    model = jf.DecoderLM(256, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1,
                         rngs=nnx.Rngs(0))
    text = np.frombuffer((jf.__doc__ * 4).encode(), np.uint8)
    starts = np.arange(8) * 97
    w = text[starts[:, None] + np.arange(33)].astype(np.int32)
    return model, jnp.asarray(w[:, :-1]), jnp.asarray(w[:, 1:])


def _make_step(graphdef, tx, axis_name=None):
    def loss_fn(p, x, y):
        logits = nnx.merge(graphdef, p)(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def step(p, s, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        if axis_name is not None:
            loss, g = jax.lax.pmean((loss, g), axis_name)
        updates, s = tx.update(g, s, p)
        return optax.apply_updates(p, updates), s, loss

    return step


def _multi_devices(n=4):
    devs = jax.devices()
    if len(devs) < n:
        devs = jax.devices("cpu")
    if len(devs) < n:
        pytest.skip(f"needs {n} devices (XLA_FLAGS=--xla_force_host_platform_device_count={n})")
    return devs[:n]


def test_train_step_jit_pmap_and_sharded_agree_and_loss_decreases():
    model, x, y = _lm_and_data()
    graphdef, params = nnx.split(model)
    tx = optax.adam(1e-2)
    opt = tx.init(params)

    step = jax.jit(_make_step(graphdef, tx))
    p1, s1, loss0 = step(params, opt, x, y)
    p, s = p1, s1
    for _ in range(9):
        p, s, loss = step(p, s, x, y)
    assert float(loss) < float(loss0) - 0.3, (float(loss0), float(loss))

    devs = _multi_devices(4)
    n = len(devs)
    # pmap: replicated params/opt state, batch split over devices, grads pmean'd.
    rep = lambda t: jax.tree.map(lambda a: jnp.stack([a] * n), t)
    shard = lambda a: a.reshape(n, a.shape[0] // n, *a.shape[1:])
    pstep = jax.pmap(_make_step(graphdef, tx, axis_name="b"), axis_name="b", devices=devs)
    pp, ps, ploss = pstep(rep(params), rep(opt), shard(x), shard(y))
    np.testing.assert_allclose(np.asarray(ploss), float(loss0), rtol=1e-5)
    _assert_trees_close(jax.tree.map(lambda a: a[0], pp), p1, atol=1e-4, what="pmap params")
    _assert_trees_close(jax.tree.map(lambda a: a[-1], ps), s1, atol=1e-6, what="pmap opt state")

    # jit with the batch sharded over a 4-device mesh, params replicated.
    mesh = Mesh(np.array(devs), ("data",))
    data_sh, repl = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    sx, sy = jax.device_put(x, data_sh), jax.device_put(y, data_sh)
    sp, so = jax.device_put(params, repl), jax.device_put(opt, repl)
    jp, js, jloss = jax.jit(_make_step(graphdef, tx))(sp, so, sx, sy)
    np.testing.assert_allclose(float(jloss), float(loss0), rtol=1e-5)
    _assert_trees_close(jp, p1, atol=1e-4, what="sharded params")
    _assert_trees_close(js, s1, atol=1e-6, what="sharded opt state")


# ---------------------------------------------------------------------------
# Unsupported combinations raise the promised errors; fallback=True runs flax's own.


def test_nnx_mask_raises_and_points_to_is_causal():
    x = _x(12)
    m = _nnx_mha(jf.attention_fn)
    with pytest.raises(UnsupportedAttentionArgument, match="is_causal=True"):
        m(x, mask=nnx.make_causal_mask(x[..., 0]))


def test_linen_mask_raises_and_points_to_make_attention_fn():
    x = _x(13)
    m = nn.MultiHeadDotProductAttention(num_heads=H, qkv_features=QKV, attention_fn=jf.attention_fn)
    with pytest.raises(UnsupportedAttentionArgument, match=r"make_attention_fn\(causal=True\)"):
        m.init(jax.random.key(0), x, mask=nn.make_causal_mask(x[..., 0]))


def test_bias_raises():
    q = _x(14, (1, 8, 2, 8))
    with pytest.raises(UnsupportedAttentionArgument, match="bias"):
        jf.attention_fn(q, q, q, bias=jnp.zeros((1, 2, 8, 8)))


def _dropout_reference(q, k, v, key, rate, causal):
    """float32 attention with the kernels' keep mask applied explicitly."""
    b, sq, h, d = q.shape
    keep = jax_flash.dropout_mask(key, rate, b, h, sq, k.shape[1])
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
    if causal:
        s = jnp.where(jnp.tril(jnp.ones((sq, k.shape[1]), bool)), s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1) * keep / (1.0 - rate)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def test_attention_fn_dropout_runs_in_the_kernels_with_the_documented_mask():
    q, k, v = (_x(30 + i, (2, 24, 4, 16)) for i in range(3))
    key = jax.random.key(7)
    out = jf.attention_fn(q, k, v, dropout_rng=key, dropout_rate=0.25, deterministic=False,
                          is_causal=True)
    direct = jax_flash.attention(q, k, v, causal=True, dropout_rate=0.25, dropout_rng=key)
    np.testing.assert_array_equal(out, direct)
    np.testing.assert_allclose(out, _dropout_reference(q, k, v, key, 0.25, True), atol=2e-5)
    # deterministic=True (evaluation) ignores the rate.
    np.testing.assert_allclose(
        jf.attention_fn(q, k, v, dropout_rng=key, dropout_rate=0.25, deterministic=True),
        jax_flash.attention(q, k, v), atol=1e-6)


def test_dropout_in_training_runs_in_modules_and_deterministic_matches_stock():
    x = _x(15)
    kw = lambda: dict(num_kv_heads=HKV, dropout_rate=0.1, decode=False,
                      rngs=nnx.Rngs(0, dropout=1))
    m = nnx.MultiHeadAttention(H, F, QKV, attention_fn=jf.attention_fn, **kw())
    y1 = m(x, deterministic=False, is_causal=True)
    y2 = m(x, deterministic=False, is_causal=True)  # the dropout stream advances
    y0 = m(x, deterministic=True, is_causal=True)
    assert np.all(np.isfinite(y1)) and not np.allclose(y1, y2) and not np.allclose(y1, y0)
    stock = nnx.MultiHeadAttention(H, F, QKV, **kw())
    np.testing.assert_allclose(
        y0, stock(x, deterministic=True, mask=nnx.make_causal_mask(x[..., 0])), atol=2e-5)
    # Gradients flow through the dropped attention.
    g = nnx.grad(lambda m: jnp.sum(m(x, deterministic=False, is_causal=True) ** 2))(m)
    assert all(np.all(np.isfinite(l)) for l in jax.tree.leaves(g))
    lm = nn.MultiHeadDotProductAttention(num_heads=H, dropout_rate=0.1,
                                         attention_fn=jf.make_attention_fn(causal=True))
    params = lm.init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, x,
                     deterministic=False)
    ya = lm.apply(params, x, deterministic=False, rngs={"dropout": jax.random.key(2)})
    yb = lm.apply(params, x, deterministic=False, rngs={"dropout": jax.random.key(3)})
    assert np.all(np.isfinite(ya)) and not np.allclose(ya, yb)


def test_dropout_without_rng_or_with_traced_flags_raises():
    q = _x(16, (1, 8, 2, 8))
    with pytest.raises(UnsupportedAttentionArgument, match="dropout_rng"):
        jf.attention_fn(q, q, q, dropout_rate=0.1, deterministic=False)
    with pytest.raises(UnsupportedAttentionArgument, match="traced `deterministic`"):
        jax.jit(lambda det: jf.attention_fn(q, q, q, dropout_rate=0.1, deterministic=det,
                                            dropout_rng=jax.random.key(0)))(False)


def test_sow_weights_raises():
    x = _x(16)
    with pytest.raises(UnsupportedAttentionArgument, match="sow"):
        _nnx_mha(jf.attention_fn)(x, sow_weights=True, is_causal=True)
    lm = nn.MultiHeadDotProductAttention(num_heads=H, attention_fn=jf.attention_fn)
    with pytest.raises(UnsupportedAttentionArgument, match="sow"):
        lm.init(jax.random.key(0), x, sow_weights=True)


def test_custom_einsum_raises():
    x = _x(17)
    lm = nn.MultiHeadDotProductAttention(
        num_heads=H, attention_fn=jf.attention_fn,
        qk_attn_weights_einsum_cls=lambda: jnp.einsum,
        attn_weights_value_einsum_cls=lambda: jnp.einsum,
    )
    with pytest.raises(UnsupportedAttentionArgument, match="einsum"):
        lm.init(jax.random.key(0), x)


def test_nnx_decode_cache_mask_raises():
    m = nnx.MultiHeadAttention(H, F, QKV, attention_fn=jf.attention_fn, decode=True,
                               rngs=nnx.Rngs(0))
    m.init_cache((B, S, F))
    with pytest.raises(UnsupportedAttentionArgument, match="decode=True"):
        m(_x(18, (B, 1, F)))


@pytest.mark.filterwarnings("ignore:Using 'Module.sow:DeprecationWarning")
def test_fallback_runs_flax_for_unfusable_calls_only():
    x = _x(19)
    pad = jnp.arange(S) < S - 5
    mask = nnx.combine_masks(nnx.make_causal_mask(x[..., 0]), pad[None, None, None, :])
    fb = _nnx_mha(jf.make_attention_fn(fallback=True))
    stock = _nnx_mha(None)
    np.testing.assert_allclose(fb(x, mask=mask), stock(x, mask=mask), atol=2e-5)
    # fallback + is_causal + padding mask: flax combines them.
    np.testing.assert_allclose(fb(x, mask=pad[None, None, None, :], is_causal=True),
                               stock(x, mask=mask), atol=2e-5)
    # Fusable call: still on the kernels and equal to the stock causal result.
    np.testing.assert_allclose(fb(x, is_causal=True),
                               stock(x, mask=nnx.make_causal_mask(x[..., 0])), atol=2e-5)
    # Sowing works in fallback (NNX and Linen).
    fb(x, sow_weights=True, is_causal=True)
    (w,) = nnx.pop(fb, nnx.Intermediate)["attention_weights"].get_value()
    assert w.shape == (B, H, S, S) and float(jnp.max(jnp.triu(w[0, 0], 1))) == 0.0
    lm = nn.MultiHeadDotProductAttention(
        num_heads=H, attention_fn=jf.make_attention_fn(causal=True, fallback=True))
    v = lm.init(jax.random.key(0), x)
    _, st = lm.apply(v, x, sow_weights=True, mutable=["intermediates"])
    (w,) = st["intermediates"]["attention_weights"]
    assert w.shape == (B, H, S, S) and float(jnp.max(jnp.triu(w[0, 0], 1))) == 0.0
    np.testing.assert_allclose(
        lm.apply(v, x), nn.MultiHeadDotProductAttention(num_heads=H).apply(
            v, x, mask=nn.make_causal_mask(x[..., 0])), atol=2e-5)


def test_kernel_and_module_argument_errors():
    q = _x(20, (1, 8, 2, 300))
    with pytest.raises(ValueError, match="head_dim"):
        jf.attention_fn(q, q, q)
    with pytest.raises(ValueError, match="num_kv_heads"):
        jf.MultiHeadAttention(4, 32, num_kv_heads=3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="even head_dim"):
        jf.MultiHeadAttention(4, 36, rope=True, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="attention_impl"):
        jf.MultiHeadAttention(4, 32, attention_impl="cudnn", rngs=nnx.Rngs(0))
    m = jf.MultiHeadAttention(4, 32, rope=True, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="positions"):
        m(_x(21, (1, 4, 32)), _x(22, (1, 4, 32)), positions=jnp.arange(4))
    with pytest.raises(ValueError, match="num_kv_heads"):
        jfl.MultiHeadAttention(4, num_kv_heads=3).init(jax.random.key(0), _x(23, (1, 4, 32)))
    with pytest.raises(NotImplementedError, match="first-order"):
        jax.grad(lambda x: jnp.sum(jax.grad(lambda x: jnp.sum(m(x)))(x)))(_x(24, (1, 4, 32)))
