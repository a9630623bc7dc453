"""workcount.py against brute-force S x S masks, closed forms and the seed workload figure."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tutorial_utils.inputs import fixed_slot_segments, pack_segments, random_segment_lengths
from tutorial_utils.perfmodel.workcount import (
    attention_flops,
    count_work,
    count_workload,
    local_token_order,
    pair_matrix,
    ring_step_pairs,
    total_visible_pairs,
    visible_pairs_per_query,
)
from tutorial_utils.perfmodel.workload import get_workload, workload_segments

# --------------------------------------------------------------------------------------------
# brute force: explicit masks, explicit runs, explicit tiles


def _mask(ids, pos, left):
    """[B, S, S] visible(i, j) straight from the definition."""
    same = (ids[:, :, None] == ids[:, None, :]) & (ids[:, :, None] != 0)
    causal = pos[:, None, :] <= pos[:, :, None]
    m = same & causal
    if left >= 0:
        m &= pos[:, None, :] >= pos[:, :, None] - left
    return m


def _tiles(block, tq, tk):
    """(touched, full) tq x tk tiles of a run-local mask anchored at (0, 0)."""
    nq, nk = block.shape
    if nq == 0 or nk == 0:
        return 0, 0
    Q, K = -(-nq // tq) * tq, -(-nk // tk) * tk
    padded = np.zeros((Q, K), bool)
    padded[:nq, :nk] = block
    inside = np.zeros((Q, K), bool)
    inside[:nq, :nk] = True
    t = padded.reshape(Q // tq, tq, K // tk, tk)
    ins = inside.reshape(Q // tq, tq, K // tk, tk)
    touched = t.any(axis=(1, 3))
    full = t.all(axis=(1, 3)) & ins.all(axis=(1, 3))
    return int(touched.sum()), int(full.sum())


def _brute(ids, pos, window, cp, layout, stripe, tq, tk):
    B, S = ids.shape
    order = local_token_order(S, cp, layout, stripe)
    m = _mask(ids, pos, window[0])
    rank = np.empty(S, int)
    for r in range(cp):
        rank[order[r]] = r
    M = np.array([[m[:, rank == r][:, :, rank == k].sum() for k in range(cp)] for r in range(cp)])
    ring_t, ring_f = np.zeros((cp, cp), int), np.zeros((cp, cp), int)
    ag_t, ag_f = np.zeros(cp, int), np.zeros(cp, int)
    for b in range(B):
        for r in range(cp):
            qi = order[r]
            for s in set(ids[b, qi].tolist()) - {0}:  # Ring: one run per local segment piece
                qrun = qi[ids[b, qi] == s]
                for t in range(cp):
                    ki = order[(r - t) % cp]
                    tt, ff = _tiles(m[b][np.ix_(qrun, ki[ids[b, ki] == s])], tq, tk)
                    ring_t[r, t] += tt
                    ring_f[r, t] += ff
            runs, cur = [], []  # AllGather: break on id change / pos jump
            for i in qi:
                if ids[b, i] == 0:
                    if cur:
                        runs.append(cur)
                    cur = []
                elif cur and ids[b, i] == ids[b, cur[-1]] and pos[b, i] == pos[b, cur[-1]] + 1:
                    cur.append(i)
                else:
                    if cur:
                        runs.append(cur)
                    cur = [i]
            if cur:
                runs.append(cur)
            for run in runs:
                keys = np.nonzero(ids[b] == ids[b, run[0]])[0]
                tt, ff = _tiles(m[b][np.ix_(run, keys)], tq, tk)
                ag_t[r] += tt
                ag_f[r] += ff
    return M, ring_t, ring_f, ag_t, ag_f


def _random_case(rng):
    cp = int(rng.choice([1, 2, 4]))
    layout = str(rng.choice(["contiguous", "striped", "dual_chunk"]))
    stripe = int(rng.choice([1, 2, 4])) if layout == "striped" else 1
    align = int(rng.choice([1, cp * stripe]))
    S = 2 * cp * stripe * int(rng.integers(2, 7))
    B = int(rng.integers(1, 3))
    ids, pos = pack_segments(random_segment_lengths(rng, B, S, 4, align=align), S, align=align)
    window = (int(rng.choice([-1, 0, 1, 3, 7, 100])), int(rng.choice([-1, 0])))
    tile = (int(rng.choice([1, 2, 4, 8])), int(rng.choice([1, 2, 4, 8])))
    return ids, pos, window, cp, layout, stripe, tile


@pytest.mark.parametrize("seed", range(6))
def test_counts_and_tiles_match_brute_force(seed):
    rng = np.random.default_rng(1000 + seed)
    for _ in range(8):
        ids, pos, window, cp, layout, stripe, (tq, tk) = _random_case(rng)
        wc = count_work(
            ids, pos, window, cp_size=cp, layout=layout, stripe_size=stripe, tile=(tq, tk)
        )
        M, rt, rf, at, af = _brute(ids, pos, window, cp, layout, stripe, tq, tk)
        where = f"cp={cp} layout={layout} stripe={stripe} window={window} tile={(tq, tk)}"
        np.testing.assert_array_equal(wc.pair_matrix, M, err_msg=where)
        np.testing.assert_array_equal(wc.ring_tiles, rt, err_msg=where)
        np.testing.assert_array_equal(wc.ring_full_tiles, rf, err_msg=where)
        np.testing.assert_array_equal(wc.allgather_tiles, at, err_msg=where)
        np.testing.assert_array_equal(wc.allgather_full_tiles, af, err_msg=where)
        assert wc.total_pairs == int(_mask(ids, pos, window[0]).sum())
        # every layout is a partition of the same pairs
        np.testing.assert_array_equal(wc.allgather_pairs, M.sum(axis=1))


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 3).flatmap(
        lambda b: st.integers(1, 24).flatmap(
            lambda s: st.tuples(
                st.lists(
                    st.lists(st.integers(0, 3), min_size=s, max_size=s), min_size=b, max_size=b
                ),
                st.lists(
                    st.lists(st.integers(0, 12), min_size=s, max_size=s), min_size=b, max_size=b
                ),
            )
        )
    ),
    st.sampled_from([-1, 0, 1, 2, 5]),
)
def test_pair_counts_exact_for_arbitrary_ids_and_positions(data, left):
    """Pair counts hold for any integer ids/positions, not only TE-valid packings."""
    ids, pos = (np.array(x, dtype=np.int32) for x in data)
    m = _mask(ids, pos, left)
    np.testing.assert_array_equal(visible_pairs_per_query(ids, pos, (left, 0)), m.sum(axis=2))


@pytest.mark.parametrize("window", [(-1, 0), (0, 0), (5, 0), (64, -1)])
def test_closed_forms_for_full_segments(window):
    L, W = 200, window[0]
    ids, pos = fixed_slot_segments(1, 256, 1, L)
    if W < 0:
        want = L * (L + 1) // 2
    else:
        want = W * (W + 1) // 2 + (L - W) * (W + 1)  # anchors.md C.1, L >= W
    assert total_visible_pairs(ids, pos, window) == want


def test_ring_steps_and_allgather_rows_partition_the_matrix():
    ids, pos = fixed_slot_segments(2, 512, 4, 100)
    m = pair_matrix(ids, pos, (30, 0), cp_size=4, layout="striped", stripe_size=2)
    steps = ring_step_pairs(m)
    np.testing.assert_array_equal(steps.sum(axis=1), m.sum(axis=1))
    # at step 0 every rank works on its own block (the diagonal)
    np.testing.assert_array_equal(steps[:, 0], np.diag(m))
    assert steps[1, 1] == m[1, 0] and steps[0, 1] == m[0, 3]


def test_contiguous_split_of_one_long_causal_segment_is_unbalanced_and_striping_fixes_it():
    ids, pos = fixed_slot_segments(1, 1024, 1, 1024)
    contiguous = count_work(ids, pos, (-1, 0), cp_size=4, layout="contiguous", tile=None)
    striped = count_work(ids, pos, (-1, 0), cp_size=4, layout="striped", stripe_size=1, tile=None)
    dual = count_work(ids, pos, (-1, 0), cp_size=4, layout="dual_chunk", tile=None)
    assert contiguous.imbalance("allgather") > 1.7  # last rank does 7/16 of the triangle
    assert striped.imbalance("allgather") < 1.01
    assert dual.imbalance("allgather") == pytest.approx(1.0)


def test_stripe_one_allgather_fragments_into_one_row_runs():
    wl = get_workload("cpu")
    st1 = count_workload(wl, layout="striped", stripe_size=1, tile=(16, 16))
    st16 = count_workload(wl, layout="striped", stripe_size=16, tile=(16, 16))
    tokens_per_rank = wl.batch * wl.segments_per_row * wl.valid_per_slot // wl.cp_size
    assert (st1.allgather_runs == tokens_per_rank).all()  # every stripe-1 token is its own run
    assert st1.tile_efficiency("allgather") < 0.1 < 0.8 < st16.tile_efficiency("allgather")
    assert st1.total_pairs == st16.total_pairs


def test_seed_workload_matches_anchor_figure():
    wl = get_workload("seed")
    ids, pos = workload_segments(wl)
    total = total_visible_pairs(ids, pos, wl.window)
    ring = count_workload(wl, layout="striped", stripe_size=1)
    ag = count_workload(wl, layout="striped", stripe_size=512)
    single = count_workload(wl, layout="contiguous", cp_size=1)
    # anchors.md C.4: 5.369e8 visible pairs per head; closed form: 8 segments of L=12288, W=8192
    L, W = 12288, 8192
    assert total == 8 * (W * (W + 1) // 2 + (L - W) * (W + 1)) == 536_936_448
    assert round(total / 1e8, 3) == 5.369
    assert ring.total_pairs == ag.total_pairs == single.total_pairs == total
    assert attention_flops(total, 128, 128) == pytest.approx(1.23e14, rel=2e-3)
    # stripe 512 leaves the last rank ~9% more work; stripe 1 is balanced to 0.02%
    assert ag.imbalance("allgather") == pytest.approx(1.094, abs=1e-3)
    assert ring.imbalance("ring") < 1.001


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda ids, pos: count_work(ids, pos, cp_size=4, layout="zigzag"), "layout='zigzag'"),
        (lambda ids, pos: count_work(ids, pos[:, :-1], cp_size=4), "segment_pos has shape"),
        (lambda ids, pos: count_work(ids.astype(float), pos, cp_size=4), "must be integer arrays"),
        (lambda ids, pos: count_work(-ids, pos, cp_size=4), "negative id"),
        (
            lambda ids, pos: count_work(ids, pos, cp_size=3, layout="contiguous"),
            "seq_len=64 is not divisible by cp_size=3",
        ),
        (lambda ids, pos: count_work(ids, pos, cp_size=4, stripe_size=0), "stripe_size=0"),
        (lambda ids, pos: count_work(ids, pos, cp_size=4, tile=(128, 0)), "tile cols"),
        (lambda ids, pos: count_work(ids, pos, (-3, 0), cp_size=4), "negative"),
        (lambda ids, pos: attention_flops(10, 0, 128), "num_q_heads=0"),
    ],
)
def test_bad_input_raises_naming_the_parameter(call, needle):
    ids, pos = fixed_slot_segments(1, 64, 2, 20)
    with pytest.raises(ValueError) as err:
        call(ids, pos)
    assert needle in str(err.value)


def test_running_count_answers_as_searchsorted_does_and_falls_back_when_sparse():
    """count_work's lookups (workcount._Below) against np.searchsorted, on a dense and a sparse code
    range."""
    from tutorial_utils.perfmodel.workcount import _Below

    rng = np.random.default_rng(3)
    for size in (500, 10**7):  # the first builds the running count, the second is too sparse for it
        codes = rng.integers(0, size, 300)
        below = _Below(codes, size)
        assert (below._table is None) == (size > 8 * codes.size + 4096)
        x = np.concatenate([rng.integers(0, size, 1000), codes, [0, size - 1]])
        ordered = np.sort(codes)
        np.testing.assert_array_equal(below.left(x), np.searchsorted(ordered, x, side="left"))
        np.testing.assert_array_equal(below.right(x), np.searchsorted(ordered, x, side="right"))
