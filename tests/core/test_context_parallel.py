"""Every CP strategy reproduces the single-device reference: outputs and dQ, dK, dV.

Set-up: 4 simulated CPU devices (tests/conftest.py), batch 2, 128 tokens, 8 query / 4 KV heads
(GQA 2; Ulysses needs both head counts divisible by cp), head dim 16. Inputs are reordered with
TE's striped reorder, run through ``context_parallel_attention`` under ``jax.jit``, and the
results are inverse-reordered and compared with ``dense_attention`` on the original order.

Two packings are used with every compiled function (data is a runtime argument, so this costs
no extra compilation): TE's safe layout (every segment slot starts at a multiple of
cp * 8, padding positions keep counting) and a random unaligned packing where TE's AllGather
path would misbehave (§6.6) but the reference must still be exact.

To keep compile time affordable, the full strategy x stripe x window x dtype product runs
with ``kernel=`` set to the dense reference; a subset runs the default blockwise kernel.

Tolerances: fp32 1e-5 (atol and rtol). bf16: TE's own test tolerance for bf16,
rtol = atol = eps^(2/3) with eps = 2^-7 (bf16 machine epsilon), i.e. about 0.0394.
Padding rows (segment id 0) must be exactly 0 in the output and in every gradient.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tutorial_utils.te as te
from tutorial_utils.context_parallel import (
    context_parallel_attention,
    merge_partial,
    normalize_strategy,
)
from tutorial_utils.inputs import pack_segments
from tutorial_utils.reference import LSE_EMPTY, MaskSpec, dense_attention
from tutorial_utils.reorder import (
    ReorderStrategy,
    inverse_reorder_causal_load_balancing,
    reorder_causal_load_balancing,
)
from tutorial_utils.te.attention import (
    AttnBiasType,
    AttnMaskType,
    AttnSoftmaxType,
    CPStrategy,
    QKVLayout,
    SequenceDescriptor,
    fused_attn,
)
from tutorial_utils.te.sharding import MeshResource
from tutorial_utils.validation import validate_packed_inputs

CP = 4
B, S, HQ, HKV, D = 2, 128, 8, 4, 16
SCALE = D**-0.5
BF16_TOL = (2.0**-7) ** (2.0 / 3.0)  # TE's dtype_tols for bf16: eps^(2/3), eps = 2^-7 -> 0.0394
TOLS = {"float32": dict(atol=1e-5, rtol=1e-5), "bfloat16": dict(atol=BF16_TOL, rtol=BF16_TOL)}
STRIPED = ReorderStrategy.Striped

WINDOWS = {
    "allgather": [(-1, 0), (CP - 1, 0), (16, 0), (0, 0)],
    "ulysses": [(-1, 0), (CP - 1, 0), (16, 0), (0, 0)],
    "ring": [(-1, 0), (CP - 1, 0), (16, 0)],  # TE's ring needs left >= cp-1 (notes §6.6(2))
}
STRIPES = {"allgather": [1, 2, 4, 8], "ulysses": [1, 2, 4, 8], "ring": [1]}
ALL_WINDOWS = sorted({w for ws in WINDOWS.values() for w in ws})

# TE's safe layout: every slot starts at a multiple of cp * max stripe = 32.
LAYOUTS = {
    "aligned": pack_segments([[20, 25, 30], [60, 9]], S, align=CP * 8),
    "unaligned": pack_segments(
        [[1, 37, 5, 50], [3, 70, 2]], S, align=1, slot_padding=[[3, 0, 7, 2], [0, 5, 1]]
    ),
}


@functools.cache
def mesh_cp():
    return Mesh(np.array(jax.devices()[:CP]), ("cp",))


@functools.cache
def inputs(dtype):
    ks = jax.random.split(jax.random.PRNGKey(2026), 4)
    shapes = ((B, S, HQ, D), (B, S, HKV, D), (B, S, HKV, D), (B, S, HQ, D))
    return tuple(jax.random.normal(kk, shp).astype(dtype) for kk, shp in zip(ks, shapes))


def _loss_and_grads(attn, q, k, v, dout):
    def loss(q, k, v):
        out = attn(q, k, v)
        return jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32)), out

    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return (out, *grads)


@functools.cache
def single_device(dtype):
    """{(layout, window): (out, dq, dk, dv)} of the single-device dense reference, original
    order."""

    def run(q, k, v, dout, ids, pos):
        res = []
        for window in ALL_WINDOWS:
            spec = MaskSpec(causal=True, window=window)
            attn = lambda q, k, v, spec=spec: dense_attention(
                q, k, v, ids, ids, pos, pos, scale=SCALE, spec=spec
            )[0]
            res.append(_loss_and_grads(attn, q, k, v, dout))
        return res

    fn = jax.jit(run)
    out = {}
    for layout, (ids, pos) in LAYOUTS.items():
        for window, vals in zip(
            ALL_WINDOWS, fn(*inputs(dtype), jnp.asarray(ids), jnp.asarray(pos))
        ):
            out[layout, window] = tuple(np.asarray(x.astype(jnp.float32)) for x in vals)
    return out


def _dense_kernel(window):
    spec = MaskSpec(causal=True, window=window)

    def kernel(q, k, v, ids_q, ids_kv, pos_q, pos_kv):
        return dense_attention(q, k, v, ids_q, ids_kv, pos_q, pos_kv, scale=SCALE, spec=spec)

    return kernel


@functools.cache
def cp_results(
    strategy,
    stripe,
    dtype,
    kernel_kind,
    windows,
    mesh=None,
    batch_axis=None,
    reorder=STRIPED,
    load_balanced=True,
):
    """{(layout, window): (out, dq, dk, dv)} from CP, inverse-reordered to the original order."""
    mesh = mesh or mesh_cp()
    cp = dict(zip(mesh.axis_names, mesh.devices.shape))["cp"]
    st = stripe if reorder == STRIPED else None

    def run(q, k, v, dout, ids, pos):
        res = []
        for window in windows:
            kw = (
                dict(kernel=_dense_kernel(window))
                if kernel_kind == "dense"
                else dict(block_q=16, block_kv=32)
            )
            attn = functools.partial(
                context_parallel_attention,
                segment_ids=ids,
                segment_pos=pos,
                mesh=mesh,
                strategy=strategy,
                stripe_size=stripe,
                window_size=window,
                batch_axis=batch_axis,
                reorder_strategy=reorder,
                load_balanced=load_balanced,
                **kw,
            )
            res.append(_loss_and_grads(attn, q, k, v, dout))
        return res

    fn = jax.jit(run)
    fwd = (
        (lambda x: reorder_causal_load_balancing(x, reorder, cp, 1, st))
        if load_balanced
        else (lambda x: x)
    )
    inv = (
        (lambda x: inverse_reorder_causal_load_balancing(x, reorder, cp, 1, st))
        if load_balanced
        else (lambda x: x)
    )
    out = {}
    for layout, (ids, pos) in LAYOUTS.items():
        args = [fwd(x) for x in inputs(dtype)] + [fwd(jnp.asarray(ids)), fwd(jnp.asarray(pos))]
        for window, vals in zip(windows, fn(*args)):
            assert all(x.dtype == jnp.dtype(dtype) for x in vals)
            out[layout, window] = tuple(np.asarray(inv(x).astype(jnp.float32)) for x in vals)
    return out


MAX_ERR = {}  # (strategy, dtype) -> largest |cp - single| seen (outputs and gradients)


def _compare(got, want, ids, dtype, tag):
    for g, w, name in zip(got, want, ("out", "dq", "dk", "dv")):
        np.testing.assert_allclose(g, w, err_msg=f"{tag} {name}", **TOLS[dtype])
        key = (tag.split()[0], dtype)
        MAX_ERR[key] = max(MAX_ERR.get(key, 0.0), float(np.max(np.abs(g - w))))
        # padding tokens: exactly zero output, dQ, dK and dV (dO is non-zero there)
        assert np.all(g[ids == 0] == 0.0), f"{tag} {name}: padding rows must be exactly 0"


PRODUCT = [
    (strategy, stripe, dtype, window)
    for strategy in ("allgather", "ring", "ulysses")
    for stripe in STRIPES[strategy]
    for dtype in ("float32", "bfloat16")
    for window in WINDOWS[strategy]
]


@pytest.mark.parametrize(
    "strategy, stripe, dtype, window",
    PRODUCT,
    ids=[f"{s}-st{st}-{d}-w{w[0]}_{w[1]}" for s, st, d, w in PRODUCT],
)
def test_cp_matches_single_device(strategy, stripe, dtype, window):
    got_all = cp_results(strategy, stripe, dtype, "dense", tuple(WINDOWS[strategy]))
    want_all = single_device(dtype)
    for layout, (ids, _) in LAYOUTS.items():
        _compare(
            got_all[layout, window],
            want_all[layout, window],
            ids,
            dtype,
            f"{strategy} stripe={stripe} {dtype} window={window} {layout}",
        )


BLOCKWISE_CASES = [
    ("allgather", 2, "float32", ((CP - 1, 0), (0, 0))),
    ("allgather", 8, "bfloat16", ((-1, 0),)),
    ("ring", 1, "float32", ((CP - 1, 0),)),
    ("ring", 1, "bfloat16", ((16, 0),)),
    ("ulysses", 4, "float32", ((16, 0),)),
    ("ulysses", 1, "bfloat16", ((0, 0),)),
]


@pytest.mark.parametrize(
    "strategy, stripe, dtype, windows",
    BLOCKWISE_CASES,
    ids=[f"{c[0]}-st{c[1]}-{c[2]}" for c in BLOCKWISE_CASES],
)
def test_cp_default_blockwise_kernel_matches_single_device(strategy, stripe, dtype, windows):
    got_all = cp_results(strategy, stripe, dtype, "blockwise", windows)
    want_all = single_device(dtype)
    for window in windows:
        for layout, (ids, _) in LAYOUTS.items():
            _compare(
                got_all[layout, window],
                want_all[layout, window],
                ids,
                dtype,
                f"{strategy} stripe={stripe} {dtype} window={window} {layout} (blockwise)",
            )


@pytest.mark.parametrize(
    "strategy, reorder, load_balanced",
    [
        ("ring", ReorderStrategy.DualChunkSwap, True),
        ("allgather", ReorderStrategy.DualChunkSwap, True),
        ("allgather", STRIPED, False),
    ],
)
def test_cp_other_load_balancing(strategy, reorder, load_balanced):
    windows = ((-1, 0), (16, 0))
    got_all = cp_results(
        strategy, 1, "float32", "dense", windows, reorder=reorder, load_balanced=load_balanced
    )
    want_all = single_device("float32")
    for window in windows:
        for layout, (ids, _) in LAYOUTS.items():
            _compare(
                got_all[layout, window],
                want_all[layout, window],
                ids,
                "float32",
                f"{strategy} {reorder.name} balanced={load_balanced} window={window} {layout}",
            )


def test_aligned_layout_is_te_safe():
    ids, pos = LAYOUTS["aligned"]
    validate_packed_inputs(
        ids,
        pos,
        max_segments_per_seq=3,
        cp_size=CP,
        stripe_size=8,
        strategy="allgather",
        window_size=(16, 0),
    )
    validate_packed_inputs(
        ids,
        pos,
        max_segments_per_seq=3,
        cp_size=CP,
        stripe_size=1,
        strategy="ring",
        window_size=(CP - 1, 0),
    )
    with pytest.raises(
        ValueError,
        match=r"strategy='allgather', cp_size=4, stripe_size=1: row 1, token 4 "
        r"\(segment 2, position 1\) lands on rank 0",
    ):
        validate_packed_inputs(
            *LAYOUTS["unaligned"],
            max_segments_per_seq=4,
            cp_size=CP,
            stripe_size=1,
            strategy="allgather",
        )


@pytest.mark.parametrize("strategy, stripe", [("allgather", 4), ("ring", 1), ("ulysses", 2)])
def test_data_and_context_parallel_mesh(strategy, stripe):
    """2 x 2 mesh: batch split over "dp", sequence over "cp" (cp = 2)."""
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "cp"))
    windows = ((-1, 0), (16, 0))
    kernel = "blockwise" if strategy != "ulysses" else "dense"
    got_all = cp_results(strategy, stripe, "float32", kernel, windows, mesh=mesh, batch_axis="dp")
    want_all = single_device("float32")
    for window in windows:
        for layout, (ids, _) in LAYOUTS.items():
            _compare(
                got_all[layout, window],
                want_all[layout, window],
                ids,
                "float32",
                f"{strategy} dp x cp stripe={stripe} window={window} {layout}",
            )


# ----------------------------------------------------------------------------- the TE facade under


@pytest.mark.parametrize(
    "strategy, stripe",
    [(CPStrategy.RING, 1), (CPStrategy.ALL_GATHER, 4)],
    ids=["RING", "ALL_GATHER"],
)
def test_fused_attn_context_parallel_through_facade(strategy, stripe):
    mesh = mesh_cp()
    ids, pos = LAYOUTS["aligned"]
    q, k, v, dout = inputs("float32")
    window = (8, 0)

    def loss(qkv, desc, dout, **cp_kw):
        out = fused_attn(
            qkv,
            None,
            desc,
            None,
            AttnBiasType.NO_BIAS,
            AttnMaskType.PADDING_CAUSAL_MASK,
            QKVLayout.THD_THD_THD,
            AttnSoftmaxType.VANILLA_SOFTMAX,
            SCALE,
            0.0,
            True,
            max_segments_per_seq=3,
            window_size=window,
            **cp_kw,
        )
        return jnp.sum(out * dout), out

    desc0 = SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids), jnp.asarray(pos))
    (_, out0), g0 = jax.jit(jax.value_and_grad(loss, has_aux=True))((q, k, v), desc0, dout)

    cp_kw = dict(
        context_parallel_strategy=strategy,
        context_parallel_causal_load_balanced=True,
        stripe_size=stripe,
    )
    reorder = functools.partial(
        reorder_causal_load_balancing, strategy=STRIPED, cp_size=CP, seq_dim=1, stripe_size=stripe
    )
    inverse = functools.partial(
        inverse_reorder_causal_load_balancing,
        strategy=STRIPED,
        cp_size=CP,
        seq_dim=1,
        stripe_size=stripe,
    )
    qkv_r = tuple(reorder(x) for x in (q, k, v))
    desc = SequenceDescriptor.from_segment_ids_and_pos(
        reorder(jnp.asarray(ids)), reorder(jnp.asarray(pos))
    )
    with jax.set_mesh(mesh), te.autocast(mesh_resource=MeshResource(cp_resource="cp")):
        x4 = NamedSharding(mesh, P(None, "cp", None, None))
        desc_sh = jax.tree.map(
            lambda a: NamedSharding(mesh, P(None, "cp") if a.ndim == 2 else P()), desc
        )
        fn = jax.jit(
            jax.value_and_grad(functools.partial(loss, **cp_kw), has_aux=True),
            in_shardings=((x4, x4, x4), desc_sh, x4),
        )
        args = (
            tuple(jax.device_put(x, x4) for x in qkv_r),
            desc,
            jax.device_put(reorder(dout), x4),
        )
        hlo = fn.lower(*args).as_text()
        (_, out), grads = fn(*args)
    collective = "collective_permute" if strategy == CPStrategy.RING else "all_gather"
    assert collective in hlo, (
        f"{strategy.name} should run as CP ({collective} missing from the lowered program)"
    )
    np.testing.assert_allclose(np.asarray(inverse(out)), np.asarray(out0), atol=1e-5, rtol=1e-5)
    for g, w in zip(grads, g0):
        np.testing.assert_allclose(np.asarray(inverse(g)), np.asarray(w), atol=1e-5, rtol=1e-5)
    assert np.all(np.asarray(inverse(out))[ids == 0] == 0.0)


@pytest.mark.parametrize("balanced", [False, True])
@pytest.mark.parametrize(
    "strategy", [CPStrategy.ALL_GATHER, CPStrategy.RING], ids=["ALL_GATHER", "RING"]
)
def test_fused_attn_bshd_causal_context_parallel_through_facade(strategy, balanced):
    """BSHD + CAUSAL_MASK under CP (TE: DualChunkSwap load balancing), no sequence descriptor."""
    mesh = mesh_cp()
    q, k, v, dout = (x[:, :64] for x in inputs("float32"))

    def loss(q, k, v, dout, **cp_kw):
        out = fused_attn(
            (q, k, v),
            None,
            None,
            None,
            AttnBiasType.NO_BIAS,
            AttnMaskType.CAUSAL_MASK,
            QKVLayout.BSHD_BSHD_BSHD,
            AttnSoftmaxType.VANILLA_SOFTMAX,
            SCALE,
            0.0,
            True,
            **cp_kw,
        )
        return jnp.sum(out * dout), out

    grad_argnums = (0, 1, 2)
    (_, out0), g0 = jax.jit(jax.value_and_grad(loss, argnums=grad_argnums, has_aux=True))(
        q, k, v, dout
    )
    dual = ReorderStrategy.DualChunkSwap
    fwd = (lambda x: reorder_causal_load_balancing(x, dual, CP, 1)) if balanced else (lambda x: x)
    inv = (
        (lambda x: inverse_reorder_causal_load_balancing(x, dual, CP, 1))
        if balanced
        else (lambda x: x)
    )
    cp_kw = dict(context_parallel_strategy=strategy, context_parallel_causal_load_balanced=balanced)
    with jax.set_mesh(mesh), te.autocast(mesh_resource=MeshResource(cp_resource="cp")):
        x4 = NamedSharding(mesh, P(None, "cp", None, None))
        fn = jax.jit(
            jax.value_and_grad(
                functools.partial(loss, **cp_kw), argnums=grad_argnums, has_aux=True
            ),
            in_shardings=(x4, x4, x4, x4),
        )
        (_, out), grads = fn(*(jax.device_put(fwd(x), x4) for x in (q, k, v, dout)))
    np.testing.assert_allclose(np.asarray(inv(out)), np.asarray(out0), atol=1e-5, rtol=1e-5)
    for g, w in zip(grads, g0):
        np.testing.assert_allclose(np.asarray(inv(g)), np.asarray(w), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- small pieces


def test_merge_partial_equals_joint_softmax():
    rng = np.random.default_rng(0)
    out1, out2 = (jnp.asarray(rng.normal(size=(1, 3, 2, 4)), jnp.float32) for _ in range(2))
    lse1 = jnp.asarray(rng.normal(size=(1, 2, 3)), jnp.float32)
    lse2 = lse1.at[0, 0, 1].set(LSE_EMPTY)  # one row empty in the second part
    out, lse = merge_partial(out1, lse1, out2, lse2)
    w1 = np.exp(np.asarray(lse1) - np.logaddexp(lse1, lse2)).transpose(0, 2, 1)[..., None]
    w2 = np.exp(np.asarray(lse2) - np.logaddexp(lse1, lse2)).transpose(0, 2, 1)[..., None]
    np.testing.assert_allclose(
        np.asarray(out), w1 * np.asarray(out1) + w2 * np.asarray(out2), rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(np.asarray(out)[0, 1, 0], np.asarray(out1)[0, 1, 0], rtol=1e-6)
    empty_both, _ = merge_partial(
        out1, jnp.full_like(lse1, LSE_EMPTY), out2, jnp.full_like(lse1, LSE_EMPTY)
    )
    assert np.all(np.isfinite(np.asarray(empty_both)))


@pytest.mark.parametrize(
    "name, want", [("DEFAULT", "allgather"), ("ALL_GATHER", "allgather"), ("RING", "ring")]
)
def test_normalize_strategy(name, want):
    assert normalize_strategy(getattr(CPStrategy, name)) == want
    assert normalize_strategy(name.lower()) == want
    with pytest.raises(ValueError, match="strategy='butterfly' is unknown"):
        normalize_strategy("butterfly")
