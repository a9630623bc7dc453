"""Checks of the figures' inputs; each error names the parameter and says what to pass."""

from __future__ import annotations

import numpy as np


def positive_int(name: str, value) -> int:
    """``value`` as an int, if it is an integer >= 1.

    Args:
        name: The parameter's name, for the error.
        value: The value to check.

    Raises:
        ValueError: ``value`` is not an integer >= 1 (a bool is not one).
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {name}={value!r}.")
    return int(value)


def nonnegative_int(name: str, value) -> int:
    """``value`` as an int, if it is an integer >= 0.

    Args:
        name: The parameter's name, for the error.
        value: The value to check.

    Raises:
        ValueError: ``value`` is not an integer >= 0 (a bool is not one).
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {name}={value!r}.")
    return int(value)


def int_rows(name: str, value) -> np.ndarray:
    """``value`` as a non-empty ``[batch, seq]`` integer array (a ``[seq]`` row becomes one row).

    Args:
        name: The parameter's name, for the error.
        value: A ``[seq]`` or ``[batch, seq]`` array of integers.

    Raises:
        ValueError: ``value`` has another shape, is empty, or does not hold integers.
    """
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


def ids_pos_row(segment_ids, segment_pos, row) -> tuple[np.ndarray, np.ndarray]:
    """Batch row ``row`` of matching segment ids and positions.

    Args:
        segment_ids: ``[seq]`` or ``[batch, seq]`` integer ids, 0 for padding.
        segment_pos: Positions of the same shape.
        row: The batch row to return.

    Returns:
        ``(ids, pos)`` of that row, each ``[seq]``.

    Raises:
        ValueError: The shapes differ, an id is negative, or ``row`` is out of range.
    """
    ids = int_rows("segment_ids", segment_ids)
    pos = int_rows("segment_pos", segment_pos)
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
    r = nonnegative_int("row", row)
    if r >= ids.shape[0]:
        raise ValueError(f"row={row} is out of range for a batch of {ids.shape[0]} row(s).")
    return ids[r], pos[r]
