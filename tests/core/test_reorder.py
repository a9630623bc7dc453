"""Load-balancing reorders: TE's worked examples, inverse round trips and error conditions.

The tables are the ones in the project's semantics notes (§5.1, §5.2), which were produced by
running TransformerEngine's own reorder functions; the property tests check the closed-form
permutations stated there and that every inverse undoes its forward reorder.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tutorial_utils.reorder import (
    ReorderStrategy,
    dual_chunk_permutation,
    inverse_reorder_causal_load_balancing,
    load_balancing_permutation,
    rank_token_indices,
    reorder_causal_load_balancing,
    striped_permutation,
)

STRIPED = ReorderStrategy.Striped
DUAL = ReorderStrategy.DualChunkSwap


def _ranks(seq_len, strategy, cp, stripe=None):
    """Original token indices held by each rank, read off the reordered ``arange``."""
    out = reorder_causal_load_balancing(np.arange(seq_len)[None], strategy, cp, 1, stripe)
    return out[0].reshape(cp, -1).tolist()


# ----------------------------------------------------------------------------- striped (§5.1)

STRIPED_TABLE = [
    (16, 4, 1, [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]),
    (16, 4, 2, [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]),
    (16, 4, 4, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]),
    (16, 2, 1, [[0, 2, 4, 6, 8, 10, 12, 14], [1, 3, 5, 7, 9, 11, 13, 15]]),
    (16, 2, 4, [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]),
    (
        32,
        4,
        2,
        [
            [0, 1, 8, 9, 16, 17, 24, 25],
            [2, 3, 10, 11, 18, 19, 26, 27],
            [4, 5, 12, 13, 20, 21, 28, 29],
            [6, 7, 14, 15, 22, 23, 30, 31],
        ],
    ),
    (
        32,
        2,
        2,
        [
            [0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29],
            [2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31],
        ],
    ),
]


@pytest.mark.parametrize("seq_len, cp, stripe, table", STRIPED_TABLE)
def test_striped_worked_examples(seq_len, cp, stripe, table):
    assert _ranks(seq_len, STRIPED, cp, stripe) == table
    assert rank_token_indices(seq_len, STRIPED, cp, stripe).tolist() == table


def test_striped_stripe_none_means_one():
    assert _ranks(16, STRIPED, 4, None) == _ranks(16, STRIPED, 4, 1)


def test_striped_inverse_worked_example():
    got = inverse_reorder_causal_load_balancing(np.arange(16), STRIPED, 4, 0, 2)
    assert got.tolist() == [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15]


SEG_IDS = np.array([[1] * 6 + [0, 0] + [2] * 5 + [0, 0, 0]], np.int32)
SEG_POS = np.array([list(range(8)) + list(range(8))], np.int32)


@pytest.mark.parametrize(
    "stripe, ids, pos",
    [
        (
            1,
            [1, 1, 1, 0, 2, 2, 2, 0, 1, 1, 1, 0, 2, 2, 0, 0],
            [0, 2, 4, 6, 0, 2, 4, 6, 1, 3, 5, 7, 1, 3, 5, 7],
        ),
        (
            2,
            [1, 1, 1, 1, 2, 2, 2, 0, 1, 1, 0, 0, 2, 2, 0, 0],
            [0, 1, 4, 5, 0, 1, 4, 5, 2, 3, 6, 7, 2, 3, 6, 7],
        ),
    ],
)
def test_striped_segment_worked_example(stripe, ids, pos):
    assert reorder_causal_load_balancing(SEG_IDS, STRIPED, 2, 1, stripe)[0].tolist() == ids
    assert reorder_causal_load_balancing(SEG_POS, STRIPED, 2, 1, stripe)[0].tolist() == pos
    # same on jax arrays
    assert (
        np.asarray(reorder_causal_load_balancing(jnp.asarray(SEG_IDS), STRIPED, 2, 1, stripe))[
            0
        ].tolist()
        == ids
    )


# ----------------------------------------------------------------------------- dual chunk swap (§5.

DUAL_TABLE = [
    (16, 4, [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]),
    (16, 2, [[0, 1, 2, 3, 12, 13, 14, 15], [4, 5, 6, 7, 8, 9, 10, 11]]),
    (16, 8, [[r, 15 - r] for r in range(8)]),
    (
        24,
        6,
        [
            [0, 1, 22, 23],
            [2, 3, 20, 21],
            [4, 5, 18, 19],
            [6, 7, 16, 17],
            [8, 9, 14, 15],
            [10, 11, 12, 13],
        ],
    ),
]


@pytest.mark.parametrize("seq_len, cp, table", DUAL_TABLE)
def test_dual_chunk_worked_examples(seq_len, cp, table):
    assert _ranks(seq_len, DUAL, cp) == table
    assert rank_token_indices(seq_len, DUAL, cp).tolist() == table


def test_dual_chunk_docstring_example_in_te_is_wrong():
    # TE's ReorderStrategy docstring lists rank 1 as 4,5,10,11 for cp=4; the code gives 2,3,12,13.
    assert _ranks(16, DUAL, 4)[1] == [2, 3, 12, 13]


def test_dual_chunk_cp1_is_identity():
    x = np.arange(10)
    assert reorder_causal_load_balancing(x, DUAL, 1, 0).tolist() == x.tolist()
    assert inverse_reorder_causal_load_balancing(x, DUAL, 1, 0).tolist() == x.tolist()


def test_striped_cp1_is_identity():
    x = np.arange(12)
    assert reorder_causal_load_balancing(x, STRIPED, 1, 0, 3).tolist() == x.tolist()


def test_load_balancing_permutation_dispatch():
    assert np.array_equal(
        load_balancing_permutation(32, STRIPED, 4, 2), striped_permutation(32, 4, 2)
    )
    assert np.array_equal(load_balancing_permutation(32, DUAL, 4), dual_chunk_permutation(32, 4))


# ----------------------------------------------------------------------------- closed forms (hypoth


@st.composite
def striped_cases(draw):
    cp = draw(st.integers(1, 8))
    stripe = draw(st.integers(1, 6))
    reps = draw(st.integers(1, 4))
    return cp * stripe * reps, cp, stripe


@st.composite
def dual_cases(draw):
    cp = draw(st.sampled_from([1, 2, 4, 6, 8]))
    reps = draw(st.integers(1, 4))
    return 2 * cp * reps, cp


@settings(max_examples=60, deadline=None)
@given(striped_cases())
def test_striped_matches_te_closed_forms(case):
    seq_len, cp, stripe = case
    perm = striped_permutation(seq_len, cp, stripe)
    L = seq_len // cp
    p = np.arange(seq_len)
    r, a, b = p // L, (p % L) // stripe, p % stripe
    assert np.array_equal(perm, a * cp * stripe + r * stripe + b)  # src(p) = a*cp*st + r*st + b
    q = np.arange(seq_len)
    inv_pos = (q // stripe % cp) * L + (q // (cp * stripe)) * stripe + q % stripe
    assert np.array_equal(perm[inv_pos], q)  # original q sits at inv_pos(q)


@settings(max_examples=40, deadline=None)
@given(dual_cases())
def test_dual_chunk_matches_closed_form(case):
    seq_len, cp = case
    ranks = rank_token_indices(seq_len, DUAL, cp)
    chunk = seq_len // (2 * cp)
    if cp == 1:  # TE returns the input unchanged
        assert ranks.tolist() == [list(range(seq_len))]
        return
    for r in range(cp):  # rank r owns chunks r and 2cp-1-r, in that order
        want = list(range(r * chunk, (r + 1) * chunk)) + list(
            range((2 * cp - 1 - r) * chunk, (2 * cp - r) * chunk)
        )
        assert ranks[r].tolist() == want


@st.composite
def tensor_cases(draw):
    strategy = draw(st.sampled_from([STRIPED, DUAL]))
    if strategy is STRIPED:
        cp = draw(st.integers(1, 4))
        stripe = draw(st.sampled_from([None, 1, 2, 3]))
        seq_len = cp * (stripe or 1) * draw(st.integers(1, 3))
    else:
        cp = draw(st.sampled_from([1, 2, 4]))
        stripe = None
        seq_len = 2 * cp * draw(st.integers(1, 3))
    seq_dim = draw(st.integers(0, 2))
    shape = [draw(st.integers(1, 3)) for _ in range(3)]
    shape[seq_dim] = seq_len
    use_jax = draw(st.booleans())
    return strategy, cp, stripe, seq_dim, tuple(shape), use_jax


@settings(max_examples=50, deadline=None)
@given(tensor_cases())
def test_inverse_round_trip(case):
    strategy, cp, stripe, seq_dim, shape, use_jax = case
    x = np.arange(int(np.prod(shape))).reshape(shape)
    if use_jax:
        x = jnp.asarray(x)
    y = reorder_causal_load_balancing(x, strategy, cp, seq_dim, stripe)
    assert type(y) is type(x) or (use_jax and not isinstance(y, np.ndarray))
    back = inverse_reorder_causal_load_balancing(y, strategy, cp, seq_dim, stripe)
    assert np.array_equal(np.asarray(back), np.asarray(x))
    forth = reorder_causal_load_balancing(
        inverse_reorder_causal_load_balancing(x, strategy, cp, seq_dim, stripe),
        strategy,
        cp,
        seq_dim,
        stripe,
    )
    assert np.array_equal(np.asarray(forth), np.asarray(x))
    # the reorder only moves whole slices along seq_dim
    perm = load_balancing_permutation(shape[seq_dim], strategy, cp, stripe)
    assert np.array_equal(np.asarray(y), np.take(np.asarray(x), perm, axis=seq_dim))


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("stripe", [0, -1, -4])
def test_nonpositive_stripe_raises(stripe):
    with pytest.raises(
        ValueError, match=rf"stripe_size must be a positive integer.*stripe_size={stripe}"
    ):
        reorder_causal_load_balancing(np.arange(16), STRIPED, 4, 0, stripe)


def test_striped_indivisible_raises():
    with pytest.raises(
        ValueError, match=r"seq_len=24 is not divisible by cp_size\*stripe_size=4\*4=16"
    ):
        reorder_causal_load_balancing(np.arange(24), STRIPED, 4, 0, 4)
    with pytest.raises(ValueError, match=r"not divisible by cp_size\*stripe_size=4\*1=4"):
        inverse_reorder_causal_load_balancing(np.zeros((2, 10)), STRIPED, 4, 1)


def test_dual_chunk_odd_cp_raises():
    with pytest.raises(ValueError, match=r"cp_size=3 must be a multiple of 2"):
        reorder_causal_load_balancing(np.arange(12), DUAL, 3, 0)


def test_dual_chunk_indivisible_raises():
    with pytest.raises(ValueError, match=r"seq_len=12 is not divisible by 2\*cp_size=2\*4=8"):
        reorder_causal_load_balancing(np.arange(12), DUAL, 4, 0)


def test_dual_chunk_with_stripe_raises():
    with pytest.raises(
        ValueError, match=r"stripe_size=2 is only meaningful for ReorderStrategy.Striped"
    ):
        reorder_causal_load_balancing(np.arange(16), DUAL, 4, 0, 2)


@pytest.mark.parametrize("cp", [0, -2, 2.0, True])
def test_bad_cp_size_raises(cp):
    with pytest.raises(ValueError, match=r"cp_size must be a positive integer.*cp_size="):
        reorder_causal_load_balancing(np.arange(16), STRIPED, cp, 0)


def test_bad_seq_dim_and_strategy_raise():
    with pytest.raises(
        ValueError, match=r"seq_dim=3 is not an axis of a tensor with shape \(2, 16\)"
    ):
        reorder_causal_load_balancing(np.zeros((2, 16)), STRIPED, 2, 3)
    with pytest.raises(
        ValueError,
        match=(
            r"strategy must be ReorderStrategy.Striped or ReorderStrategy.DualChunkSwap, got"
            r" strategy='striped'"
        ),
    ):
        reorder_causal_load_balancing(np.zeros((2, 16)), "striped", 2, 1)
