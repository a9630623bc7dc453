"""Checks for the inputs under which TransformerEngine silently returns wrong results.

Why: TE's THD context-parallel paths derive cuDNN's ragged metadata from segment ids and
positions with fast host-free tricks (bincount, run starts found from position jumps).
Those tricks assume a layout; outside it TE does not raise, it computes a *different*
attention. Every check here raises ``ValueError`` naming the parameter, the offending
value and the fix, so a user learns it before a week of training on garbage.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

__all__ = ["check_window", "check_gqa_heads", "check_divisible_seq", "validate_packed_inputs", "first_violation"]


def check_window(window, name: str = "window_size") -> Tuple[int, int]:
    """Normalise a sliding window to ``(left, right)``; ``None`` means ``(-1, -1)``."""
    if window is None:
        return (-1, -1)
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(
            f"{name}={window!r} is not a (left, right) pair; pass e.g. (8192, 0) for a causal window of 8192 "
            "tokens, and -1 for an unbounded side."
        )
    left, right = window
    for side, value in (("left", left), ("right", right)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name}={window!r}: the {side} bound must be an int (-1 for unbounded), got {value!r}.")
        if value < -1:
            raise ValueError(
                f"{name}={window!r}: the {side} bound {value} is negative; use -1 for unbounded (TE's kernel only "
                "recognises exactly -1) or a bound >= 0."
            )
    return (int(left), int(right))


def check_gqa_heads(num_q_heads: int, num_kv_heads: int, name: str = "num_kv_heads") -> int:
    if num_kv_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(
            f"{name}={num_kv_heads} does not divide num_q_heads={num_q_heads}; GQA maps query head h to KV head "
            f"h // (num_q_heads/num_kv_heads), so pick a KV head count that divides {num_q_heads}."
        )
    return num_q_heads // num_kv_heads


def check_divisible_seq(seq_len: int, cp_size: int, stripe_size: int = 1, name: str = "seq_len") -> None:
    if seq_len % (cp_size * stripe_size):
        raise ValueError(
            f"{name}={seq_len} is not divisible by cp_size*stripe_size={cp_size}*{stripe_size}={cp_size * stripe_size}; "
            f"pad each row to a multiple of {cp_size * stripe_size} tokens (padding has segment id 0) or choose a "
            "smaller stripe_size."
        )


def _strategy_name(strategy) -> Optional[str]:
    if strategy is None:
        return None
    name = getattr(strategy, "name", strategy)
    name = str(name).lower().replace("_", "").replace("-", "")
    aliases = {"default": "allgather", "allgather": "allgather", "ring": "ring", "ulysses": "ulysses", "alltoall": "ulysses"}
    if name not in aliases:
        raise ValueError(f"strategy={strategy!r} is unknown; use 'ring', 'allgather' or 'ulysses' (or a CPStrategy).")
    return aliases[name]


def first_violation(segment_ids, segment_pos, *, max_segments_per_seq: int, cp_size: int = 1,
                    stripe_size: Optional[int] = None, strategy=None, window_size=None) -> Optional[str]:
    """The first violated precondition as a message, or ``None`` when the inputs are safe."""
    try:
        validate_packed_inputs(segment_ids, segment_pos, max_segments_per_seq=max_segments_per_seq, cp_size=cp_size,
                               stripe_size=stripe_size, strategy=strategy, window_size=window_size)
    except ValueError as err:
        return str(err)
    return None


def validate_packed_inputs(segment_ids, segment_pos, *, max_segments_per_seq: int, cp_size: int = 1,
                           stripe_size: Optional[int] = None, strategy=None, window_size=None,
                           num_q_heads: Optional[int] = None, num_kv_heads: Optional[int] = None) -> None:
    """Raise ``ValueError`` if packed THD inputs violate a precondition of TE's THD (CP) paths.

    Pass the **global, un-reordered** ``[batch, seq]`` segment ids and positions (host arrays or
    concrete JAX arrays). ``strategy`` is ``'ring'``, ``'allgather'``, ``'ulysses'`` or a ``CPStrategy``.
    """
    ids = np.asarray(segment_ids)
    pos = np.asarray(segment_pos)
    if ids.ndim != 2:
        raise ValueError(f"segment_ids must be 2-D [batch, seq], got shape {ids.shape}; add a batch axis with ids[None].")
    if pos.shape != ids.shape:
        raise ValueError(f"segment_pos has shape {pos.shape} but segment_ids has shape {ids.shape}; they must match token for token.")
    if not np.issubdtype(ids.dtype, np.integer) or not np.issubdtype(pos.dtype, np.integer):
        raise ValueError(f"segment_ids/segment_pos must be integer arrays, got {ids.dtype}/{pos.dtype}; cast with .astype(jnp.int32).")
    if not isinstance(max_segments_per_seq, (int, np.integer)) or max_segments_per_seq < 1:
        raise ValueError(f"max_segments_per_seq must be a positive int, got {max_segments_per_seq!r}.")
    if (ids < 0).any():
        b, t = np.argwhere(ids < 0)[0]
        raise ValueError(f"segment_ids[{b}, {t}]={ids[b, t]} is negative; use 0 for padding and 1..N for segments.")
    window = check_window(window_size)
    strat = _strategy_name(strategy)
    st = 1 if stripe_size is None else stripe_size
    if not isinstance(st, (int, np.integer)) or st < 1:
        raise ValueError(f"stripe_size={stripe_size!r} must be a positive int (or None for 1).")
    batch, seq = ids.shape
    if cp_size > 1:
        check_divisible_seq(seq, cp_size, st, name="segment_ids.shape[1]")

    for b in range(batch):
        row_ids, row_pos = ids[b], pos[b]
        valid = row_ids > 0
        if not valid.any():
            continue
        present = row_ids[valid]
        top = int(present.max())
        if top > max_segments_per_seq:
            raise ValueError(
                f"segment_ids row {b} uses id {top} > max_segments_per_seq={max_segments_per_seq}; TE drops such "
                f"tokens silently (treats them as padding). Pass max_segments_per_seq>={top}."
            )
        # order of first appearance must be 1, 2, 3, ... with no gaps
        _, first_idx = np.unique(present, return_index=True)
        order = present[np.sort(first_idx)]
        expected = np.arange(1, len(order) + 1)
        if not np.array_equal(order, expected):
            raise ValueError(
                f"segment_ids row {b} has ids in order of appearance {order[:8].tolist()}..., expected "
                f"{expected[:8].tolist()}...: ids must be 1..N, consecutive and in order of appearance. "
                "Renumber the segments of each row from 1."
            )
        for sid in order:
            idx = np.nonzero(row_ids == sid)[0]
            if idx[-1] - idx[0] + 1 != len(idx):
                gap = idx[np.nonzero(np.diff(idx) > 1)[0][0]] + 1
                raise ValueError(
                    f"segment_ids row {b}: segment {sid} is not contiguous (its tokens resume after position {gap}); "
                    "each segment's valid tokens must be one contiguous run. Split it into two segments."
                )
            seg_pos = row_pos[idx]
            want = np.arange(len(idx))
            if not np.array_equal(seg_pos, want):
                bad = int(np.nonzero(seg_pos != want)[0][0])
                raise ValueError(
                    f"segment_pos row {b}, segment {sid}: token {bad} of the segment has pos {int(seg_pos[bad])}, "
                    f"expected {bad}; positions must count 0,1,2,... from each segment's first token."
                )
            if strat == "allgather" and cp_size > 1:
                align = cp_size * st
                # The slot starts where the segment starts; TE finds run starts from position jumps.
                if idx[0] % align:
                    raise ValueError(
                        f"segment_ids row {b}: segment {sid} starts at token {idx[0]}, not a multiple of "
                        f"cp_size*stripe_size={align}; AllGather CP finds segment starts from position jumps and can "
                        f"pair the wrong keys. Start every segment slot at a multiple of {align} (pad with id 0)."
                    )
    if strat == "ring" and cp_size > 1:
        if st != 1:
            raise ValueError(
                f"stripe_size={stripe_size} with strategy='ring': TE's THD ring attention only supports stripe_size=1 "
                "(larger stripes give wrong masks without an error). Use stripe_size=1 for Ring, or AllGather for larger stripes."
            )
        if window[0] != -1 and window[0] < cp_size - 1:
            raise ValueError(
                f"window_size={window} with strategy='ring' and cp_size={cp_size}: Ring + sliding window needs "
                f"left >= cp_size-1 = {cp_size - 1} (cuDNN cannot express the empty band). Widen the window or use AllGather."
            )
    if strat == "ulysses" and cp_size > 1 and num_q_heads is not None:
        check_ulysses_heads(num_q_heads, num_kv_heads or num_q_heads, cp_size)


def check_ulysses_heads(num_q_heads: int, num_kv_heads: int, cp_size: int) -> None:
    for name, heads in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads)):
        if heads % cp_size:
            raise ValueError(
                f"{name}={heads} is not divisible by cp_size={cp_size}: Ulysses all-to-all gives each rank "
                f"{name}/cp_size whole heads. Use Ring or AllGather, or a cp_size that divides {heads}."
            )
