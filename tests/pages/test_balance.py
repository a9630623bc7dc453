"""tutorial_utils.pages.balance: chapter 4's packings, layouts and table."""

import pytest

from tutorial_utils.pages.balance import (
    balance_layouts,
    balance_scenarios,
    balance_table,
    count_layouts,
)
from tutorial_utils.perfmodel.workcount import count_work
from tutorial_utils.perfmodel.workload import get_workload


def test_layouts_keep_only_stripes_that_divide_the_row():
    assert list(balance_layouts(get_workload("cpu"))) == [
        "contiguous",
        "striped 1",
        "striped 16",
        "striped 64",
        "dual-chunk",
    ]
    # 256 tokens on 8 devices hold whole stripes of 16 but not of 4 x 16 = 64
    assert list(balance_layouts(get_workload("tiny", cp_size=8, stripe_size=16))) == [
        "contiguous",
        "striped 1",
        "striped 16",
        "dual-chunk",
    ]


def test_scenarios_and_counts():
    wl = get_workload("tiny")
    scenarios = balance_scenarios(wl)
    assert list(scenarios) == ["one long document", "'tiny' workload", "random packing"]
    for ids, pos, _window in scenarios.values():
        assert ids.shape == pos.shape and ids.shape[1] == wl.seq_len
    counts = count_layouts(wl, tile=(16, 16))
    one = counts["one long document"]
    assert one["contiguous"].imbalance("allgather") > 1.5 > one["striped 1"].imbalance("allgather")
    ids, pos, window = scenarios["random packing"]
    direct = count_work(
        ids, pos, window, cp_size=wl.cp_size, layout="striped", stripe_size=1, tile=(16, 16)
    )
    assert (counts["random packing"]["striped 1"].pair_matrix == direct.pair_matrix).all()


def test_table():
    counts = count_layouts(get_workload("tiny"), tile=(16, 16))
    text = balance_table(counts)._repr_markdown_()
    assert text.startswith("**one long document**\n\n| layout | AG max/mean | Ring steps/mean |")
    assert text.count("**") == 2 * 3  # a table per packing
    assert text.count("\n| ") == 3 * (5 + 1)  # its header's rule and a row per layout
    first = text.split("**", 3)[2]
    assert "\n| striped 1 | 1.0" in first  # within 10% of perfect balance
    device = balance_table(counts, per_strategy=False)._repr_markdown_()
    assert "| layout | max/mean | tile eff. |" in device and "Ring" not in device
    assert device.count("\n| ") == text.count("\n| ")  # the same rows, two columns fewer
    with pytest.raises(ValueError, match="count_layouts"):
        balance_table({})
    no_tiles = count_layouts(get_workload("tiny"), tile=None)
    with pytest.raises(ValueError, match="needs tile counts"):
        balance_table(no_tiles)
