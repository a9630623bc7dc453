"""Chapter 4's load-balance comparison: three packings, several layouts, one table.

The chapter's point is the numbers, not the loops that produce them; the counting itself is
:func:`tutorial_utils.perfmodel.workcount.count_work`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tutorial_utils.inputs import fixed_slot_segments, pack_segments, random_segment_lengths
from tutorial_utils.perfmodel.workcount import WorkCount, count_work
from tutorial_utils.perfmodel.workload import workload_segments

__all__ = ["balance_scenarios", "balance_layouts", "count_layouts", "balance_table", "BalanceTable"]


def balance_scenarios(workload, seed: int = 7) -> dict[str, tuple]:
    """``{name: (segment_ids, segment_pos, window)}`` for three packings of the workload's rows.

    * ``one long document``: one causal document fills each row (the worst case for a
      contiguous split);
    * the workload's own packing (padded slots, its sliding window);
    * ``random packing``: 1-6 documents of random lengths per row, starting on a grid of
      1/32 of the row, fully causal (2 rows, drawn with ``seed``).
    """
    s = workload.seq_len
    one_ids, one_pos = fixed_slot_segments(1, s, 1, s)
    wl_ids, wl_pos = workload_segments(workload)
    align = max(s // 32, 1)
    lengths = random_segment_lengths(
        np.random.default_rng(seed), 2, s, 6, align=align, min_len=align
    )
    rnd_ids, rnd_pos = pack_segments(lengths, s, align=align)
    return {
        "one long document": (one_ids, one_pos, (-1, 0)),
        f"'{workload.name}' workload": (wl_ids, wl_pos, workload.window),
        "random packing": (rnd_ids, rnd_pos, (-1, 0)),
    }


def balance_layouts(workload) -> dict[str, tuple[str, int]]:
    """``{label: (layout, stripe_size)}``: contiguous, striped with stripes 1, the workload's
    stripe and 4x it (those that divide the row into whole stripes per device), dual-chunk."""
    stripes = sorted({1, workload.stripe_size, 4 * workload.stripe_size})
    out = {"contiguous": ("contiguous", 1)}
    out.update(
        {
            f"striped {st}": ("striped", st)
            for st in stripes
            if workload.seq_len % (workload.cp_size * st) == 0
        }
    )
    out["dual-chunk"] = ("dual_chunk", 1)
    return out


def count_layouts(
    workload, scenarios: Mapping[str, tuple] | None = None, *, tile=(128, 128)
) -> dict[str, dict[str, WorkCount]]:
    """``{scenario: {layout label: WorkCount}}`` on ``workload.cp_size`` devices.

    ``scenarios`` defaults to :func:`balance_scenarios`; the layouts are
    :func:`balance_layouts`. Counts are exact (no mask is built).
    """
    scenarios = balance_scenarios(workload) if scenarios is None else scenarios
    layouts = balance_layouts(workload)
    return {
        name: {
            label: count_work(
                ids,
                pos,
                window,
                cp_size=workload.cp_size,
                layout=layout,
                stripe_size=stripe,
                tile=tile,
            )
            for label, (layout, stripe) in layouts.items()
        }
        for name, (ids, pos, window) in scenarios.items()
    }


class BalanceTable:
    """The balance and tile-efficiency figures of :func:`count_layouts`, as a Markdown table."""

    # short headings, so that the table fits the page's column; the chapters spell them out
    # (AG = AllGather; Ring steps = Ring's lock-stepped steps; tile eff. = tile efficiency)
    HEADER = (
        "| layout | AG max/mean | Ring steps/mean | AG tile eff. | Ring tile eff. |\n"
        "|---|---|---|---|---|"
    )
    # before the strategies are introduced: one kernel call over all of a device's keys
    DEVICE_HEADER = "| layout | max/mean | tile eff. |\n|---|---|---|"

    def __init__(self, counts: Mapping[str, Mapping[str, WorkCount]], per_strategy=True):
        self.per_strategy = per_strategy
        self.rows = [
            (
                scenario,
                label,
                wc.imbalance("allgather"),
                wc.imbalance("ring"),
                wc.tile_efficiency("allgather"),
                wc.tile_efficiency("ring"),
            )
            for scenario, per_layout in counts.items()
            for label, wc in per_layout.items()
        ]

    def markdown(self) -> str:
        """One short table per packing (tile efficiencies are the model's)."""
        out = []
        header = self.HEADER if self.per_strategy else self.DEVICE_HEADER
        for packing in dict.fromkeys(row[0] for row in self.rows):
            lines = [
                f"| {lab} | {ag:.2f} | {ring:.2f} | {tag:.2f} | {tring:.2f} |"
                if self.per_strategy
                else f"| {lab} | {ag:.2f} | {tag:.2f} |"
                for s, lab, ag, ring, tag, tring in self.rows
                if s == packing
            ]
            out.append(f"**{packing}**\n\n" + header + "\n" + "\n".join(lines))
        return "\n\n".join(out)

    def _repr_markdown_(self) -> str:
        return self.markdown()


def balance_table(
    counts: Mapping[str, Mapping[str, WorkCount]], *, per_strategy: bool = True
) -> BalanceTable:
    """Per packing and layout: AllGather's slowest device / mean, Ring's sum of per-step
    slowest / mean (1.00 = perfect balance), and the tile efficiency of each (a model).

    Args:
        counts: :func:`count_layouts`' result, counted with tiles.
        per_strategy: ``False`` keeps the two columns that need no CP strategy: the slowest
            device / mean and the tile efficiency of one kernel call over all of a device's
            keys (AllGather's figures, for chapter 4, before the strategies are introduced).

    Returns:
        The table; it displays as Markdown in a notebook.

    Raises:
        ValueError: ``counts`` is empty or was counted without tiles.
    """
    if not counts or not all(counts.values()):
        raise ValueError(
            "counts must map each packing to {layout: WorkCount}; use count_layouts()."
        )
    for per_layout in counts.values():
        for label, wc in per_layout.items():
            if not isinstance(wc, WorkCount) or wc.tile is None:
                raise ValueError(
                    f"counts entry {label!r} needs tile counts: count_work(..., tile=(128, 128))."
                )
    return BalanceTable(counts, per_strategy)
