"""Figures of the cost model's predictions (chapter 6): where each configuration's time goes,
and the predicted speedup along one swept workload field, with TE's published points.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .style import fit_to_column, load_matplotlib

_PUBLISHED_LABEL = "published (TE tutorial, 4xGB200)"
_PUBLISHED_STYLE = dict(marker="*", s=110, color="black", zorder=5)
_BREAKDOWN_PARTS = (
    ("ideal_ms", "ideal (one GPU / cp)"),
    ("fragmentation_ms", "tile fragmentation"),
    ("imbalance_ms", "load imbalance"),
    ("cp_overhead_ms", "fitted CP efficiency loss"),
    ("comm_exposed_ms", "exposed communication"),
)


def _case_text(strategy, stripe, sep=", ") -> str:
    return str(strategy) + ("" if stripe is None else f"{sep}stripe {stripe}")


def _short_gpu(name) -> str:
    return str(name).split(" (")[0]  # "GB200 (per Blackwell GPU)" -> "GB200"


def plot_time_breakdown(predictions, *, published=None, title: str | None = None):
    """Model-predicted fwd+bwd time of each configuration, stacked by where the time goes.

    Why: a speedup short of ``cp`` has several causes, and the fix depends on which one
    dominates. ``predictions``: applicable
    :class:`~tutorial_utils.perfmodel.costmodel.Prediction` objects; each bar stacks its
    ``breakdown`` (the ideal one-GPU time / cp, tile fragmentation, load imbalance, the
    fitted CP efficiency loss, exposed communication). ``published``: optional mapping
    ``(strategy, stripe) -> ms``, drawn as black stars on the matching bars and labelled
    as TE's published 4xGB200 times, so the reader sees which bars the model was fitted on.
    """
    preds = list(predictions) if isinstance(predictions, (list, tuple)) else None
    if not preds:
        raise ValueError("predictions must be a non-empty list of costmodel.predict(...) results.")
    for i, p in enumerate(preds):
        if not getattr(p, "applicable", False) or not isinstance(
            getattr(p, "breakdown", None), Mapping
        ):
            raise ValueError(
                f"predictions[{i}] is not an applicable prediction with a breakdown "
                f"({getattr(p, 'reason', p)!r}); leave it out."
            )
    pub = dict(published or {})
    plt = load_matplotlib().pyplot
    fig, ax = plt.subplots(figsize=(8.4, 3.8), constrained_layout=True)
    x = np.arange(len(preds))
    bottom = np.zeros(len(preds))
    for key, name in _BREAKDOWN_PARTS:
        vals = np.array([float(p.breakdown[key]) for p in preds])
        ax.bar(x, vals, bottom=bottom, label=name, width=0.6)
        bottom += vals
    stars = [
        (i, pub[(p.strategy, p.stripe_size)])
        for i, p in enumerate(preds)
        if (p.strategy, p.stripe_size) in pub
    ]
    if stars:
        ax.scatter(
            [i for i, _ in stars],
            [ms for _, ms in stars],
            label=_PUBLISHED_LABEL,
            **_PUBLISHED_STYLE,
        )
    ax.set_xticks(x, [_case_text(p.strategy, p.stripe_size, "\n") for p in preds], fontsize=9)
    ax.set_ylabel("fwd+bwd time (ms)")
    ax.set_title(
        title
        or f"Model prediction, {preds[0].cp_size} x {_short_gpu(preds[0].hardware)}: "
        "where the time goes",
        fontsize=10,
    )
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fit_to_column(fig)


def plot_speedup_sweep(
    sweep: Mapping,
    *,
    published=None,
    xlabel: str | None = None,
    title: str | None = None,
    other: Mapping | None = None,
    labels: tuple[str, str] = ("fraction fit", "constant fit"),
):
    """Predicted speedup over one GPU along one swept workload field, one line per configuration.

    Why: the line crossing 1 is where CP starts (or stops) paying off. ``sweep``: the dict
    :func:`tutorial_utils.perfmodel.costmodel.speedup_sweep` returns (NaN points, where a
    strategy cannot run the shape, are gaps). ``published``: optional mapping
    ``(strategy, stripe) -> speedup`` drawn as black stars at the sweep's ``base`` value
    (the workload the measurements were taken on). ``other``: the same sweep under a second
    calibration; each configuration is then drawn as a band between the two predictions
    (solid: ``sweep``, dashed: ``other``, named by ``labels``), so a reader sees the range the
    two fits leave open. A field spanning more than 8x is drawn on a log2 axis.
    """
    if not isinstance(sweep, Mapping) or not {"values", "speedup", "field"} <= set(sweep):
        raise ValueError("sweep must be the dict costmodel.speedup_sweep(...) returns.")
    xs = np.asarray(sweep["values"], dtype=np.float64)
    if xs.ndim != 1 or xs.size == 0 or not sweep["speedup"]:
        raise ValueError("sweep has no values or no configurations to draw.")
    plt = load_matplotlib().pyplot
    fig, ax = plt.subplots(figsize=(7.2, 3.9), constrained_layout=True)
    colors = {key: f"C{i}" for i, key in enumerate(sweep["speedup"])}
    # a marker and a width per configuration, wider first, so that lines lying on one another
    # (AllGather's stripes at narrow windows) both stay visible
    markers = {key: "os^vDP"[i % 6] for i, key in enumerate(sweep["speedup"])}
    n_cases = len(sweep["speedup"])
    widths = {key: 1.2 + 1.0 * (n_cases - 1 - i) for i, key in enumerate(sweep["speedup"])}
    # the second fit's lines dashed, each configuration with its own pattern
    patterns = ((5, 2), (1.5, 1.5), (6, 2, 1.5, 2), (3, 3), (1, 3))
    dashes = {key: patterns[i % len(patterns)] for i, key in enumerate(sweep["speedup"])}
    for key, ys in sweep["speedup"].items():
        ys = np.asarray(ys, dtype=np.float64)
        if ys.shape != xs.shape:
            raise ValueError(
                f"sweep['speedup'][{key!r}] has {ys.size} points for {xs.size} values."
            )
        if other is None:
            ax.plot(
                xs, ys, "-o", ms=3, color=colors[key], label=f"model prediction: {_case_text(*key)}"
            )
            continue
        alt = np.asarray(other["speedup"][key], dtype=np.float64)
        ax.plot(
            xs,
            ys,
            "-",
            lw=widths[key],
            marker=markers[key],
            ms=3 + widths[key],
            mfc="none",
            color=colors[key],
            label=f"{_case_text(*key)}: {labels[0]}",
        )
        ax.plot(
            xs,
            alt,
            dashes=dashes[key],
            lw=1.2 + 0.6 * (widths[key] > 1.2),
            color=colors[key],
            label=f"{_case_text(*key)}: {labels[1]}",
        )
        ax.fill_between(xs, np.fmin(ys, alt), np.fmax(ys, alt), color=colors[key], alpha=0.15)
    stars = [(key, s) for key, s in dict(published or {}).items() if key in colors]
    for j, (key, s) in enumerate(sorted(stars, key=lambda ks: ks[1])):
        ax.scatter(
            [sweep.get("base")], [s], label=_PUBLISHED_LABEL if j == 0 else None, **_PUBLISHED_STYLE
        )
        # each star names its configuration, the lower one below-left, the next above-left
        ax.annotate(
            f"{_case_text(*key)} {s:.2f}x",
            (sweep.get("base"), s),
            xytext=(-9, -9 if j % 2 == 0 else 9),
            textcoords="offset points",
            ha="right",
            va="center",
            fontsize=9,
            bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85),
        )
    ax.axhline(1.0, color="0.3", lw=0.9, ls=":", label="one GPU (break-even)")
    if xs.min() > 0 and xs.max() / xs.min() > 8:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{v:,.0f}" for v in xs], fontsize=9)
        ax.minorticks_off()
    ax.set_xlabel(xlabel or str(sweep["field"]))
    ax.set_ylabel("speedup over one GPU")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    cp = sweep.get("cp_size")
    where = (
        _short_gpu(sweep.get("hardware", ""))
        if cp is None
        else f"{cp} x {_short_gpu(sweep.get('hardware', ''))}"
    )
    ax.set_title(title or f"Model prediction, {where}: speedup vs {sweep['field']}", fontsize=10)
    # under the axes, never over the curves
    fig.legend(
        *ax.get_legend_handles_labels(),
        fontsize=9,
        loc="outside lower center",
        ncol=2,
        frameon=False,
    )
    return fit_to_column(fig)


def plot_break_even_bands(
    sweep: Mapping,
    other: Mapping,
    *,
    published=None,
    xlabel: str | None = None,
    title: str | None = None,
    labels: tuple[str, str] = ("fraction fit", "constant fit"),
):
    """Predicted speedup over one GPU as one band per configuration, between two calibrations.

    Why: the takeaway chart of chapter 6. Two fits of TE's three published times agree at
    TE's window and part at narrow ones, so each configuration is a range, not a line: the
    band's solid edge is ``sweep``, its dashed edge ``other``. Published points are stars in
    their strategy's colour at the sweep's ``base`` value, named in the legend, not on the plot.

    Args:
        sweep: The dict :func:`tutorial_utils.perfmodel.costmodel.speedup_sweep` returns.
        other: The same sweep under the second calibration (same values and configurations).
        published: Optional mapping ``(strategy, stripe) -> speedup``, TE's measured points.
        xlabel: The x axis label; default the swept field's name.
        title: The title; default names the model, the CP size and the GPU.
        labels: The names of the two fits, for the edges' legend entries.

    Returns:
        The :class:`~matplotlib.figure.Figure`.

    Raises:
        ValueError: ``sweep`` or ``other`` is not a sweep, or they do not match.
    """
    for name, s in (("sweep", sweep), ("other", other)):
        if not isinstance(s, Mapping) or not {"values", "speedup", "field"} <= set(s):
            raise ValueError(f"{name} must be the dict costmodel.speedup_sweep(...) returns.")
    xs = np.asarray(sweep["values"], dtype=np.float64)
    if xs.ndim != 1 or xs.size == 0 or not sweep["speedup"]:
        raise ValueError("sweep has no values or no configurations to draw.")
    if list(other["values"]) != list(sweep["values"]) or set(other["speedup"]) != set(
        sweep["speedup"]
    ):
        raise ValueError("other must sweep the same values and configurations as sweep.")
    mpl = load_matplotlib()
    plt = mpl.pyplot
    fig, ax = plt.subplots(figsize=(6.8, 3.9), constrained_layout=True)
    handles = []
    for i, (key, ys) in enumerate(sweep["speedup"].items()):
        ys = np.asarray(ys, dtype=np.float64)
        alt = np.asarray(other["speedup"][key], dtype=np.float64)
        if ys.shape != xs.shape or alt.shape != xs.shape:
            raise ValueError(f"configuration {key!r} has a point count unlike the values'.")
        color = f"C{i}"
        ax.fill_between(xs, np.fmin(ys, alt), np.fmax(ys, alt), color=color, alpha=0.3, lw=0)
        ax.plot(xs, ys, "-", color=color, lw=2)
        ax.plot(xs, alt, "--", color=color, lw=2)
        handles.append(mpl.patches.Patch(color=color, alpha=0.5, label=_case_text(*key)))
    edge = mpl.lines.Line2D
    handles += [
        edge([], [], color="0.3", lw=2, label=f"solid edge: {labels[0]}"),
        edge([], [], color="0.3", lw=2, ls="--", label=f"dashed edge: {labels[1]}"),
    ]
    # each measured point a star in its strategy's colour, its value in the legend
    colors = {key[0]: f"C{i}" for i, key in enumerate(sweep["speedup"])}
    for key, s in sorted(dict(published or {}).items(), key=lambda ks: ks[1]):
        color = colors.get(key[0], "black")
        ax.scatter([sweep.get("base")], [s], marker="*", s=160, color=color, ec="black", zorder=5)
        handles.append(
            edge(
                [],
                [],
                ls="",
                marker="*",
                ms=13,
                mfc=color,
                mec="black",
                label=f"TE measured: {_case_text(*key)}, {s:.2f}x",
            )
        )
    ax.axhline(1.0, color="0.2", lw=1, ls=":")
    ax.text(xs[0], 1.03, "one GPU", fontsize=10, va="bottom", color="0.2")
    if xs.min() > 0 and xs.max() / xs.min() > 8:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{v:,.0f}" for v in xs], fontsize=10)
        ax.minorticks_off()
    ax.tick_params(labelsize=10)
    ax.set_xlabel(xlabel or str(sweep["field"]), fontsize=10)
    ax.set_ylabel("speedup over one GPU", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    where = f"{sweep.get('cp_size')} x {_short_gpu(sweep.get('hardware', ''))}"
    ax.set_title(title or f"Model prediction, {where}", fontsize=11)
    fig.legend(handles=handles, fontsize=10, loc="outside lower center", ncol=2, frameon=False)
    return fit_to_column(fig)
