"""Matplotlib figures for the tutorial chapters.

Every figure the chapters show is drawn here from plain arrays, so a notebook cell is one call
and the drawing code is tested. Each ``plot_*`` function validates its inputs and returns a
:class:`~matplotlib.figure.Figure`. Colours: light grey is padding (segment id 0), ranks use
``tab10`` in order, segments ``Set2`` in order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "PAD_COLOR",
    "rank_colors",
    "segment_colors",
    "plot_ids_and_positions",
    "plot_attention_mask",
    "plot_batch_and_window",
    "plot_gqa_mapping",
    "plot_token_ownership",
    "plot_per_token",
    "plot_rank_work",
    "plot_comm_steps",
    "plot_comm_bytes",
    "plot_benchmark",
    "annotate_heatmap",
    "text_color_for",
    "result_labels",
    "record_speedup",
    "plot_record_times",
    "plot_record_speedups",
]

#: Colour of padding tokens (segment id 0) in every figure.
PAD_COLOR = "#d9d9d9"
_MAX_MASK_TOKENS = 4096
_STRATEGIES = ("ring", "allgather", "ulysses")


def _plt():
    import matplotlib.pyplot as plt

    return plt


# --------------------------------------------------------------------------------------------
# colours


def rank_colors(cp_size: int) -> list:
    """One colour per rank (``tab10``, cycling after 10)."""
    cp = _positive_int("cp_size", cp_size)
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(r % 10) for r in range(cp)]


def segment_colors(num_segments: int) -> list:
    """Padding grey followed by one colour per segment id 1..N (``Set2``, cycling after 8)."""
    n = _nonnegative_int("num_segments", num_segments)
    from matplotlib import colormaps

    cmap = colormaps["Set2"]
    return [PAD_COLOR] + [cmap(i % 8) for i in range(n)]


def _segment_cmap(num_segments: int):
    from matplotlib.colors import BoundaryNorm, ListedColormap

    colors = segment_colors(num_segments)
    cmap = ListedColormap(colors)
    norm = BoundaryNorm(np.arange(len(colors) + 1) - 0.5, len(colors))
    return cmap, norm


def text_color_for(rgba) -> str:
    """``'black'`` or ``'white'``, whichever reads better on a cell of colour ``rgba``.

    Uses the relative luminance of the colour (sRGB weights), so light cells (e.g. the
    yellow end of ``viridis``) get black text and dark cells white text.
    """
    from matplotlib.colors import to_rgba

    r, g, b, _ = to_rgba(rgba)

    def lin(c):
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    luminance = 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)
    return "black" if luminance > 0.179 else "white"


def annotate_heatmap(ax, image, values=None, *, fmt="{:.2f}", fontsize: float = 9):
    """Write each cell's value into an ``imshow`` heatmap, in a colour that contrasts with the cell.

    ``image`` is the :class:`~matplotlib.image.AxesImage` returned by ``ax.imshow``;
    ``values`` (default: the image's data) is the ``[rows, cols]`` array to print, and
    ``fmt`` a format string or a callable. Returns the list of text artists.
    """
    data = np.asarray(image.get_array(), dtype=np.float64)
    vals = data if values is None else np.asarray(values)
    if vals.shape != data.shape or vals.ndim != 2:
        raise ValueError(
            f"values has shape {vals.shape}; expected the image's [rows, cols] shape {data.shape}."
        )
    fmt_fn = fmt if callable(fmt) else fmt.format
    texts = []
    for (i, j), v in np.ndenumerate(vals):
        color = text_color_for(image.cmap(image.norm(data[i, j])))
        texts.append(
            ax.text(j, i, fmt_fn(v), ha="center", va="center", fontsize=fontsize, color=color)
        )
    return texts


# --------------------------------------------------------------------------------------------
# input checks (each names the parameter)


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {name}={value!r}.")
    return int(value)


def _nonnegative_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {name}={value!r}.")
    return int(value)


def _int_rows(name: str, value) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise ValueError(
            f"{name} must be a non-empty [seq] or [batch, seq] array, got shape {np.shape(value)}."
        )
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"{name} must hold integers, got dtype {arr.dtype}; convert with np.asarray(x,"
            " np.int32)."
        )
    return arr


def _ids_pos_row(segment_ids, segment_pos, row) -> tuple[np.ndarray, np.ndarray]:
    ids = _int_rows("segment_ids", segment_ids)
    pos = _int_rows("segment_pos", segment_pos)
    if pos.shape != ids.shape:
        raise ValueError(
            f"segment_pos has shape {pos.shape} but segment_ids has shape {ids.shape}; pass one"
            " position per token."
        )
    if (ids < 0).any():
        raise ValueError(
            f"segment_ids has a negative id {int(ids.min())}; use 0 for padding and 1..N for"
            " segments."
        )
    r = _nonnegative_int("row", row)
    if r >= ids.shape[0]:
        raise ValueError(f"row={row} is out of range for a batch of {ids.shape[0]} row(s).")
    return ids[r], pos[r]


def _padding_spans(ids_row: np.ndarray):
    """``(start, stop)`` of every maximal run of padding tokens (id 0)."""
    pad = np.r_[False, ids_row == 0, False].astype(np.int8)
    edges = np.diff(pad)
    return list(zip(np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]))


def _shade_padding(ax, ids_row, label=True):
    first = True
    for start, stop in _padding_spans(ids_row):
        ax.axvspan(
            start - 0.5,
            stop - 0.5,
            color=PAD_COLOR,
            alpha=0.6,
            lw=0,
            label="padding (id 0)" if (label and first) else None,
        )
        first = False


# --------------------------------------------------------------------------------------------
# chapter 1: packed inputs, masks, GQA


def plot_ids_and_positions(segment_ids, segment_pos, *, row: int = 0, title: str | None = None):
    """Segment ids (top) and positions (bottom) of one batch row along the packed sequence.

    Why: a THD row is only meaningful together with its two per-token arrays; seeing
    where ids drop to 0 while positions keep counting is the quickest way to read a
    packing. Returns a figure with two axes; the top axes holds the ids as an image and
    the bottom axes one line per segment plus one for padding.
    """
    ids, pos = _ids_pos_row(segment_ids, segment_pos, row)
    plt = _plt()
    s = ids.size
    n_seg = int(ids.max())
    cmap, norm = _segment_cmap(n_seg)
    fig, (ax_id, ax_pos) = plt.subplots(
        2,
        1,
        figsize=(9, 3.6),
        sharex=True,
        gridspec_kw={"height_ratios": [1, 2.2]},
        constrained_layout=True,
    )
    ax_id.imshow(
        ids[None, :],
        aspect="auto",
        cmap=cmap,
        norm=norm,
        interpolation="nearest",
        extent=(-0.5, s - 0.5, 0, 1),
    )
    ax_id.set_yticks([])
    ax_id.set_ylabel("id", rotation=0, ha="right", va="center")
    for sid in range(1, n_seg + 1):
        where = np.nonzero(ids == sid)[0]
        if where.size:
            ax_id.text(
                (where[0] + where[-1]) / 2,
                0.5,
                f"segment {sid}",
                ha="center",
                va="center",
                fontsize=9,
            )
    x = np.arange(s)
    for sid in range(0, n_seg + 1):
        y = np.where(ids == sid, pos, np.nan).astype(float)
        if np.isnan(y).all():
            continue
        color = PAD_COLOR if sid == 0 else segment_colors(n_seg)[sid]
        ax_pos.plot(
            x,
            y,
            drawstyle="steps-mid",
            color=color if sid else "0.55",
            lw=1.6 if sid else 1.0,
            ls="-" if sid else ":",
            label="padding (id 0)" if sid == 0 else f"segment {sid}",
        )
    ax_pos.set_xlabel("token index in the packed row")
    ax_pos.set_ylabel("segment_pos")
    ax_pos.set_xlim(-0.5, s - 0.5)
    ax_pos.legend(loc="upper left", fontsize=9, ncol=min(n_seg + 1, 6), frameon=False)
    fig.suptitle(title or f"Batch row {row}: segment ids and positions ({s} tokens)", fontsize=10)
    return fig


def plot_attention_mask(
    segment_ids, segment_pos, *, window=(-1, 0), row: int = 0, title: str | None = None
):
    """The THD + ``PADDING_CAUSAL_MASK`` attention mask of one row, built up rule by rule.

    Four panels in a 2x2 grid over (query token, key token): same non-padding segment;
    causal on positions (``pos_k <= pos_q``); the window (``pos_k >= pos_q - left``); and
    their conjunction, coloured by segment. The last panel's image is the visibility matrix
    that :func:`tutorial_utils.reference.visibility` defines (white = masked).
    """
    from tutorial_utils.reference import MaskSpec, visibility
    from tutorial_utils.validation import check_window

    left, right = check_window(window, name="window")
    ids, pos = _ids_pos_row(segment_ids, segment_pos, row)
    s = ids.size
    if s > _MAX_MASK_TOKENS:
        raise ValueError(
            f"segment_ids has {s} tokens per row; a mask picture needs <= {_MAX_MASK_TOKENS}. "
            "Slice a window of tokens (e.g. ids[:, :512]) first."
        )
    iq, ik = ids[None, :], ids[None, :]
    pq, pk = pos[None, :], pos[None, :]
    same = np.asarray(
        visibility(iq, ik, pq, pk, MaskSpec(padding=True, causal=False, window=(-1, -1)))
    )[0]
    causal = np.asarray(
        visibility(iq, ik, pq, pk, MaskSpec(padding=False, causal=True, window=(-1, -1)))
    )[0]
    win = np.asarray(
        visibility(iq, ik, pq, pk, MaskSpec(padding=False, causal=False, window=(left, -1)))
    )[0]
    vis = np.asarray(
        visibility(iq, ik, pq, pk, MaskSpec(padding=True, causal=True, window=(left, right)))
    )[0]

    plt = _plt()
    n_seg = int(ids.max())
    cmap, norm = _segment_cmap(n_seg)
    fig, axes = plt.subplots(2, 2, figsize=(7.6, 7.8), constrained_layout=True)
    axes = axes.ravel()
    from matplotlib import colormaps

    rule_cmap = colormaps["Greys"]
    panels = [
        (same, "same segment, id != 0"),
        (causal, "causal: pos_k <= pos_q"),
        (win, "no window (left = -1)" if left < 0 else f"window: pos_k >= pos_q - {left}"),
    ]
    for ax, (m, name) in zip(axes[:3], panels):
        ax.imshow(m.astype(float), cmap=rule_cmap, vmin=0, vmax=1.6, interpolation="nearest")
        ax.set_title(name, fontsize=11)
    colored = np.where(vis, ids[:, None], 0)
    # masked (invisible) pairs are left white; the image data is the visibility matrix coloured by
    # segment
    axes[3].imshow(
        np.ma.masked_array(colored, mask=~vis), cmap=cmap, norm=norm, interpolation="nearest"
    )
    axes[3].set_title(f"visible = all three ({int(vis.sum())} pairs)", fontsize=11)
    for ax in axes:
        ax.set_xlabel("key token", fontsize=10)
        ax.set_ylabel("query token", fontsize=10)
        ax.tick_params(labelsize=9)
    fig.suptitle(
        title
        or f"Attention mask of batch row {row}\n(THD, PADDING_CAUSAL_MASK, window={(left, right)})",
        fontsize=12,
    )
    return fig


def plot_batch_and_window(
    segment_ids, segment_pos, *, window, row: int = 0, title: str | None = None
):
    """A packed batch's segment ids (left) and what the window lets one row attend to (right).

    Why: a check on a packed batch means little if every row is one layout and the window
    masks nothing. The left image shows every row's segments and padding (grey); the right
    one is row ``row``'s visibility matrix (same segment, causal, inside the window; white =
    masked), coloured by segment, so a window shorter than a segment shows as a band.
    """
    from tutorial_utils.reference import MaskSpec, visibility
    from tutorial_utils.validation import check_window

    left, right = check_window(window, name="window")
    ids = _int_rows("segment_ids", segment_ids)
    ids_row, pos_row = _ids_pos_row(segment_ids, segment_pos, row)
    s = ids.shape[1]
    if s > _MAX_MASK_TOKENS:
        raise ValueError(
            f"segment_ids has {s} tokens per row; a mask picture needs <= {_MAX_MASK_TOKENS}. "
            "Slice a window of tokens (e.g. ids[:, :512]) first."
        )
    i, p = ids_row[None, :], pos_row[None, :]
    vis = np.asarray(
        visibility(i, i, p, p, MaskSpec(padding=True, causal=True, window=(left, right)))
    )[0]
    plt = _plt()
    n_seg = int(ids.max())
    cmap, norm = _segment_cmap(n_seg)
    fig, (ax_ids, ax_vis) = plt.subplots(
        1, 2, figsize=(9, 3.6), constrained_layout=True, gridspec_kw={"width_ratios": [1.35, 1]}
    )
    ax_ids.imshow(ids, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest")
    ax_ids.set_yticks(range(ids.shape[0]))
    ax_ids.set(xlabel="token", ylabel="row")
    pad = float(np.mean(ids == 0))
    ax_ids.set_title(f"segment ids ({pad:.0%} padding, grey)", fontsize=10)
    ax_vis.imshow(
        np.ma.masked_array(np.where(vis, ids_row[:, None], 0), mask=~vis),
        cmap=cmap,
        norm=norm,
        interpolation="nearest",
    )
    ax_vis.set(xlabel="key token", ylabel="query token")
    ax_vis.set_title(f"row {row}: visible keys, window={(left, right)}", fontsize=10)
    for ax in (ax_ids, ax_vis):
        ax.tick_params(labelsize=9)
        ax.xaxis.label.set_fontsize(10)
        ax.yaxis.label.set_fontsize(10)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def plot_gqa_mapping(num_q_heads: int, num_kv_heads: int, *, title: str | None = None):
    """Which KV head each query head reads under GQA: query head ``h`` -> KV head ``h // (Hq/Hkv)``.

    One line per query head (``ax.lines``), from its box in the top row to its KV head's
    box in the bottom row; consecutive query heads share a KV head.
    """
    from tutorial_utils.validation import check_gqa_heads

    hq = _positive_int("num_q_heads", num_q_heads)
    hkv = _positive_int("num_kv_heads", num_kv_heads)
    group = check_gqa_heads(hq, hkv, name="num_kv_heads")
    if hq > 64:
        raise ValueError(
            f"num_q_heads={hq} is too many heads to draw legibly; pass at most 64 (the mapping is"
            " the same pattern repeated)."
        )
    plt = _plt()
    from matplotlib.patches import Rectangle

    colors = segment_colors(hkv)[1:]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.42 * hq + 1.5), 2.8), constrained_layout=True)
    xq = np.arange(hq, dtype=float)
    xkv = (np.arange(hkv) + 0.5) * group - 0.5
    for h in range(hq):
        g = h // group
        ax.plot([xq[h], xkv[g]], [1.0, 0.0], color=colors[g], lw=1.4)
        ax.add_patch(
            Rectangle((xq[h] - 0.4, 1.0), 0.8, 0.35, facecolor=colors[g], edgecolor="k", lw=0.6)
        )
        ax.text(xq[h], 1.175, f"q{h}", ha="center", va="center", fontsize=9)
    for g in range(hkv):
        w = 0.8 + 0.6 * (group - 1) / max(group, 1)
        ax.add_patch(
            Rectangle((xkv[g] - w / 2, -0.35), w, 0.35, facecolor=colors[g], edgecolor="k", lw=0.8)
        )
        ax.text(xkv[g], -0.175, f"kv{g}", ha="center", va="center", fontsize=9)
    ax.set_xlim(-1, hq)
    ax.set_ylim(-0.5, 1.5)
    ax.axis("off")
    ax.set_title(
        title
        or f"GQA: {hq} query heads share {hkv} KV heads "
        f"(group size {group}: head h reads KV head h // {group})",
        fontsize=9,
    )
    return fig


# --------------------------------------------------------------------------------------------
# chapters 2 and 4: who owns which token


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
    from tutorial_utils.perfmodel.workcount import LAYOUTS

    if layout not in LAYOUTS:
        raise ValueError(f"layouts entry {item!r}: layout must be one of {LAYOUTS}.")
    stripe = _positive_int("stripe_size", stripe)
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
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch

    from tutorial_utils.perfmodel.workcount import local_token_order

    s = _positive_int("seq_len", seq_len)
    cp = _positive_int("cp_size", cp_size)
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

    plt = _plt()
    if ids_row is None:
        fig, ax0 = plt.subplots(figsize=(9, 0.55 * len(specs) + 1.3), constrained_layout=True)
        ax_ids = None
    else:
        fig, (ax0, ax_ids) = plt.subplots(
            2,
            1,
            figsize=(9, 0.55 * len(specs) + 1.8),
            sharex=True,
            constrained_layout=True,
            gridspec_kw={"height_ratios": [len(specs), 1]},
        )
    colors = rank_colors(cp)
    cmap = ListedColormap(colors)
    norm = BoundaryNorm(np.arange(cp + 1) - 0.5, cp)
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
        scmap, snorm = _segment_cmap(n_seg)
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
    handles = [Patch(color=colors[r], label=f"rank {r}") for r in range(cp)]
    ax0.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(0, 1.02),
        ncol=min(cp, 8),
        fontsize=9,
        frameon=False,
    )
    fig.suptitle(title or f"Which rank holds each token (seq_len={s}, cp={cp})", fontsize=10)
    return fig


def plot_per_token(
    values, segment_ids, *, ylabel: str = "value", title: str | None = None, logy: bool = False
):
    """One or more per-token series along a row, with padding tokens shaded grey.

    ``values``: a ``[seq]`` array or a mapping ``label -> [seq]``; ``segment_ids``: the
    row's ``[seq]`` ids (padding = 0). Used to show that padded rows of outputs and
    gradients are exactly zero.
    """
    if isinstance(values, Mapping):
        series = dict(values)
    else:
        series = {ylabel: values}
    if not series:
        raise ValueError(
            "values is empty; pass a [seq] array or a non-empty {label: [seq] array} mapping."
        )
    ids_row = np.asarray(segment_ids)
    if ids_row.ndim != 1 or ids_row.size == 0 or not np.issubdtype(ids_row.dtype, np.integer):
        raise ValueError(
            f"segment_ids must be one non-empty integer row [seq], got shape {ids_row.shape}, dtype"
            f" {ids_row.dtype}."
        )
    s = ids_row.size
    arrays = {}
    for label, v in series.items():
        arr = np.asarray(v, dtype=np.float64)
        if arr.shape != (s,):
            raise ValueError(
                f"values[{label!r}] has shape {arr.shape}; expected ({s},) to match segment_ids."
            )
        arrays[label] = arr
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 2.8), constrained_layout=True)
    _shade_padding(ax, ids_row)
    x = np.arange(s)
    for label, arr in arrays.items():
        ax.plot(x, arr, lw=0.9, label=label)
    if logy:
        ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlim(-0.5, s - 0.5)
    ax.set_xlabel("token index in the packed row")
    ax.set_ylabel(ylabel)
    ax.legend(loc="upper right", fontsize=9, frameon=False, ncol=len(arrays) + 1)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


# --------------------------------------------------------------------------------------------
# chapter 4: per-rank work


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
    plt = _plt()
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
    return fig


# --------------------------------------------------------------------------------------------
# chapter 5: communication


def _ring_positions(cp: int):
    angles = np.pi / 2 - 2 * np.pi * np.arange(cp) / cp
    return np.stack([np.cos(angles), np.sin(angles)], axis=1)


def _rank_labels(ax, cp: int, labels: Sequence[str]):
    """The ranks' labels on a circle of radius 1; the discs go round them later
    (:func:`_ring_discs`), once the figure's layout says how large the labels are."""
    xy = _ring_positions(cp)
    for r in range(cp):
        ax.text(
            *xy[r],
            labels[r],
            ha="center",
            va="center",
            fontsize=9,
            color="white",
            zorder=4,
            fontweight="bold",
            gid="rank-label",
        )
    ax.set_xlim(-1.55, 1.55)
    ax.set_ylim(-1.55, 1.55)
    ax.set_aspect("equal")
    ax.axis("off")
    return xy


def _disc_radius(fig) -> float:
    """One radius, in data units, for every rank disc of ``fig``: the largest label's
    half-diagonal plus a margin, measured after layout, so no label sticks out of its disc
    and every panel's discs are the same size."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    radius = 0.0
    for ax in fig.axes:
        per_unit = abs(ax.transData.transform((1, 0))[0] - ax.transData.transform((0, 0))[0])
        for text in ax.texts:
            if text.get_gid() == "rank-label":
                box = text.get_window_extent(renderer)
                radius = max(radius, 0.5 * math.hypot(box.width, box.height) / per_unit)
    return radius * 1.12


def _ring_discs(ax, xy, radius: float):
    from matplotlib.patches import Circle

    for point, color in zip(xy, rank_colors(len(xy))):
        ax.add_patch(
            Circle(point, radius, facecolor=color, edgecolor="k", lw=0.8, alpha=0.9, zorder=3)
        )


def _arrow(ax, p0, p1, color, label=None, rad=0.0, gap=0.27):
    from matplotlib.patches import FancyArrowPatch

    d = p1 - p0
    u = d / (np.linalg.norm(d) or 1.0)
    a, b = p0 + gap * u, p1 - gap * u
    patch = FancyArrowPatch(
        a,
        b,
        arrowstyle="-|>",
        mutation_scale=9,
        color=color,
        lw=1.1,
        connectionstyle=f"arc3,rad={rad}",
        zorder=2,
    )
    ax.add_patch(patch)
    if label:
        mid = (a + b) / 2
        normal = np.array([-u[1], u[0]])
        ax.text(
            *(mid + (0.18 + 0.5 * rad) * normal),
            label,
            ha="center",
            va="center",
            fontsize=9,
            bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85),
            zorder=5,
        )
    return patch


def plot_comm_steps(strategy: str, cp_size: int, *, schedule: str = "te", title: str | None = None):
    """Who sends what to whom, step by step, for one CP strategy.

    * ``'ring'`` (forward pass): ``cp-1`` hops. Before hop t (counting from 0) rank r holds
      the K/V block of rank ``(r - t) mod cp`` (with that block's segment ids and
      positions); it attends its queries to it and passes it to rank ``r+1``.
    * ``'allgather'`` (forward and backward): the forward all-gather of K, V, ids and
      positions (every rank sends its shard to every other); in the backward, with
      ``schedule='te'`` (TransformerEngine's primitives, as counted by
      :func:`tutorial_utils.perfmodel.comm.comm_volume`), the same all-gather again, because TE's
      backward receives only the local shards, and then the reduce-scatter of dK, dV.
      ``schedule='reference'`` (``jax.grad`` of the ``shard_map`` reference, which keeps the
      gathered K/V) has only the reduce-scatter.
    * ``'ulysses'`` (forward pass): an all-to-all of Q, K, V from sequence shards to head
      shards, local attention over the whole sequence, and an all-to-all of O back.

    One axes per step; every arrow is a :class:`~matplotlib.patches.FancyArrowPatch`.
    """
    if strategy not in _STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is unknown; use one of {_STRATEGIES}.")
    if schedule not in ("te", "reference"):
        raise ValueError(
            f"schedule={schedule!r} is unknown; use 'te' (TransformerEngine's primitives) or"
            " 'reference'."
        )
    cp = _positive_int("cp_size", cp_size)
    if not 2 <= cp <= 16:
        raise ValueError(f"cp_size={cp}: draw between 2 and 16 ranks (with 1 rank nothing moves).")
    plt = _plt()
    colors = rank_colors(cp)

    def panels(count):
        """``count`` square panels, at most three per row, so the text stays legible on a page."""
        ncols = min(count, 3)
        nrows = math.ceil(count / ncols)
        side = 2.55 if cp <= 4 else 3.4  # more ranks on the circle: larger panels
        fig, grid = plt.subplots(
            nrows,
            ncols,
            figsize=(side * ncols + 0.3, (side + 0.35) * nrows + 0.3),
            squeeze=False,
            constrained_layout=True,
        )
        for ax in grid.ravel()[count:]:
            fig.delaxes(ax)
        return fig, grid.ravel()[:count]

    drawn = []  # (ax, rank positions, arrows as (from, to, colour, label, rad))

    def all_to_all(ax, labels):
        xy = _rank_labels(ax, cp, labels)
        arrows = [
            (xy[r], xy[dst], colors[r], None, 0.12)
            for r in range(cp)
            for dst in range(cp)
            if dst != r
        ]
        drawn.append((ax, xy, arrows))

    if strategy == "ring":
        n = cp - 1
        fig, axes = panels(n)
        for t, ax in enumerate(axes):
            held = [(r - t) % cp for r in range(cp)]
            xy = _rank_labels(ax, cp, [f"r{r}\nKV{held[r]}" for r in range(cp)])
            arrows = [
                (xy[r], xy[(r + 1) % cp], colors[held[r]], f"KV{held[r]}", 0.0) for r in range(cp)
            ]
            drawn.append((ax, xy, arrows))
            ax.set_title(
                f"hop {t + 1} of {n}: attend, then pass\nthe held K/V block to rank r+1", fontsize=9
            )
    elif strategy == "allgather":
        phases = [("forward: all-gather K, V, ids, pos\n(each rank then holds all K/V)", "KV")]
        if schedule == "te":
            phases.append(("backward, first: all-gather\nK, V, ids, pos again", "KV"))
        phases.append(("backward: reduce-scatter dK, dV\n(each rank keeps its shard's sum)", "dKV"))
        fig, axes = panels(len(phases))
        for ax, (name, what) in zip(axes, phases):
            all_to_all(ax, [f"r{r}\n{what}{r}" for r in range(cp)])
            ax.set_title(name, fontsize=9)
    else:
        phases = (
            ("all-to-all Q, K, V: sequence\nshards -> head shards", "heads"),
            ("all-to-all O: head shards\n-> sequence shards", "seq"),
        )
        fig, axes = panels(len(phases))
        for ax, (name, what) in zip(axes, phases):
            all_to_all(ax, [f"r{r}\n{what}" for r in range(cp)])
            ax.set_title(name, fontsize=9)
    if strategy == "allgather":
        default = f"allgather: what moves between {cp} ranks,\nforward and backward " + (
            "(TE's schedule)" if schedule == "te" else "(jax.grad of the shard_map reference)"
        )
    else:
        default = f"{strategy}: what moves between {cp} ranks in the forward pass"
    fig.suptitle(title or default, fontsize=10)
    radius = _disc_radius(fig)
    for ax, xy, arrows in drawn:
        _ring_discs(ax, xy, radius)
        for p0, p1, color, label, rad in arrows:
            _arrow(ax, p0, p1, color, label, rad=rad, gap=radius + 0.03)
    return fig


def _tensor_group(tensor: str) -> str:
    t = tensor.replace("[", "").replace("]", "")
    if "segment" in t:
        return "segment ids / pos"
    if t.split()[0] in ("Q", "O", "dQ", "dO"):
        return "Q / O (and grads)"
    return "K / V (and grads)"


def plot_comm_bytes(volumes, *, unit: str = "MiB", title: str | None = None):
    """Bytes each rank receives, forward and backward, per strategy (stacked by what moves).

    ``volumes``: ``{label: CommVolume}`` from :func:`tutorial_utils.perfmodel.comm.comm_volume` (any
    object with ``transfers`` whose items have ``phase``, ``tensor`` and
    ``total_received``). Bars are grouped per strategy, ``fwd`` and ``bwd`` side by side,
    stacked into K/V, Q/O and segment-metadata bytes.
    """
    scales = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    if unit not in scales:
        raise ValueError(f"unit={unit!r} is unknown; use one of {tuple(scales)}.")
    if not isinstance(volumes, Mapping) or not volumes:
        raise ValueError(
            "volumes must be a non-empty mapping {label: CommVolume}, e.g. "
            "{s: comm_for_workload(wl, s) for s in ('ring', 'allgather', 'ulysses')}."
        )
    groups = ("K / V (and grads)", "Q / O (and grads)", "segment ids / pos")
    data = {}
    for label, vol in volumes.items():
        transfers = getattr(vol, "transfers", None)
        if transfers is None:
            raise ValueError(
                f"volumes[{label!r}] has no 'transfers'; pass"
                " tutorial_utils.perfmodel.comm.CommVolume objects."
            )
        acc = {(ph, g): 0.0 for ph in ("fwd", "bwd") for g in groups}
        for t in transfers:
            try:
                acc[(t.phase, _tensor_group(t.tensor))] += float(t.total_received)
            except (AttributeError, KeyError) as err:
                raise ValueError(
                    f"volumes[{label!r}] has a transfer without phase 'fwd'/'bwd', tensor and "
                    f"total_received ({err!r})."
                ) from None
        data[str(label)] = acc
    plt = _plt()
    colors = {
        "K / V (and grads)": "#4c72b0",
        "Q / O (and grads)": "#dd8452",
        "segment ids / pos": "#8c8c8c",
    }
    fig, ax = plt.subplots(figsize=(max(5.0, 2.0 * len(data) + 1.5), 3.4), constrained_layout=True)
    width = 0.38
    scale = scales[unit]
    for i, acc in enumerate(data.values()):
        for k, phase in enumerate(("fwd", "bwd")):
            x = i + (k - 0.5) * width
            bottom = 0.0
            for g in groups:
                h = acc[(phase, g)] / scale
                ax.bar(
                    x,
                    h,
                    width * 0.95,
                    bottom=bottom,
                    color=colors[g],
                    edgecolor="white",
                    lw=0.5,
                    label=g if (i == 0 and k == 0) else None,
                    hatch="//" if phase == "bwd" else None,
                )
                bottom += h
            ax.text(x, bottom, f"{phase}\n{bottom:.3g}", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(data)), list(data))
    ax.set_ylabel(f"received per rank [{unit}]")
    ax.margins(y=0.22)
    # outside the axes: inside, it covered the tallest bar's label
    ax.legend(fontsize=9, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or "Bytes each rank receives per forward and backward pass", fontsize=10)
    return fig


# --------------------------------------------------------------------------------------------
# chapter 5: benchmark


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
    plt = _plt()
    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n, 3.6), squeeze=False, constrained_layout=True)
    for ax, (rows, name) in zip(axes[0], panels):
        _bar_panel(ax, rows, name)
        if rows is pub:
            ax.set_facecolor("#f7f3e8")
    return fig


# --------------------------------------------------------------------------------------------
# benchmarks page: stored cp-bench/1 records

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
    import textwrap

    from tutorial_utils.perfmodel.records import source_title

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
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.2, 0.42 * len(rows) + 1.5), constrained_layout=True)
    _hbar_panel(ax, labels, means, [r.get("std_ms") for r in rows], extrap, texts, log=log)
    ax.set_xlabel("mean time per step (ms" + (", log scale)" if log else ")"), fontsize=9)
    ax.set_title(title or _record_title(record), fontsize=9)
    if any(extrap):
        from matplotlib.patches import Patch

        fig.legend(
            handles=[
                Patch(
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
    return fig


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
    plt = _plt()
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
    return fig


# --------------------------------------------------------------------------------------------
# chapter 6: the cost model's predictions

__all__ += ["plot_time_breakdown", "plot_speedup_sweep"]

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
    plt = _plt()
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
    return fig


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
    plt = _plt()
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
    return fig
