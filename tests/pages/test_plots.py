"""Fast checks of the figure helpers: each returns a Figure showing the expected data, and
rejects bad input with a ValueError that names the parameter."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

from tutorial_utils.inputs import fixed_slot_segments, pack_segments  # noqa: E402
from tutorial_utils.pages import plots  # noqa: E402
from tutorial_utils.pages.plots.style import padding_spans  # noqa: E402
from tutorial_utils.perfmodel.workcount import count_work, local_token_order  # noqa: E402

MIN_FONT_PT = (
    9  # the smallest text any figure may draw (titles, labels, ticks, legends, annotations)
)


def small_texts(fig):
    """Visible, non-empty text artists of ``fig`` drawn below ``MIN_FONT_PT``."""
    from matplotlib.text import Text

    return [
        (t.get_text(), t.get_fontsize())
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and t.get_fontsize() < MIN_FONT_PT
    ]


@pytest.fixture(autouse=True)
def _close_figures():
    """After every test, each figure it drew must use fonts of at least ``MIN_FONT_PT`` points."""
    yield
    try:
        for num in plt.get_fignums():
            fig = plt.figure(num)
            fig.canvas.draw()  # ticks and legends exist once drawn
            assert not small_texts(fig), f"text below {MIN_FONT_PT} pt: {small_texts(fig)[:5]}"
    finally:
        plt.close("all")


@pytest.fixture
def small():
    return fixed_slot_segments(1, 32, 2, 12)


def _brute_visible(ids, pos, left):
    i, j = np.meshgrid(np.arange(ids.size), np.arange(ids.size), indexing="ij")
    vis = (ids[i] == ids[j]) & (ids[i] > 0) & (pos[j] <= pos[i])
    if left >= 0:
        vis &= pos[j] >= pos[i] - left
    return vis


# ----------------------------------------------------------------------------- ids and positions


def test_ids_and_positions_shows_ids_image_and_position_lines(small):
    ids, pos = small
    fig = plots.plot_ids_and_positions(ids, pos)
    assert isinstance(fig, Figure)
    ax_id, ax_pos = fig.axes
    np.testing.assert_array_equal(np.asarray(ax_id.images[0].get_array())[0], ids[0])
    # one line per segment plus padding; together they reproduce pos exactly once per token
    assert len(ax_pos.lines) == 3
    ys = np.stack([line.get_ydata() for line in ax_pos.lines]).astype(float)
    assert (np.sum(~np.isnan(ys), axis=0) == 1).all()
    np.testing.assert_array_equal(np.nanmax(ys, axis=0), pos[0])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (
            dict(segment_ids=np.zeros((1, 4), np.int32), segment_pos=np.zeros((1, 5), np.int32)),
            "segment_pos",
        ),
        (
            dict(segment_ids=np.zeros((1, 4), np.float32), segment_pos=np.zeros((1, 4), np.int32)),
            "segment_ids",
        ),
        (
            dict(segment_ids=-np.ones((1, 4), np.int32), segment_pos=np.zeros((1, 4), np.int32)),
            "segment_ids",
        ),
        (
            dict(
                segment_ids=np.ones((2, 4), np.int32), segment_pos=np.zeros((2, 4), np.int32), row=2
            ),
            "row",
        ),
    ],
)
def test_ids_and_positions_rejects_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        plots.plot_ids_and_positions(**kwargs)


# ----------------------------------------------------------------------------- mask


@pytest.mark.parametrize("window", [(-1, 0), (4, 0), (0, 0)])
def test_attention_mask_final_panel_is_the_visibility_matrix(small, window):
    ids, pos = small
    fig = plots.plot_attention_mask(ids, pos, window=window)
    assert len(fig.axes) == 4
    data = fig.axes[3].images[0].get_array()
    shown = ~np.ma.getmaskarray(data)
    expected = _brute_visible(ids[0], pos[0], window[0])
    np.testing.assert_array_equal(shown, expected)
    # visible pairs are coloured by their segment id
    np.testing.assert_array_equal(
        np.asarray(data)[expected], np.broadcast_to(ids[0][:, None], expected.shape)[expected]
    )
    assert str(int(expected.sum())) in fig.axes[3].get_title()


def test_attention_mask_rejects_bad_window_and_long_rows(small):
    ids, pos = small
    with pytest.raises(ValueError, match="window"):
        plots.plot_attention_mask(ids, pos, window=(-3, 0))
    with pytest.raises(ValueError, match="window"):
        plots.plot_attention_mask(ids, pos, window=5)
    long_ids, long_pos = fixed_slot_segments(1, 8192, 2, 100)
    with pytest.raises(ValueError, match="segment_ids"):
        plots.plot_attention_mask(long_ids, long_pos)


# ----------------------------------------------------------------------------- GQA


def test_gqa_mapping_draws_one_line_per_query_head_to_its_kv_head():
    fig = plots.plot_gqa_mapping(16, 4)
    ax = fig.axes[0]
    assert len(ax.lines) == 16
    kv_x = sorted({line.get_xdata()[1] for line in ax.lines})
    assert len(kv_x) == 4
    for h, line in enumerate(ax.lines):
        assert line.get_xdata()[0] == h
        assert kv_x.index(line.get_xdata()[1]) == h // 4
    assert sum(isinstance(p, Rectangle) for p in ax.patches) == 16 + 4


@pytest.mark.parametrize(
    "args, name",
    [
        ((16, 5), "num_kv_heads"),
        ((0, 1), "num_q_heads"),
        ((8, 0), "num_kv_heads"),
        ((128, 8), "num_q_heads"),
    ],
)
def test_gqa_mapping_rejects_bad_heads(args, name):
    with pytest.raises(ValueError, match=name):
        plots.plot_gqa_mapping(*args)


# ----------------------------------------------------------------------------- ownership


def test_token_ownership_matches_te_layouts():
    layouts = ["contiguous", ("striped", 1), ("striped", 2), "dual_chunk"]
    fig = plots.plot_token_ownership(16, 4, layouts)
    owners = np.asarray(fig.axes[0].images[0].get_array())
    assert owners.shape == (4, 16)
    np.testing.assert_array_equal(owners[0], np.repeat(np.arange(4), 4))
    np.testing.assert_array_equal(
        owners[1], np.tile(np.arange(4), 4)
    )  # stripe 1: token t on rank t % 4
    # TE's worked example, stripe 2: rank0 holds 0,1,8,9
    assert set(np.nonzero(owners[2] == 0)[0]) == {0, 1, 8, 9}
    # dual chunk, cp=4: rank0 holds 0,1,14,15
    assert set(np.nonzero(owners[3] == 0)[0]) == {0, 1, 14, 15}
    for i, (layout, stripe) in enumerate(
        [("contiguous", 1), ("striped", 1), ("striped", 2), ("dual_chunk", 1)]
    ):
        order = local_token_order(16, 4, layout, stripe)
        for r in range(4):
            assert (owners[i, order[r]] == r).all()
    assert len(fig.axes[0].texts) == 4 * 16  # annotated for short rows


def test_token_ownership_with_segment_row():
    ids, _ = fixed_slot_segments(1, 64, 2, 20)
    fig = plots.plot_token_ownership(64, 4, "contiguous", segment_ids=ids[0], annotate=False)
    assert len(fig.axes) == 2
    np.testing.assert_array_equal(np.asarray(fig.axes[1].images[0].get_array())[0], ids[0])


@pytest.mark.parametrize(
    "args, kwargs, name",
    [
        ((16, 4, []), {}, "layouts"),
        ((16, 4, ["zigzag"]), {}, "layout"),
        ((16, 4, [("striped", 0)]), {}, "stripe_size"),
        ((16, 0, ["contiguous"]), {}, "cp_size"),
        ((16, 4, ["contiguous"]), {"segment_ids": np.zeros(15, np.int32)}, "segment_ids"),
    ],
)
def test_token_ownership_rejects_bad_input(args, kwargs, name):
    with pytest.raises(ValueError, match=name):
        plots.plot_token_ownership(*args, **kwargs)


# ----------------------------------------------------------------------------- per-token series


def test_per_token_plots_each_series_and_shades_padding(small):
    ids, _ = small
    vals = {"a": np.arange(32.0), "b": np.ones(32)}
    fig = plots.plot_per_token(vals, ids[0], ylabel="norm")
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines] == ["a", "b"]
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), vals["a"])
    assert len(ax.patches) == 2  # two padding spans


def test_per_token_rejects_bad_input(small):
    ids, _ = small
    with pytest.raises(ValueError, match="values"):
        plots.plot_per_token({"a": np.ones(31)}, ids[0])
    with pytest.raises(ValueError, match="values"):
        plots.plot_per_token({}, ids[0])
    with pytest.raises(ValueError, match="segment_ids"):
        plots.plot_per_token(np.ones(32), ids)  # 2-D ids


# ----------------------------------------------------------------------------- rank work


def test_rank_work_panels_and_relative_totals():
    ids, pos = fixed_slot_segments(1, 256, 1, 256)
    mats = {
        layout: (
            count_work(
                ids, pos, (-1, 0), cp_size=4, layout=layout, stripe_size=1, tile=None
            ).pair_matrix
        )
        for layout in ("contiguous", "striped")
    }
    fig = plots.plot_rank_work(mats)
    assert len(fig.axes) == 3
    np.testing.assert_array_equal(fig.axes[0].images[0].get_array(), mats["contiguous"])
    rel = np.asarray(fig.axes[-1].images[0].get_array())
    totals = np.stack([m.sum(axis=1) for m in mats.values()])
    np.testing.assert_allclose(rel, totals / totals.mean(axis=1, keepdims=True))
    # one causal document split contiguously: the last rank does 7x the first rank's work
    assert rel[0, -1] / rel[0, 0] > 6
    assert f"{rel[0].max():.2f}" in fig.axes[0].get_title()


def test_rank_work_wraps_many_layouts_into_rows_of_three():
    ids, pos = fixed_slot_segments(1, 256, 1, 256)
    layouts = [
        ("contiguous", 1),
        ("striped", 1),
        ("striped", 4),
        ("striped", 16),
        ("dual_chunk", 1),
    ]
    mats = {
        f"{lay} {st}": (
            count_work(
                ids, pos, (-1, 0), cp_size=4, layout=lay, stripe_size=st, tile=None
            ).pair_matrix
        )
        for lay, st in layouts
    }
    fig = plots.plot_rank_work(mats)
    assert len(fig.axes) == len(mats) + 1
    heat = fig.axes[:-1]
    columns = sorted({round(ax.get_position().x0, 3) for ax in heat})
    rows = sorted({round(ax.get_position().y0, 3) for ax in heat})
    assert len(columns) == 3 and len(rows) == 2
    # the summary panel spans the full width below the heatmaps
    summary = fig.axes[-1].get_position()
    assert summary.width > 2 * heat[0].get_position().width
    assert summary.y0 < min(ax.get_position().y0 for ax in heat)
    # cell annotations are legible (not the 7-point text of a single long row)
    assert min(t.get_fontsize() for t in heat[0].texts) >= 8.5


def test_heatmap_text_colour_follows_cell_brightness():
    assert plots.text_color_for("yellow") == "black"
    assert plots.text_color_for("#440154") == "white"  # dark end of viridis
    fig, ax = plt.subplots()
    values = np.array([[0.0, 1.0], [0.5, 0.2]])
    im = ax.imshow(values, cmap="viridis", vmin=0, vmax=1)
    texts = plots.annotate_heatmap(ax, im, fmt="{:.1f}")
    colours = {t.get_text(): t.get_color() for t in texts}
    assert colours["1.0"] == "black" and colours["0.0"] == "white"
    with pytest.raises(ValueError, match="values"):
        plots.annotate_heatmap(ax, im, values=np.ones((3, 3)))


@pytest.mark.parametrize(
    "arg",
    [
        {},
        [np.eye(2)],
        {"a": np.ones((2, 3))},
        {"a": -np.ones((2, 2))},
        {"a": np.ones((2, 2)), "b": np.ones((3, 3))},
    ],
)
def test_rank_work_rejects_bad_input(arg):
    with pytest.raises(ValueError, match="pair_matrices"):
        plots.plot_rank_work(arg)


# ----------------------------------------------------------------------------- communication


@pytest.mark.parametrize(
    "strategy, schedule, panels, arrows",
    [
        ("ring", "te", 3, 4),
        ("allgather", "te", 3, 12),
        ("allgather", "reference", 2, 12),
        ("ulysses", "te", 2, 12),
    ],
)
def test_comm_steps_arrows_per_panel(strategy, schedule, panels, arrows):
    fig = plots.plot_comm_steps(strategy, 4, schedule=schedule)
    assert len(fig.axes) == panels
    for ax in fig.axes:
        assert sum(isinstance(p, FancyArrowPatch) for p in ax.patches) == arrows


def labels_outside_their_disc(fig) -> list:
    """The rank labels of ``fig`` whose box (at the saved size) reaches outside the disc
    centred on them."""
    from matplotlib.patches import Circle

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    bad = []
    for ax in fig.axes:
        discs = [p for p in ax.patches if isinstance(p, Circle)]
        for text in (t for t in ax.texts if t.get_gid() == "rank-label"):
            x, y = text.get_position()
            disc = min(discs, key=lambda c: (c.center[0] - x) ** 2 + (c.center[1] - y) ** 2)
            centre = ax.transData.transform(disc.center)
            edge = ax.transData.transform((disc.center[0] + disc.radius, disc.center[1]))
            box = text.get_window_extent(renderer)
            corners = [(box.x0, box.y0), (box.x0, box.y1), (box.x1, box.y0), (box.x1, box.y1)]
            reach = max(np.hypot(cx - centre[0], cy - centre[1]) for cx, cy in corners)
            if reach > edge[0] - centre[0]:
                bad.append(text.get_text().replace("\n", " "))
    return bad


@pytest.mark.parametrize(
    "strategy, schedule", [("ring", "te"), ("allgather", "te"), ("ulysses", "te")]
)
@pytest.mark.parametrize("cp", [4, 8])
def test_comm_steps_labels_stay_inside_equal_discs(strategy, schedule, cp):
    """Every rank's label fits inside its disc ("dKV3", "heads" included), and all the
    figure's discs have one radius; shrinking the discs makes the check fail."""
    from matplotlib.patches import Circle

    fig = plots.plot_comm_steps(strategy, cp, schedule=schedule)
    radii = {round(p.radius, 9) for ax in fig.axes for p in ax.patches if isinstance(p, Circle)}
    assert len(radii) == 1, radii
    assert labels_outside_their_disc(fig) == []
    for ax in fig.axes:
        for disc in (p for p in ax.patches if isinstance(p, Circle)):
            disc.set_radius(disc.radius * 0.7)
    assert labels_outside_their_disc(fig), "the check cannot fail"
    plt.close(fig)


def test_comm_steps_allgather_panels_follow_the_byte_accounting():
    """The diagram draws one panel per collective that tutorial_utils.perfmodel.comm counts, in
    order."""
    comm = pytest.importorskip("tutorial_utils.perfmodel.comm")
    for schedule in ("te", "reference"):
        vol = comm.comm_volume(
            "allgather",
            batch=1,
            seq_len=64,
            num_q_heads=4,
            num_kv_heads=2,
            head_dim=8,
            cp_size=4,
            schedule=schedule,
        )
        collectives = []
        for t in vol.transfers:
            key = (t.phase, t.op)
            if not collectives or collectives[-1] != key:
                collectives.append(key)
        fig = plots.plot_comm_steps("allgather", 4, schedule=schedule)
        titles = [ax.get_title() for ax in fig.axes]
        assert len(titles) == len(collectives)
        for (phase, op), t in zip(collectives, titles):
            assert ("forward" if phase == "fwd" else "backward") in t
            assert op in t


def test_comm_steps_ring_labels_follow_the_rotation():
    fig = plots.plot_comm_steps("ring", 4)
    # before hop t, rank r holds (and sends) block (r - t) mod 4
    for t, ax in enumerate(fig.axes):
        labels = [txt.get_text() for txt in ax.texts if txt.get_text().startswith("KV")]
        assert sorted(labels) == [f"KV{b}" for b in range(4)]
        held = [txt.get_text() for txt in ax.texts if txt.get_text().startswith("r")]
        assert held == [f"r{r}\nKV{(r - t) % 4}" for r in range(4)]


@pytest.mark.parametrize(
    "args, name", [(("tree", 4), "strategy"), (("ring", 1), "cp_size"), (("ring", 2.5), "cp_size")]
)
def test_comm_steps_rejects_bad_input(args, name):
    with pytest.raises(ValueError, match=name):
        plots.plot_comm_steps(*args)
    with pytest.raises(ValueError, match="schedule"):
        plots.plot_comm_steps("allgather", 4, schedule="xla")


def test_comm_bytes_bar_heights_match_the_volumes():
    comm = pytest.importorskip("tutorial_utils.perfmodel.comm")
    vols = {
        s: comm.comm_volume(
            s, batch=2, seq_len=2048, num_q_heads=16, num_kv_heads=4, head_dim=32, cp_size=4
        )
        for s in ("ring", "allgather", "ulysses")
    }
    fig = plots.plot_comm_bytes(vols, unit="B")
    ax = fig.axes[0]
    bars = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(bars) == 3 * 2 * 3  # strategies x phases x stacked groups
    for i, vol in enumerate(vols.values()):
        for k, expected in enumerate((vol.fwd_received, vol.bwd_received)):
            stack = bars[(i * 2 + k) * 3 : (i * 2 + k + 1) * 3]
            assert sum(b.get_height() for b in stack) == pytest.approx(expected)


def test_comm_bytes_rejects_bad_input():
    with pytest.raises(ValueError, match="volumes"):
        plots.plot_comm_bytes({})
    with pytest.raises(ValueError, match="volumes"):
        plots.plot_comm_bytes({"ring": {"fwd": 1}})
    with pytest.raises(ValueError, match="unit"):
        plots.plot_comm_bytes({"ring": object()}, unit="bits")


# ----------------------------------------------------------------------------- benchmark


def test_benchmark_separate_panels_and_speedups():
    local = [
        {"strategy": "single", "mean_ms": 100.0, "std_ms": 2.0},
        {"strategy": "ring", "stripe_size": 1, "mean_ms": 50.0},
    ]
    pub = [
        {"strategy": "single", "mean_ms": 126.7},
        {"strategy": "allgather", "stripe_size": 512, "mean_ms": 53.8},
    ]
    fig = plots.plot_benchmark(local, published=pub)
    assert len(fig.axes) == 2
    ax_local, ax_pub = fig.axes
    assert ax_local.get_shared_y_axes().get_siblings(ax_local) == [ax_local]
    assert [b.get_height() for b in ax_local.patches] == [100.0, 50.0]
    assert [b.get_height() for b in ax_pub.patches] == [126.7, 53.8]
    assert "published" in ax_pub.get_title() and "GB200" in ax_pub.get_title()
    assert any("2.00x" in t.get_text() for t in ax_local.texts)
    assert any("2.36x" in t.get_text() for t in ax_pub.texts)
    assert len(plots.plot_benchmark(local).axes) == 1


def test_benchmark_labels_sit_above_the_error_bars():
    local = [
        {"strategy": "single", "mean_ms": 100.0, "std_ms": 20.0},
        {"strategy": "ring", "stripe_size": 1, "mean_ms": 50.0, "std_ms": 10.0},
    ]
    fig = plots.plot_benchmark(local)
    ax = fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for bar, std in zip(ax.patches, (20.0, 10.0)):
        top = ax.transData.transform((0, bar.get_height() + std))[1]
        label = next(
            t for t in ax.texts if abs(t.xy[0] - (bar.get_x() + bar.get_width() / 2)) < 1e-9
        )
        assert label.get_window_extent(renderer).y0 > top


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(results=[]), "results"),
        (dict(results=[{"strategy": "ring", "mean_ms": 0.0}]), r"results\[0\]\.mean_ms"),
        (dict(results=[{"mean_ms": 1.0}]), r"results\[0\]"),
        (
            dict(results=[{"strategy": "ring", "mean_ms": 1.0, "std_ms": -1.0}]),
            r"results\[0\]\.std_ms",
        ),
        (
            dict(
                results=[{"strategy": "ring", "mean_ms": 1.0}],
                published=[{"strategy": "ring", "mean_ms": float("nan")}],
            ),
            r"published\[0\]\.mean_ms",
        ),
    ],
)
def test_benchmark_rejects_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        plots.plot_benchmark(**kwargs)


def test_colour_helpers_validate():
    assert len(plots.rank_colors(4)) == 4
    assert plots.segment_colors(3)[0] == plots.PAD_COLOR
    with pytest.raises(ValueError, match="cp_size"):
        plots.rank_colors(0)
    with pytest.raises(ValueError, match="num_segments"):
        plots.segment_colors(-1)


def test_padding_spans_helper():
    ids, _ = pack_segments([[3, 2]], seq_len=10, align=4)
    assert padding_spans(ids[0]) == [(3, 4), (6, 10)]


# ----------------------------------------------------------------------------- stored records

_BLOCKWISE_ROWS = [
    {
        "strategy": "single-blockwise",
        "stripe_size": None,
        "seq_len": 16384,
        "mean_ms": 1213.0,
        "std_ms": 124.0,
        "measurement": "measured",
        "extrapolated": False,
    },
    {
        "strategy": "single-blockwise",
        "stripe_size": None,
        "seq_len": 8192,
        "mean_ms": 664.0,
        "std_ms": 89.0,
        "measurement": "measured",
        "extrapolated": False,
    },
    {
        "strategy": "single-dense",
        "stripe_size": None,
        "seq_len": 8192,
        "mean_ms": 15978.0,
        "std_ms": 799.0,
        "measurement": "measured",
        "extrapolated": False,
    },
    {
        "strategy": "single-dense",
        "stripe_size": None,
        "seq_len": 16384,
        "mean_ms": 63912.0,
        "measurement": "extrapolated (x4 from S=8192)",
        "extrapolated": True,
    },
]


def _record(source, results, label="test"):
    return {
        "schema": "cp-bench/1",
        "source": source,
        "label": label,
        "hardware": {},
        "config": {},
        "results": results,
    }


def test_result_labels_are_distinct_and_mark_extrapolation():
    labels = plots.result_labels(_BLOCKWISE_ROWS)
    assert labels == [
        "single-blockwise, S=16,384",
        "single-blockwise, S=8,192",
        "single-dense, S=8,192",
        "single-dense, S=16,384, extrapolated",
    ]
    rows = [
        {"strategy": "ring", "stripe_size": 1, "window": [64, 0]},
        {"strategy": "ring", "stripe_size": 1, "window": [-1, 0]},
        {"strategy": "allgather", "stripe_size": 512},
        {"strategy": "allgather", "stripe_size": 512},
    ]
    assert plots.result_labels(rows) == [
        "ring (stripe 1), window (64, 0)",
        "ring (stripe 1), window (-1, 0)",
        "allgather (stripe 512) #1",
        "allgather (stripe 512) #2",
    ]
    with pytest.raises(ValueError, match="results"):
        plots.result_labels([])


def test_record_times_hatch_extrapolated_rows_and_keep_labels_past_error_bars():
    fig = plots.plot_record_times(_record("cpu-reference", _BLOCKWISE_ROWS))
    ax = fig.axes[0]
    bars = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_width() > 0][
        : len(_BLOCKWISE_ROWS)
    ]
    assert [b.get_hatch() for b in bars] == [None, None, None, "///"]
    assert [t.get_text() for t in ax.get_yticklabels()] == plots.result_labels(_BLOCKWISE_ROWS)
    assert ax.get_xscale() == "log"  # 664 ms to 64 s
    # error bars: one per measured row, none for the extrapolated one
    (errbar,) = [c for c in ax.containers if c.__class__.__name__ == "ErrorbarContainer"]
    segments = errbar.lines[2][0].get_segments()
    assert len(segments) == 3
    for row, text in zip(_BLOCKWISE_ROWS, ax.texts):
        assert text.xy[0] == pytest.approx(
            row["mean_ms"] + (0 if row["extrapolated"] else row["std_ms"])
        )
    assert "this machine" in ax.get_title()


def test_record_speedups_one_panel_per_record_never_a_shared_axis():
    gpu = _record(
        "gpu",
        [
            {"strategy": "single", "mean_ms": 200.0},
            {"strategy": "ring", "stripe_size": 1, "mean_ms": 400.0},
        ],
        label="gpu run",
    )
    pub = _record(
        "published",
        [
            {"strategy": "single", "mean_ms": 126.7, "speedup": 1.0},
            {"strategy": "ring", "stripe_size": 1, "mean_ms": 57.2, "speedup": 2.22},
            {"strategy": "allgather", "stripe_size": 512, "mean_ms": 53.8, "speedup": 2.36},
        ],
        label="TE tutorial, 4x GB200",
    )
    no_speedup = _record("gpu-reference", _BLOCKWISE_ROWS)
    fig = plots.plot_record_speedups([gpu, no_speedup, pub])
    assert len(fig.axes) == 2
    ax_gpu, ax_pub = fig.axes
    assert ax_gpu.get_shared_x_axes().get_siblings(ax_gpu) == [ax_gpu]
    assert "GPU run" in ax_gpu.get_title() and "published" in ax_pub.get_title()
    assert [b.get_width() for b in ax_gpu.patches] == [0.5]
    assert [b.get_width() for b in ax_pub.patches] == [2.22, 2.36]
    assert plots.plot_record_speedups([no_speedup]) is None


def test_cpu_records_get_no_speedup_anywhere():
    """Simulated CPU devices share the cores: a CPU record's ratio is no speedup, so its
    bars carry times only and it gets no speedup panel; the same rows filed as a GPU run
    do get them."""
    rows = [
        {"strategy": "single", "mean_ms": 200.0, "std_ms": 1.0},
        {"strategy": "ring", "stripe_size": 1, "mean_ms": 400.0, "std_ms": 1.0},
    ]
    for source in ("cpu-te", "cpu-reference"):
        rec = _record(source, rows)
        assert plots.record_speedup(rec, rows[1]) is None
        assert plots.plot_record_speedups([rec]) is None
        fig = plots.plot_record_times(rec)
        assert not any("x)" in t.get_text() for t in fig.axes[0].texts), source
        plt.close(fig)
    gpu = _record("gpu", rows)
    assert plots.record_speedup(gpu, rows[1]) == 0.5
    fig = plots.plot_record_times(gpu)
    assert any(t.get_text().endswith("(0.50x)") for t in fig.axes[0].texts)
    plt.close(fig)


def test_the_font_check_can_fail():
    fig, ax = plt.subplots()
    ax.text(0, 0, "tiny", fontsize=7)
    assert small_texts(fig) == [("tiny", 7.0)]
    plt.close(fig)


def test_batch_and_window_shows_every_row_and_the_window_band():
    ids, pos = pack_segments([[40, 20], [64]], 64, align=4)
    fig = plots.plot_batch_and_window(ids, pos, window=(8, 0))
    ax_ids, ax_vis = fig.axes
    np.testing.assert_array_equal(np.asarray(ax_ids.images[0].get_array()), ids)
    shown = ~np.ma.getmaskarray(ax_vis.images[0].get_array())
    np.testing.assert_array_equal(shown, _brute_visible(ids[0], pos[0], 8))
    assert shown.sum(axis=1).max() == 9  # a window of 8 keys plus the query itself
    assert "window=(8, 0)" in ax_vis.get_title() and "padding" in ax_ids.get_title()
    with pytest.raises(ValueError, match="window"):
        plots.plot_batch_and_window(ids, pos, window=(8, 8, 8))


def test_benchmark_without_local_results_draws_the_published_panel_alone():
    """A CPU page prints its times and draws only TE's published figures, as bars."""
    pub = [
        dict(strategy="single", mean_ms=126.7),
        dict(strategy="ring", mean_ms=57.2, stripe_size=1),
    ]
    fig = plots.plot_benchmark(None, published=pub, published_title="published by TE")
    (ax,) = fig.axes
    assert [b.get_height() for b in ax.patches] == [126.7, 57.2]
    assert ax.get_title() == "published by TE"
    with pytest.raises(ValueError, match="results and published are both None"):
        plots.plot_benchmark(None)
