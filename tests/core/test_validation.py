"""Bad inputs raise ``ValueError`` naming the parameter and the offending value; good inputs pass.

Most of these are inputs on which TransformerEngine does not raise but silently computes a
different attention (semantics notes §6.6); the rest are ordinary argument errors.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import tutorial_utils.te as te
from tutorial_utils.context_parallel import context_parallel_attention
from tutorial_utils.inputs import pack_segments
from tutorial_utils.perfmodel.workload import PRESETS, workload_segments
from tutorial_utils.reference import MaskSpec, blockwise_attention, dense_attention
from tutorial_utils.te.attention import (
    AttnBiasType,
    AttnMaskType,
    AttnSoftmaxType,
    CPStrategy,
    QKVLayout,
    SequenceDescriptor,
    fused_attn,
    static_checks,
)
from tutorial_utils.validation import (
    check_divisible_seq,
    check_gqa_heads,
    check_ulysses_heads,
    check_window,
    first_violation,
    validate_packed_inputs,
)


def row(*ids):
    """One-row ids with positions counting from 0 inside each segment (padding keeps counting)."""
    ids = np.array([ids], np.int32)
    pos = np.zeros_like(ids)
    start = 0
    for t in range(1, ids.shape[1] + 1):
        if t == ids.shape[1] or (ids[0, t] != ids[0, t - 1] and ids[0, t] != 0):
            pos[0, start:t] = np.arange(t - start)
            start = t
    return ids, pos


# ----------------------------------------------------------------------------- windows, heads, leng


@pytest.mark.parametrize(
    "window, pattern",
    [
        ((1, 2, 3), r"window_size=\(1, 2, 3\) is not a \(left, right\) pair"),
        (8, r"window_size=8 is not a \(left, right\) pair"),
        ((-2, 0), r"window_size=\(-2, 0\): the left bound -2 is negative; use -1 for unbounded"),
        ((4, -3), r"window_size=\(4, -3\): the right bound -3 is negative"),
        ((1.5, 0), r"window_size=\(1.5, 0\): the left bound must be an int .*got 1.5"),
        ((0, True), r"window_size=\(0, True\): the right bound must be an int"),
    ],
)
def test_bad_window(window, pattern):
    with pytest.raises(ValueError, match=pattern):
        check_window(window)


def test_window_normalisation():
    assert check_window(None) == (-1, -1)
    assert check_window([np.int64(8), 0]) == (8, 0)
    with pytest.raises(ValueError, match=r"Workload.window=\(-5, 0\)"):
        check_window((-5, 0), name="Workload.window")


def test_gqa_heads_not_divisible():
    with pytest.raises(ValueError, match=r"num_kv_heads=4 does not divide num_q_heads=6"):
        check_gqa_heads(6, 4)
    q = jnp.zeros((1, 8, 6, 4))
    k = jnp.zeros((1, 8, 4, 4))
    ids = jnp.ones((1, 8), jnp.int32)
    pos = jnp.arange(8)[None]
    with pytest.raises(
        ValueError, match=r"kv heads \(k.shape\[2\]\)=4 does not divide num_q_heads=6"
    ):
        dense_attention(q, k, k, ids, ids, pos, pos, scale=1.0)
    with pytest.raises(
        ValueError, match=r"kv heads \(k.shape\[2\]\)=4 does not divide num_q_heads=6"
    ):
        blockwise_attention(q, k, k, ids, ids, pos, pos, scale=1.0)
    assert check_gqa_heads(8, 2) == 4


def test_ulysses_heads_not_divisible():
    with pytest.raises(ValueError, match=r"num_q_heads=6 is not divisible by cp_size=4"):
        check_ulysses_heads(6, 2, 4)
    with pytest.raises(ValueError, match=r"num_kv_heads=2 is not divisible by cp_size=4"):
        check_ulysses_heads(8, 2, 4)


def test_seq_not_divisible():
    with pytest.raises(
        ValueError, match=r"seq_len=100 is not divisible by cp_size\*stripe_size=4\*8=32"
    ):
        check_divisible_seq(100, 4, 8)


def test_block_size_must_be_positive():
    x = jnp.zeros((1, 8, 2, 4))
    ids = jnp.ones((1, 8), jnp.int32)
    pos = jnp.arange(8)[None]
    with pytest.raises(ValueError, match=r"block_q must be a positive int, got block_q=0"):
        blockwise_attention(x, x, x, ids, ids, pos, pos, scale=1.0, block_q=0)
    with pytest.raises(ValueError, match=r"block_kv must be a positive int, got block_kv=2.5"):
        blockwise_attention(x, x, x, ids, ids, pos, pos, scale=1.0, block_kv=2.5)
    with pytest.raises(ValueError, match=r"window_size=\(-2, -1\)"):
        MaskSpec(window=(-2, -1))


# ----------------------------------------------------------------------------- context_parallel_att


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()[:4]), ("cp",))


def _cp_args(s=64, hq=4, hkv=2):
    q = jnp.zeros((1, s, hq, 8))
    k = jnp.zeros((1, s, hkv, 8))
    return q, k, k, jnp.ones((1, s), jnp.int32), jnp.arange(s, dtype=jnp.int32)[None]


def test_cp_ulysses_heads(mesh):
    with pytest.raises(ValueError, match=r"num_kv_heads=2 is not divisible by cp_size=4"):
        context_parallel_attention(*_cp_args(), mesh=mesh, strategy="ulysses")


def test_cp_seq_not_divisible(mesh):
    with pytest.raises(
        ValueError, match=r"q.shape\[1\]=48 is not divisible by cp_size\*stripe_size=4\*8=32"
    ):
        context_parallel_attention(*_cp_args(s=48), mesh=mesh, strategy="allgather", stripe_size=8)


def test_cp_ring_stripe(mesh):
    with pytest.raises(
        ValueError, match=r"stripe_size=2 with strategy='ring'.*requires stripe_size=1"
    ):
        context_parallel_attention(*_cp_args(), mesh=mesh, strategy="ring", stripe_size=2)


def test_cp_other_argument_errors(mesh):
    with pytest.raises(ValueError, match=r"strategy='tree' is unknown"):
        context_parallel_attention(*_cp_args(), mesh=mesh, strategy="tree")
    with pytest.raises(ValueError, match=r"axis_name='sp' is not an axis of the mesh"):
        context_parallel_attention(*_cp_args(), mesh=mesh, axis_name="sp")
    with pytest.raises(ValueError, match=r"mesh=None but no mesh is active"):
        context_parallel_attention(*_cp_args())
    q, k, v, ids, pos = _cp_args()
    with pytest.raises(ValueError, match=r"segment_ids/segment_pos must have shape \(1, 64\)"):
        context_parallel_attention(q, k, v, ids[:, :32], pos, mesh=mesh)
    with pytest.raises(ValueError, match=r"window_size=\(3, 0, 0\) is not a \(left, right\) pair"):
        context_parallel_attention(q, k, v, ids, pos, mesh=mesh, window_size=(3, 0, 0))


# ----------------------------------------------------------------------------- packed THD precondit


def test_ring_window_too_narrow():
    ids, pos = row(*([1] * 16))
    with pytest.raises(
        ValueError,
        match=r"window_size=\(2, 0\) with strategy='ring' and cp_size=4.*left >= cp_size-1 = 3",
    ):
        validate_packed_inputs(
            ids, pos, max_segments_per_seq=1, cp_size=4, strategy="ring", window_size=(2, 0)
        )
    validate_packed_inputs(
        ids, pos, max_segments_per_seq=1, cp_size=4, strategy="ring", window_size=(3, 0)
    )
    validate_packed_inputs(
        ids, pos, max_segments_per_seq=1, cp_size=4, strategy="ring", window_size=None
    )
    with pytest.raises(ValueError, match=r"window_size=\(-1, 0\) with strategy='ring'.*=None"):
        validate_packed_inputs(
            ids, pos, max_segments_per_seq=1, cp_size=4, strategy="ring", window_size=(-1, 0)
        )


def test_ring_stripe_in_validator():
    ids, pos = row(*([1] * 16))
    with pytest.raises(ValueError, match=r"stripe_size=2 with strategy='ring'"):
        validate_packed_inputs(
            ids, pos, max_segments_per_seq=1, cp_size=4, stripe_size=2, strategy=CPStrategy.RING
        )


def test_ids_with_gap():
    ids, pos = row(1, 1, 1, 3, 3, 0, 0, 0)
    with pytest.raises(
        ValueError,
        match=r"segment_ids row 0 has ids in order of appearance \[1, 3\].*expected \[1, 2\]",
    ):
        validate_packed_inputs(ids, pos, max_segments_per_seq=3)


def test_ids_out_of_order():
    ids, pos = row(2, 2, 2, 1, 1, 0, 0, 0)
    with pytest.raises(ValueError, match=r"order of appearance \[2, 1\]"):
        validate_packed_inputs(ids, pos, max_segments_per_seq=2)


def test_id_above_max_segments():
    ids, pos = row(1, 1, 2, 2, 3, 3, 0, 0)
    with pytest.raises(ValueError, match=r"segment_ids row 0 uses id 3 > max_segments_per_seq=2"):
        validate_packed_inputs(ids, pos, max_segments_per_seq=2)


def test_non_contiguous_segment():
    ids = np.array([[1, 1, 0, 1, 2, 2, 0, 0]], np.int32)
    pos = np.array([[0, 1, 2, 3, 0, 1, 2, 3]], np.int32)
    with pytest.raises(ValueError, match=r"segment_ids row 0: segment 1 is not contiguous"):
        validate_packed_inputs(ids, pos, max_segments_per_seq=2)


def test_positions_not_from_zero():
    ids, pos = row(1, 1, 1, 1, 2, 2, 0, 0)
    pos = pos.copy()
    pos[0, 4:6] = [1, 2]
    with pytest.raises(
        ValueError,
        match=r"segment_pos row 0, segment 2: token 0 of the segment has pos 1, expected 0",
    ):
        validate_packed_inputs(ids, pos, max_segments_per_seq=2)


def test_allgather_hidden_run_start():
    ids, pos = row(*([1] * 6 + [2] * 6 + [0] * 4))
    with pytest.raises(
        ValueError,
        match=r"strategy='allgather', cp_size=4, stripe_size=2: row 0, token 8 "
        r"\(segment 2, position 2\) lands on rank 0",
    ):
        validate_packed_inputs(
            ids, pos, max_segments_per_seq=2, cp_size=4, stripe_size=2, strategy="allgather"
        )
    # the same rows are fine for Ring (stripe 1) and without CP
    validate_packed_inputs(
        ids, pos, max_segments_per_seq=2, cp_size=4, strategy="ring", window_size=None
    )
    validate_packed_inputs(ids, pos, max_segments_per_seq=2)


def test_allgather_accepts_te_deep_dive_layout_with_unaligned_start():
    """TE's own example (a document starting at token 21, cp 4, stripe 4): TE computes it
    exactly."""
    ids = np.array([[1] * 8 + [0] * 13 + [2] * 32 + [0] * 11], np.int32)
    pos = np.array([list(range(21)) + list(range(32)) + [0] * 11], np.int32)
    validate_packed_inputs(
        ids, pos, max_segments_per_seq=3, cp_size=4, stripe_size=4, strategy="allgather"
    )


def test_allgather_rejects_aligned_slots_whose_padding_restarts_at_zero():
    """Slot-aligned segments are not enough: padding positions 0, 1, ... can hide a run start.

    Rank 1 holds tokens 13 (segment 2, pos 1), 17 (padding, pos 0) and 21 (segment 3, pos 1):
    pos 0 -> 1 looks like one run, so TE misses segment 3's start there (TE-on-CPU: error 1.75).
    """
    ids = np.array([[1] * 12 + [2] * 5 + [0] * 3 + [3] * 12], np.int32)
    pos = np.array([list(range(12)) + list(range(5)) + [0, 1, 2] + list(range(12))], np.int32)
    with pytest.raises(
        ValueError,
        match=r"cp_size=4, stripe_size=1: row 0, token 21 \(segment 3, position 1\) "
        r"lands on rank 1 and would attend keys none instead of 20..21",
    ):
        validate_packed_inputs(
            ids, pos, max_segments_per_seq=3, cp_size=4, stripe_size=1, strategy="allgather"
        )
    keep_counting = pos.copy()
    keep_counting[0, 17:20] = [5, 6, 7]
    validate_packed_inputs(
        ids, keep_counting, max_segments_per_seq=3, cp_size=4, stripe_size=1, strategy="allgather"
    )


@pytest.mark.parametrize(
    "ids, pos, kw, pattern",
    [
        (
            np.array([[1, 1, -1, 0]]),
            np.array([[0, 1, 2, 3]]),
            {},
            r"segment_ids\[0, 2\]=-1 is negative",
        ),
        (
            np.array([1, 1, 0, 0]),
            np.array([0, 1, 2, 3]),
            {},
            r"segment_ids must be 2-D \[batch, seq\], got shape \(4,\)",
        ),
        (
            np.ones((1, 8), np.int32),
            np.zeros((1, 4), np.int32),
            {},
            r"segment_pos has shape \(1, 4\) but segment_ids has shape \(1, 8\)",
        ),
        (
            np.ones((1, 4), np.float32),
            np.zeros((1, 4), np.int32),
            {},
            r"must be integer arrays, got float32/int32",
        ),
        (
            np.ones((1, 4), np.int32),
            np.arange(4)[None],
            {"max_segments_per_seq": 0},
            r"max_segments_per_seq=0 must be a positive int",
        ),
        (
            np.ones((1, 12), np.int32),
            np.arange(12)[None],
            {"cp_size": 4, "stripe_size": 2},
            r"segment_ids.shape\[1\]=12 is not divisible by cp_size\*stripe_size=4\*2=8",
        ),
        (
            np.ones((1, 8), np.int32),
            np.arange(8)[None],
            {"stripe_size": 0},
            r"stripe_size=0 must be a positive int",
        ),
        (
            np.ones((1, 8), np.int32),
            np.arange(8)[None],
            {"strategy": "mesh"},
            r"strategy='mesh' is unknown",
        ),
        (
            np.ones((1, 8), np.int32),
            np.arange(8)[None],
            {"window_size": (-3, 0)},
            r"window_size=\(-3, 0\)",
        ),
        (
            np.ones((1, 8), np.int32),
            np.arange(8)[None],
            {"cp_size": 4, "strategy": "ulysses", "num_q_heads": 6, "num_kv_heads": 2},
            r"num_q_heads=6 is not divisible by cp_size=4",
        ),
    ],
)
def test_validator_argument_errors(ids, pos, kw, pattern):
    kw = {"max_segments_per_seq": 1, **kw}
    with pytest.raises(ValueError, match=pattern):
        validate_packed_inputs(ids, pos, **kw)


@pytest.mark.parametrize("name", ["seed", "cpu", "tiny"])
def test_presets_are_valid_for_both_te_strategies(name):
    wl = PRESETS[name]
    ids, pos = workload_segments(wl)
    common = dict(
        max_segments_per_seq=wl.max_segments_per_seq, cp_size=wl.cp_size, window_size=wl.window
    )
    assert (
        first_violation(ids, pos, stripe_size=wl.stripe_size, strategy="allgather", **common)
        is None
    )
    assert (
        first_violation(ids, pos, stripe_size=wl.ring_stripe_size, strategy="ring", **common)
        is None
    )
    msg = first_violation(ids, pos, stripe_size=2, strategy="ring", **common)
    assert msg is not None and "stripe_size=2" in msg


def test_packed_aligned_rows_pass_allgather():
    ids, pos = pack_segments([[5, 17, 1], [30]], 64, align=8)
    validate_packed_inputs(
        ids, pos, max_segments_per_seq=3, cp_size=4, stripe_size=2, strategy="allgather"
    )


# ----------------------------------------------------------------------------- the facade


def _qkv(s=16, hq=4, hkv=2):
    q = jnp.ones((1, s, hq, 8))
    k = jnp.ones((1, s, hkv, 8))
    return q, k, k


def _fused(
    qkv=None,
    desc=None,
    layout=QKVLayout.THD_THD_THD,
    softmax=AttnSoftmaxType.VANILLA_SOFTMAX,
    mask=AttnMaskType.PADDING_CAUSAL_MASK,
    dropout=0.0,
    training=False,
    **kw,
):
    if desc is None:
        desc = SequenceDescriptor.from_segment_ids_and_pos(
            jnp.ones((1, 16), jnp.int32), jnp.arange(16)[None]
        )
    return fused_attn(
        qkv or _qkv(),
        None,
        desc,
        None,
        AttnBiasType.NO_BIAS,
        mask,
        layout,
        softmax,
        0.35,
        dropout,
        training,
        **kw,
    )


def test_segment_pos_required():
    with pytest.raises(ValueError, match=r"segment_pos=None: segment positions are required"):
        SequenceDescriptor.from_segment_ids_and_pos(jnp.ones((1, 16), jnp.int32))
    with pytest.raises(ValueError, match=r"segment_ids tuple must be \(q, kv\), got length 3"):
        SequenceDescriptor.from_segment_ids_and_pos((jnp.ones((1, 4)),) * 3, jnp.zeros((1, 4)))


def test_qkv_tuple_length_must_match_layout():
    with pytest.raises(ValueError, match=r"qkv has 2 tensors but qkv_layout=THD_THD_THD needs 3"):
        _fused(qkv=_qkv()[:2])
    with pytest.raises(ValueError, match=r"qkv has 3 tensors but qkv_layout=BSHD_BS2HD needs 2"):
        _fused(layout=QKVLayout.BSHD_BS2HD, desc=None, mask=AttnMaskType.CAUSAL_MASK)
    with pytest.raises(
        ValueError,
        match=r"qkv must be a tuple \(packed,\), \(q, kv\) or \(q, k, v\); got list of length 4",
    ):
        _fused(qkv=list(_qkv()) + [None])


def test_learnable_softmax_needs_offset():
    with pytest.raises(ValueError, match=r"softmax_type=LEARNABLE_SOFTMAX needs softmax_offset"):
        _fused(softmax=AttnSoftmaxType.LEARNABLE_SOFTMAX)
    with pytest.raises(ValueError, match=r"softmax_offset has 3 elements, expected num_q_heads=4"):
        _fused(softmax=AttnSoftmaxType.LEARNABLE_SOFTMAX, softmax_offset=jnp.zeros((1, 3, 1, 1)))


def test_dropout_with_training():
    with pytest.raises(ValueError, match=r"dropout_probability=0.1 with is_training=True"):
        _fused(dropout=0.1, training=True)
    with pytest.raises(ValueError, match=r"dropout_probability=1.5 must be a float in \[0, 1\)"):
        _fused(dropout=1.5)


def test_fused_attn_other_argument_errors():
    with pytest.raises(ValueError, match=r"expected a AttnMaskType member, got 'causal'"):
        fused_attn(
            _qkv(),
            None,
            None,
            None,
            AttnBiasType.NO_BIAS,
            "causal",
            QKVLayout.BSHD_BSHD_BSHD,
            AttnSoftmaxType.VANILLA_SOFTMAX,
            1.0,
            0.0,
            False,
        )
    with pytest.raises(ValueError, match=r"score_mod is not supported by the reference backend"):
        _fused(score_mod=lambda s: s)
    with pytest.raises(ValueError, match=r"window_size=\(-2, 0\)"):
        _fused(window_size=(-2, 0))
    with pytest.raises(
        ValueError, match=r"kv heads \(k.shape\[2\]\)=3 does not divide num_q_heads=4"
    ):
        _fused(qkv=_qkv(hkv=3))
    with pytest.raises(ValueError, match=r"max_segments_per_seq=0 must be a positive int"):
        _fused(max_segments_per_seq=0)
    with pytest.raises(
        ValueError, match=r"sequence_descriptor must be a SequenceDescriptor or None, got ndarray"
    ):
        _fused(desc=np.ones((1, 16)))
    with pytest.raises(ValueError, match=r"context_parallel_axis='cp' but no mesh is active"):
        _fused(context_parallel_axis="cp")


STATIC = dict(
    attn_bias_type=AttnBiasType.NO_BIAS,
    attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
    qkv_layout=QKVLayout.THD_THD_THD,
    softmax_type=AttnSoftmaxType.VANILLA_SOFTMAX,
    dropout_probability=0.0,
    max_segments_per_seq=4,
    window_size=(8, 0),
    context_parallel_strategy=CPStrategy.ALL_GATHER,
    context_parallel_causal_load_balanced=True,
    stripe_size=4,
    cp_size=4,
)


@pytest.mark.parametrize(
    "changes, pattern",
    [
        (
            dict(context_parallel_strategy=CPStrategy.RING, stripe_size=2),
            r"stripe_size=2 with CPStrategy.RING",
        ),
        (
            dict(context_parallel_strategy=CPStrategy.RING, stripe_size=1, window_size=(2, 0)),
            (
                r"window_size=\(2, 0\) with CPStrategy.RING and cp_size=4: the left window must be"
                r" >= cp_size-1=3"
            ),
        ),
        (dict(stripe_size=None), r"stripe_size=None with THD AllGather context parallelism"),
        (
            dict(context_parallel_causal_load_balanced=False),
            r"context_parallel_causal_load_balanced=False with THD AllGather",
        ),
        (
            dict(attn_bias_type=AttnBiasType.POST_SCALE_BIAS),
            r"attn_bias_type=POST_SCALE_BIAS is not supported with context parallelism",
        ),
        (
            dict(softmax_type=AttnSoftmaxType.OFF_BY_ONE_SOFTMAX),
            r"softmax_type=OFF_BY_ONE_SOFTMAX is not supported",
        ),
        (dict(qkv_layout=QKVLayout.T3HD), r"qkv_layout=T3HD \(packed QKV\) is not supported"),
        (
            dict(attn_mask_type=AttnMaskType.CAUSAL_MASK),
            r"attn_mask_type=CAUSAL_MASK is not supported for THD layouts",
        ),
        (
            dict(
                qkv_layout=QKVLayout.BSHD_BSHD_BSHD,
                attn_mask_type=AttnMaskType.CAUSAL_MASK,
                stripe_size=None,
                window_size=(8, 0),
            ),
            r"window_size=\(8, 0\) with a BSHD layout",
        ),
        (
            dict(qkv_layout=QKVLayout.BSHD_BSHD_BSHD, attn_mask_type=AttnMaskType.CAUSAL_MASK),
            r"stripe_size=4 with a BSHD layout",
        ),
        (
            dict(
                qkv_layout=QKVLayout.BSHD_BSHD_BSHD,
                attn_mask_type=AttnMaskType.CAUSAL_MASK,
                stripe_size=None,
                window_size=None,
                max_segments_per_seq=2,
            ),
            r"max_segments_per_seq=2 with a BSHD layout",
        ),
        (
            dict(dropout_probability=0.2),
            r"dropout_probability=0.2 is not supported with context parallelism",
        ),
    ],
)
def test_static_cp_checks(changes, pattern):
    static_checks((1, 64, 4, 8), (1, 64, 2, 8), **STATIC)  # the baseline is valid
    with pytest.raises(ValueError, match=pattern):
        static_checks((1, 64, 4, 8), (1, 64, 2, 8), **{**STATIC, **changes})


def test_autocast_rejects_quantisation_recipes():
    with pytest.raises(ValueError, match=r"autocast\(enabled=True"):
        with te.autocast(enabled=True):
            pass
