"""Chapter 6's takeaway chart: one band per configuration between two fits, readable at
1280 px (no text under 10 px where the page shows it, no text over another)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tutorial_utils.pages import plots  # noqa: E402

CASES = [("ring", 1), ("allgather", 128)]
WINDOWS = [2**k for k in range(4, 15)]  # chapter 6's: 16 ... 16,384 tokens
DPI, COLUMN_PX = 100, 688  # the figures' PNG density; the content column at 1280 px


def sweep(scale):
    """A stand-in for costmodel.speedup_sweep's dict; speedups grow with the window."""
    grow = np.log2(WINDOWS) / np.log2(WINDOWS[-1])
    return {
        "field": "window",
        "values": WINDOWS,
        "base": 8192,
        "hardware": "GB200 (per Blackwell GPU)",
        "cp_size": 4,
        "speedup": {case: scale * (i + 1) * grow for i, case in enumerate(CASES)},
    }


@pytest.fixture
def fig():
    published = {("ring", 1): 2.22, ("allgather", 512): 2.36}
    figure = plots.plot_break_even_bands(sweep(1.0), sweep(0.5), published=published)
    yield figure
    plt.close("all")


def test_one_band_per_configuration_with_both_fits_as_edges(fig):
    ax = fig.axes[0]
    bands = [
        c
        for c in ax.collections
        if type(c).__name__ in ("PolyCollection", "FillBetweenPolyCollection")
    ]
    assert len(bands) == len(CASES)
    ys = [tuple(line.get_ydata()) for line in ax.lines]
    for case in CASES:
        assert tuple(sweep(1.0)["speedup"][case]) in ys
        assert tuple(sweep(0.5)["speedup"][case]) in ys
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:2] == ["ring, stripe 1", "allgather, stripe 128"]
    assert "TE measured: allgather, stripe 512, 2.36x" in labels
    assert ax.get_xscale() == "log" and "4 x GB200" in ax.get_title()


def test_text_is_at_least_10_px_and_nothing_overlaps_at_1280_px(fig):
    from matplotlib.text import Text

    fig.set_dpi(DPI)
    fig.canvas.draw()
    scale = min(1.0, COLUMN_PX / (fig.get_figwidth() * DPI))
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    small = [
        (t.get_text(), t.get_fontsize()) for t in texts if t.get_fontsize() * DPI / 72 * scale < 10
    ]
    assert not small
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    overlaps = [
        (a, b)
        for i, (a, box_a) in enumerate(boxes)
        for b, box_b in boxes[i + 1 :]
        if box_a.overlaps(box_b)
    ]
    assert not overlaps
    legend = fig.legends[0].get_window_extent(renderer)
    assert not legend.overlaps(fig.axes[0].get_window_extent(renderer))


def test_mismatched_sweeps_are_rejected():
    other = sweep(0.5)
    other["values"] = WINDOWS[:-1]
    with pytest.raises(ValueError, match="same values"):
        plots.plot_break_even_bands(sweep(1.0), other)
    with pytest.raises(ValueError, match="other must be"):
        plots.plot_break_even_bands(sweep(1.0), {"values": [1]})
