"""The stored support matrix (results/support_matrix/) is what TE's code computes today.

``make support-matrix`` computes every cell (minutes); here a sample is recomputed on every
run (a right CP cell, BSHD bias on one device, one refusal, the first wrong cell if the record has
one) and must
give the stored verdict, message or error. The record must also cover every row and column
the tool defines, and its counts must add up.
"""

import json

import pytest

from tutorial_utils.cli import support_matrix as sm

RECORD = json.loads(sm.DEFAULT_OUT.read_text(encoding="utf-8"))
ROWS = {r["id"]: r for r in sm.ROWS}
STORED = {r["id"]: r["cells"] for r in RECORD["rows"]}


def _sample():
    # a right CP cell, and BSHD bias on one device (the stand-in's bias backward once added a zero
    # sink)
    cells = [("thd-padding-causal", "allgather-stripe4"), ("bshd-bias", "single")]
    for verdict in ("refused", "wrong"):
        found = next(
            (
                (row, col)
                for row, cs in STORED.items()
                for col, c in cs.items()
                if c["verdict"] == verdict
            ),
            None,
        )
        if found:
            cells.append(found)
    return cells


def test_record_covers_the_tool_and_counts_add_up():
    assert RECORD["schema"] == sm.SCHEMA and RECORD["versions"]["transformer_engine"] == "2.20.2"
    assert list(STORED) == [r["id"] for r in sm.ROWS]
    assert all(list(cells) == list(sm.COLUMNS) for cells in STORED.values())
    assert RECORD["counts"] == sm.counts(RECORD)
    for cells in STORED.values():
        for cell in cells.values():
            assert cell["verdict"] in ("right", "refused", "wrong", "n/a")
            if cell["verdict"] == "refused":
                assert cell["message"] and cell["rule"].startswith("faq.md#")


@pytest.mark.parametrize("row, column", _sample(), ids=[f"{r}-{c}" for r, c in _sample()])
def test_sampled_cell_is_recomputed_the_same(row, column):
    stored = STORED[row][column]
    cell = sm.compute_cell(ROWS[row], column)
    assert cell["verdict"] == stored["verdict"], (cell, stored)
    if stored["verdict"] == "refused":
        assert cell["message"] == stored["message"]
    else:
        assert cell["max_error"] == pytest.approx(stored["max_error"], abs=2e-3)


def test_the_comparison_can_fail():
    """The verdict's comparison passes the oracle against itself and fails a slightly wrong copy."""
    x = sm._inputs(ROWS["thd-padding-causal"])
    out, grads = sm._oracle(x)
    want = [out, *grads]
    assert sm.judge(want, want) == (True, 0.0)
    broken = [w.copy() for w in want]
    broken[0][0, 20, 0, 0] += 0.2  # one output value off by 0.2
    ok, err = sm.judge(broken, want)
    assert not ok and err == pytest.approx(0.2, abs=1e-6)
