"""``tutorial_utils.te`` behaves like ``transformer_engine.jax`` (reference backend).

Enums, mask/layout helper methods, the ``SequenceDescriptor`` pytree (8 leaves, TE's order),
the three descriptor constructors agreeing with each other, the packed ``qkv`` forms,
``MeshResource`` and ``autocast``, and which backend answered.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tutorial_utils.reorder as reorder_mod
import tutorial_utils.te as te
from tutorial_utils.te import sharding
from tutorial_utils.te.attention import (
    AttnBiasType,
    AttnMaskType,
    AttnSoftmaxType,
    CPStrategy,
    QKVFormat,
    QKVLayout,
    ReorderStrategy,
    SequenceDescriptor,
    fused_attn,
    inverse_reorder_causal_load_balancing,
    is_fused_attn_kernel_available,
    reorder_causal_load_balancing,
)

TOL = dict(atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- enums


@pytest.mark.parametrize(
    "cls, members",
    [
        (AttnBiasType, {"NO_BIAS": 0, "PRE_SCALE_BIAS": 1, "POST_SCALE_BIAS": 2}),
        (
            AttnMaskType,
            {
                "NO_MASK": 0,
                "PADDING_MASK": 1,
                "CAUSAL_MASK": 2,
                "PADDING_CAUSAL_MASK": 3,
                "CAUSAL_BOTTOM_RIGHT_MASK": 4,
                "PADDING_CAUSAL_BOTTOM_RIGHT_MASK": 5,
            },
        ),
        (AttnSoftmaxType, {"VANILLA_SOFTMAX": 0, "OFF_BY_ONE_SOFTMAX": 1, "LEARNABLE_SOFTMAX": 2}),
        (QKVFormat, {"SBHD": 0, "BSHD": 1, "THD": 2}),
        (
            QKVLayout,
            {
                "BS3HD": 0,
                "BSHD_BS2HD": 1,
                "BSHD_BSHD_BSHD": 2,
                "T3HD": 3,
                "THD_T2HD": 4,
                "THD_THD_THD": 5,
            },
        ),
        (CPStrategy, {"DEFAULT": 0, "ALL_GATHER": 1, "RING": 2}),
        (ReorderStrategy, {"DualChunkSwap": 0, "Striped": 1}),
    ],
)
def test_enum_members_and_values(cls, members):
    assert {m.name: m.value for m in cls} == members
    assert list(cls.__members__) == list(members)  # order too, and no aliases


def test_reorder_names_are_the_package_ones():
    assert ReorderStrategy is reorder_mod.ReorderStrategy
    assert reorder_causal_load_balancing is reorder_mod.reorder_causal_load_balancing
    assert (
        inverse_reorder_causal_load_balancing is reorder_mod.inverse_reorder_causal_load_balancing
    )


@pytest.mark.parametrize(
    "mask, causal, padding, bottom_right",
    [
        (AttnMaskType.NO_MASK, False, False, False),
        (AttnMaskType.PADDING_MASK, False, True, False),
        (AttnMaskType.CAUSAL_MASK, True, False, False),
        (AttnMaskType.PADDING_CAUSAL_MASK, True, True, False),
        (AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, True, False, True),
        (AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK, True, True, True),
    ],
)
def test_mask_type_methods(mask, causal, padding, bottom_right):
    assert (mask.is_causal(), mask.is_padding(), mask.is_bottom_right()) == (
        causal,
        padding,
        bottom_right,
    )


@pytest.mark.parametrize(
    "layout, fmt, kind, thd",
    [
        (QKVLayout.BS3HD, QKVFormat.BSHD, "qkvpacked", False),
        (QKVLayout.BSHD_BS2HD, QKVFormat.BSHD, "kvpacked", False),
        (QKVLayout.BSHD_BSHD_BSHD, QKVFormat.BSHD, "separate", False),
        (QKVLayout.T3HD, QKVFormat.THD, "qkvpacked", True),
        (QKVLayout.THD_T2HD, QKVFormat.THD, "kvpacked", True),
        (QKVLayout.THD_THD_THD, QKVFormat.THD, "separate", True),
    ],
)
def test_qkv_layout_methods(layout, fmt, kind, thd):
    assert layout.get_qkv_format() is fmt
    assert layout.is_thd() is thd
    assert (layout.is_qkvpacked(), layout.is_kvpacked(), layout.is_separate()) == (
        kind == "qkvpacked",
        kind == "kvpacked",
        kind == "separate",
    )
    family = (
        (QKVLayout.T3HD, QKVLayout.THD_T2HD, QKVLayout.THD_THD_THD)
        if thd
        else (QKVLayout.BS3HD, QKVLayout.BSHD_BS2HD, QKVLayout.BSHD_BSHD_BSHD)
    )
    assert (layout.to_qkvpacked(), layout.to_kvpacked(), layout.to_separate()) == family


def test_softmax_type_from_str():
    assert AttnSoftmaxType.from_str("vanilla") is AttnSoftmaxType.VANILLA_SOFTMAX
    assert AttnSoftmaxType.from_str("off_by_one") is AttnSoftmaxType.OFF_BY_ONE_SOFTMAX
    assert AttnSoftmaxType.from_str("learnable") is AttnSoftmaxType.LEARNABLE_SOFTMAX
    with pytest.raises(ValueError, match=r"softmax_type='softer' is unknown"):
        AttnSoftmaxType.from_str("softer")


# ----------------------------------------------------------------------------- SequenceDescriptor


def test_sequence_descriptor_pytree_has_te_leaf_order():
    ids_q, ids_kv = jnp.full((2, 8), 1, jnp.int32), jnp.full((2, 8), 2, jnp.int32)
    pos_q, pos_kv = jnp.full((2, 8), 3, jnp.int32), jnp.full((2, 8), 4, jnp.int32)
    desc = SequenceDescriptor.from_segment_ids_and_pos((ids_q, ids_kv), (pos_q, pos_kv))
    leaves, treedef = jax.tree.flatten(desc)
    assert len(leaves) == 8
    # q/kv seqlens, q/kv offsets: size-0 1-D placeholders
    assert all(leaf.shape == (0,) for leaf in leaves[:4])
    assert [int(leaf[0, 0]) for leaf in leaves[4:]] == [1, 2, 3, 4]  # q ids, kv ids, q pos, kv pos
    back = jax.tree.unflatten(treedef, leaves)
    assert isinstance(back, SequenceDescriptor) and back.segment_ids[1] is ids_kv
    # jit sees it as a pytree of arrays
    total = jax.jit(lambda d: sum(jnp.sum(x) for x in jax.tree.leaves(d)))(desc)
    assert int(total) == 2 * 8 * (1 + 2 + 3 + 4)


def test_sequence_descriptor_constructors_fill_the_right_leaves():
    lens = jnp.array([5, 8])
    leaves = jax.tree.leaves(SequenceDescriptor.from_seqlens(lens))
    assert [leaf.shape for leaf in leaves] == [(2,), (2,)] + [(0,)] * 6
    seqlens = jnp.array([[3, 2, -1], [4, -1, -1]])
    offsets = jnp.array([[0, 4, -1], [1, -1, -1]])
    leaves = jax.tree.leaves(SequenceDescriptor.from_seqlens_and_offsets(seqlens, offsets))
    assert [leaf.shape for leaf in leaves] == [(2, 3)] * 4 + [(0,)] * 4
    single = SequenceDescriptor.from_segment_ids_and_pos(
        jnp.ones((2, 8), jnp.int32), jnp.zeros((2, 8), jnp.int32)
    )
    assert single.segment_ids[0] is single.segment_ids[1]  # one array is used for q and kv


_fused_jit = jax.jit(
    fused_attn,
    static_argnums=tuple(range(4, 11)),
    static_argnames=("max_segments_per_seq", "window_size", "return_max_logit"),
)


def _attn(qkv, desc, mask, layout, max_segments=1, **kw):
    return _fused_jit(
        qkv,
        None,
        desc,
        None,
        AttnBiasType.NO_BIAS,
        mask,
        layout,
        AttnSoftmaxType.VANILLA_SOFTMAX,
        0.3,
        0.0,
        False,
        max_segments_per_seq=max_segments,
        **kw,
    )


def _qkv(b=2, s=16, hq=4, hkv=2, d=8, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (
        jax.random.normal(ks[0], (b, s, hq, d)),
        jax.random.normal(ks[1], (b, s, hkv, d)),
        jax.random.normal(ks[2], (b, s, hkv, d)),
    )


def test_from_seqlens_bshd_matches_segment_ids_and_zeroes_padding():
    q, k, v = _qkv()
    lens = np.array([11, 16])
    out = _attn(
        (q, k, v),
        SequenceDescriptor.from_seqlens(jnp.asarray(lens)),
        AttnMaskType.PADDING_CAUSAL_MASK,
        QKVLayout.BSHD_BSHD_BSHD,
    )
    ar = np.arange(16)[None]
    ids = (ar < lens[:, None]).astype(np.int32)
    pos = np.broadcast_to(ar, (2, 16)).astype(np.int32)
    want = _attn(
        (q, k, v),
        SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids), jnp.asarray(pos)),
        AttnMaskType.PADDING_CAUSAL_MASK,
        QKVLayout.THD_THD_THD,
    )
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), **TOL)
    assert np.all(np.asarray(out)[0, 11:] == 0.0), "rows past the sequence length must be exactly 0"
    assert np.all(np.asarray(out)[0, :11] != 0.0)


def test_from_seqlens_and_offsets_matches_segment_ids():
    q, k, v = _qkv(seed=1)
    # row 0: segments [0,5) and [7,13); row 1: [2,6), [6,8), [9,16)   (start offsets only, -1
    # padded)
    seqlens = np.array([[5, 6, -1], [4, 2, 7]])
    offsets = np.array([[0, 7, -1], [2, 6, 9]])
    ids = np.zeros((2, 16), np.int32)
    pos = np.tile(np.arange(16, dtype=np.int32), (2, 1))
    for r in range(2):
        for n, (length, off) in enumerate(zip(seqlens[r], offsets[r]), start=1):
            if length > 0:
                ids[r, off : off + length] = n
                pos[r, off : off + length] = np.arange(length)
    desc_a = SequenceDescriptor.from_seqlens_and_offsets(jnp.asarray(seqlens), jnp.asarray(offsets))
    desc_b = SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids), jnp.asarray(pos))
    for window in (None, (2, 0)):
        a = _attn(
            (q, k, v),
            desc_a,
            AttnMaskType.PADDING_CAUSAL_MASK,
            QKVLayout.THD_THD_THD,
            3,
            window_size=window,
        )
        b = _attn(
            (q, k, v),
            desc_b,
            AttnMaskType.PADDING_CAUSAL_MASK,
            QKVLayout.THD_THD_THD,
            3,
            window_size=window,
        )
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)
        assert np.all(np.asarray(a)[ids == 0] == 0.0)


def test_packed_qkv_forms_agree():
    q, k, v = _qkv(hq=2, hkv=2, seed=2)
    sep = _attn((q, k, v), None, AttnMaskType.CAUSAL_MASK, QKVLayout.BSHD_BSHD_BSHD)
    kvp = _attn(
        (q, jnp.stack([k, v], axis=2)), None, AttnMaskType.CAUSAL_MASK, QKVLayout.BSHD_BS2HD
    )
    qkvp = _attn((jnp.stack([q, k, v], axis=2),), None, AttnMaskType.CAUSAL_MASK, QKVLayout.BS3HD)
    np.testing.assert_allclose(np.asarray(kvp), np.asarray(sep), **TOL)
    np.testing.assert_allclose(np.asarray(qkvp), np.asarray(sep), **TOL)


def test_no_mask_without_descriptor_is_plain_softmax_attention():
    q, k, v = _qkv(seed=3)
    out = _attn((q, k, v), None, AttnMaskType.NO_MASK, QKVLayout.BSHD_BSHD_BSHD)
    want = jax.nn.dot_product_attention(q, k, v, scale=0.3, implementation="xla")
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), **TOL)


def test_output_dtype_follows_query():
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(seed=4))
    out = _attn((q, k, v), None, AttnMaskType.CAUSAL_MASK, QKVLayout.BSHD_BSHD_BSHD)
    assert out.dtype == jnp.bfloat16 and out.shape == q.shape


def test_max_segments_warning_for_bshd():
    q, k, v = _qkv(seed=5)
    with pytest.warns(UserWarning, match=r"max_segments_per_seq=2 only applies to THD layouts"):
        fused_attn(
            (q, k, v),
            None,
            None,
            None,
            AttnBiasType.NO_BIAS,
            AttnMaskType.CAUSAL_MASK,
            QKVLayout.BSHD_BSHD_BSHD,
            AttnSoftmaxType.VANILLA_SOFTMAX,
            0.3,
            0.0,
            False,
            max_segments_per_seq=2,
        )


def test_is_fused_attn_kernel_available_keywords():
    base = dict(
        is_training=True,
        batch_size=2,
        q_dtype=jnp.bfloat16,
        kv_dtype=jnp.bfloat16,
        qkv_layout=QKVLayout.THD_THD_THD,
        attn_bias_type=AttnBiasType.NO_BIAS,
        attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
        softmax_type=AttnSoftmaxType.VANILLA_SOFTMAX,
        dropout_probability=0.0,
        q_num_heads=16,
        kv_num_heads=4,
        q_max_seqlen=2048,
        kv_max_seqlen=2048,
        head_dim_qk=32,
        head_dim_v=32,
        window_size=(256, 0),
    )
    assert is_fused_attn_kernel_available(**base) is True
    assert is_fused_attn_kernel_available(**{**base, "kv_num_heads": 3}) is False
    assert is_fused_attn_kernel_available(**{**base, "window_size": (-2, 0)}) is False
    assert is_fused_attn_kernel_available(**{**base, "dropout_probability": 0.1}) is False


def test_return_max_logit_dtype_follows_output():
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(seed=6))
    out, max_logit = _attn(
        (q, k, v), None, AttnMaskType.CAUSAL_MASK, QKVLayout.BSHD_BSHD_BSHD, return_max_logit=True
    )
    assert max_logit.shape == (q.shape[2],)
    assert max_logit.dtype == out.dtype == jnp.bfloat16


# ----------------------------------------------------------------------------- MeshResource, autoca


def test_mesh_resource_field_order():
    names = [f.name for f in dataclasses.fields(te.MeshResource)]
    assert names == [
        "dp_resource",
        "tp_resource",
        "tpsp_resource",
        "fsdp_resource",
        "pp_resource",
        "cp_resource",
        "ep_resource",
    ]
    assert all(f.default is None for f in dataclasses.fields(te.MeshResource))
    positional = te.MeshResource("dp", "cp")  # the classic mistake: "cp" lands on tp_resource
    assert positional.tp_resource == "cp" and positional.cp_resource is None


def test_autocast_sets_and_restores_global_resource():
    with pytest.raises(ValueError, match=r"No global MeshResource is set"):
        sharding.global_mesh_resource()
    outer = te.MeshResource(cp_resource="cp")
    inner = te.MeshResource(dp_resource="dp", cp_resource="seq")
    with te.autocast(mesh_resource=outer):
        assert sharding.global_mesh_resource() is outer
        with te.autocast(mesh_resource=inner):
            assert sharding.global_mesh_resource().cp_resource == "seq"
        assert sharding.global_mesh_resource() is outer
        with pytest.raises(RuntimeError):
            with te.autocast(mesh_resource=inner):
                raise RuntimeError("boom")
        assert sharding.global_mesh_resource() is outer  # restored after an exception too
    with pytest.raises(ValueError, match=r"No global MeshResource is set"):
        sharding.global_mesh_resource()
    with te.autocast():
        assert sharding.global_mesh_resource() == te.MeshResource()


def test_cp_axis_lookup_without_mesh_means_no_cp():
    with te.autocast(mesh_resource=te.MeshResource(cp_resource="cp")):
        mesh, axis, size = sharding.cp_axis_and_size("")
    assert (mesh, axis, size) == (None, "", 1)


def test_backend_is_reference():
    assert "reference" in te.backend_name()
    assert te.using_real_te() is False
