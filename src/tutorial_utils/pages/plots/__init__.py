"""Matplotlib figures for the tutorial chapters.

Every figure the chapters show is drawn here from plain arrays, so a notebook cell is one call
and the drawing code is tested. Each ``plot_*`` function validates its inputs and returns a
:class:`~matplotlib.figure.Figure`. Colours: light grey is padding (segment id 0), ranks use
``tab10`` in order, segments ``Set2`` in order.

The figures live by kind, one module each; this package re-exports them, so a page writes
``from tutorial_utils.pages import plots`` and calls ``plots.plot_...``:

* :mod:`.style`: the shared look (colours, heatmap labels, padding shade) and matplotlib's
  loading;
* :mod:`.packed_inputs`: segment ids and positions, masks, GQA, per-token series;
* :mod:`.load_balance`: which rank owns each token, and each rank's work;
* :mod:`.communication`: what moves between ranks, and how many bytes;
* :mod:`.benchmarks`: measured times, from the chapter's benchmark and stored records;
* :mod:`.cost_model`: the cost model's predictions;
* :mod:`.checks`: the input checks the figures share.
"""

from .benchmarks import (
    plot_benchmark,
    plot_record_speedups,
    plot_record_times,
    record_speedup,
    result_labels,
)
from .communication import plot_comm_bytes, plot_comm_steps
from .cost_model import plot_break_even_bands, plot_speedup_sweep, plot_time_breakdown
from .load_balance import plot_rank_work, plot_token_ownership
from .packed_inputs import (
    plot_attention_mask,
    plot_batch_and_window,
    plot_gqa_mapping,
    plot_ids_and_positions,
    plot_per_token,
)
from .style import PAD_COLOR, annotate_heatmap, rank_colors, segment_colors, text_color_for

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
    "plot_time_breakdown",
    "plot_speedup_sweep",
    "plot_break_even_bands",
]
