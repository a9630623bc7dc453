"""Figures of packed THD inputs: segment ids and positions, the attention mask rule by rule, a
packed batch under a window, GQA's head mapping, and per-token series with padding shaded.

Chapters 1, 3, 6 and 7 show them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tutorial_utils.reference import MaskSpec, visibility
from tutorial_utils.validation import check_gqa_heads, check_window

from .checks import ids_pos_row, int_rows, positive_int
from .style import (
    PAD_COLOR,
    fit_to_column,
    load_matplotlib,
    segment_cmap,
    segment_colors,
    shade_padding,
)

#: The longest row a mask picture draws (a [seq, seq] image).
_MAX_MASK_TOKENS = 4096


def plot_ids_and_positions(segment_ids, segment_pos, *, row: int = 0, title: str | None = None):
    """Segment ids (top) and positions (bottom) of one batch row along the packed sequence.

    Why: a THD row is only meaningful together with its two per-token arrays; seeing
    where ids drop to 0 while positions keep counting is the quickest way to read a
    packing. Returns a figure with two axes; the top axes holds the ids as an image and
    the bottom axes one line per segment plus one for padding.
    """
    ids, pos = ids_pos_row(segment_ids, segment_pos, row)
    plt = load_matplotlib().pyplot
    s = ids.size
    n_seg = int(ids.max())
    cmap, norm = segment_cmap(n_seg)
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
    return fit_to_column(fig)


def plot_attention_mask(
    segment_ids, segment_pos, *, window=(-1, 0), row: int = 0, title: str | None = None
):
    """The THD + ``PADDING_CAUSAL_MASK`` attention mask of one row, built up rule by rule.

    Four panels in a 2x2 grid over (query token, key token): same non-padding segment;
    causal on positions (``pos_k <= pos_q``); the window (``pos_k >= pos_q - left``); and
    their conjunction, coloured by segment. The last panel's image is the visibility matrix
    that :func:`tutorial_utils.reference.visibility` defines (white = masked).
    """
    left, right = check_window(window, name="window")
    ids, pos = ids_pos_row(segment_ids, segment_pos, row)
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

    mpl = load_matplotlib()
    n_seg = int(ids.max())
    cmap, norm = segment_cmap(n_seg)
    fig, axes = mpl.pyplot.subplots(2, 2, figsize=(7.6, 7.8), constrained_layout=True)
    axes = axes.ravel()
    rule_cmap = mpl.colormaps["Greys"]
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
    return fit_to_column(fig)


def plot_batch_and_window(
    segment_ids, segment_pos, *, window, row: int = 0, title: str | None = None
):
    """A packed batch's segment ids (left) and what the window lets one row attend to (right).

    Why: a check on a packed batch means little if every row is one layout and the window
    masks nothing. The left image shows every row's segments and padding (grey); the right
    one is row ``row``'s visibility matrix (same segment, causal, inside the window; white =
    masked), coloured by segment, so a window shorter than a segment shows as a band.
    """
    left, right = check_window(window, name="window")
    ids = int_rows("segment_ids", segment_ids)
    ids_row, pos_row = ids_pos_row(segment_ids, segment_pos, row)
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
    plt = load_matplotlib().pyplot
    n_seg = int(ids.max())
    cmap, norm = segment_cmap(n_seg)
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
    return fit_to_column(fig)


def plot_gqa_mapping(num_q_heads: int, num_kv_heads: int, *, title: str | None = None):
    """Which KV head each query head reads under GQA: query head ``h`` -> KV head ``h // (Hq/Hkv)``.

    One line per query head (``ax.lines``), from its box in the top row to its KV head's
    box in the bottom row; consecutive query heads share a KV head.
    """
    hq = positive_int("num_q_heads", num_q_heads)
    hkv = positive_int("num_kv_heads", num_kv_heads)
    group = check_gqa_heads(hq, hkv, name="num_kv_heads")
    if hq > 64:
        raise ValueError(
            f"num_q_heads={hq} is too many heads to draw legibly; pass at most 64 (the mapping is"
            " the same pattern repeated)."
        )
    mpl = load_matplotlib()
    colors = segment_colors(hkv)[1:]
    fig, ax = mpl.pyplot.subplots(figsize=(max(6.0, 0.42 * hq + 1.5), 2.8), constrained_layout=True)
    xq = np.arange(hq, dtype=float)
    xkv = (np.arange(hkv) + 0.5) * group - 0.5
    for h in range(hq):
        g = h // group
        ax.plot([xq[h], xkv[g]], [1.0, 0.0], color=colors[g], lw=1.4)
        ax.add_patch(
            mpl.patches.Rectangle(
                (xq[h] - 0.4, 1.0), 0.8, 0.35, facecolor=colors[g], edgecolor="k", lw=0.6
            )
        )
        ax.text(xq[h], 1.175, f"q{h}", ha="center", va="center", fontsize=9)
    for g in range(hkv):
        w = 0.8 + 0.6 * (group - 1) / max(group, 1)
        ax.add_patch(
            mpl.patches.Rectangle(
                (xkv[g] - w / 2, -0.35), w, 0.35, facecolor=colors[g], edgecolor="k", lw=0.8
            )
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
    return fit_to_column(fig)


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
    plt = load_matplotlib().pyplot
    fig, ax = plt.subplots(figsize=(9, 2.8), constrained_layout=True)
    shade_padding(ax, ids_row)
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
    return fit_to_column(fig)
