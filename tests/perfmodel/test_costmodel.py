"""The cost model's sweeps: speedup along one workload field, and where CP starts to pay off.

The fit itself, the advisor and the published record are checked in ``test_plan.py``.
"""

import math

import numpy as np
import pytest

from tutorial_utils.perfmodel.costmodel import (
    DEFAULT_CASES,
    PUBLISHED_GB200,
    break_even_window,
    fit_calibration,
    predict,
    published_points,
    speedup_sweep,
)
from tutorial_utils.perfmodel.workload import get_workload

SEED = get_workload("seed")


def _speedup(wl, strategy, stripe):
    p = predict(wl, strategy, stripe_size=stripe)
    return p.speedup if p.applicable else math.nan


def test_published_points_are_tes_speedups_and_times():
    ms = published_points("ms")
    speed = published_points()
    assert set(ms) == set(speed) == {("ring", 1), ("allgather", 512)}
    assert set(ms) <= set(DEFAULT_CASES)
    for (strategy, _), value in ms.items():
        assert value == PUBLISHED_GB200[strategy]["mean_ms"]
        assert speed[(strategy, _)] == pytest.approx(PUBLISHED_GB200["single_ms"] / value)
    with pytest.raises(ValueError, match="value='seconds'"):
        published_points("seconds")


def test_sweep_matches_predict_point_by_point_and_marks_inapplicable_shapes():
    sweep = speedup_sweep(SEED, "window", [2, 512, 8192], cases=[("ring", 1), ("allgather", 512)])
    assert sweep["field"] == "window" and sweep["base"] == 8192 and sweep["cp_size"] == 4
    assert sweep["hardware"].startswith("GB200")
    ring = sweep["speedup"][("ring", 1)]
    assert math.isnan(ring[0])  # window 2 < cp - 1: TE's Ring cannot run it
    for i, w in enumerate([2, 512, 8192]):
        wl = SEED.replace(window=(w, 0))
        for key, values in sweep["speedup"].items():
            np.testing.assert_allclose(values[i], _speedup(wl, *key))
    # at the published shape the sweep reproduces the fitted points
    for key, s in published_points().items():
        assert sweep["speedup"][key][2] == pytest.approx(s, rel=1e-6)


def test_sweep_over_another_field_and_bad_fields():
    sweep = speedup_sweep("seed", "num_kv_heads", [8, 128], cases=[("allgather", 512)])
    fewer_bytes, more_bytes = sweep["speedup"][("allgather", 512)]
    assert fewer_bytes > more_bytes  # MHA gathers 16x the K/V bytes
    with pytest.raises(ValueError, match="field='windw'"):
        speedup_sweep("seed", "windw", [1])
    with pytest.raises(ValueError, match="values is empty"):
        speedup_sweep("seed", "window", [])


@pytest.mark.parametrize("strategy, stripe", [("ring", 1), ("ulysses", None)])
def test_break_even_window_is_the_first_window_that_wins(strategy, stripe):
    w = break_even_window(SEED, strategy, stripe_size=stripe)
    assert w is not None and w > 0
    assert _speedup(SEED.replace(window=(w, 0)), strategy, stripe) > 1
    assert not _speedup(SEED.replace(window=(w - 1, 0)), strategy, stripe) > 1
    for wider in (2 * w, 4 * w, 8192):  # and it keeps winning above it
        assert _speedup(SEED.replace(window=(wider, 0)), strategy, stripe) > 1


def test_break_even_window_when_cp_always_or_never_wins():
    # AllGather with full tiles wins at every window on the seed shape (model prediction)
    assert break_even_window(SEED, "allgather", stripe_size=128) == 0
    # stripe-1 AllGather wastes >99% of every tile: it never beats one GPU
    assert break_even_window(SEED, "allgather", stripe_size=1) is None
    # from a narrowest tested window on, "wins everywhere" returns that window, not 0
    assert break_even_window(SEED, "allgather", stripe_size=128, min_window=16) == 16
    with pytest.raises(ValueError, match=r"min_window=-1 must be a non-negative int"):
        break_even_window(SEED, "allgather", stripe_size=128, min_window=-1)


def test_constant_cp_loss_fits_the_same_times_and_moves_the_break_even():
    """The second reading of TE's three times: exact on them, with a much wider break-even."""
    prop, const = fit_calibration(), fit_calibration(cp_loss="constant")
    assert const.eta == prop.eta and const.cp_loss == "constant" and const.cp_factor == {}
    for strategy in ("ring", "allgather"):
        pub = PUBLISHED_GB200[strategy]
        p = predict(SEED, strategy, stripe_size=pub["stripe_size"], calibration=const)
        assert p.predicted_ms == pytest.approx(pub["mean_ms"], rel=1e-9)
        assert p.breakdown["cp_overhead_ms"] == pytest.approx(const.cp_loss_ms[strategy])
        # away from the published window the constant loss does not shrink with the compute
        narrow = predict(
            SEED.replace(window=(256, 0)),
            strategy,
            stripe_size=pub["stripe_size"],
            calibration=const,
        )
        assert narrow.breakdown["cp_overhead_ms"] == pytest.approx(const.cp_loss_ms[strategy])
    assert 0.03 < const.cross_strategy_error < 0.10
    for strategy, stripe in (("ring", 1), ("allgather", 128)):
        w_prop = break_even_window(SEED, strategy, stripe_size=stripe, min_window=16)
        w_const = break_even_window(
            SEED, strategy, stripe_size=stripe, min_window=16, calibration=const
        )
        assert w_const > 2 * w_prop, (strategy, w_prop, w_const)
    with pytest.raises(ValueError, match=r"cp_loss='fixed' is unknown"):
        fit_calibration(cp_loss="fixed")


# --------------------------------------------------------------------------------------------
# the chapter's figures of these predictions (pages.plots)


@pytest.fixture
def plt_agg():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    yield plt
    plt.close("all")


def test_time_breakdown_stacks_the_breakdown_and_stars_the_published_bars(plt_agg):
    from tutorial_utils.pages import plots

    preds = [predict(SEED, s, stripe_size=st) for s, st in [("ring", 1), ("allgather", 128)]]
    fig = plots.plot_time_breakdown(preds, published=published_points("ms"))
    ax = fig.axes[0]
    tops = {}
    for bar in ax.patches:
        x = round(bar.get_x() + bar.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    for i, p in enumerate(preds):
        assert tops[i] == pytest.approx(p.predicted_ms, rel=1e-9)
    (stars,) = ax.collections
    np.testing.assert_allclose(stars.get_offsets(), [[0, PUBLISHED_GB200["ring"]["mean_ms"]]])
    assert any("published (TE tutorial" in t.get_text() for t in ax.get_legend().get_texts())
    assert "Model prediction" in ax.get_title()
    bad = predict(SEED.replace(window=(1, 0)), "ring")
    with pytest.raises(ValueError, match=r"predictions\[0\]"):
        plots.plot_time_breakdown([bad])
    with pytest.raises(ValueError, match="predictions"):
        plots.plot_time_breakdown([])


def test_speedup_sweep_draws_each_case_the_break_even_line_and_the_published_points(plt_agg):
    from tutorial_utils.pages import plots

    sweep = speedup_sweep(SEED, "window", [2, 512, 8192], cases=[("ring", 1), ("allgather", 512)])
    fig = plots.plot_speedup_sweep(sweep, published=published_points())
    ax = fig.axes[0]
    curves = [line for line in ax.lines if line.get_label().startswith("model prediction")]
    assert len(curves) == 2
    np.testing.assert_array_equal(
        curves[0].get_ydata(), sweep["speedup"][("ring", 1)]
    )  # NaN gap kept
    assert any(list(line.get_ydata()) == [1.0, 1.0] for line in ax.lines)  # break-even
    stars = np.concatenate([c.get_offsets() for c in ax.collections])
    np.testing.assert_allclose(sorted(stars[:, 1]), sorted(published_points().values()))
    assert set(stars[:, 0]) == {8192}
    assert ax.get_xscale() == "log" and "4 x GB200" in ax.get_title()
    with pytest.raises(ValueError, match="sweep"):
        plots.plot_speedup_sweep({"values": [1]})


def test_speedup_sweep_draws_both_fits_as_a_band(plt_agg):
    from tutorial_utils.pages import plots

    cases = [("ring", 1), ("allgather", 128)]
    windows = [16, 512, 8192]
    fraction = speedup_sweep(SEED, "window", windows, cases=cases)
    constant = speedup_sweep(
        SEED, "window", windows, cases=cases, calibration=fit_calibration(cp_loss="constant")
    )
    ax = plots.plot_speedup_sweep(fraction, other=constant).axes[0]
    solid = [ln for ln in ax.lines if ln.get_label().endswith("fraction fit")]
    dashed = [ln for ln in ax.lines if ln.get_label().endswith("constant fit")]
    assert len(solid) == len(dashed) == len(cases)
    np.testing.assert_array_equal(dashed[1].get_ydata(), constant["speedup"][("allgather", 128)])
    assert len(ax.collections) == 2  # one band per configuration
    # the fits part at narrow windows: the band is open there
    ag = ("allgather", 128)
    assert fraction["speedup"][ag][0] > 1 > constant["speedup"][ag][0]
