"""What ``check_layout`` reads from the reader: windows from flags, and reordered arrays (no TE).

* ``--window`` (TE's L, ``none``) and ``--model-window`` (the model's W -> TE's ``(W-1, 0)``):
  values, labels, order, one window per L, refusals naming the flag;
* the packed-layout test behind the reorder diagnosis equals the validator's layout rules on
  random rows, well-formed and broken (property test);
* ``looks_reordered``: natural layouts and broken ones no reorder explains get no diagnosis; a
  layout reordered by any candidate (Striped at several CP and stripe sizes, DualChunkSwap) is
  recognised, its undoing gives a packed layout, and on the shipped sample batch the reorder
  that was applied is the one named first.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import packed_rows
from hypothesis import given, settings
from hypothesis import strategies as st

from tutorial_utils.cli import check_layout_input as cli_input
from tutorial_utils.cli.check_layout_input import (
    Window,
    looks_reordered,
    model_windows,
    reorder_fix,
    te_windows,
    unique_windows,
)
from tutorial_utils.reorder import (
    ReorderStrategy,
    inverse_reorder_causal_load_balancing,
    reorder_causal_load_balancing,
)
from tutorial_utils.validation import first_violation

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ----------------------------------------------------------------------------- windows


def test_window_flags_read_te_and_model_windows():
    assert te_windows("63") == [Window(left=63, given=True)]
    assert te_windows("63, none") == [Window(63, given=True), Window(None, given=True)]
    assert model_windows("64,none") == [Window(63, model=64, given=True), Window(given=True)]
    labels = [w.label() for w in te_windows("0,none") + model_windows("64")]
    assert labels == ["window=(0, 0)", "window=None (global)", "window=(63, 0) (model window W=64)"]
    assert model_windows("1")[0].size == (0, 0)  # W=1: a query sees itself only
    assert Window().size is None and not Window().given


def test_windows_keep_the_flags_order_and_each_l_once():
    groups = [te_windows("256"), model_windows("64,none"), te_windows("63,none")]
    assert [w.label() for w in unique_windows(groups)] == [
        "window=(256, 0)",
        "window=(63, 0) (model window W=64)",
        "window=None (global)",
    ]
    assert unique_windows(None) == [Window()]  # no flag: full causal, not named


@pytest.mark.parametrize(
    "parse, text, message",
    [
        (te_windows, "-1", r"^--window=-1 must be an int >= 0: the left side of a causal sliding"),
        (te_windows, "63,abc", r"^--window='abc' is not a window: give an int or 'none'"),
        (model_windows, "0", r"^--model-window=0 must be an int >= 1: the keys a query sees"),
        (model_windows, "1.5", r"^--model-window='1.5' is not a window"),
    ],
)
def test_bad_window_values_name_the_flag(parse, text, message):
    with pytest.raises(ValueError, match=message):
        parse(text)


# ----------------------------------------------------------------------------- the layout test


@st.composite
def _rows_maybe_broken(draw):
    ids, pos = draw(packed_rows(2, 32, 2, 2))
    how = draw(st.sampled_from(["none", "pos", "swap", "gap", "renumber"]))
    b, t = draw(st.integers(0, 1)), draw(st.integers(0, 31))
    if how == "pos":
        pos[b, t] += draw(st.integers(1, 3))
    elif how == "swap":
        u = draw(st.integers(0, 31))
        ids[b, [t, u]], pos[b, [t, u]] = ids[b, [u, t]], pos[b, [u, t]]
    elif how == "gap":
        ids[b, t] = 0
    elif how == "renumber":
        ids[b] = np.where(ids[b] > 0, ids[b] + 1, 0)
    return ids, pos


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(rows=_rows_maybe_broken())
def test_packed_layout_test_equals_the_validators_layout_rules(rows):
    ids, pos = rows
    rule = first_violation(ids, pos, max_segments_per_seq=64)
    assert cli_input._packed(ids, pos) == (rule is None), (rule, ids.tolist(), pos.tolist())


# ----------------------------------------------------------------------------- reordered arrays

REORDERS = [
    (ReorderStrategy.Striped, 2, 1),
    (ReorderStrategy.Striped, 4, 1),
    (ReorderStrategy.Striped, 4, 2),
    (ReorderStrategy.Striped, 2, 4),
    (ReorderStrategy.DualChunkSwap, 2, None),
    (ReorderStrategy.DualChunkSwap, 4, None),
]


@settings(max_examples=120, deadline=None, derandomize=True, database=None)
@given(rows=packed_rows(2, 32, 2, 2), reorder=st.sampled_from(REORDERS))
def test_reordered_rows_are_recognised(rows, reorder):
    ids, pos = rows
    assert looks_reordered(ids, pos, cp=4, stripe=2) == []  # natural: nothing to diagnose
    strategy, cp, stripe = reorder
    r_ids, r_pos = (reorder_causal_load_balancing(x, strategy, cp, 1, stripe) for x in rows)
    if cli_input._packed(r_ids, r_pos):
        return  # this reorder left the rows a packed layout (e.g. all padding): nothing to see
    found = looks_reordered(r_ids, r_pos, cp=4, stripe=2)
    assert found, (reorder, ids.tolist())
    for match in found:  # every reorder named does turn the arrays into a packed layout
        undo = [
            inverse_reorder_causal_load_balancing(
                x, ReorderStrategy[match["strategy"]], match["cp"], 1, match["stripe"]
            )
            for x in (r_ids, r_pos)
        ]
        assert cli_input._packed(*undo), match


def test_the_sample_batch_names_the_reorder_that_was_applied():
    data = np.load(os.path.join(ROOT, "examples", "packed_batch.npz"))
    ids, pos = data["segment_ids"], data["segment_pos"]
    for strategy, cp, stripe in [
        (ReorderStrategy.Striped, 4, 128),
        (ReorderStrategy.Striped, 4, 1),
        (ReorderStrategy.Striped, 2, 64),
        (ReorderStrategy.Striped, 8, 1),
        (ReorderStrategy.DualChunkSwap, 4, None),
    ]:
        r_ids, r_pos = (
            reorder_causal_load_balancing(x, strategy, cp, 1, stripe) for x in (ids, pos)
        )
        found = looks_reordered(r_ids, r_pos, cp=4, stripe=128)
        assert found[0] == {"strategy": strategy.name, "cp": cp, "stripe": stripe}, found
    assert reorder_fix(found[0]) == (
        "pass segment_ids and segment_pos as they are before the reorder (check_layout reorders"
        " them itself), or undo it on both arrays with inverse_reorder_causal_load_balancing(x,"
        " strategy=ReorderStrategy.DualChunkSwap, cp_size=4, seq_dim=1)."
    )


def test_broken_arrays_no_reorder_explains_get_no_diagnosis():
    data = np.load(os.path.join(ROOT, "examples", "packed_batch.npz"))
    ids, pos = data["segment_ids"].copy(), data["segment_pos"].copy()
    pos[0, 5] += 1  # a position that does not count on
    assert looks_reordered(ids, pos, cp=4, stripe=128) == []
    ids, pos = data["segment_ids"].copy(), data["segment_pos"].copy()
    ids[0, 100] = 0  # a hole inside a segment: "split it in two" is the right fix here
    assert looks_reordered(ids, pos, cp=4, stripe=128) == []
