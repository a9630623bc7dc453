"""Deterministic inputs: Q, K, V, dO and packed THD segment ids / positions.

Every comparison in the tutorial must see bit-identical inputs, and the packing helpers
produce exactly the layout TE's CP paths need.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["random_qkv", "fixed_slot_segments", "pack_segments", "random_segment_lengths"]


def random_qkv(
    seed: int, batch: int, seq_len: int, num_q_heads: int, num_kv_heads: int, head_dim: int, dtype
):
    """Random ``q, k, v, dout`` drawn from one seed.

    One seed fixes all four tensors, so every comparison (reference vs oracle, CP vs one
    device, TE vs reference) sees bit-identical inputs.

    Args:
        seed: Seed of the ``jax.random.PRNGKey`` the four draws are split from.
        batch: Batch size.
        seq_len: Sequence length.
        num_q_heads: Number of query heads.
        num_kv_heads: Number of key/value heads (GQA when fewer than ``num_q_heads``).
        head_dim: Size of each head.
        dtype: Floating dtype of the results, e.g. ``jnp.bfloat16``.

    Returns:
        ``(q, k, v, dout)`` standard-normal JAX arrays of shapes ``[b, s, hq, d]``,
        ``[b, s, hkv, d]``, ``[b, s, hkv, d]`` and ``[b, s, hq, d]``.

    Raises:
        ValueError: If a size is not a positive int or ``dtype`` is not floating.
    """
    for name, value in (
        ("batch", batch),
        ("seq_len", seq_len),
        ("num_q_heads", num_q_heads),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int.")
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
    """Segment ids and positions for equal slots, each with a valid prefix.

    The simplest packed THD layout: every row is cut into ``slots`` equal slots, each holding
    one segment of ``valid_per_slot`` tokens followed by padding (id 0) whose positions keep
    counting through the slot, as in TE's example.

    Args:
        batch: Number of rows.
        seq_len: Tokens per row; a multiple of ``slots``.
        slots: Segments per row.
        valid_per_slot: Valid tokens at the start of each slot, at most ``seq_len // slots``.

    Returns:
        ``(segment_ids, segment_pos)``, int32 NumPy arrays of shape ``[batch, seq_len]``.

    Raises:
        ValueError: If a size is not a positive int, ``slots`` does not divide ``seq_len`` or
            ``valid_per_slot`` exceeds the slot length.
    """
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
    """Pack variable-length segments into rows of segment ids and positions.

    Produces the layout TE's CP paths need: segments contiguous, ids ``1..N`` in order,
    positions from 0, and padding (id 0) whose positions keep counting through the slot,
    like TE's example.

    Args:
        lengths: ``lengths[b]`` lists the valid lengths of row ``b``'s segments.
        seq_len: Tokens per row.
        align: Each segment starts at a multiple of ``align`` (use ``cp_size * stripe_size``
            for AllGather); the gap up to the next slot is padding.
        slot_padding: Optional extra padding after each segment, before alignment, shaped
            like ``lengths``.

    Returns:
        ``(segment_ids, segment_pos)``, int32 NumPy arrays of shape ``[len(lengths), seq_len]``.

    Raises:
        ValueError: If ``align`` is not a positive int, a length is not an int of at least 1,
            or a row's segments do not fit in ``seq_len``.
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
    """Random per-row segment lengths that fit ``seq_len`` once aligned.

    For tests and demos: ragged packings to feed :func:`pack_segments`, reproducible from
    ``rng``.

    Args:
        rng: NumPy random generator the counts and lengths are drawn from.
        batch: Number of rows.
        seq_len: Tokens per row.
        max_segments: Each row gets between 1 and ``max_segments`` segments.
        align: Alignment :func:`pack_segments` will use; each length fits its share of the
            row once rounded up to it.
        min_len: Smallest segment length.

    Returns:
        A list of ``batch`` lists of int lengths.

    Raises:
        ValueError: If ``seq_len`` is too short for the drawn number of aligned segments.
    """
    out = []
    for _ in range(batch):
        n = int(rng.integers(1, max_segments + 1))
        budget = seq_len // n
        cap = (budget // align) * align
        if cap < min_len:
            raise ValueError(f"seq_len={seq_len} is too short for {n} segments aligned to {align}.")
        out.append([int(rng.integers(min_len, cap + 1)) for _ in range(n)])
    return out
