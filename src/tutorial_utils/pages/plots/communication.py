"""Figures of what context parallelism sends between ranks (chapter 5): who sends what to whom
at each step of a strategy, and the bytes each rank receives per pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from .checks import positive_int
from .style import fit_to_column, load_matplotlib, rank_colors

_STRATEGIES = ("ring", "allgather", "ulysses")


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
    patches = load_matplotlib().patches
    for point, color in zip(xy, rank_colors(len(xy))):
        ax.add_patch(
            patches.Circle(
                point, radius, facecolor=color, edgecolor="k", lw=0.8, alpha=0.9, zorder=3
            )
        )


def _arrow(ax, p0, p1, color, label=None, rad=0.0, gap=0.27):
    d = p1 - p0
    u = d / (np.linalg.norm(d) or 1.0)
    a, b = p0 + gap * u, p1 - gap * u
    patch = load_matplotlib().patches.FancyArrowPatch(
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
    cp = positive_int("cp_size", cp_size)
    if not 2 <= cp <= 16:
        raise ValueError(f"cp_size={cp}: draw between 2 and 16 ranks (with 1 rank nothing moves).")
    plt = load_matplotlib().pyplot
    colors = rank_colors(cp)

    def panels(count):
        """``count`` square panels, at most two per row, so that the figure fits the page's column
        at its own size and its text shows at 12 px."""
        ncols = min(count, 2)
        nrows = math.ceil(count / ncols)
        side = 2.55 if cp <= 4 else 3.25  # more ranks on the circle: larger panels
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
    return fit_to_column(fig)


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
    plt = load_matplotlib().pyplot
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
    return fit_to_column(fig)
