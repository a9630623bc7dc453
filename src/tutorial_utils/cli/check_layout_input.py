"""What a reader hands ``check_layout``: the batches, the windows, and reordered arrays.

* :func:`load_batches` reads an ``.npz`` file (or a folder of them) with ``segment_ids`` and
  ``segment_pos`` ``[batch, seq]`` integer arrays, refusing bad files with the fix;
* :func:`te_windows` and :func:`model_windows` read ``--window`` (TE's left bound L; ``none`` for
  a global layer) and ``--model-window`` (the model's own window W, TE's ``(W-1, 0)``) as
  :class:`Window` s, so a model with local and global layers is checked in one run;
* :func:`looks_reordered` recognises arrays that were already reordered for CP (the tool takes
  them un-reordered and reorders them itself): it undoes candidate reorders and names the ones
  that turn the arrays into a packed layout, so the report can give the right fix instead of
  "split the segment".
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from tutorial_utils.reorder import ReorderStrategy, load_balancing_permutation

__all__ = [
    "REQUIRED_ARRAYS",
    "Window",
    "load_batches",
    "te_windows",
    "model_windows",
    "unique_windows",
    "looks_reordered",
    "reorder_fix",
]

REQUIRED_ARRAYS = ("segment_ids", "segment_pos")
CANDIDATE_CP_SIZES = (2, 4, 8, 16, 32, 64)
MAX_MATCHES = 3  # reorders named in a diagnosis: the first is the fix, the others "also fit"


# ----------------------------------------------------------------------------- the batches


def _load_one(path: pathlib.Path):
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"BATCH={str(path)!r} is not a readable .npz file ({err}); save your arrays with "
            "np.savez(path, segment_ids=ids, segment_pos=pos)."
        ) from err
    if not hasattr(data, "files"):
        raise ValueError(
            f"BATCH={str(path)!r} holds a single array, not an .npz archive; save both arrays with "
            "np.savez(path, segment_ids=ids, segment_pos=pos)."
        )
    missing = [name for name in REQUIRED_ARRAYS if name not in data.files]
    if missing:
        raise ValueError(
            f"BATCH={str(path)!r} has no array {missing[0]!r} (it holds {sorted(data.files)}); it"
            " needs segment_ids and segment_pos, e.g. np.savez(path, segment_ids=ids,"
            " segment_pos=pos)."
        )
    ids, pos = data["segment_ids"], data["segment_pos"]
    for name, arr in (("segment_ids", ids), ("segment_pos", pos)):
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(
                f"{path}: {name} has dtype {arr.dtype}, not an integer type; save it with "
                f"{name}.astype(np.int32)."
            )
        if arr.ndim != 2:
            hint = " (one row? save it as x[None])" if arr.ndim == 1 else ""
            raise ValueError(
                f"{path}: {name} has shape {arr.shape}; it must be 2-D [batch, seq]{hint}."
            )
    if ids.shape != pos.shape:
        raise ValueError(
            f"{path}: segment_ids has shape {ids.shape} but segment_pos has shape {pos.shape}; they"
            " must match token for token."
        )
    if ids.size == 0:
        raise ValueError(f"{path}: the arrays are empty (shape {ids.shape}).")
    return ids.astype(np.int32), pos.astype(np.int32)


def load_batches(path) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """The batches in an ``.npz`` file or a folder of them.

    Args:
        path: An ``.npz`` file with ``segment_ids`` and ``segment_pos`` ``[batch, seq]`` integer
            arrays, or a folder of such files (read in name order).

    Returns:
        ``[(name, segment_ids, segment_pos), ...]`` with int32 arrays.

    Raises:
        ValueError: If the path, a file or an array is unusable, naming it and the fix.
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise ValueError(
            f"BATCH={str(path)!r} does not exist; pass an .npz file with segment_ids and"
            " segment_pos [batch, seq] arrays, or a folder of such files."
        )
    if path.is_dir():
        files = sorted(path.glob("*.npz"))
        if not files:
            raise ValueError(f"BATCH={str(path)!r} is a folder with no .npz files in it.")
        return [(str(f), *_load_one(f)) for f in files]
    return [(str(path), *_load_one(path))]


# ----------------------------------------------------------------------------- the windows


@dataclasses.dataclass(frozen=True)
class Window:
    """One attention window to check.

    Attributes:
        left: TE's left bound L of ``window_size=(L, 0)``; ``None`` for full causal attention
            (a global layer).
        model: The model's own window W when it was asked as one (W counts the keys a query
            sees, itself included, from array indices, so L = W - 1); ``None`` otherwise.
        given: Whether a window flag asked for it (``False``: no window flag at all).
    """

    left: int | None = None
    model: int | None = None
    given: bool = False

    @property
    def size(self) -> tuple[int, int] | None:
        """TE's ``window_size``: ``(L, 0)``, or ``None`` for a global layer."""
        return None if self.left is None else (self.left, 0)

    def label(self) -> str:
        """How the report names the window, e.g. ``window=(62, 0) (model window W=63)``."""
        if self.left is None:
            return "window=None (global)"
        model = f" (model window W={self.model})" if self.model is not None else ""
        return f"window={self.size}{model}"


def _window_values(text: str, flag: str) -> list[int | None]:
    values = []
    for part in text.split(","):
        part = part.strip()
        if part.lower() in ("none", "global"):
            values.append(None)
            continue
        try:
            values.append(int(part))
        except ValueError:
            raise ValueError(
                f"{flag}={part!r} is not a window: give an int or 'none' (a global layer), several"
                " as a comma list or repeated flags."
            ) from None
    return values


def te_windows(text: str) -> list[Window]:
    """The windows of one ``--window`` value: TE's left bounds L and ``none``, comma-separated.

    Args:
        text: E.g. ``"63"``, ``"none"`` or ``"63,none"``.

    Returns:
        One :class:`Window` per value, in order.

    Raises:
        ValueError: If a value is neither an int >= 0 nor ``none``.
    """
    out = []
    for left in _window_values(text, "--window"):
        if left is not None and left < 0:
            raise ValueError(
                f"--window={left!r} must be an int >= 0: the left side of a causal sliding window "
                "(window_size=(L, 0)); give 'none' (or leave it out) for full causal attention."
            )
        out.append(Window(left=left, given=True))
    return out


def model_windows(text: str) -> list[Window]:
    """The windows of one ``--model-window`` value: the model's own W, each TE's ``(W-1, 0)``.

    Args:
        text: E.g. ``"64"`` or ``"64,none"``; W counts the keys a query sees, itself included
            (a mask ``j > i - W`` on array indices).

    Returns:
        One :class:`Window` per value, in order (``none``: a global layer).

    Raises:
        ValueError: If a value is neither an int >= 1 nor ``none``.
    """
    out = []
    for w in _window_values(text, "--model-window"):
        if w is not None and w < 1:
            raise ValueError(
                f"--model-window={w!r} must be an int >= 1: the keys a query sees, itself"
                " included (a mask j > i - W on array indices), which is TE's window_size=(W-1,"
                " 0); give 'none' for a global layer."
            )
        out.append(Window(given=True) if w is None else Window(left=w - 1, model=w, given=True))
    return out


def unique_windows(groups) -> list[Window]:
    """The windows of one run, in the order the flags gave them, each L once.

    Args:
        groups: Lists of :class:`Window` s (what :func:`te_windows` and :func:`model_windows`
            give, one list per flag), or ``None`` when no window flag was given.

    Returns:
        The windows, the first of each L kept (``--window 62`` and ``--model-window 63`` are
        one window); ``[Window()]`` (full causal, not named in the report) when there are none.
    """
    seen, out = set(), []
    for window in (w for group in groups or () for w in group):
        if window.left not in seen:
            seen.add(window.left)
            out.append(window)
    return out or [Window()]


# ----------------------------------------------------------------------------- reordered input


def _packed(ids, pos) -> bool:
    """Whether ``[batch, seq]`` ids/positions are a packed layout (the validator's layout rules).

    In every row the segments are contiguous runs numbered 1, 2, 3, ... in order, their
    positions counting 0, 1, 2, ...; padding (id 0) may be anywhere.
    """
    valid = ids != 0
    seq = ids.shape[1]
    starts = valid.copy()
    starts[:, 1:] &= ids[:, 1:] != ids[:, :-1]
    run = np.cumsum(starts, axis=1)  # the run a token belongs to, counted per row
    if not np.array_equal(ids[starts], run[starts]):
        return False  # a segment in two runs, or ids not 1, 2, 3, ... in order
    t = np.broadcast_to(np.arange(seq), ids.shape)
    first = np.maximum.accumulate(np.where(starts, t, 0), axis=1)
    return bool(np.array_equal(pos[valid], (t - first)[valid]))


def _candidates(seq: int, cp: int, stripe: int):
    """Reorders the arrays may have been through, the likeliest first.

    This run's ``(cp, stripe)``, other stripes at this cp, other CP sizes, then DualChunkSwap;
    the identity (``cp * stripe == seq``) is left out.
    """
    powers = [2**k for k in range(seq.bit_length())]
    sizes = [cp, *(c for c in CANDIDATE_CP_SIZES if c != cp)]
    striped = [(cp, stripe), *((cp, s) for s in powers if s != stripe)]
    striped += [(c, s) for c in sizes[1:] for s in powers]
    for c, s in striped:
        if c > 1 and seq % (c * s) == 0 and c * s < seq:
            yield ReorderStrategy.Striped, c, s
    for c in sizes:
        if c > 1 and c % 2 == 0 and seq % (2 * c) == 0:
            yield ReorderStrategy.DualChunkSwap, c, None


def looks_reordered(segment_ids, segment_pos, *, cp: int, stripe: int) -> list[dict]:
    """The reorders whose undoing turns ids/positions that are not a packed layout into one.

    Args:
        segment_ids: ``[batch, seq]`` segment ids, meant to be un-reordered.
        segment_pos: ``[batch, seq]`` positions.
        cp: This run's CP size (tried first).
        stripe: This run's stripe size (tried first).

    Returns:
        Up to three dicts with keys ``strategy`` (``"Striped"`` or ``"DualChunkSwap"``),
        ``cp`` and ``stripe`` (an int or None), the likeliest first; empty when the arrays
        are a packed layout already or no reorder explains them.
    """
    ids, pos = np.asarray(segment_ids), np.asarray(segment_pos)
    if _packed(ids, pos):
        return []
    found = []
    for strategy, c, s in _candidates(ids.shape[1], cp, stripe):
        back = np.argsort(load_balancing_permutation(ids.shape[1], strategy, c, s))
        if _packed(ids[:, back], pos[:, back]):
            found.append({"strategy": strategy.name, "cp": c, "stripe": s})
            if len(found) == MAX_MATCHES:
                break
    return found


def reorder_fix(match: dict) -> str:
    """The fix for arrays reordered as ``match`` (one of :func:`looks_reordered`'s)."""
    stripe = f", stripe_size={match['stripe']}" if match["stripe"] is not None else ""
    return (
        "pass segment_ids and segment_pos as they are before the reorder (check_layout reorders"
        " them itself), or undo it on both arrays with inverse_reorder_causal_load_balancing(x,"
        f" strategy=ReorderStrategy.{match['strategy']}, cp_size={match['cp']}, seq_dim=1{stripe})."
    )
