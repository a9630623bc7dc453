"""Figures and labels of measured times: the chapter 5 benchmark's bars, and the stored
``cp-bench/1`` records of the benchmarks page (a label per result row, speedups, times).

``result_labels`` and ``record_speedup`` draw nothing; the pages also print them in tables.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence

import numpy as np

from tutorial_utils.perfmodel.records import source_title

from .style import fit_to_column, load_matplotlib

# --------------------------------------------------------------------------------------------
# chapter 5: the benchmark's bars


def _check_results(name: str, results) -> list:
    if not isinstance(results, (list, tuple)) or not results:
        raise ValueError(
            f"{name} must be a non-empty list of result dicts with 'strategy' and 'mean_ms'."
        )
    out = []
    for i, r in enumerate(results):
        if not isinstance(r, Mapping) or "strategy" not in r:
            raise ValueError(
                f"{name}[{i}] must be a dict with 'strategy' and 'mean_ms', got {r!r}."
            )
        ms = r.get("mean_ms")
        if (
            isinstance(ms, bool)
            or not isinstance(ms, (int, float))
            or not math.isfinite(ms)
            or ms <= 0
        ):
            raise ValueError(
                f"{name}[{i}].mean_ms must be a positive finite number of milliseconds, got {ms!r}."
            )
        std = r.get("std_ms")
        if std is not None and (
            isinstance(std, bool) or not isinstance(std, (int, float)) or not std >= 0
        ):
            raise ValueError(f"{name}[{i}].std_ms must be a number >= 0 (or absent), got {std!r}.")
        out.append(r)
    return out


def _bar_panel(ax, results, title):
    labels, ms, err = [], [], []
    for r in results:
        st = r.get("stripe_size")
        labels.append(f"{r['strategy']}" + (f"\nstripe {st}" if st not in (None, 0) else ""))
        ms.append(float(r["mean_ms"]))
        err.append(float(r.get("std_ms") or 0.0))
    base = next((float(r["mean_ms"]) for r in results if r["strategy"] == "single"), None)
    colors = ["#7f7f7f" if r["strategy"] == "single" else "#4c72b0" for r in results]
    bars = ax.bar(
        range(len(ms)),
        ms,
        yerr=err if any(err) else None,
        color=colors,
        capsize=3,
        error_kw=dict(elinewidth=1.0, ecolor="0.15"),
    )
    for b, m, e in zip(bars, ms, err):
        text = _fmt_ms(m)
        if base:
            text += f"\n{base / m:.2f}x"
        # anchored at the top of the error bar and lifted by a few points, so the bar never crosses
        # the label
        ax.annotate(
            text,
            (b.get_x() + b.get_width() / 2, b.get_height() + e),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_xticks(range(len(ms)), labels, fontsize=9)
    ax.set_ylabel("forward + backward [ms]")
    ax.margins(y=0.3)
    ax.set_title(title, fontsize=9)


def plot_benchmark(
    results,
    *,
    published=None,
    title: str | None = "this machine",
    published_title: str = "published by TE, 4x GB200",
):
    """Forward+backward times as bars; published figures, if given, in a *separate* panel.

    ``results`` / ``published``: lists of dicts with ``strategy``, ``mean_ms`` and
    optionally ``std_ms`` (error bar) and ``stripe_size`` (as in a ``cp-bench/1``
    record's ``results``). Each bar is labelled with its time and, when a ``'single'``
    entry exists in the same panel, the speed-up over it. The two panels never share a
    y-axis: timings from different machines and backends are not comparable.
    ``results=None`` draws the published panel alone: a CPU run's times are printed by the
    page, since bars of them next to GPU speed-ups invite a wrong reading.
    """
    if results is None and published is None:
        raise ValueError("results and published are both None; pass at least one of them.")
    local = None if results is None else _check_results("results", results)
    pub = None if published is None else _check_results("published", published)
    panels = [(local, title or "")] if local is not None else []
    if pub is not None:
        panels.append((pub, published_title))
    plt = load_matplotlib().pyplot
    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n, 3.6), squeeze=False, constrained_layout=True)
    for ax, (rows, name) in zip(axes[0], panels):
        _bar_panel(ax, rows, name)
        if rows is pub:
            ax.set_facecolor("#f7f3e8")
    return fit_to_column(fig)


# --------------------------------------------------------------------------------------------
# the benchmarks page: stored cp-bench/1 records

_DISTINGUISHING_FIELDS = (
    ("seq_len", "S={}"),
    ("window", "window {}"),
    ("batch", "batch {}"),
    ("cp_size", "cp {}"),
)


def _fmt_ms(ms: float) -> str:
    """A time for a bar label: ``0.123 ms``, ``57.2 ms``, ``1,213 ms``, ``63.9 s``."""
    if ms >= 10_000:
        return f"{ms / 1e3:,.1f} s"
    if ms >= 1_000:
        return f"{ms:,.0f} ms"
    return f"{ms:.3g} ms" if ms < 100 else f"{ms:.1f} ms"


def _is_extrapolated(row: Mapping) -> bool:
    return bool(row.get("extrapolated")) or str(row.get("measurement", "")).startswith(
        "extrapolated"
    )


def _field_text(value) -> str:
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(str(v) for v in value) + ")"
    return (
        f"{value:,}"
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        else str(value)
    )


def result_labels(results) -> list:
    """One distinct, readable label per result row of a ``cp-bench/1`` record.

    The label starts with the strategy and its stripe (``"ring (stripe 1)"``). Rows that
    would share a label get the fields in which they differ (``seq_len`` as ``S=...``,
    ``window``, ``batch``, ``cp_size``); rows marked extrapolated (``extrapolated: true`` or
    a ``measurement`` starting with "extrapolated") end in ``", extrapolated"`` and emulated
    rows in ``", emulated"``. Any labels still equal are numbered.
    """
    rows = _check_rows("results", results)
    base = []
    for r in rows:
        st = r.get("stripe_size")
        base.append(str(r["strategy"]) + ("" if st in (None, 0) else f" (stripe {st})"))
    labels = list(base)
    for name in set(base):
        group = [i for i, b in enumerate(base) if b == name]
        if len(group) < 2:
            continue
        for field, fmt in _DISTINGUISHING_FIELDS:
            values = [_field_text(rows[i].get(field)) for i in group]
            if len(set(values)) > 1:
                for i, v in zip(group, values):
                    labels[i] += ", " + fmt.format(v)
    for i, r in enumerate(rows):
        if _is_extrapolated(r):
            labels[i] += ", extrapolated"
        elif r.get("emulated"):
            labels[i] += ", emulated"
    seen: dict = {}
    counts = {lab: labels.count(lab) for lab in labels}
    for i, lab in enumerate(list(labels)):
        if counts[lab] > 1:
            seen[lab] = seen.get(lab, 0) + 1
            labels[i] = f"{lab} #{seen[lab]}"
    return labels


def _check_rows(name: str, results) -> list:
    if not isinstance(results, (list, tuple)) or not results:
        raise ValueError(f"{name} must be a non-empty list of result dicts with 'strategy'.")
    for i, r in enumerate(results):
        if not isinstance(r, Mapping) or "strategy" not in r:
            raise ValueError(f"{name}[{i}] must be a dict with 'strategy', got {r!r}.")
    return list(results)


def _record_title(record: Mapping, width: int = 70) -> str:
    return textwrap.fill(source_title(dict(record)), width)


def record_speedup(record: Mapping, row: Mapping) -> float | None:
    """A row's speedup: the stored ``speedup``, else the record's ``'single'`` time over the
    row's; ``None`` for a CPU record.

    Why none on a CPU: simulated CPU devices share one machine's cores, so the ratio of two
    times says how the stand-in or the reference scales there, not how CP speeds anything
    up; printed as "0.45x" it reads as one.
    """
    if str(record.get("source", "")).startswith("cpu"):
        return None
    if row.get("speedup") is not None:
        return float(row["speedup"])
    singles = [r["mean_ms"] for r in record.get("results", ()) if r.get("strategy") == "single"]
    if singles and row.get("mean_ms"):
        return float(singles[0]) / float(row["mean_ms"])
    return None


def _hbar_panel(
    ax, labels, values, errors, extrapolated, value_text, *, color="#4c72b0", log=False
):
    """Horizontal bars with value labels placed beyond the end of each error bar."""
    y = np.arange(len(values))
    face = ["white" if x else color for x in extrapolated]
    bars = ax.barh(y, values, color=face, edgecolor=color, lw=1.2, hatch=None, height=0.65)
    for bar, x in zip(bars, extrapolated):
        if x:
            bar.set_hatch("///")
    err = np.asarray([0.0 if (x or e is None) else float(e) for e, x in zip(errors, extrapolated)])
    has = err > 0
    if has.any():  # measured rows with a spread only: extrapolated rows never get an error bar
        ax.errorbar(
            np.asarray(values)[has],
            y[has],
            xerr=err[has],
            fmt="none",
            ecolor="0.15",
            elinewidth=1.0,
            capsize=3,
        )
    for yi, v, e, text in zip(y, values, err, value_text):
        ax.annotate(
            text,
            (v + e, yi),
            xytext=(5, 0),
            textcoords="offset points",
            ha="left",
            va="center",
            fontsize=9,
        )
    ax.set_yticks(y, labels, fontsize=9)
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
        lo, hi = min(values), max(values + err)
        ax.set_xlim(lo / 3, hi * 12)
    else:
        ax.set_xlim(0, max(values + err) * 1.3)
    return bars


def plot_record_times(record: Mapping, *, title: str | None = None):
    """Mean time per result row of one ``cp-bench/1`` record, as horizontal bars.

    Titled with the record's source and label. Each bar is labelled with its time (and the
    speedup over the record's single-device row, when known) *after* the end of its error
    bar (``std_ms``). Extrapolated rows are drawn hatched and unfilled, say so in their
    label, and never get an error bar. With times spanning more than 30x the axis is
    logarithmic.
    """
    if not isinstance(record, Mapping) or "results" not in record:
        raise ValueError(
            "record must be a cp-bench/1 record (a dict with 'results'); load it with"
            " records.load_records()."
        )
    rows = _check_results("record['results']", record["results"])
    labels = result_labels(rows)
    means = np.asarray([float(r["mean_ms"]) for r in rows])
    extrap = [_is_extrapolated(r) for r in rows]
    texts = []
    for r, m in zip(rows, means):
        s = record_speedup(record, r)
        text = _fmt_ms(m)
        if s is not None and r["strategy"] != "single":
            text += f"  ({s:.2f}x)"
        texts.append(text)
    log = means.max() / means.min() > 30
    mpl = load_matplotlib()
    fig, ax = mpl.pyplot.subplots(figsize=(7.2, 0.42 * len(rows) + 1.5), constrained_layout=True)
    _hbar_panel(ax, labels, means, [r.get("std_ms") for r in rows], extrap, texts, log=log)
    ax.set_xlabel("mean time per step (ms" + (", log scale)" if log else ")"), fontsize=9)
    ax.set_title(title or _record_title(record), fontsize=9)
    if log:  # plain numbers: a 10^k label's exponent would show at 70% of the label's size
        ax.xaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    if any(extrap):
        fig.legend(
            handles=[
                mpl.patches.Patch(
                    facecolor="white",
                    edgecolor="#4c72b0",
                    hatch="///",
                    label="extrapolated, not measured",
                )
            ],
            fontsize=9,
            loc="outside lower right",
            frameon=False,
        )
    return fit_to_column(fig)


def plot_record_speedups(records: Sequence[Mapping], *, title: str | None = None):
    """Speedup over one device, one panel (with its own axis) per record that has speedups.

    Records from different sources (a CPU run of the reference, TE's published GB200
    figures) are never drawn on one axis: each panel is titled with its record's source and
    label. Rows without a speedup (and the single-device rows) are left out; extrapolated
    rows are hatched and labelled as such. Returns ``None`` when no record has a speedup.
    """
    panels = []
    for rec in records:
        if not isinstance(rec, Mapping) or "results" not in rec:
            raise ValueError("records must be cp-bench/1 records (dicts with 'results').")
        rows = _check_rows("record['results']", rec["results"])
        labels = result_labels(rows)
        keep = [
            (lab, r, record_speedup(rec, r))
            for lab, r in zip(labels, rows)
            if r["strategy"] != "single"
        ]
        keep = [(lab, r, s) for lab, r, s in keep if s is not None]
        if keep:
            panels.append((rec, keep))
    if not panels:
        return None
    plt = load_matplotlib().pyplot
    heights = [0.42 * len(k) + 1.1 for _, k in panels]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(7.2, sum(heights) + 0.4),
        squeeze=False,
        constrained_layout=True,
        gridspec_kw={"height_ratios": heights},
    )
    for ax, (rec, keep) in zip(axes[:, 0], panels):
        labels = [lab for lab, _, _ in keep]
        values = np.asarray([s for _, _, s in keep])
        extrap = [_is_extrapolated(r) for _, r, _ in keep]
        color = "#b07d2b" if rec.get("source") == "published" else "#4c72b0"
        _hbar_panel(
            ax,
            labels,
            values,
            [None] * len(keep),
            extrap,
            [f"{v:.2f}x" for v in values],
            color=color,
        )
        ax.axvline(1.0, color="0.4", lw=0.9, ls=":")
        ax.set_xlabel("speedup over the same record's single device", fontsize=9)
        ax.set_title(_record_title(rec), fontsize=9)
        if rec.get("source") == "published":
            ax.set_facecolor("#f7f3e8")
    if title:
        fig.suptitle(title, fontsize=10)
    return fit_to_column(fig)
