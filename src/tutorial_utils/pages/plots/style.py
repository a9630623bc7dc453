"""The look every figure shares: the padding grey, rank and segment colours, heatmap labels.

matplotlib is imported on first use, by :func:`load_matplotlib` (the one place in
``tutorial_utils.pages.plots`` that imports it): it is an optional dependency (the ``docs``
extra, not the package's own requirements), so the installed package, the API reference and
the figure-free helpers (``result_labels``, ``record_speedup``) import without it.
``matplotlib_inline`` (IPython's figure display) is imported by :func:`use_page_figures`, only
inside a running IPython kernel.

Sizes: a page's column is about 690 px wide at a 1280 px window, and an SVG figure is shown at
its own size (1 pt = 4/3 px) or shrunk to the column. A figure at most ``MAX_FIGURE_WIDTH_IN``
wide is shown at its own size, so its text of 7.5 pt or more shows at 10 px or more.
"""

from __future__ import annotations

import sys

import numpy as np

from .checks import nonnegative_int, positive_int

#: Colour of padding tokens (segment id 0) in every figure.
PAD_COLOR = "#d9d9d9"

#: The widest figure shown at its own size in the page's column (about 690 px at 1280 px), less
#: a margin for labels that a tight bounding box adds outside the axes.
MAX_FIGURE_WIDTH_IN = 6.8

#: matplotlib settings for every page's figures: SVG text stays text (crisp, searchable, and
#: measurable by the site test), and figures drawn without a size fit the column.
PAGE_RC = {
    "svg.fonttype": "none",
    "figure.figsize": (MAX_FIGURE_WIDTH_IN, 3.2),
    "font.size": 10,
    "legend.fontsize": 9,
}


def use_page_figures() -> None:
    """Show this IPython kernel's figures as SVG, text kept as text, in :data:`PAGE_RC`'s sizes.

    Does nothing outside IPython or without matplotlib (the ``docs`` extra), so a command-line
    tool that sets up devices the same way imports no plotting package.
    """
    ipython = sys.modules.get("IPython")
    if ipython is None or ipython.get_ipython() is None:
        return
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:
        return
    load_matplotlib().rcParams.update(PAGE_RC)
    set_matplotlib_formats("svg")


def load_matplotlib():
    """The ``matplotlib`` package, with ``pyplot``, ``colors`` and ``patches`` loaded.

    Returns:
        The ``matplotlib`` module: use ``.pyplot``, ``.colors``, ``.patches``, ``.ticker``,
        ``.colormaps``.
    """
    import matplotlib.colors
    import matplotlib.patches
    import matplotlib.pyplot
    import matplotlib.ticker

    return matplotlib


def fit_to_column(fig):
    """Shrink ``fig`` (width and height alike) to at most :data:`MAX_FIGURE_WIDTH_IN` wide, so that
    the page shows it at its own size and its text at its own size; returns ``fig``."""
    width, height = fig.get_size_inches()
    if width > MAX_FIGURE_WIDTH_IN:
        scale = MAX_FIGURE_WIDTH_IN / width
        fig.set_size_inches(width * scale, height * scale)
    return fig


def rank_colors(cp_size: int) -> list:
    """One colour per rank (``tab10``, cycling after 10)."""
    cp = positive_int("cp_size", cp_size)
    cmap = load_matplotlib().colormaps["tab10"]
    return [cmap(r % 10) for r in range(cp)]


def segment_colors(num_segments: int) -> list:
    """Padding grey followed by one colour per segment id 1..N (``Set2``, cycling after 8)."""
    n = nonnegative_int("num_segments", num_segments)
    cmap = load_matplotlib().colormaps["Set2"]
    return [PAD_COLOR] + [cmap(i % 8) for i in range(n)]


def segment_cmap(num_segments: int):
    """A colormap and norm that paint segment id ``i`` in ``segment_colors(num_segments)[i]``.

    Args:
        num_segments: The largest segment id to colour.

    Returns:
        ``(cmap, norm)`` to pass to ``imshow``.
    """
    mpl_colors = load_matplotlib().colors
    colors = segment_colors(num_segments)
    cmap = mpl_colors.ListedColormap(colors)
    norm = mpl_colors.BoundaryNorm(np.arange(len(colors) + 1) - 0.5, len(colors))
    return cmap, norm


def text_color_for(rgba) -> str:
    """``'black'`` or ``'white'``, whichever reads better on a cell of colour ``rgba``.

    Uses the relative luminance of the colour (sRGB weights), so light cells (e.g. the
    yellow end of ``viridis``) get black text and dark cells white text.
    """
    r, g, b, _ = load_matplotlib().colors.to_rgba(rgba)

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


def padding_spans(ids_row: np.ndarray):
    """``(start, stop)`` of every maximal run of padding tokens (id 0).

    Args:
        ids_row: One row of segment ids, ``[seq]``.
    """
    pad = np.r_[False, ids_row == 0, False].astype(np.int8)
    edges = np.diff(pad)
    return list(zip(np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]))


def shade_padding(ax, ids_row, label=True):
    """Shade the padding runs of ``ids_row`` grey along the x axis of ``ax``.

    Args:
        ax: The axes, with token index on x.
        ids_row: One row of segment ids, ``[seq]``.
        label: Label the first span "padding (id 0)" for the legend.
    """
    first = True
    for start, stop in padding_spans(ids_row):
        ax.axvspan(
            start - 0.5,
            stop - 0.5,
            color=PAD_COLOR,
            alpha=0.6,
            lw=0,
            label="padding (id 0)" if (label and first) else None,
        )
        first = False
