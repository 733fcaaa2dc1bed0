"""Batch and head sharding of the two FFI calls (jax.experimental.custom_partitioning).

Under `jax.jit` with inputs sharded over batch axes and/or the head axis, the
forward and backward custom calls run on each shard as they are: no all-gather
or all-to-all. Both of JAX's partitioners are covered:

* Shardy (the default): an einsum-like `sharding_rule`; the sequence axes and
  head_dim are `need_replication` factors. With GQA, when the kv head count is
  divisible by the mesh size, the q head axis is the compound factor (h g) of
  the kv head factor h and the group g (g need_replication), so Shardy keeps a
  q head and its kv head on the same shard while propagating. Otherwise the q
  heads get their own factor (a compound factor could land on a sub-axis of a
  mesh axis, which custom_partitioning cannot hand to Python) and the
  partition callback below lines the heads up.
* GSPMD (`jax_use_shardy_partitioner=False`): `infer_sharding_from_operands`
  and `propagate_user_sharding`, with the same policy as below.

The `partition` callback (used by both) settles the final shardings:

* batch axes keep their sharding when the mesh axes divide the axis length
  (otherwise that axis is replicated);
* the head axis keeps its sharding when the number of shards divides the
  number of *kv* heads (so every shard holds whole GQA groups); otherwise heads
  are replicated: correct, but XLA then gathers the heads;
* the sequence axes and head_dim are never sharded. A sequence-sharded input is
  all-gathered by the partitioner before the call (correct, but memory hungry)
  and a UserWarning at compile time points to `jax_flash.ring_attention`, the
  sequence-parallel path (inside `shard_map`).

Inside `shard_map` (any manual mesh axis at trace time) the bare FFI calls are
used: each device runs the kernel on its own block. In a `shard_map` over only
some mesh axes (`axis_names=`), XLA gathers the remaining auto axes before the
kernel: correct, not efficient (custom_partitioning cannot help there: it gets
no mesh to decode shardings with, and GSPMD aborts on it).

The FFI results carry the shard_map varying-axes type of their operands, so
`jax_flash.attention` inside `shard_map(check_vma=True)` is typed per device.

The optional per-batch operands (jax_flash.mask.Extras: lengths, per-batch
query offsets, segment ids and their block ranges, ALiBi slopes) follow the
batch factors of q (ALiBi also the q head factor); the dropout seed is
replicated. The dropout counter uses shard-local batch/head indices.

`custom_partitioning` has no batching rule, so each call is also wrapped in a
`jax.custom_batching.custom_vmap` that maps a vmapped axis onto a leading batch
axis (what `vmap_method="broadcast_all"` does for the bare ffi_call).
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from jax_flash import _ffi
from jax_flash.mask import NO_EXTRAS, Extras, Mask

# ---------------------------------------------------------------------------
# The bare FFI calls (what each shard runs).


def _lse_shape(q):
    return q.shape[:-3] + (q.shape[-2], q.shape[-3])


def _sds_axis_kwarg():
    """Name of ShapeDtypeStruct's keyword for shard_map's varying manual axes
    ("vma" or, on some JAX versions, "manual_axis_type"), or None."""
    try:
        params = inspect.signature(jax.ShapeDtypeStruct.__init__).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return None
    for name in ("vma", "manual_axis_type"):
        if name in params:
            return name
    return None


_SDS_AXIS_KWARG = _sds_axis_kwarg()


def _no_manual_axes(axes) -> bool:
    empty = getattr(axes, "empty", None)  # ManualAxisType
    if isinstance(empty, bool):
        return empty
    try:
        return len(axes) == 0  # a set of axis names
    except TypeError:  # pragma: no cover
        return False


def _result(shape, dtype, like):
    """ShapeDtypeStruct for an FFI result that varies over the same shard_map
    axes as the operand `like` (ffi_call otherwise types it as invariant inside
    shard_map with check_vma=True)."""
    if _SDS_AXIS_KWARG is not None:
        try:
            aval = jax.typeof(like)
            axes = getattr(aval, _SDS_AXIS_KWARG)
            if _no_manual_axes(axes):  # outside shard_map: nothing to add
                return jax.ShapeDtypeStruct(shape, dtype)
            mesh = getattr(getattr(aval, "sharding", None), "mesh", None)
            kw = {_SDS_AXIS_KWARG: axes}
            if mesh is not None and not mesh.empty:
                kw["sharding"] = NamedSharding(mesh, P())
            return jax.ShapeDtypeStruct(shape, dtype, **kw)
        except Exception:  # pragma: no cover - unexpected JAX internals
            pass
    return jax.ShapeDtypeStruct(shape, dtype)


def _fwd_scratch_ints(q, k, mask: Mask, extras: Extras) -> int:
    """int32 scratch per leading-batch element for the CUDA forward: the tile
    scheduler's work counter; for float32 at head dims 33-128 (multiples of
    4) without soft-cap, ALiBi or dropout, also the Hopper TF32 kernel's
    rounded K and transposed V copies (cpp/cuda/sm90/tf32_operands.cuh: K,
    and V^T with the keys padded to whole groups of eight, each region 256 B
    aligned: 64 ints of slack per region cover the round-ups over the whole
    batch)."""
    sk, hkv, d = k.shape[-3:]
    masks_only = mask.softcap == 0 and mask.dropout_rate == 0 and extras.alibi_slopes is None
    if jnp.dtype(q.dtype) != jnp.dtype(jnp.float32) or not masks_only or d % 4 or not 32 < d <= 128:
        return 1
    return hkv * d * (sk + -(-sk // 8) * 8) + 3 * 64


def ffi_fwd(q, k, v, scale: float, causal, extras: Extras = NO_EXTRAS):
    """The forward custom call; `causal` is a Mask or a plain causal flag;
    `extras` the optional operands (appended after q, k, v in FFI order)."""
    mask = Mask.of(causal)

    def with_scratch(ints):
        def run(q, k, v, *aux):
            out_types = (
                _result(q.shape, q.dtype, q),
                _result(_lse_shape(q), jnp.float32, q),
                # Scratch for the CUDA kernels (_fwd_scratch_ints), an extra
                # discarded output as the backward's workspace is.
                _result(q.shape[:-3] + (ints,), jnp.int32, q),
            )
            call = jax.ffi.ffi_call(_ffi.FWD_TARGET, out_types, vmap_method="broadcast_all")
            o, lse, _scratch = call(q, k, v, *aux, scale=np.float32(scale),
                                    optional_inputs=np.int64(extras.present()), **mask.ffi_attrs())
            return o, lse

        return run

    ints = _fwd_scratch_ints(q, k, mask, extras)
    if ints == 1:
        return with_scratch(1)(q, k, v, *extras.arrays())
    # The CPU kernel ignores the scratch: one int a batch element there.
    return jax.lax.platform_dependent(q, k, v, *extras.arrays(), cpu=with_scratch(1),
                                      default=with_scratch(ints))


def _kernel_head_dim(d: int, variants: bool) -> int:
    """The head dim of the CUDA kernel that serves head dim `d` (the smallest
    compiled one >= d; the variants kernels exist for fewer head dims)."""
    padded = -(-d // 32) * 32
    larger = [x for x in _ffi.cuda_head_dims(variants) if x >= d]
    return max(padded, min(larger)) if larger else padded


# The padded head dims the Hopper (sm_90a) kernels run calls at, by the SM80
# kernel head dim (cpp/cuda/common/head_dims.h: hopper_pad_head_dim for plain
# calls, hopper_pad_variant_head_dim with options).
_HOPPER_PAD = {32: 64, 96: 128, 160: 256, 192: 256, 224: 256}
_HOPPER_VARIANT_PAD = {32: 64}


def _accum_head_dim(d: int, variants: bool) -> int:
    """The dQ accumulator's head dim: the kernel's (_kernel_head_dim), or in a
    build with sm_90a the Hopper kernel's where head dim `d` runs zero-padded
    on it (cpp/cuda/bwd_launch.cu, accum_head_dim)."""
    kd = _kernel_head_dim(d, variants)
    pad = (_HOPPER_VARIANT_PAD if variants else _HOPPER_PAD).get(kd)
    archs = (_ffi.cuda_archs() or "").split(";")
    if pad is not None and "90a" in archs and pad in _ffi.cuda_head_dims(variants):
        return pad
    return kd


def _bwd_workspace_floats(q, deterministic: bool, variants: bool, k_shape=None) -> int:
    """float32 scratch per leading-batch element for the CUDA backward: rowsum
    D = rowsum(dO * O), plus the float32 dQ accumulator (head_dim padded to
    the widest kernel's that may run: _accum_head_dim) in atomic mode, and in
    deterministic mode where the Hopper kernel may run (padded head dim 64,
    128 or 256). The ordered kernels' counters (deterministic mode, and the
    ordered path atomic mode takes on some plain grids) live in dq's own buffer
    until the backward writes it (cpp/cuda/bwd_dispatch.h), so they add
    nothing here. XLA hands custom calls no reliable scratch allocator, so it
    travels as an extra, discarded output (on the CPU, whose kernel ignores it,
    ffi_bwd asks for one float instead). The CUDA side rounds each region up to
    256 B over the whole batch: no slack is needed when the row count is a
    multiple of 64 floats (then this is no bigger than cuDNN's scratch), else
    128 floats per element cover both round-ups (batch >= 1). The
    accumulator's rows are padded per head to whole 128-row tiles (the Hopper
    kernel reduces a tile at a time), which costs nothing when seqlen_q is a
    multiple of 128."""
    sq, hq, d = q.shape[-3:]
    if jnp.dtype(q.dtype) == jnp.dtype(jnp.float32):
        # The float32 (TF32) backward: D (no dQ accumulator); for plain
        # attention at head dims 33-128 (multiples of 4) also the Hopper
        # kernels' tile counter and rounded K, V, Q, dO and transposed K,
        # Q, dO copies (cpp/cuda/sm90/tf32_operands.cuh, Tf32BwdScratch; 64
        # floats of slack per region cover its 256 B round-ups).
        if variants or d % 4 or not 32 < d <= 128:
            return hq * sq
        sk, hkv = (k_shape or q.shape)[-3], (k_shape or q.shape)[-2]
        pad8 = lambda n: -(-n // 8) * 8  # noqa: E731
        return hq * sq + 9 * 64 + hkv * d * (2 * sk + pad8(sk)) + 2 * hq * d * (sq + pad8(sq))
    d_pad = _accum_head_dim(d, variants)
    rows = hq * sq * math.prod(q.shape[:-3])
    slack = 0 if rows % 64 == 0 else 128
    det_ordered = d_pad in (64, 128, 256)
    accum = d_pad if (det_ordered or not deterministic) else 0
    sq_pad = -(-sq // 128) * 128
    return hq * sq + hq * sq_pad * accum + slack


def ffi_bwd(q, k, v, o, lse, do, scale: float, causal, deterministic: bool,
            extras: Extras = NO_EXTRAS):
    """The backward custom call; `causal` is a Mask or a plain causal flag;
    `extras` the optional operands (appended after q, k, v, o, lse, do)."""
    mask = Mask.of(causal)
    variants = mask._replace(causal=False, f32_full=False) != Mask() or extras.present() != 0

    def with_workspace(floats):
        def run(q, k, v, o, lse, do, *aux):
            out_types = (
                _result(q.shape, q.dtype, q),
                _result(k.shape, k.dtype, q),
                _result(v.shape, v.dtype, q),
                _result(q.shape[:-3] + (floats,), jnp.float32, q),
            )
            call = jax.ffi.ffi_call(_ffi.BWD_TARGET, out_types, vmap_method="broadcast_all")
            dq, dk, dv, _workspace = call(
                q, k, v, o, lse, do, *aux,
                scale=np.float32(scale), deterministic=bool(deterministic),
                optional_inputs=np.int64(extras.present()), **mask.ffi_attrs(),
            )
            return dq, dk, dv

        return run

    # The workspace is the CUDA kernels' scratch; the CPU kernel ignores it, so
    # the CPU lowering asks for one float a batch element, not a dq-sized buffer.
    return jax.lax.platform_dependent(
        q, k, v, o, lse, do, *extras.arrays(), cpu=with_workspace(1),
        default=with_workspace(_bwd_workspace_floats(q, deterministic, variants, k.shape)))


# ---------------------------------------------------------------------------
# Sharding policy (GSPMD callbacks and the partition callback).


def _axes(entry) -> tuple:
    """Mesh axis names of one PartitionSpec entry."""
    if entry is None:
        return ()
    if isinstance(entry, (tuple, list)):
        return tuple(entry)
    return (entry,)


def _spec_entries(sharding, ndim) -> list[tuple]:
    spec = tuple(sharding.spec) if isinstance(sharding, NamedSharding) else ()
    spec = spec + (None,) * (ndim - len(spec))
    return [_axes(e) for e in spec[:ndim]]


def _n_shards(mesh, axes) -> int:
    return int(math.prod(mesh.shape[a] for a in axes))


def _entry(axes):
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else tuple(axes)


def _plan(mesh, q_shape, q_sharding, kv_shape, kv_sharding):
    """(batch_axes, head_axes): the mesh axes kept on each batch axis and on the
    head axis. Everything else is replicated."""
    nb = len(q_shape) - 3
    q_ent = _spec_entries(q_sharding, len(q_shape))
    kv_ent = _spec_entries(kv_sharding, len(kv_shape)) if kv_sharding is not None else None
    used: set = set()
    batch = []
    for i in range(nb):
        axes = q_ent[i] if q_ent[i] else (kv_ent[i] if kv_ent else ())
        if axes and (q_shape[i] % _n_shards(mesh, axes) != 0 or used & set(axes)):
            axes = ()
        used |= set(axes)
        batch.append(axes)
    hkv = kv_shape[-2]
    head = ()
    for cand in (q_ent[-2], kv_ent[-2] if kv_ent else ()):
        if cand and hkv % _n_shards(mesh, cand) == 0 and not (used & set(cand)):
            head = cand
            break
    return tuple(batch), head


_SEQ_WARNING = (
    "jax_flash.attention: the sequence axis of q/k/v is sharded; XLA gathers the whole "
    "sequence onto every device before the kernel (correct, but not sequence parallel). "
    "For sequence parallelism use jax_flash.ring_attention inside shard_map."
)


def _warn_if_sequence_sharded(q, k):
    if _spec_entries(q.sharding, q.ndim)[-3] or _spec_entries(k.sharding, k.ndim)[-3]:
        warnings.warn(_SEQ_WARNING, stacklevel=2)


def _named(mesh, batch, head, kind):
    """NamedSharding for an operand of the given kind: 'bshd' (q, k, v, o, do),
    'bhs' (lse), or an Extras kind ('b', 'bq', 'bk', 'bqr', 'bkr', 'bh', 'seed')."""
    b = [_entry(a) for a in batch]
    specs = {
        "bshd": (None, _entry(head), None),
        "bhs": (_entry(head), None),
        "b": (),
        "bq": (None,),
        "bk": (None,),
        "bqr": (None, None),
        "bkr": (None, None),
        "bh": (_entry(head),),
    }
    if kind == "seed":
        return NamedSharding(mesh, P())
    return NamedSharding(mesh, P(*b, *specs[kind]))


def _extras_named(mesh, batch, head, present: int) -> tuple:
    return tuple(_named(mesh, batch, head, kind) for kind in Extras.kinds(present))


def _shape_of(x):
    return tuple(x.shape)


# ---------------------------------------------------------------------------
# custom_partitioning + custom_vmap wrappers, one per static configuration.


def _rule_kwargs(rule: str, group: int) -> dict:
    # Shardy wants the special factors in the order the factors first appear.
    names = []
    for tok in rule.replace("(", " ").replace(")", " ").replace(",", " ").split():
        if tok.isidentifier() and tok not in names:
            names.append(tok)
    special = ("sq", "sk", "d", "g", "nq", "nk", "two", "seed")
    kw = {"need_replication_factors": tuple(f for f in names if f in special)}
    if "(h g)" in rule:
        kw["g"] = group
    return kw


def _q_heads_factor(mesh, group: int, hkv: int) -> str:
    """Shardy factor of the q head axis.

    "(h g)" (compound: a q head shard is always its kv heads' shard) when the
    kv head count is divisible by the mesh size, so no sharding of the kv heads
    over any set of mesh axes can split a mesh axis; otherwise an independent
    factor "hq" (a compound factor could then be split onto a sub-axis of a
    mesh axis, which custom_partitioning cannot decode). With "hq" the
    partition callback still lines q heads up with their kv heads (or
    replicates heads).
    """
    try:
        n = int(mesh.size)
    except Exception:  # pragma: no cover - no mesh in context
        n = 0
    if group > 1 and n > 0 and hkv % n == 0:
        return "(h g)"
    return "h" if group == 1 else "hq"


def _extras_rule(present: int, hq: str) -> str:
    """Shardy operand specs of the optional operands: per-batch arrays share
    the batch factors (and ALiBi the q head factor); the seed is replicated."""
    spec = {"b": "...", "bq": "... sq", "bk": "... sk", "bqr": "... nq two",
            "bkr": "... nk two", "bh": f"... {hq}", "seed": "seed"}
    return "".join(", " + spec[kind] for kind in Extras.kinds(present))


def _fwd_rule(group: int, hkv: int, present: int):
    def rule(mesh, value_types, result_types):
        hq = _q_heads_factor(mesh, group, hkv)
        r = (f"... sq {hq} d, ... sk h d, ... sk h d{_extras_rule(present, hq)} "
             f"-> ... sq {hq} d, ... {hq} sq")
        return r, _rule_kwargs(r, group)

    return rule


def _bwd_rule(group: int, hkv: int, present: int):
    def rule(mesh, value_types, result_types):
        hq = _q_heads_factor(mesh, group, hkv)
        qt = f"... sq {hq} d"
        kt = "... sk h d"
        r = (f"{qt}, {kt}, {kt}, {qt}, ... {hq} sq, {qt}{_extras_rule(present, hq)} "
             f"-> {qt}, {kt}, {kt}")
        return r, _rule_kwargs(r, group)

    return rule


def _broadcast_rule(fn, n_out, n_fixed, present):
    """custom_vmap rule: move every vmapped axis to the front as an extra batch
    axis (broadcasting unbatched operands), then call `fn` again. The dropout
    seed is not per batch: an unbatched seed stays as it is; a batched one
    (one key per vmapped instance) runs the instances one after the other."""
    kinds = ["x"] * n_fixed + Extras.kinds(present)

    def rule(axis_size, in_batched, *args):
        seed_batched = any(b for b, kind in zip(in_batched, kinds) if kind == "seed")
        args = [
            a if (b or (kind == "seed" and not seed_batched))
            else jnp.broadcast_to(a, (axis_size,) + a.shape)
            for a, b, kind in zip(args, in_batched, kinds)
        ]
        if seed_batched:
            return jax.lax.map(lambda xs: fn(*xs), tuple(args)), (True,) * n_out
        return fn(*args), (True,) * n_out

    return rule


@functools.lru_cache(maxsize=None)
def _fwd_fn(scale: float, causal: bool, group: int, hkv: int, present: int = 0):
    def extras_of(aux):
        return Extras.from_arrays(present, aux)

    @custom_partitioning
    def part(q, k, v, *aux):
        return ffi_fwd(q, k, v, scale, causal, extras_of(aux))

    def infer(mesh, arg_shapes, result_shape):
        q, k = arg_shapes[0], arg_shapes[1]
        batch, head = _plan(mesh, _shape_of(q), q.sharding, _shape_of(k), k.sharding)
        return (_named(mesh, batch, head, "bshd"), _named(mesh, batch, head, "bhs"))

    def propagate(mesh, user_shape):
        o = user_shape[0]
        shape = _shape_of(o)
        batch, head = _plan(mesh, shape, o.sharding, shape[:-2] + (shape[-2] // group, shape[-1]), None)
        return (_named(mesh, batch, head, "bshd"), _named(mesh, batch, head, "bhs"))

    def partition(mesh, arg_shapes, result_shape):
        q, k = arg_shapes[0], arg_shapes[1]
        _warn_if_sequence_sharded(q, k)
        batch, head = _plan(mesh, _shape_of(q), q.sharding, _shape_of(k), k.sharding)
        x = _named(mesh, batch, head, "bshd")
        lse = _named(mesh, batch, head, "bhs")

        def lower(q, k, v, *aux):
            return ffi_fwd(q, k, v, scale, causal, extras_of(aux))

        return mesh, lower, (x, lse), (x, x, x) + _extras_named(mesh, batch, head, present)

    part.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer,
        propagate_user_sharding=propagate,
        sharding_rule=_fwd_rule(group, hkv, present),
    )

    @custom_vmap
    def call(q, k, v, *aux):
        return part(q, k, v, *aux)

    call.def_vmap(_broadcast_rule(call, 2, 3, present))
    return call


@functools.lru_cache(maxsize=None)
def _bwd_fn(scale: float, causal: bool, deterministic: bool, group: int, hkv: int,
            present: int = 0):
    def extras_of(aux):
        return Extras.from_arrays(present, aux)

    @custom_partitioning
    def part(q, k, v, o, lse, do, *aux):
        return ffi_bwd(q, k, v, o, lse, do, scale, causal, deterministic, extras_of(aux))

    def infer(mesh, arg_shapes, result_shape):
        q, k = arg_shapes[0], arg_shapes[1]
        batch, head = _plan(mesh, _shape_of(q), q.sharding, _shape_of(k), k.sharding)
        x = _named(mesh, batch, head, "bshd")
        return (x, x, x)

    def propagate(mesh, user_shape):
        dq = user_shape[0]
        shape = _shape_of(dq)
        batch, head = _plan(mesh, shape, dq.sharding, shape[:-2] + (shape[-2] // group, shape[-1]), None)
        x = _named(mesh, batch, head, "bshd")
        return (x, x, x)

    def partition(mesh, arg_shapes, result_shape):
        q, k = arg_shapes[0], arg_shapes[1]
        _warn_if_sequence_sharded(q, k)
        batch, head = _plan(mesh, _shape_of(q), q.sharding, _shape_of(k), k.sharding)
        x = _named(mesh, batch, head, "bshd")
        lse = _named(mesh, batch, head, "bhs")

        def lower(q, k, v, o, lse_, do, *aux):
            return ffi_bwd(q, k, v, o, lse_, do, scale, causal, deterministic, extras_of(aux))

        return (mesh, lower, (x, x, x),
                (x, x, x, x, lse, x) + _extras_named(mesh, batch, head, present))

    part.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer,
        propagate_user_sharding=propagate,
        sharding_rule=_bwd_rule(group, hkv, present),
    )

    @custom_vmap
    def call(q, k, v, o, lse, do, *aux):
        return part(q, k, v, o, lse, do, *aux)

    call.def_vmap(_broadcast_rule(call, 3, 6, present))
    return call


@functools.lru_cache(maxsize=None)
def _bare_fwd_fn(scale: float, causal: bool, present: int):
    """The bare forward call (no partitioning) for use inside shard_map, with
    the same vmap rule as the partitioned one (the dropout seed is not
    broadcast over the vmapped axis)."""
    @custom_vmap
    def call(q, k, v, *aux):
        return ffi_fwd(q, k, v, scale, causal, Extras.from_arrays(present, aux))

    call.def_vmap(_broadcast_rule(call, 2, 3, present))
    return call


@functools.lru_cache(maxsize=None)
def _bare_bwd_fn(scale: float, causal: bool, deterministic: bool, present: int):
    @custom_vmap
    def call(q, k, v, o, lse, do, *aux):
        return ffi_bwd(q, k, v, o, lse, do, scale, causal, deterministic,
                       Extras.from_arrays(present, aux))

    call.def_vmap(_broadcast_rule(call, 3, 6, present))
    return call


def _inside_shard_map() -> bool:
    """True while tracing inside shard_map (some mesh axes manual). There each
    device runs the kernel on its block, so the bare FFI call is used."""
    try:
        return bool(jax.sharding.get_abstract_mesh().manual_axes)
    except Exception:  # pragma: no cover - API drift
        return False


def _jaxlib_version() -> tuple:
    import jaxlib.version

    info = getattr(jaxlib.version, "__version_info__", None)
    if info is None:  # pragma: no cover - older jaxlib
        info = tuple(int(x) for x in jaxlib.version.__version__.split(".")[:3] if x.isdigit())
    return tuple(info)


# jaxlib 0.10.0 and 0.10.1: XLA's GSPMD partitioner aborts the process (a failed
# CHECK in PartitionedHlo::ReshardNoCache, seen on the CPU target) on a custom call
# inside a shard_map that leaves a mesh axis of size > 1 automatic.
_GSPMD_PARTIAL_MANUAL_FIXED = (0, 10, 2)


def _refuse_gspmd_partial_manual() -> None:
    """Raise a clear error where the bare kernel call would crash the process."""
    if _jaxlib_version() >= _GSPMD_PARTIAL_MANUAL_FIXED or jax.config.jax_use_shardy_partitioner:
        return
    try:
        mesh = jax.sharding.get_abstract_mesh()
        manual = tuple(mesh.manual_axes)
        auto = tuple(a for a, n in zip(mesh.axis_names, mesh.axis_sizes) if a not in manual and n > 1)
    except Exception:  # pragma: no cover - API drift
        return
    if manual and auto:
        raise NotImplementedError(
            f"jax_flash: a kernel inside shard_map over some mesh axes only (manual {manual}, automatic "
            f"{auto}) crashes XLA's GSPMD partitioner in jaxlib {'.'.join(map(str, _jaxlib_version()))} "
            f"(fixed in {'.'.join(map(str, _GSPMD_PARTIAL_MANUAL_FIXED))}). Use the Shardy partitioner "
            "(jax.config.update('jax_use_shardy_partitioner', True), JAX's default), make every mesh axis "
            "manual, or upgrade jax and jaxlib.")


def fwd(q, k, v, scale: float, causal: bool, extras: Extras = NO_EXTRAS):
    """(o, lse) of the forward kernel; shards over batch and heads under jit."""
    if _inside_shard_map():
        _refuse_gspmd_partial_manual()
        fn = _bare_fwd_fn(float(scale), Mask.of(causal), extras.present())
        return fn(q, k, v, *extras.arrays())
    group = q.shape[-2] // k.shape[-2]
    fn = _fwd_fn(float(scale), Mask.of(causal), int(group), int(k.shape[-2]), extras.present())
    o, lse = fn(q, k, v, *extras.arrays())
    return o, lse


def bwd(q, k, v, o, lse, do, scale: float, causal: bool, deterministic: bool,
        extras: Extras = NO_EXTRAS):
    """(dq, dk, dv) of the backward kernel; shards over batch and heads under jit."""
    if _inside_shard_map():
        _refuse_gspmd_partial_manual()
        fn = _bare_bwd_fn(float(scale), Mask.of(causal), bool(deterministic), extras.present())
        return fn(q, k, v, o, lse, do, *extras.arrays())
    group = q.shape[-2] // k.shape[-2]
    fn = _bwd_fn(float(scale), Mask.of(causal), bool(deterministic), int(group),
                 int(k.shape[-2]), extras.present())
    dq, dk, dv = fn(q, k, v, o, lse, do, *extras.arrays())
    return dq, dk, dv
