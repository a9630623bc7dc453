"""argparse value types shared by the command-line tools (bench, launch).

Why: every CLI must reject a bad value with a message that says what was expected and
what was given; one definition keeps those messages identical across tools.
"""

from __future__ import annotations

import argparse
import math

__all__ = ["positive_int", "nonneg_int", "positive_float"]


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _int_at_least(text, 1)


def nonneg_int(text: str) -> int:
    """An integer >= 0."""
    return _int_at_least(text, 0)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {value}")
    return value
