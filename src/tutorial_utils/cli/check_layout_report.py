"""How ``check_layout`` reports: one :class:`Report` per batch and window, and a run's summary.

The text is what a terminal and the recipes page show (lines wrapped at :data:`WIDTH` columns);
``Report.to_json`` is the same for machines, without the arrays.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap

from tutorial_utils.cli.check_layout_input import Window

__all__ = ["Report", "summary", "fix_of", "TOLERANCE", "WIDTH"]

#: Largest absolute difference of float32 outputs that still counts as the same attention.
TOLERANCE = 2e-5
GIB = 1024**3
WIDTH = 88  # the report's lines, as a terminal and the recipes page show them


def _wrap(line: str) -> str:
    """``line`` wrapped at :data:`WIDTH` columns, its continuation lines indented two more
    spaces; words (paths, ``name=value``) are never broken."""
    indent = " " * (len(line) - len(line.lstrip(" ")))
    return textwrap.fill(
        line.strip(),
        WIDTH,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_long_words=False,
        break_on_hyphens=False,
    )


@dataclasses.dataclass
class Report:
    """What :func:`~tutorial_utils.cli.check_layout.check` found for one batch and window.

    ``to_json`` drops the arrays.
    """

    file: str
    batch: int
    seq: int
    cp: int
    strategy: str
    stripe: int
    window: tuple[int, int] | None
    max_segments: int
    head_dim: int
    verdict: str
    validator: str | None  # None = accepts, else the violated rule
    fix: str | None
    max_error_cp_vs_one_device: float
    max_error_cp_vs_reference: float
    max_error_one_device_vs_reference: float
    wrong_rows: int  # tokens (batch row, position) whose CP output is wrong
    wrong_segments: list[dict]
    memory_estimate_bytes: int
    seconds: float
    model_window: int | None = None  # the model's W when asked as one: window is (W-1, 0)
    window_given: bool = False  # a window flag asked for this window (a global one is named)
    looks_reordered: list[dict] = dataclasses.field(default_factory=list)  # looks_reordered()
    outputs: dict = dataclasses.field(default_factory=dict, repr=False)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out.pop("outputs")
        return out

    def window_label(self) -> str:
        """The window as the report names it, e.g. ``window=(62, 0) (model window W=63)``."""
        left = self.window[0] if self.window else None
        return Window(left, self.model_window, self.window_given).label()

    def _reordered(self) -> str:
        first, *others = self.looks_reordered
        stripe = f", stripe_size={first['stripe']}" if first["stripe"] is not None else ""
        text = (
            f"undoing ReorderStrategy.{first['strategy']} with cp_size={first['cp']}{stripe}"
            " makes these arrays a valid packed layout; check_layout takes them un-reordered and"
            " reorders them itself, so the verdict above reads them as they are"
        )
        if first["strategy"] != "Striped":
            text += "; TE's THD (packed) CP paths take ReorderStrategy.Striped"
        elif (first["cp"], first["stripe"]) != (self.cp, self.stripe):
            text += (
                f"; that is not this run's cp={self.cp}, stripe={self.stripe}: the pipeline"
                " reorders for another mesh or stripe"
            )
        if others:
            fits = ", ".join(
                f"{m['strategy']} cp_size={m['cp']}"
                + (f" stripe_size={m['stripe']}" if m["stripe"] is not None else "")
                for m in others
            )
            text += f" (also fits: {fits})"
        return text

    def text(self) -> str:
        win = f", {self.window_label()}" if self.window or self.window_given else ""
        lines = [
            f"check_layout: {self.file}: {self.batch} x {self.seq:,} tokens",
            (
                f"  cp={self.cp}, strategy={self.strategy}, stripe={self.stripe}{win},"
                f" max_segments_per_seq={self.max_segments}"
            ),
            (
                f"  run: TE's own CP code on {self.cp} simulated CPU devices (reference kernel in"
                f" place of cuDNN), random q/k/v with 1 head, head_dim {self.head_dim}, float32;"
                f" {self.seconds:.1f} s"
            ),
            f"  memory estimate: {self.memory_estimate_bytes / GIB:.2f} GiB",
            f"  validator: {'accepts' if self.validator is None else 'rejects'}",
            (
                f"  max error: CP vs one device {self.max_error_cp_vs_one_device:.3g}, CP vs"
                f" reference {self.max_error_cp_vs_reference:.3g}, one device vs reference"
                f" {self.max_error_one_device_vs_reference:.3g} (tolerance {TOLERANCE:g})"
            ),
        ]
        if self.verdict == "ok":
            lines.append("  verdict: OK - TE's CP code computes this layout right")
        else:
            head = (
                "WRONG - TE's CP code attends the wrong keys"
                if self.verdict == "wrong"
                else (
                    "REJECTED - TE computed this batch right, but the validator rejects it (please"
                    " report this)"
                )
            )
            lines.append(
                f"  verdict: {head}: {self.wrong_rows:,} token rows in"
                f" {len(self.wrong_segments)} segments"
            )
            for seg in self.wrong_segments[:10]:
                what = "padding" if seg["segment"] == 0 else f"segment {seg['segment']}"
                lines.append(
                    f"    row {seg['row']}, {what}: {seg['tokens']:,} tokens wrong, first at token "
                    f"{seg['first_token']:,}"
                )
            if len(self.wrong_segments) > 10:
                lines.append(f"    ... and {len(self.wrong_segments) - 10} more segments")
            if self.max_error_one_device_vs_reference > TOLERANCE:
                why = (
                    "the arrays as given are not a packed layout"
                    if self.looks_reordered
                    else "e.g. more segments than max_segments_per_seq"
                )
                lines.append(f"  note: the one-device call is wrong too ({why})")
            if self.validator:
                rule = self.validator
                own_fix = fix_of(rule)
                if self.looks_reordered and own_fix and rule.endswith(own_fix):
                    # the rule's own fix is not this batch's: the one below replaces it
                    rule = rule[: -len(own_fix)].rstrip().removesuffix("Fix:").rstrip()
                lines.append(f"  rule broken: {rule}")
            if self.looks_reordered:
                lines.append(f"  looks reordered: {self._reordered()}")
            if self.fix:
                lines.append(f"  fix: {self.fix}")
        return "\n".join(_wrap(line) for line in lines)


def fix_of(message: str | None) -> str | None:
    """The fix a validator message gives: the text after ``Fix:``, else its last sentence.

    Args:
        message: A rule's message, or ``None``.

    Returns:
        The fix, or ``None`` when the message has none.
    """
    if not message:
        return None
    if "Fix:" in message:
        return message.split("Fix:", 1)[1].strip()
    sentences = re.split(r"(?<=[.;])\s+", message.strip())
    return sentences[-1] if len(sentences) > 1 else None


def summary(reports) -> str:
    """One line per report (file and window) with its verdict, under a count of the verdicts.

    Args:
        reports: :class:`Report` s of one run.

    Returns:
        The summary the command line prints after the reports of a run with several windows.
    """
    counts = {v: sum(r.verdict == v for r in reports) for v in ("ok", "wrong", "rejected")}
    files = len({r.file for r in reports})
    windows = len({(r.window, r.model_window) for r in reports})
    lines = [
        f"check_layout: {windows} windows x {files} file{'s' * (files > 1)}: "
        + ", ".join(f"{n} {v.upper()}" for v, n in counts.items() if n)
    ]
    lines += [f"  {r.file}, {r.window_label()}: {r.verdict.upper()}" for r in reports]
    return "\n".join(_wrap(line) for line in lines)
