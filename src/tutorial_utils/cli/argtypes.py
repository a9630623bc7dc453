"""argparse value types and output-file checks shared by the CLIs (bench, check, launch).

One definition keeps the messages that reject a bad value (what was expected, what was given)
identical across tools.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

__all__ = ["positive_int", "nonneg_int", "positive_float", "output_file", "record_file"]


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


def output_file(flag: str, path, *, force: bool) -> Path:
    """Check, *before any work starts*, that ``path`` can be written without losing a file.

    Raises ``ValueError`` naming the flag when the path is a folder, its parent cannot be a
    folder, or a file is already there and ``force`` was not given. Creates the parent folder.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(
            f"{flag} {str(path)!r} is a folder; give a file name inside it, e.g."
            f" {str(path / 'report.json')!r}."
        )
    for parent in (path.parent, *path.parent.parents):
        if parent.exists() and not parent.is_dir():
            raise ValueError(
                f"{flag} {str(path)!r}: {str(parent)!r} is a file, not a folder; choose another"
                " path."
            )
    if path.exists() and not force:
        raise ValueError(
            f"{flag} {str(path)!r} already exists; choose another name or add --force to"
            " replace it."
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    if not os.access(path.parent, os.W_OK):
        raise ValueError(f"{flag} {str(path)!r}: the folder {str(path.parent)!r} is not writable.")
    return path


def record_file(folder, name: str | None, *, force: bool) -> Path | None:
    """``output_file`` for a record folder and an optional file name (``--out`` / ``--name``)."""
    if name is not None and (
        os.sep in name or (os.altsep and os.altsep in name) or name in ("", ".", "..")
    ):
        raise ValueError(
            f"--name {name!r} must be a file name, not a path; give the folder with --out."
        )
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--out {str(folder)!r} is a file; give a folder for the record.")
    if name is None:
        folder.mkdir(parents=True, exist_ok=True)
        return None
    return output_file(
        "--name", folder / (name if name.endswith(".json") else name + ".json"), force=force
    )
