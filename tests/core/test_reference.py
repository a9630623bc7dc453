"""The single-device reference (dense and blockwise) against independent oracles.

* ``jax.nn.dot_product_attention(..., implementation="xla")`` with a boolean mask built in numpy
  (``tests/helpers.py``, not with ``reference.visibility``), on rows that see at least one key;
* a float64 numpy formula (``helpers.np_attention``) for the off-by-one / learnable ("sink")
  softmax and the bottom-right masks;
* dense vs blockwise (outputs, LSE, max logit, and every gradient, including the LSE
  cotangent and the learnable sink) for block sizes that do and do not divide the length.

Rows that see no key (padding, or a query whose segment has no visible key) must be exactly
0 in the output and in dQ; keys that no query sees (padding keys included) get exactly 0 dK, dV.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import np_attention, np_visible, oracle_fn, random_layout

import tutorial_utils.te as te
from tutorial_utils.reference import (
    LSE_EMPTY,
    MaskSpec,
    block_needed,
    blockwise_attention,
    dense_attention,
)
from tutorial_utils.te.attention import (
    AttnBiasType,
    AttnMaskType,
    AttnSoftmaxType,
    QKVLayout,
    SequenceDescriptor,
    fused_attn,
)

D = 16
TOL = dict(atol=1e-5, rtol=1e-5)  # fp32 everywhere in this file

# fused_attn under jit (enums, scale, dropout, flags and the keyword options are static)
fused_attn_jit = jax.jit(
    fused_attn,
    static_argnums=tuple(range(4, 11)),
    static_argnames=("max_segments_per_seq", "window_size", "return_max_logit"),
)


# ----------------------------------------------------------------------------- data and independent


def qkv_arrays(seed, b, sq, skv, hq, hkv, d=D, dtype=jnp.float32):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    return (
        jax.random.normal(ks[0], (b, sq, hq, d), dtype),
        jax.random.normal(ks[1], (b, skv, hkv, d), dtype),
        jax.random.normal(ks[2], (b, skv, hkv, d), dtype),
        jax.random.normal(ks[3], (b, sq, hq, d), dtype),
    )


# ----------------------------------------------------------------------------- reference vs jax.nn

# (name, batch, sq, skv, hq, hkv, causal, window, padding, kv_layout, block_q, block_kv)
#   kv_layout: "self" (same ids/pos), "shift" (kv pos +2: early queries see no key), "other" (own
#   layout)
ORACLE_CASES = [
    ("causal-full-mha", 2, 48, 48, 4, 4, True, (-1, -1), True, "self", 16, 16),
    ("causal-inf-left-gqa2-shift", 2, 48, 48, 4, 2, True, (-1, 0), True, "shift", 16, 32),
    ("causal-swa5-gqa4", 2, 48, 48, 4, 1, True, (5, 0), True, "self", 32, 16),
    ("causal-self-only-b1", 1, 64, 64, 4, 2, True, (0, 0), True, "self", 24, 40),
    ("noncausal-full", 2, 48, 48, 4, 4, False, (-1, -1), True, "self", 16, 16),
    ("noncausal-3-2-gqa2-shift", 2, 48, 48, 4, 2, False, (3, 2), True, "shift", 16, 32),
    ("noncausal-self-only-gqa4-b1", 1, 48, 48, 4, 1, False, (0, 0), True, "self", 48, 48),
    ("noncausal-right-only", 2, 48, 48, 4, 2, False, (-1, 4), True, "self", 7, 13),
    ("causal-7-3-gqa4-shift", 2, 48, 48, 4, 1, True, (7, 3), True, "shift", 16, 16),
    ("causal-no-padding-mask", 2, 48, 48, 4, 2, True, (-1, -1), False, "self", 16, 32),
    ("noncausal-6-inf-b1", 1, 64, 64, 4, 1, False, (6, -1), True, "self", 32, 32),
    ("cross-lengths-causal-swa", 2, 40, 56, 4, 2, True, (4, 0), True, "other", 16, 16),
]


def _draw(rng, case):
    _, b, sq, skv, hq, hkv, causal, window, padding, kv_layout, _, _ = case
    ids, pos = random_layout(rng, b, sq, empty_last_row=bool(rng.integers(0, 2)) and b > 1)
    if not padding:
        ids, pos = np.ones_like(ids), np.tile(np.arange(sq, dtype=np.int32), (b, 1))
    if kv_layout == "self":
        ids_kv, pos_kv = ids, pos
    elif kv_layout == "shift":
        ids_kv, pos_kv = ids, pos + 2
    else:
        ids_kv, pos_kv = random_layout(rng, b, skv)
    return ids, ids_kv, pos, pos_kv


@functools.cache
def _impl_fns(spec, scale, block_q, block_kv):
    def run(attn, q, k, v, iq, ik, pq, pk, dout):
        def loss(q, k, v):
            out, lse = attn(q, k, v, iq, ik, pq, pk)
            return jnp.sum(out * dout), (out, lse)

        (_, (out, lse)), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
        return out, lse, grads

    dense = functools.partial(dense_attention, scale=scale, spec=spec)
    block = functools.partial(
        blockwise_attention, scale=scale, spec=spec, block_q=block_q, block_kv=block_kv
    )
    return {
        "dense": jax.jit(functools.partial(run, dense)),
        "blockwise": jax.jit(functools.partial(run, block)),
    }


@pytest.mark.parametrize("case", ORACLE_CASES, ids=[c[0] for c in ORACLE_CASES])
def test_reference_matches_jax_oracle(case):
    name, b, sq, skv, hq, hkv, causal, window, padding, _, bq, bk = case
    scale = 0.37  # deliberately not 1/sqrt(d): the scale must be passed through
    spec = MaskSpec(padding=padding, causal=causal, window=window)
    fns, oracle = _impl_fns(spec, scale, bq, bk), oracle_fn(scale)
    rng = np.random.default_rng(sum(map(ord, name)))
    saw_empty_row = False
    for draw in range(3):
        q, k, v, dout = qkv_arrays(100 * draw + len(name), b, sq, skv, hq, hkv)
        ids, ids_kv, pos, pos_kv = _draw(rng, case)
        mask = np_visible(ids, ids_kv, pos, pos_kv, causal=causal, window=window, padding=padding)
        has = mask.any(-1)  # [b, sq]: rows that see at least one key
        seen = mask.any(1)  # [b, skv]: keys that some query sees
        saw_empty_row |= bool((~has).any())
        # The oracle's key-less rows are a uniform average: give them no cotangent.
        out_o, grads_o = oracle(q, k, v, jnp.asarray(mask), dout * has[:, :, None, None])
        _, s64 = np_attention(q, k, v, mask, scale)
        with np.errstate(divide="ignore"):
            lse64 = np.log(np.where(mask[:, None], np.exp(s64), 0.0).sum(-1))  # [b, h, sq]
        for impl, fn in fns.items():
            out, lse, (dq, dk, dv) = fn(
                q, k, v, *(jnp.asarray(a) for a in (ids, ids_kv, pos, pos_kv)), dout
            )
            out, lse, dq, dk, dv = map(np.asarray, (out, lse, dq, dk, dv))
            np.testing.assert_allclose(
                out[has], np.asarray(out_o)[has], err_msg=f"{impl} output", **TOL
            )
            assert np.all(out[~has] == 0.0), f"{impl}: key-less rows must be exactly 0"
            hq_has = np.broadcast_to(has[:, None, :], lse.shape)
            np.testing.assert_allclose(lse[hq_has], lse64[hq_has], err_msg=f"{impl} lse", **TOL)
            assert np.all(lse[~hq_has] == np.float32(LSE_EMPTY))
            # dout is non-zero on key-less rows too: they must still get and give exactly 0.
            for got, want, what in (
                (dq, grads_o[0], "dq"),
                (dk, grads_o[1], "dk"),
                (dv, grads_o[2], "dv"),
            ):
                np.testing.assert_allclose(got, np.asarray(want), err_msg=f"{impl} {what}", **TOL)
            assert np.all(dq[~has] == 0.0), f"{impl}: dQ of key-less rows must be exactly 0"
            assert np.all(dk[~seen] == 0.0) and np.all(dv[~seen] == 0.0), (
                f"{impl}: unseen keys need exactly 0 dK, dV"
            )
            if padding:
                assert np.all(dk[ids_kv == 0] == 0.0) and np.all(dv[ids_kv == 0] == 0.0)
                assert np.all(out[ids == 0] == 0.0) and np.all(dq[ids == 0] == 0.0)
    if padding:
        assert saw_empty_row, "the draws should include key-less rows"


# ----------------------------------------------------------------------------- dense vs blockwise

# (block_q, block_kv, causal, window, use_sink, kv_shift)
BLOCK_CASES = [
    (16, 16, True, (9, 0), True, 0),
    (24, 40, False, (5, 3), True, 0),  # neither divides 64
    (7, 13, True, (-1, -1), False, 2),  # key-less early rows
    (64, 64, True, (0, 0), False, 0),  # one block
    (128, 96, False, (-1, -1), True, 0),  # larger than the sequence: clamped
    (48, 20, True, (6, 0), True, 2),
]


@pytest.mark.parametrize("bq, bk, causal, window, use_sink, shift", BLOCK_CASES)
def test_dense_and_blockwise_agree(bq, bk, causal, window, use_sink, shift):
    b, s, hq, hkv = 2, 64, 4, 2
    scale = D**-0.5
    spec = MaskSpec(causal=causal, window=window)
    rng = np.random.default_rng(bq * 1000 + bk)
    ids, pos = random_layout(rng, b, s)
    args = tuple(jnp.asarray(a) for a in (ids, ids, pos, pos + shift))
    q, k, v, dout = qkv_arrays(bq + bk, b, s, s, hq, hkv)
    w = jax.random.normal(jax.random.PRNGKey(7), (b, hq, s))  # LSE cotangent, also on key-less rows
    sink = jnp.array([0.5, -1.0, 2.0, 0.0], jnp.float32) if use_sink else None

    def make(attn):
        # The raw LSE cotangent includes key-less rows (LSE_EMPTY * w, a huge constant): it must not
        # leak into any gradient.
        def loss(q, k, v, sink):
            out, lse = attn(q, k, v, *args, sink=sink)
            return jnp.sum(out * dout) + jnp.sum(lse * w), (out, lse)

        argnums = (0, 1, 2, 3) if use_sink else (0, 1, 2)
        return jax.jit(jax.value_and_grad(loss, argnums=argnums, has_aux=True))

    dense = make(functools.partial(dense_attention, scale=scale, spec=spec))
    block = make(
        functools.partial(blockwise_attention, scale=scale, spec=spec, block_q=bq, block_kv=bk)
    )
    (_, (o0, lse0)), g0 = dense(q, k, v, sink)
    (_, (o1, lse1)), g1 = block(q, k, v, sink)
    np.testing.assert_allclose(np.asarray(o1), np.asarray(o0), **TOL)
    empty = np.asarray(lse0) == np.float32(LSE_EMPTY)
    if shift:
        assert empty.any(), "shifted kv positions should leave early queries without keys"
    np.testing.assert_array_equal(np.asarray(lse1) == np.float32(LSE_EMPTY), empty)
    np.testing.assert_allclose(np.asarray(lse1), np.asarray(lse0), **TOL)
    for a, b_, what in zip(g1, g0, ("dq", "dk", "dv", "dsink")):
        assert np.all(np.isfinite(np.asarray(a))), what
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b_), atol=2e-5, rtol=1e-5, err_msg=what
        )


def test_blockwise_skips_blocks_outside_a_window_and_is_conservative():
    rng = np.random.default_rng(3)
    ids, pos = random_layout(rng, 2, 256, max_segments=3)
    spec = MaskSpec(causal=True, window=(16, 0))
    need = np.asarray(block_needed(*(jnp.asarray(a) for a in (ids, ids, pos, pos)), spec, 32, 32))
    vis = np_visible(ids, ids, pos, pos, causal=True, window=(16, 0))
    touched = vis.reshape(2, 8, 32, 8, 32).any(
        axis=(0, 2, 4)
    )  # [nq, nk] blocks with a visible pair
    assert np.all(need[touched]), "a block with visible pairs was skipped"
    assert need.sum() <= 0.5 * need.size, (
        f"sliding window should skip most blocks, needed {need.sum()}/{need.size}"
    )


def test_blockwise_return_max_logit():
    b, s, hq, hkv = 2, 48, 4, 2
    rng = np.random.default_rng(11)
    ids, pos = random_layout(rng, b, s, empty_last_row=True)
    q, k, v, _ = qkv_arrays(5, b, s, s, hq, hkv)
    spec = MaskSpec(causal=True, window=(4, 0))
    block = jax.jit(
        functools.partial(blockwise_attention, scale=0.25, spec=spec, block_q=16, block_kv=16),
        static_argnames="return_max_logit",
    )
    out, lse, mx = block(
        q, k, v, *(jnp.asarray(a) for a in (ids, ids, pos, pos)), return_max_logit=True
    )
    mask = np_visible(ids, ids, pos, pos, causal=True, window=(4, 0))
    _, s64 = np_attention(q, k, v, mask, 0.25)
    want = np.where(mask[:, None], s64, -np.inf).max(-1)  # [b, h, sq]
    mx = np.asarray(mx)
    finite = np.isfinite(want)
    assert np.all(np.isneginf(mx[~finite]))
    np.testing.assert_allclose(mx[finite], want[finite], **TOL)
    out2, lse2 = block(q, k, v, *(jnp.asarray(a) for a in (ids, ids, pos, pos)))
    assert np.array_equal(np.asarray(out), np.asarray(out2)) and np.array_equal(
        np.asarray(lse), np.asarray(lse2)
    )


# ----------------------------------------------------------------------------- sink softmax vs form


@pytest.mark.parametrize("alpha", [None, "zeros", "learned"])
def test_sink_softmax_matches_formula(alpha):
    """out = sum_j exp(s_j) v_j / (exp(alpha_h) + sum_j exp(s_j)); off-by-one is alpha = 0."""
    b, s, hq, hkv = 2, 40, 4, 2
    rng = np.random.default_rng(21)
    ids, pos = random_layout(rng, b, s)
    q, k, v, _ = qkv_arrays(9, b, s, s, hq, hkv)
    sink = {None: None, "zeros": jnp.zeros(hq), "learned": jnp.array([3.0, -2.0, 0.5, 1.5])}[alpha]
    mask = np_visible(ids, ids, pos, pos, causal=True, window=(8, 0))
    want, _ = np_attention(q, k, v, mask, 0.3, None if sink is None else np.asarray(sink))
    args = (q, k, v, *(jnp.asarray(a) for a in (ids, ids, pos, pos)))
    spec = MaskSpec(causal=True, window=(8, 0))
    for attn in (
        functools.partial(dense_attention, scale=0.3, spec=spec),
        functools.partial(blockwise_attention, scale=0.3, spec=spec, block_q=16, block_kv=8),
    ):
        out, _ = jax.jit(attn)(*args, sink=sink)
        np.testing.assert_allclose(np.asarray(out), want, **TOL)
    if sink is None:
        return
    # the same through the facade: OFF_BY_ONE (alpha = 0, not scaled) or LEARNABLE with
    # softmax_offset
    softmax_type = (
        AttnSoftmaxType.OFF_BY_ONE_SOFTMAX
        if alpha == "zeros"
        else AttnSoftmaxType.LEARNABLE_SOFTMAX
    )
    offset = None if alpha == "zeros" else sink.reshape(1, hq, 1, 1)
    desc = SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids), jnp.asarray(pos))
    out = fused_attn_jit(
        (q, k, v),
        None,
        desc,
        None,
        AttnBiasType.NO_BIAS,
        AttnMaskType.PADDING_CAUSAL_MASK,
        QKVLayout.THD_THD_THD,
        softmax_type,
        0.3,
        0.0,
        True,
        max_segments_per_seq=4,
        window_size=(8, 0),
        softmax_offset=offset,
    )
    np.testing.assert_allclose(np.asarray(out), want, **TOL)


def test_learnable_sink_gradient_through_facade():
    b, s, hq, hkv = 1, 32, 4, 4
    ids, pos = np.ones((b, s), np.int32), np.arange(s, dtype=np.int32)[None]
    q, k, v, dout = qkv_arrays(2, b, s, s, hq, hkv)
    desc = SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids), jnp.asarray(pos))

    def loss(offset):
        out = fused_attn(
            (q, k, v),
            None,
            desc,
            None,
            AttnBiasType.NO_BIAS,
            AttnMaskType.PADDING_CAUSAL_MASK,
            QKVLayout.THD_THD_THD,
            AttnSoftmaxType.LEARNABLE_SOFTMAX,
            0.25,
            0.0,
            True,
            softmax_offset=offset,
        )
        return jnp.sum(out * dout)

    offset = jnp.array([0.1, -0.4, 1.2, 0.0]).reshape(1, hq, 1, 1)
    g = np.asarray(jax.jit(jax.grad(loss))(offset))
    loss = jax.jit(loss)
    eps = 1e-2  # central differences of a smooth function, in float32
    num = [
        (float(loss(offset.at[0, h, 0, 0].add(eps))) - float(loss(offset.at[0, h, 0, 0].add(-eps))))
        / (2 * eps)
        for h in range(hq)
    ]
    np.testing.assert_allclose(g.reshape(hq), num, rtol=2e-2, atol=2e-3)


# ----------------------------------------------------------------------------- bottom-right masks (


def _call(q, k, v, desc, mask_type, layout, **kw):
    return fused_attn_jit(
        (q, k, v),
        None,
        desc,
        None,
        AttnBiasType.NO_BIAS,
        mask_type,
        layout,
        AttnSoftmaxType.VANILLA_SOFTMAX,
        0.3,
        0.0,
        False,
        **kw,
    )


def test_causal_bottom_right_bshd():
    b, sq, skv, hq, hkv = 2, 16, 24, 4, 2
    q, k, v, _ = qkv_arrays(4, b, sq, skv, hq, hkv)
    out = _call(q, k, v, None, AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, QKVLayout.BSHD_BSHD_BSHD)
    i, j = np.arange(sq)[:, None], np.arange(skv)[None, :]
    mask = np.broadcast_to(
        j <= i + (skv - sq), (b, sq, skv)
    )  # diagonal through the bottom-right corner
    want, _ = np_attention(q, k, v, mask, 0.3)
    np.testing.assert_allclose(np.asarray(out), want, **TOL)
    top_left = _call(q, k, v, None, AttnMaskType.CAUSAL_MASK, QKVLayout.BSHD_BSHD_BSHD)
    want_tl, _ = np_attention(q, k, v, np.broadcast_to(j <= i, (b, sq, skv)), 0.3)
    np.testing.assert_allclose(np.asarray(top_left), want_tl, **TOL)


@pytest.mark.parametrize("window", [None, (2, 0)])
def test_padding_causal_bottom_right_thd(window):
    b, sq, skv, hq, hkv = 1, 16, 16, 4, 2
    ids_q = np.array([[1] * 5 + [2] * 3 + [0] * 8], np.int32)
    ids_kv = np.array([[1] * 7 + [2] * 6 + [0] * 3], np.int32)

    def local_pos(ids):
        p = np.zeros_like(ids)
        for sid in (1, 2):
            idx = np.nonzero(ids[0] == sid)[0]
            p[0, idx] = np.arange(len(idx))
        return p

    pos_q, pos_kv = local_pos(ids_q), local_pos(ids_kv)
    q, k, v, _ = qkv_arrays(6, b, sq, skv, hq, hkv)
    desc = SequenceDescriptor.from_segment_ids_and_pos(
        (jnp.asarray(ids_q), jnp.asarray(ids_kv)), (jnp.asarray(pos_q), jnp.asarray(pos_kv))
    )
    out = _call(
        q,
        k,
        v,
        desc,
        AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
        QKVLayout.THD_THD_THD,
        max_segments_per_seq=2,
        window_size=window,
    )
    # segment 1: 5 queries, 7 keys (diagonal shifted by 2); segment 2: 3 queries, 6 keys (shift 3)
    shift = {1: 2, 2: 3}
    mask = np.zeros((b, sq, skv), bool)
    for i in range(sq):
        for j in range(skv):
            sid = ids_q[0, i]
            if sid == 0 or ids_kv[0, j] != sid:
                continue
            diag = pos_q[0, i] + shift[sid]
            mask[0, i, j] = pos_kv[0, j] <= diag and (
                window is None or pos_kv[0, j] >= diag - window[0]
            )
    want, _ = np_attention(q, k, v, mask, 0.3)
    np.testing.assert_allclose(np.asarray(out), want, **TOL)
    assert np.all(np.asarray(out)[0, ids_q[0] == 0] == 0.0)


# ----------------------------------------------------------------------------- return_max_logit (fa


def test_fused_attn_return_max_logit():
    b, s, hq, hkv = 2, 32, 4, 2
    rng = np.random.default_rng(8)
    ids, pos = random_layout(rng, b, s)
    q, k, v, _ = qkv_arrays(12, b, s, s, hq, hkv)
    desc = SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids), jnp.asarray(pos))
    out, max_logit = _call(
        q,
        k,
        v,
        desc,
        AttnMaskType.PADDING_CAUSAL_MASK,
        QKVLayout.THD_THD_THD,
        max_segments_per_seq=4,
        window_size=(6, 0),
        return_max_logit=True,
    )
    mask = np_visible(ids, ids, pos, pos, causal=True, window=(6, 0))
    want_out, s64 = np_attention(q, k, v, mask, 0.3)
    want = np.where(mask[:, None], s64, -np.inf).max(axis=(0, 2, 3))  # per query head
    assert max_logit.shape == (hq,)
    np.testing.assert_allclose(np.asarray(max_logit), want, **TOL)
    np.testing.assert_allclose(np.asarray(out), want_out, **TOL)
    plain = _call(
        q,
        k,
        v,
        desc,
        AttnMaskType.PADDING_CAUSAL_MASK,
        QKVLayout.THD_THD_THD,
        max_segments_per_seq=4,
        window_size=(6, 0),
    )
    assert np.array_equal(np.asarray(plain), np.asarray(out))


def test_backend_is_reference():
    assert "reference" in te.backend_name()
