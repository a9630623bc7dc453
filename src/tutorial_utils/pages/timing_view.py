"""Chapter 5b's timing lines: printed on GPUs, folded behind one honest line on CPU.

On simulated CPU devices the times only demonstrate the measurement, so the page shows one
line that says so and keeps the numbers in a closed dropdown; on GPUs they are printed as they
are, with each strategy's speed-up over one device.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["CPU_LINE", "FoldedText", "show_timings", "timing_lines"]

CPU_LINE = "On CPU these times demonstrate the protocol only; they are not speed-ups."


class FoldedText:
    """Plain text in a closed dropdown (Markdown output, as ``show_source(..., folded=True)``)."""

    def __init__(self, title: str, text: str):
        self.title, self.text = title, text

    def _repr_markdown_(self) -> str:
        # a colon fence around a backtick block, as source_view's folded source
        return f":::{{dropdown}} {self.title}\n```text\n{self.text}\n```\n:::\n"

    def __repr__(self) -> str:
        return f"{self.title}\n{self.text}"


def timing_lines(timings: Mapping[str, Mapping], *, on_gpu: bool, iters: int) -> list[str]:
    """One line per run: mean and spread in ms, and on GPUs the speed-up over ``"single"``.

    Args:
        timings: ``{name: time_fn(...) result}``, ``"single"`` (the one-device step) first.
        on_gpu: whether the times were measured on GPUs (only then is a ratio a speed-up).
        iters: the timed calls per run; with one there is no spread, shown as ``n/a``.

    Returns:
        The lines, in the order of ``timings``.
    """
    lines = []
    for name, t in timings.items():
        ratio = timings["single"]["mean_ms"] / t["mean_ms"]
        speedup = f"  {ratio:.2f}x vs single" if on_gpu else ""
        std = f"{t['std_ms']:5.1f}" if iters > 1 else "  n/a"
        lines.append(f"{name:9s} {t['mean_ms']:8.1f} ms (std {std}){speedup}")
    return lines


def show_timings(timings: Mapping[str, Mapping], *, on_gpu: bool, iters: int) -> FoldedText | None:
    """Print the timing lines on GPUs; on CPU print :data:`CPU_LINE` and fold the lines.

    Args:
        timings: as :func:`timing_lines`.
        on_gpu: whether the times were measured on GPUs.
        iters: the timed calls per run.

    Returns:
        ``None`` on GPUs (the lines are printed); on CPU the folded lines, which a notebook
        cell displays as a closed dropdown when they are its last expression.
    """
    lines = "\n".join(timing_lines(timings, on_gpu=on_gpu, iters=iters))
    if on_gpu:
        print(lines)
        return None
    print(CPU_LINE)
    return FoldedText("The CPU times", lines)
