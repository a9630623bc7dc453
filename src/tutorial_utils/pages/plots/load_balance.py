"""Figures of how context parallelism shares a sequence out: which rank holds each token
under each layout (chapters 2 and 4), and the attention work each rank then does (chapter 4).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from tutorial_utils.perfmodel.workcount import LAYOUTS, local_token_order

from .checks import positive_int
from .style import annotate_heatmap, fit_to_column, load_matplotlib, rank_colors, segment_cmap


def _layout_spec(item) -> tuple[str, int, str]:
    if isinstance(item, str):
        layout, stripe = item, 1
    elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str):
        layout, stripe = item[0], item[1]
    else:
        raise ValueError(
            "layouts entries must be a layout name or a (layout, stripe_size) pair such as"
            f" ('striped', 16); got {item!r}."
        )
    if layout not in LAYOUTS:
        raise ValueError(f"layouts entry {item!r}: layout must be one of {LAYOUTS}.")
    stripe = positive_int("stripe_size", stripe)
    label = {"contiguous": "contiguous (no reorder)", "dual_chunk": "dual-chunk swap"}.get(
        layout, f"striped, stripe {stripe}"
    )
    return layout, stripe, label


def plot_token_ownership(
    seq_len: int,
    cp_size: int,
    layouts: Sequence = ("contiguous",),
    *,
    segment_ids=None,
    annotate: bool | None = None,
    title: str | None = None,
):
    """Which rank holds each token of a row, for one or more layouts (one image row per layout).

    ``layouts``: names (``'contiguous'``, ``'striped'``, ``'dual_chunk'``) or
    ``(layout, stripe_size)`` pairs. Rank r holds the r-th contiguous slice of the
    (reordered) sequence, so a layout is the permutation of
    :func:`tutorial_utils.perfmodel.workcount.local_token_order`. With ``segment_ids`` (one row,
    ``[seq]``) an extra image row shows the packing underneath. ``annotate`` writes the
    rank number into each cell (default: when ``seq_len <= 64``). The owner matrix is the
    first image's data, ``[len(layouts), seq_len]``.
    """
    s = positive_int("seq_len", seq_len)
    cp = positive_int("cp_size", cp_size)
    if isinstance(layouts, (str, tuple)) and (
        isinstance(layouts, str)
        or (len(layouts) == 2 and isinstance(layouts[1], (int, np.integer)))
    ):
        layouts = [layouts]
    layouts = list(layouts)
    if not layouts:
        raise ValueError(
            "layouts is empty; pass at least one layout, e.g. ['contiguous', ('striped', 1)]."
        )
    specs = [_layout_spec(item) for item in layouts]
    owners = np.empty((len(specs), s), np.int64)
    for i, (layout, stripe, _) in enumerate(specs):
        order = local_token_order(s, cp, layout, stripe)
        owners[i, order.reshape(-1)] = np.repeat(np.arange(cp), s // cp)
    ids_row = None
    if segment_ids is not None:
        ids_row = np.asarray(segment_ids)
        if (
            ids_row.ndim != 1
            or ids_row.shape[0] != s
            or not np.issubdtype(ids_row.dtype, np.integer)
        ):
            raise ValueError(
                f"segment_ids must be one integer row of length seq_len={s}, got shape"
                f" {ids_row.shape} and dtype {ids_row.dtype}; pass ids[0]."
            )
    if annotate is None:
        annotate = s <= 64

    mpl = load_matplotlib()
    if ids_row is None:
        fig, ax0 = mpl.pyplot.subplots(
            figsize=(9, 0.55 * len(specs) + 1.3), constrained_layout=True
        )
        ax_ids = None
    else:
        fig, (ax0, ax_ids) = mpl.pyplot.subplots(
            2,
            1,
            figsize=(9, 0.55 * len(specs) + 1.8),
            sharex=True,
            constrained_layout=True,
            gridspec_kw={"height_ratios": [len(specs), 1]},
        )
    colors = rank_colors(cp)
    cmap = mpl.colors.ListedColormap(colors)
    norm = mpl.colors.BoundaryNorm(np.arange(cp + 1) - 0.5, cp)
    ax0.imshow(
        owners,
        aspect="auto",
        cmap=cmap,
        norm=norm,
        interpolation="nearest",
        extent=(-0.5, s - 0.5, len(specs) - 0.5, -0.5),
    )
    ax0.set_yticks(range(len(specs)), [lab for _, _, lab in specs], fontsize=9)
    if annotate:
        for i in range(len(specs)):
            for t in range(s):
                ax0.text(
                    t, i, str(owners[i, t]), ha="center", va="center", fontsize=9, color="white"
                )
    if ax_ids is not None:
        n_seg = int(ids_row.max())
        scmap, snorm = segment_cmap(n_seg)
        ax_ids.imshow(
            ids_row[None, :],
            aspect="auto",
            cmap=scmap,
            norm=snorm,
            interpolation="nearest",
            extent=(-0.5, s - 0.5, 0.5, -0.5),
        )
        ax_ids.set_yticks([0], ["segment ids"], fontsize=9)
        ax_ids.set_xlabel("token index (original order)")
    else:
        ax0.set_xlabel("token index (original order)")
    handles = [mpl.patches.Patch(color=colors[r], label=f"rank {r}") for r in range(cp)]
    ax0.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(0, 1.02),
        ncol=min(cp, 8),
        fontsize=9,
        frameon=False,
    )
    fig.suptitle(title or f"Which rank holds each token (seq_len={s}, cp={cp})", fontsize=10)
    return fit_to_column(fig)


def _square_matrices(pair_matrices) -> tuple[list, list, int]:
    if not isinstance(pair_matrices, Mapping) or not pair_matrices:
        raise ValueError(
            "pair_matrices must be a non-empty mapping {layout label: [cp, cp] pair matrix}, "
            "e.g. {'contiguous': count_work(...).pair_matrix}."
        )
    labels, mats, cp = [], [], None
    for label, m in pair_matrices.items():
        arr = np.asarray(m)
        if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] < 1:
            raise ValueError(
                f"pair_matrices[{label!r}] has shape {arr.shape}; expected a square [cp, cp] matrix"
                " (query rank x key rank)."
            )
        if not np.issubdtype(arr.dtype, np.number) or (arr < 0).any():
            raise ValueError(f"pair_matrices[{label!r}] must hold non-negative pair counts.")
        if cp is None:
            cp = arr.shape[0]
        elif arr.shape[0] != cp:
            raise ValueError(
                f"pair_matrices[{label!r}] is {arr.shape[0]}x{arr.shape[0]} but the first matrix is"
                f" {cp}x{cp}; compare layouts at one cp_size."
            )
        labels.append(str(label))
        mats.append(arr.astype(np.float64))
    return labels, mats, cp


def _fmt_count(x: float) -> str:
    """A pair count in at most four characters ("131k", "1.31M"), so that a heatmap cell can
    print it at a size that stays legible when the figure is scaled to the page's column."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            v = x / scale
            return (f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}") + suffix
    return f"{x:.0f}"


def plot_rank_work(pair_matrices, *, title: str | None = None):
    """Per-rank attention work for several layouts.

    ``pair_matrices``: ``{label: M}`` with ``M[q_rank, kv_rank]`` the visible query-key
    pairs whose query lives on ``q_rank`` and key on ``kv_rank`` (e.g.
    :func:`tutorial_utils.perfmodel.workcount.pair_matrix`). One heatmap per layout (annotated in
    pairs, at most three per row), and a last, full-width panel with each rank's total
    divided by the mean over ranks, one row per layout: 1.00 everywhere is perfect
    balance, and the largest value is the slowdown the slowest rank imposes on AllGather.
    """
    labels, mats, cp = _square_matrices(pair_matrices)
    plt = load_matplotlib().pyplot
    n = len(mats)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    cell = 2.7 if cp <= 4 else 3.6  # room for 9-pt counts in every cell
    fig = plt.figure(
        figsize=(cell * ncols + 1.0, cell * nrows + 0.32 * n + 1.6), constrained_layout=True
    )
    grid = fig.add_gridspec(nrows + 1, ncols, height_ratios=[cell] * nrows + [0.32 * n + 0.9])
    axes = [fig.add_subplot(grid[i // ncols, i % ncols]) for i in range(n)]
    vmax = max(m.max() for m in mats) or 1.0
    for ax, label, m in zip(axes, labels, mats):
        im = ax.imshow(m, cmap="viridis", vmin=0, vmax=vmax, interpolation="nearest")
        annotate_heatmap(ax, im, fmt=_fmt_count, fontsize=11 if cp <= 4 else 10)
        rows = m.sum(axis=1)
        ratio = rows.max() / rows.mean() if rows.mean() > 0 else 1.0
        ax.set_title(f"{label}\nmax/mean = {ratio:.2f}", fontsize=10)
        ax.set_xlabel("key rank", fontsize=9)
        ax.set_ylabel("query rank", fontsize=9)
        ax.set_xticks(range(cp))
        ax.set_yticks(range(cp))
        ax.tick_params(labelsize=9)
    totals = np.stack([m.sum(axis=1) for m in mats])
    means = totals.mean(axis=1, keepdims=True)
    rel = np.divide(totals, means, out=np.ones_like(totals), where=means > 0)
    ax = fig.add_subplot(grid[nrows, :])
    hi = max(2.0, float(rel.max()))
    im = ax.imshow(
        rel, cmap="RdBu_r", vmin=2.0 - hi, vmax=hi, aspect="auto", interpolation="nearest"
    )
    annotate_heatmap(ax, im, fmt="{:.2f}", fontsize=11)
    ax.set_yticks(range(n), labels, fontsize=10)
    ax.set_xticks(range(cp), [f"rank {r}" for r in range(cp)], fontsize=10)
    ax.set_title("pairs per rank / mean over ranks (1.00 = perfectly balanced)", fontsize=10)
    fig.suptitle(title or "Visible query-key pairs per rank (per query head)", fontsize=11)
    return fit_to_column(fig)
