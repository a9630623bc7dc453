"""TransformerEngine's own JAX code on CPU (``tutorial_utils.te_on_cpu``) against independent
oracles.

* the stand-in extension: TE's C enum values, honest queries, loud refusals;
* single device: TE's ``fused_attn`` (THD and BSHD, every mask type, windows, GQA 1/2/4/8,
  the three softmax types, packed layouts, bias) against a float64 NumPy formula and
  ``jax.nn.dot_product_attention(implementation="xla")`` with a mask built here, outputs
  and dQ/dK/dV, in fp32 (tight; the stand-in is told to accept fp32, which cuDNN refuses)
  and bf16 (TE's own test tolerance);
* context parallelism on 2, 4 and 8 simulated devices: AllGather with stripes 1/2/4/8/128
  and Ring with stripe 1, against the same oracle on the un-reordered arrays;
* the validator is exact: it accepts a random layout iff TE's code computes it right;
* each static check of the facade prevents a result that TE's code gets wrong.

Tolerances: fp32 ``atol = rtol = 2e-5``; bf16 ``atol = rtol = 0.0394`` (TE's ``dtype_tols``).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import np_attention, np_visible, packed_rows, random_layout
from helpers import oracle_fn as _oracle  # jax.nn.dot_product_attention (xla) + gradients
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tutorial_utils import te_on_cpu
from tutorial_utils.te.attention import silent_failure_checks
from tutorial_utils.validation import first_violation

TE = te_on_cpu.install()
from transformer_engine.jax import attention as A  # noqa: E402  (after the stand-in is installed)
from transformer_engine.jax.sharding import MeshResource  # noqa: E402

FP32 = dict(atol=2e-5, rtol=2e-5)
BF16 = dict(atol=0.0394, rtol=0.0394)
D = 16


# ----------------------------------------------------------------------------- the stand-in


def test_the_single_gpu_seed_step_goes_through_tes_code_at_two_to_the_31_elements():
    """The GPU run's ``bench-single`` step: TE's published workload on one device. Q and dO hold
    2**31 elements each (4x what each of TE's 4 GPUs held); TE's code takes the shapes (lowered,
    not run: no CPU holds it), and the step's buffers fit an H200 (141 GiB) with room."""
    import math

    from tutorial_utils.perfmodel.workload import get_workload

    wl = get_workload("seed")
    q = jax.ShapeDtypeStruct((wl.batch, wl.seq_len, wl.num_q_heads, wl.head_dim), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((wl.batch, wl.seq_len, wl.num_kv_heads, wl.head_dim), jnp.bfloat16)
    ids = jax.ShapeDtypeStruct((wl.batch, wl.seq_len), jnp.int32)
    assert (
        math.prod(q.shape)
        == 2**31
        == 4 * math.prod((wl.batch, wl.seq_len // wl.cp_size, *q.shape[2:]))
    )

    def loss(qkv, seg_ids, seg_pos, dout):
        desc = A.SequenceDescriptor.from_segment_ids_and_pos(seg_ids, seg_pos)
        out = A.fused_attn(
            qkv,
            None,
            desc,
            None,
            attn_bias_type=A.AttnBiasType.NO_BIAS,
            attn_mask_type=A.AttnMaskType.PADDING_CAUSAL_MASK,
            qkv_layout=A.QKVLayout.THD_THD_THD,
            softmax_type=A.AttnSoftmaxType.VANILLA_SOFTMAX,
            scaling_factor=wl.scaling_factor,
            dropout_probability=0.0,
            is_training=True,
            max_segments_per_seq=wl.max_segments_per_seq,
            window_size=tuple(wl.window),
        )
        return jnp.vdot(out.astype(jnp.float32), dout.astype(jnp.float32))

    lowered = jax.jit(jax.value_and_grad(loss)).lower((q, kv, kv), ids, ids, q)
    nbytes = lambda tree: sum(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(tree))  # noqa: E731
    saved = (
        nbytes(q) + wl.batch * wl.num_q_heads * wl.seq_len * 4
    )  # the output and softmax stats kept for backward
    total = nbytes(lowered.in_avals) + nbytes(lowered.out_info) + saved
    assert (
        17 * 2**30 < total < 18 * 2**30 < 141 * 2**30 // 4
    )  # about 17.1 GiB: an eighth of the H200


def test_enums_carry_te_c_values():
    """Values from TE's C headers (``fused_attn.h``, ``transformer_engine.h``, ``misc.h``)."""
    from transformer_engine_jax import (
        DType,
        NVTE_Bias_Type,
        NVTE_Fused_Attn_Backend,
        NVTE_Mask_Type,
        NVTE_QKV_Format,
        NVTE_QKV_Layout,
        NVTE_Softmax_Type,
    )

    assert [int(m) for m in NVTE_Mask_Type] == [0, 1, 2, 3, 4, 5]
    assert {m.name: int(m) for m in NVTE_QKV_Layout} == {
        "NVTE_BS3HD": 5,
        "NVTE_BSHD_BS2HD": 7,
        "NVTE_BSHD_BSHD_BSHD": 9,
        "NVTE_T3HD": 10,
        "NVTE_THD_T2HD": 12,
        "NVTE_THD_THD_THD": 14,
        "NVTE_QKV_Layout_NOT_SET": 26,
    }
    assert {m.name: int(m) for m in NVTE_QKV_Format} == {
        "NVTE_SBHD": 0,
        "NVTE_BSHD": 1,
        "NVTE_THD": 2,
        "NVTE_QKV_Format_NOT_SET": 8,
    }
    assert [int(m) for m in NVTE_Bias_Type] == [0, 1, 2, 3] and [
        int(m) for m in NVTE_Softmax_Type
    ] == [0, 1, 2]
    assert {m.name: int(m) for m in NVTE_Fused_Attn_Backend} == {
        "NVTE_No_Backend": -1,
        "NVTE_F16_arbitrary_seqlen": 1,
        "NVTE_FP8": 2,
    }
    assert (int(DType.kFloat32), int(DType.kFloat16), int(DType.kBFloat16)) == (4, 5, 6)
    # TE's Python enums are built from these values
    assert A.QKVLayout.THD_THD_THD.value == NVTE_QKV_Layout.NVTE_THD_THD_THD
    assert A.AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK.value == 5


def test_queries_are_honest_and_unknown_calls_raise():
    import transformer_engine_jax as ext
    from transformer_engine.common import decode_cudnn_version

    assert decode_cudnn_version(ext.get_cudnn_version()) == te_on_cpu.CUDNN_CONTRACT == (9, 12, 0)
    assert ext.get_device_compute_capability(0) == 90 and ext.registrations() == {}
    with pytest.raises(
        NotImplementedError,
        match=r"transformer_engine_jax\.get_norm_fwd_workspace_sizes is not "
        r"implemented by the CPU stand-in",
    ):
        ext.get_norm_fwd_workspace_sizes(1, 2, 3)
    with pytest.raises(
        AttributeError, match=r"transformer_engine_jax\.no_such_function does not exist"
    ):
        ext.no_such_function  # noqa: B018
    assert te_on_cpu.install() is TE  # idempotent


def _thd_inputs(dtype, b=2, s=32, hq=4, hkv=2):
    rng = np.random.default_rng(0)
    ids, pos = random_layout(rng, b, s)
    q, k, v, dout = _qkv(1, b, s, s, hq, hkv, dtype)
    desc = A.SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids), jnp.asarray(pos))
    return (q, k, v), desc


def _call_thd(qkv, desc, **kw):
    """TE's fused_attn under jit: one program, not TE's preprocessing dispatched op by op
    (eager)."""
    args = dict(
        attn_bias_type=A.AttnBiasType.NO_BIAS,
        attn_mask_type=A.AttnMaskType.PADDING_CAUSAL_MASK,
        qkv_layout=A.QKVLayout.THD_THD_THD,
        softmax_type=A.AttnSoftmaxType.VANILLA_SOFTMAX,
        scaling_factor=0.25,
        dropout_probability=0.0,
        is_training=False,
        max_segments_per_seq=4,
    )
    args.update(kw)
    return jax.jit(lambda qkv, desc: A.fused_attn(qkv, None, desc, None, **args))(qkv, desc)


def test_fp32_is_refused_like_cudnn_unless_a_test_opts_in():
    qkv, desc = _thd_inputs(jnp.float32)
    with pytest.raises(
        ValueError, match=r"Unsupported backend: qkv dtype kFloat32: cuDNN fused attention"
    ):
        _call_thd(qkv, desc)
    with te_on_cpu.allow_fp32():
        assert _call_thd(qkv, desc).dtype == jnp.float32


def test_what_the_kernel_cannot_honour_is_refused_by_name():
    qkv, desc = _thd_inputs(jnp.bfloat16)
    with pytest.raises(
        ValueError, match=r"Unsupported backend: dropout_probability=0.1 with is_training=True"
    ):
        jax.jit(
            lambda qkv, desc, seed: A.fused_attn(
                qkv,
                None,
                desc,
                seed,
                A.AttnBiasType.NO_BIAS,
                A.AttnMaskType.PADDING_CAUSAL_MASK,
                A.QKVLayout.THD_THD_THD,
                A.AttnSoftmaxType.VANILLA_SOFTMAX,
                0.25,
                0.1,
                True,
                max_segments_per_seq=4,
            )
        )(qkv, desc, jax.random.PRNGKey(0))
    q, k, v = (x[:1, :16] for x in qkv)
    bias = jnp.zeros((1, 4, 16, 16), jnp.bfloat16)
    with pytest.raises(
        ValueError, match=r"attn_bias_type=NVTE_POST_SCALE_BIAS with qkv_layout=NVTE_THD_THD_THD"
    ):
        A.fused_attn(
            (q, k, v),
            bias,
            A.SequenceDescriptor.from_segment_ids_and_pos(
                jnp.ones((1, 16), jnp.int32), jnp.arange(16, dtype=jnp.int32)[None]
            ),
            None,
            A.AttnBiasType.POST_SCALE_BIAS,
            A.AttnMaskType.PADDING_CAUSAL_MASK,
            A.QKVLayout.THD_THD_THD,
            A.AttnSoftmaxType.VANILLA_SOFTMAX,
            0.25,
            0.0,
            False,
            max_segments_per_seq=1,
        )


# ----------------------------------------------------------------------------- single device vs ora


def _qkv(seed, b, sq, skv, hq, hkv, dtype):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    return tuple(
        jax.random.normal(kk, shape, jnp.float32).astype(dtype)
        for kk, shape in zip(
            ks, [(b, sq, hq, D), (b, skv, hkv, D), (b, skv, hkv, D), (b, sq, hq, D)]
        )
    )


def _bottom_right(ids_q, ids_kv, pos_q):
    """Query positions shifted by (kv run length - q run length) of their segment."""
    out = pos_q.copy()
    for b in range(ids_q.shape[0]):
        for sid in np.unique(ids_q[b][ids_q[b] > 0]):
            out[b, ids_q[b] == sid] += (ids_kv[b] == sid).sum() - (ids_q[b] == sid).sum()
    return out


# (name, layout, mask, sq, skv, hq, hkv, window, softmax)
SINGLE_CASES = [
    (
        "thd-padcausal-mha",
        "THD_THD_THD",
        "PADDING_CAUSAL_MASK",
        48,
        48,
        4,
        4,
        None,
        "VANILLA_SOFTMAX",
    ),
    (
        "thd-padcausal-swa-gqa2",
        "THD_THD_THD",
        "PADDING_CAUSAL_MASK",
        48,
        48,
        4,
        2,
        (5, 0),
        "VANILLA_SOFTMAX",
    ),
    (
        "thd-padding-window-gqa4",
        "THD_THD_THD",
        "PADDING_MASK",
        48,
        48,
        8,
        2,
        (4, 3),
        "VANILLA_SOFTMAX",
    ),
    (
        "thd-br-cross-gqa8",
        "THD_THD_THD",
        "PADDING_CAUSAL_BOTTOM_RIGHT_MASK",
        40,
        56,
        8,
        1,
        None,
        "VANILLA_SOFTMAX",
    ),
    (
        "thd-kvpacked-offbyone",
        "THD_T2HD",
        "PADDING_CAUSAL_MASK",
        48,
        48,
        4,
        2,
        (7, 0),
        "OFF_BY_ONE_SOFTMAX",
    ),
    (
        "thd-qkvpacked-learnable",
        "T3HD",
        "PADDING_CAUSAL_MASK",
        48,
        48,
        4,
        4,
        None,
        "LEARNABLE_SOFTMAX",
    ),
    ("bshd-nomask-gqa2", "BSHD_BSHD_BSHD", "NO_MASK", 32, 32, 4, 2, None, "VANILLA_SOFTMAX"),
    (
        "bshd-causal-window",
        "BSHD_BSHD_BSHD",
        "CAUSAL_MASK",
        32,
        32,
        4,
        1,
        (6, 0),
        "VANILLA_SOFTMAX",
    ),
    ("bshd-causal-br", "BS3HD", "CAUSAL_BOTTOM_RIGHT_MASK", 32, 32, 4, 4, None, "VANILLA_SOFTMAX"),
    (
        "bshd-br-cross",
        "BSHD_BSHD_BSHD",
        "CAUSAL_BOTTOM_RIGHT_MASK",
        24,
        40,
        4,
        2,
        None,
        "OFF_BY_ONE_SOFTMAX",
    ),
    ("bshd-padding", "BSHD_BS2HD", "PADDING_MASK", 32, 32, 4, 2, None, "VANILLA_SOFTMAX"),
    (
        "bshd-padcausal-br",
        "BSHD_BSHD_BSHD",
        "PADDING_CAUSAL_BOTTOM_RIGHT_MASK",
        32,
        32,
        8,
        8,
        (9, 0),
        "LEARNABLE_SOFTMAX",
    ),
]


def _single_setup(case, rng):
    name, layout, mask, sq, skv, hq, hkv, window, softmax = case
    b = 2
    thd = layout.startswith("T")
    padding = "PADDING" in mask
    if thd:
        ids_q, pos_q = random_layout(rng, b, sq)
        ids_kv, pos_kv = (ids_q, pos_q) if sq == skv else random_layout(rng, b, skv)
        desc = A.SequenceDescriptor.from_segment_ids_and_pos(
            (jnp.asarray(ids_q), jnp.asarray(ids_kv)), (jnp.asarray(pos_q), jnp.asarray(pos_kv))
        )
    else:
        lens_q = rng.integers(1, sq + 1, b) if padding else np.full(b, sq)
        lens_kv = (
            lens_q if sq == skv else (rng.integers(1, skv + 1, b) if padding else np.full(b, skv))
        )
        ids_q = (np.arange(sq)[None] < lens_q[:, None]).astype(np.int32)
        ids_kv = (np.arange(skv)[None] < lens_kv[:, None]).astype(np.int32)
        pos_q, pos_kv = np.tile(np.arange(sq), (b, 1)), np.tile(np.arange(skv), (b, 1))
        desc = A.SequenceDescriptor.from_seqlens(
            (jnp.asarray(lens_q, jnp.int32), jnp.asarray(lens_kv, jnp.int32))
        )
    causal = "CAUSAL" in mask
    shifted = _bottom_right(ids_q, ids_kv, pos_q) if "BOTTOM_RIGHT" in mask else pos_q
    vis = np_visible(
        ids_q, ids_kv, shifted, pos_kv, causal=causal, window=window or (-1, -1), padding=True
    )
    return desc, ids_q, vis


def _te_single(case, desc, dtype, scale, sink):
    name, layout, mask, *_, window, softmax = case
    lay = A.QKVLayout[layout]
    offset = None if sink is None else jnp.asarray(sink, jnp.float32).reshape(1, -1, 1, 1)

    def run(q, k, v, dout, offset):
        def pack(q, k, v):
            if lay.is_qkvpacked():
                return (jnp.stack([q, k, v], axis=2),)
            if lay.is_kvpacked():
                return (q, jnp.stack([k, v], axis=2))
            return (q, k, v)

        def loss(q, k, v, offset):
            out = A.fused_attn(
                pack(q, k, v),
                None,
                desc,
                None,
                A.AttnBiasType.NO_BIAS,
                A.AttnMaskType[mask],
                lay,
                A.AttnSoftmaxType[softmax],
                scale,
                0.0,
                True,
                max_segments_per_seq=4,
                window_size=window,
                softmax_offset=offset,
            )
            return jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32)), out

        argnums = (0, 1, 2) if offset is None else (0, 1, 2, 3)
        (_, out), grads = jax.value_and_grad(loss, argnums=argnums, has_aux=True)(q, k, v, offset)
        return out, grads[:3]

    with te_on_cpu.allow_fp32(dtype == jnp.float32):
        return jax.jit(run)(*_qkv(7, 2, case[3], case[4], case[5], case[6], dtype), offset)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", SINGLE_CASES, ids=[c[0] for c in SINGLE_CASES])
def test_single_device_matches_oracles(case, dtype):
    name, layout, mask, sq, skv, hq, hkv, window, softmax = case
    if layout in ("T3HD", "BS3HD") and hq != hkv:
        pytest.skip("packed QKV needs equal head counts")
    rng = np.random.default_rng(sum(map(ord, name)))
    scale = 0.3
    desc, ids_q, vis = _single_setup(case, rng)
    sink = {
        "VANILLA_SOFTMAX": None,
        "OFF_BY_ONE_SOFTMAX": np.zeros(hq),
        "LEARNABLE_SOFTMAX": rng.normal(size=hq),
    }[softmax]
    out, grads = _te_single(case, desc, dtype, scale, sink)
    q, k, v, dout = (x.astype(jnp.float32) for x in _qkv(7, 2, sq, skv, hq, hkv, dtype))
    has = vis.any(-1)
    tol = FP32 if dtype == jnp.float32 else BF16
    out64, _ = np_attention(q, k, v, vis, scale, sink)
    out = np.asarray(out.astype(jnp.float32))
    np.testing.assert_allclose(out[has], out64[has], err_msg=f"{name}: output vs float64", **tol)
    assert np.all(out[~has] == 0.0), "rows that see no key must be exactly 0"
    if (
        sink is None
    ):  # jax.nn has no sink; the sink's gradient is checked against the reference below
        _, grads_o = _oracle(scale)(q, k, v, jnp.asarray(vis), dout * has[:, :, None, None])
        for got, want, what in zip(grads, grads_o, "qkv"):
            got = np.asarray(got.astype(jnp.float32))
            if what == "q":
                got = np.where(has[:, :, None, None], got, 0.0)
                assert np.all(np.asarray(grads[0])[~has] == 0), (
                    "dQ of key-less rows must be exactly 0"
                )
            np.testing.assert_allclose(
                got, np.asarray(want), err_msg=f"{name}: d{what} vs jax.nn", **tol
            )
    else:
        from tutorial_utils.reference import MaskSpec, dense_attention

        def ref_loss(q, k, v):
            # the reference's bounds mode: each query row's visible keys form one inclusive range
            lo = np.where(has, vis.argmax(-1), 0)
            hi = np.where(has, vis.shape[-1] - 1 - vis[..., ::-1].argmax(-1), -1)
            rows = jnp.broadcast_to(jnp.arange(skv), (2, skv))
            out, _ = dense_attention(
                q,
                k,
                v,
                jnp.asarray(lo),
                rows,
                jnp.asarray(hi),
                rows,
                scale=scale,
                spec=MaskSpec(bounds=True),
                sink=jnp.asarray(sink, jnp.float32),
            )
            return jnp.sum(out * dout)

        grads_r = jax.jit(jax.grad(ref_loss, argnums=(0, 1, 2)))(q, k, v)
        for got, want, what in zip(grads, grads_r, "qkv"):
            np.testing.assert_allclose(
                np.asarray(got.astype(jnp.float32)),
                np.asarray(want),
                err_msg=f"{name}: d{what} vs reference",
                **tol,
            )


def test_bshd_post_scale_bias_matches_float64():
    q, k, v, dout = _qkv(3, 2, 24, 24, 4, 2, jnp.float32)
    bias = jax.random.normal(jax.random.PRNGKey(9), (1, 4, 24, 24), jnp.float32)

    def loss(q, k, v, bias):
        out = A.fused_attn(
            (q, k, v),
            bias,
            None,
            None,
            A.AttnBiasType.POST_SCALE_BIAS,
            A.AttnMaskType.CAUSAL_MASK,
            A.QKVLayout.BSHD_BSHD_BSHD,
            A.AttnSoftmaxType.VANILLA_SOFTMAX,
            0.3,
            0.0,
            True,
        )
        return jnp.sum(out * dout), out

    with te_on_cpu.allow_fp32():
        (_, out), (dq, dbias) = jax.jit(jax.value_and_grad(loss, argnums=(0, 3), has_aux=True))(
            q, k, v, bias
        )
    causal = np.tril(np.ones((24, 24), bool))[None].repeat(2, 0)
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("bqhd,bkhd->bhqk", q64, np.repeat(k64, 2, axis=2)) * 0.3 + np.asarray(
        bias, np.float64
    )
    p = np.where(causal[:, None], np.exp(s - s.max(-1, keepdims=True)), 0.0)
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("bhqk,bkhd->bqhd", p, np.repeat(v64, 2, axis=2))
    np.testing.assert_allclose(np.asarray(out), want, **FP32)
    assert dbias.shape == bias.shape and float(jnp.abs(dbias).max()) > 0
    assert np.all(np.asarray(dbias)[0][:, ~causal[0]] == 0), "masked logits get no bias gradient"


# ----------------------------------------------------------------------------- context parallelism


@functools.cache
def _cp_fn(
    cp, strategy, stripe, window, dtype, batch, seq, max_segments, load_balanced=True, backward=True
):
    """Jitted forward+backward of TE's fused_attn under a cp mesh, on reordered inputs.

    ``backward=False``: the forward alone (gradients ``()``), for the tests that judge only the
    output (the validator's property test, the facade checks); it compiles in about half the time.
    """
    mesh = Mesh(np.array(jax.devices()[:cp]), ("cp",))
    strat = A.CPStrategy.RING if strategy == "ring" else A.CPStrategy.ALL_GATHER
    sharding = NamedSharding(mesh, P(None, "cp"))

    def run(q, k, v, ids, pos, dout):
        desc = A.SequenceDescriptor.from_segment_ids_and_pos(ids, pos)

        def loss(q, k, v):
            out = A.fused_attn(
                (q, k, v),
                None,
                desc,
                None,
                A.AttnBiasType.NO_BIAS,
                A.AttnMaskType.PADDING_CAUSAL_MASK,
                A.QKVLayout.THD_THD_THD,
                A.AttnSoftmaxType.VANILLA_SOFTMAX,
                0.3,
                0.0,
                True,
                max_segments_per_seq=max_segments,
                window_size=window,
                context_parallel_strategy=strat,
                context_parallel_causal_load_balanced=load_balanced,
                context_parallel_axis="cp",
                stripe_size=stripe,
            )
            return jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32)), out

        if not backward:
            return loss(q, k, v)[1], ()
        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
        return out, grads

    fn = jax.jit(run, in_shardings=(sharding,) * 6)
    # TE's striped reorder and its inverse are fixed permutations of the sequence axis: read both
    # from TE's own functions once, then apply them on the host (called eagerly on each array,
    # they compiled a few ops for every new shape)
    perm, inverse = (
        np.asarray(f(jnp.arange(seq)[None], A.ReorderStrategy.Striped, cp, 1, stripe))[0]
        for f in (A.reorder_causal_load_balancing, A.inverse_reorder_causal_load_balancing)
    )
    assert np.array_equal(perm[inverse], np.arange(seq)), (
        "TE's inverse reorder does not undo its reorder"
    )

    def call(*arrays):
        def ro(x):
            return jax.device_put(np.asarray(x)[:, perm], sharding)

        def back(x):
            return np.asarray(x)[:, inverse]

        with (
            te_on_cpu.allow_fp32(dtype == jnp.float32),
            jax.set_mesh(mesh),
            TE.autocast(mesh_resource=MeshResource(cp_resource="cp")),
        ):
            out, grads = fn(*(ro(x) for x in arrays))
        return back(out), tuple(back(g) for g in grads)

    return call


def _slots(batch, seq, slot, fill):
    """Slot-aligned segments with padding whose positions keep counting (TE's documented safe
    layout)."""
    ids = np.zeros((batch, seq), np.int32)
    pos = np.tile(np.arange(slot, dtype=np.int32), (batch, seq // slot))
    for b in range(batch):
        for j in range(seq // slot):
            ids[b, j * slot : j * slot + fill - 4 * b * (j % 2)] = j + 1
    return ids, pos


CP_MATRIX_SHAPE = (2, 256)  # (batch, seq) of every CP matrix case
# (cp, strategy, stripe, window, dtype)
CP_CASES = [
    (2, "allgather", 1, (20, 0), jnp.float32),
    (2, "allgather", 128, None, jnp.float32),
    (2, "ring", 1, (20, 0), jnp.bfloat16),
    (4, "allgather", 1, None, jnp.float32),
    (4, "allgather", 2, (20, 0), jnp.float32),
    (4, "allgather", 4, (20, 0), jnp.bfloat16),
    (4, "allgather", 8, None, jnp.float32),
    (4, "ring", 1, (20, 0), jnp.float32),
    (4, "ring", 1, None, jnp.bfloat16),
    (8, "allgather", 2, (20, 0), jnp.float32),
    (8, "allgather", 8, None, jnp.bfloat16),
    (8, "ring", 1, (20, 0), jnp.float32),
]


@pytest.mark.parametrize(
    "cp, strategy, stripe, window, dtype",
    CP_CASES,
    ids=[
        f"cp{c}-{s}-stripe{t}-{'swa' if w else 'full'}-{np.dtype(d).name}"
        for c, s, t, w, d in CP_CASES
    ],
)
def test_context_parallel_matches_oracle(cp, strategy, stripe, window, dtype):
    (batch, seq), slot = CP_MATRIX_SHAPE, 64
    ids, pos = _slots(batch, seq, slot, 48)
    assert (
        first_violation(
            ids,
            pos,
            max_segments_per_seq=6,
            cp_size=cp,
            stripe_size=stripe,
            strategy=strategy,
            window_size=window,
        )
        is None
    )
    q, k, v, dout = _qkv(11, batch, seq, seq, 4, 2, dtype)
    out, grads = _cp_fn(cp, strategy, stripe, window, dtype, batch, seq, 6)(q, k, v, ids, pos, dout)
    vis = np_visible(ids, ids, pos, pos, causal=True, window=window or (-1, -1))
    has = vis.any(-1)
    f32 = [x.astype(jnp.float32) for x in (q, k, v, dout)]
    out_o, grads_o = _oracle(0.3)(*f32[:3], jnp.asarray(vis), f32[3] * has[:, :, None, None])
    tol = FP32 if dtype == jnp.float32 else BF16
    out = np.asarray(out.astype(jnp.float32))
    np.testing.assert_allclose(out[has], np.asarray(out_o)[has], err_msg="output", **tol)
    assert np.all(out[ids == 0] == 0.0), "padding rows must be exactly 0"
    for got, want, what in zip(grads, grads_o, "qkv"):
        got = np.asarray(got.astype(jnp.float32))
        np.testing.assert_allclose(got, np.asarray(want), err_msg=f"d{what}", **tol)
        assert np.all(got[ids == 0] == 0.0), f"padding d{what} must be exactly 0"


# ----------------------------------------------------------------------------- the validator is exa

EXAMPLES = int(
    os.environ.get("CP_VALIDATOR_EXAMPLES", "8")
)  # 200 per shape: 0 mismatches in 1,200 layouts
# (cp, stripe, seq): every shape compiles once; layouts vary freely inside it
# Only the output decides "right", so the validator compiles TE's forward alone (about half the
# compile of the CP matrix's forward+backward), except where the CP matrix has already compiled the
# same configuration (_MATRIX_FP32); every (cp, strategy, stripe, window) compiles once.
VALIDATOR_SHAPES = [(2, 1, 256), (4, 1, 256), (4, 2, 256), (4, 4, 256), (8, 1, 256), (8, 2, 256)]


_VERDICTS: dict = {}


# The CP matrix's float32 configurations at the validator's shape: the validator calls the matrix's
# forward+backward program for these (the same cached function, so the same compiled program)
# instead of compiling a forward of its own, and reads only the output.
_MATRIX_FP32 = {
    (cp, strategy, stripe, window)
    for cp, strategy, stripe, window, dtype in CP_CASES
    if dtype == jnp.float32
}


def _te_is_right(cp, strategy, stripe, window, ids, pos):
    batch, seq = ids.shape
    q, k, v, dout = _qkv(5, batch, seq, seq, 4, 2, jnp.float32)
    if (batch, seq) == CP_MATRIX_SHAPE and (cp, strategy, stripe, window) in _MATRIX_FP32:
        fn = _cp_fn(
            cp, strategy, stripe, window, jnp.float32, batch, seq, 6
        )  # the matrix's own call
    else:
        fn = _cp_fn(cp, strategy, stripe, window, jnp.float32, batch, seq, 6, backward=False)
    out, _ = fn(q, k, v, ids, pos, dout)
    vis = np_visible(ids, ids, pos, pos, causal=True, window=window or (-1, -1))
    want, _ = np_attention(q, k, v, vis, 0.3)
    return float(np.max(np.abs(np.asarray(out) - want))) < 1e-4


@pytest.mark.parametrize(
    "cp, stripe, seq", VALIDATOR_SHAPES, ids=[f"cp{c}-stripe{s}" for c, s, _ in VALIDATOR_SHAPES]
)
def test_validator_accepts_exactly_what_te_computes_right(cp, stripe, seq):
    """Both directions: no accepted layout gives a wrong result, no rejected layout a right one."""
    counts = _VERDICTS.setdefault((cp, stripe), {})

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        rows=packed_rows(2, seq, cp, stripe),
        window=st.sampled_from([None, (cp - 1, 0), (20, 0)]),
        strategy=st.sampled_from(["allgather", "ring"] if stripe == 1 else ["allgather"]),
    )
    def check(rows, window, strategy):
        ids, pos = rows
        why = first_violation(
            ids,
            pos,
            max_segments_per_seq=6,
            cp_size=cp,
            stripe_size=stripe,
            strategy=strategy,
            window_size=window,
        )
        right = _te_is_right(cp, strategy, stripe, window, ids, pos)
        key = (strategy, "accepted" if why is None else "rejected", "right" if right else "wrong")
        counts[key] = counts.get(key, 0) + 1
        assert (why is None) == right, (
            f"validator says {why!r} but TE's code is {'right' if right else 'wrong'}"
        )

    check()
    print(f"validator verdicts cp={cp} stripe={stripe}: {counts}")


# ----------------------------------------------------------------------------- each facade check ea

FACADE_CHECKS = [
    (
        "ring stripe 2",
        dict(strategy="ring", stripe=2, window=(20, 0), lb=True),
        r"stripe_size=2 with CPStrategy.RING",
    ),
    (
        "ring window < cp-1",
        dict(strategy="ring", stripe=1, window=(1, 0), lb=True),
        r"the left window must be >= ",
    ),
    (
        "ring window (-1, 0)",  # "causal, no window": TE's striped Ring adjusts it per step
        dict(strategy="ring", stripe=1, window=(-1, 0), lb=True),
        r"reads a left bound of -1 as a bound",
    ),
    (
        "allgather unbalanced",
        dict(strategy="allgather", stripe=4, window=None, lb=False),
        r"context_parallel_causal_load_balanced=False with THD AllGather",
    ),
]


@pytest.mark.parametrize("name, cfg, message", FACADE_CHECKS, ids=[c[0] for c in FACADE_CHECKS])
def test_each_facade_check_prevents_a_wrong_result(name, cfg, message):
    cp, batch, seq = 4, 1, 128
    ids, pos = _slots(batch, seq, 64, 48)
    with pytest.raises(ValueError, match=message):
        silent_failure_checks(
            qkv_layout=A.QKVLayout.THD_THD_THD,
            window_size=cfg["window"],
            context_parallel_strategy=A.CPStrategy[
                cfg["strategy"].upper().replace("ALLGATHER", "ALL_GATHER")
            ],
            context_parallel_causal_load_balanced=cfg["lb"],
            stripe_size=cfg["stripe"],
            cp_size=cp,
        )
    # without the check, TE's own code runs and returns a wrong result
    q, k, v, dout = _qkv(2, batch, seq, seq, 2, 1, jnp.float32)
    out, _ = _cp_fn(
        cp,
        cfg["strategy"],
        cfg["stripe"],
        cfg["window"],
        jnp.float32,
        batch,
        seq,
        4,
        load_balanced=cfg["lb"],
        backward=False,
    )(q, k, v, ids, pos, dout)
    want, _ = np_attention(
        q, k, v, np_visible(ids, ids, pos, pos, causal=True, window=cfg["window"] or (-1, -1)), 0.3
    )
    err = float(np.max(np.abs(np.asarray(out) - want)))
    assert err > 0.1, f"{name}: TE was right without the check (max error {err:.2e})"
