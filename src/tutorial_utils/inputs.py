"""Deterministic inputs: Q, K, V, dO and packed THD segment ids / positions.

Why: every comparison in the tutorial (reference vs oracle, CP vs one device, TE vs
reference) must see bit-identical inputs; the packing helpers produce exactly the layout
TE's CP paths need (segments contiguous, ids 1..N in order, positions from 0, padding
with id 0 whose positions keep counting through the slot).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["random_qkv", "fixed_slot_segments", "pack_segments", "random_segment_lengths"]


def random_qkv(
    seed: int, batch: int, seq_len: int, num_q_heads: int, num_kv_heads: int, head_dim: int, dtype
):
    """``q, k, v, dout`` drawn from one seed: ``[b, s, hq, d]``, ``[b, s, hkv, d]`` x2, ``[b, s, hq,
    d]``."""
    import jax

    for name, value in (
        ("batch", batch),
        ("seq_len", seq_len),
        ("num_q_heads", num_q_heads),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int.")
    import jax.numpy as jnp

    try:
        floating = jnp.issubdtype(jnp.dtype(dtype), jnp.floating)
    except TypeError:
        floating = False
    if not floating:
        raise ValueError(
            f"dtype={dtype!r} is not a floating dtype: q, k, v and dout are normal draws; use "
            "jnp.bfloat16, jnp.float16 or jnp.float32."
        )
    kq, kk, kv, kd = jax.random.split(jax.random.PRNGKey(seed), 4)
    q_shape = (batch, seq_len, num_q_heads, head_dim)
    kv_shape = (batch, seq_len, num_kv_heads, head_dim)
    return (
        jax.random.normal(kq, q_shape).astype(dtype),
        jax.random.normal(kk, kv_shape).astype(dtype),
        jax.random.normal(kv, kv_shape).astype(dtype),
        jax.random.normal(kd, q_shape).astype(dtype),
    )


def fixed_slot_segments(batch: int, seq_len: int, slots: int, valid_per_slot: int):
    """``(segment_ids, segment_pos)`` as int32 numpy ``[batch, seq_len]``: equal slots, valid prefix
    each."""
    for name, value in (
        ("batch", batch),
        ("seq_len", seq_len),
        ("slots", slots),
        ("valid_per_slot", valid_per_slot),
    ):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {name}={value!r}.")
    if seq_len % slots:
        raise ValueError(
            f"seq_len={seq_len} is not divisible by slots={slots}; choose a slot count that divides"
            " the row."
        )
    slot_len = seq_len // slots
    if valid_per_slot > slot_len:
        raise ValueError(
            f"valid_per_slot={valid_per_slot} exceeds the slot length {slot_len}; use at most"
            f" {slot_len}."
        )
    within = np.arange(slot_len)
    ids = np.concatenate([np.where(within < valid_per_slot, s + 1, 0) for s in range(slots)])
    pos = np.tile(within, slots)
    return np.tile(ids[None], (batch, 1)).astype(np.int32), np.tile(pos[None], (batch, 1)).astype(
        np.int32
    )


def pack_segments(
    lengths: Sequence[Sequence[int]],
    seq_len: int,
    align: int = 1,
    slot_padding: Sequence[Sequence[int]] | None = None,
):
    """Pack variable-length segments into rows.

    ``lengths[b]`` lists the valid lengths of row ``b``'s segments. Each segment starts at a
    multiple of ``align`` (use ``cp_size * stripe_size`` for AllGather); the gap up to the next
    slot is padding (id 0) whose positions keep counting, like TE's example. ``slot_padding``
    optionally adds extra padding after each segment before alignment.
    """
    if not isinstance(align, (int, np.integer)) or align < 1:
        raise ValueError(f"align must be a positive int, got align={align!r}.")
    batch = len(lengths)
    ids = np.zeros((batch, seq_len), np.int32)
    pos = np.zeros((batch, seq_len), np.int32)
    for b, row in enumerate(lengths):
        start = 0
        for s, length in enumerate(row):
            if isinstance(length, bool) or not isinstance(length, (int, np.integer)):
                raise ValueError(
                    f"lengths[{b}][{s}]={length!r} must be an int (a segment's number of valid"
                    " tokens)."
                )
            if length < 1:
                raise ValueError(
                    f"lengths[{b}][{s}]={length}: every segment needs at least one valid token."
                )
            extra = 0 if slot_padding is None else int(slot_padding[b][s])
            slot = -(-(length + extra) // align) * align
            end = start + slot
            if end > seq_len and start + length <= seq_len and s == len(row) - 1:
                end = seq_len  # last slot may be cut at the row end
            if start + length > seq_len:
                raise ValueError(
                    f"lengths[{b}]={list(row)} does not fit in seq_len={seq_len} with"
                    f" align={align}; use fewer/shorter segments or a longer row."
                )
            ids[b, start : start + length] = s + 1
            pos[b, start:end] = np.arange(end - start)
            start = end
        if start < seq_len:
            pos[b, start:] = np.arange(seq_len - start)
    return ids, pos


def random_segment_lengths(
    rng: np.random.Generator,
    batch: int,
    seq_len: int,
    max_segments: int,
    align: int = 1,
    min_len: int = 1,
):
    """Random per-row segment lengths that fit ``seq_len`` once aligned (for tests and demos)."""
    out = []
    for _ in range(batch):
        n = int(rng.integers(1, max_segments + 1))
        budget = seq_len // n
        cap = (budget // align) * align
        if cap < min_len:
            raise ValueError(f"seq_len={seq_len} is too short for {n} segments aligned to {align}.")
        out.append([int(rng.integers(min_len, cap + 1)) for _ in range(n)])
    return out
