"""Causal load-balancing reorders (striped and dual-chunk-swap) and their inverses.

With a causal mask, a contiguous CP split leaves the last rank almost all the work; these
permutations, exactly TransformerEngine's, give each rank a fair mix of early and late tokens.
"""

from __future__ import annotations

import enum

import jax.numpy as jnp
import numpy as np

from . import rules

__all__ = [
    "ReorderStrategy",
    "reorder_causal_load_balancing",
    "inverse_reorder_causal_load_balancing",
    "striped_permutation",
    "dual_chunk_permutation",
    "load_balancing_permutation",
    "rank_token_indices",
]


class ReorderStrategy(enum.Enum):
    """How the sequence is permuted before it is split over the CP axis.

    Same members and values as ``transformer_engine.jax.attention.ReorderStrategy``, so data
    reordered here and by TE is interchangeable (TE's enum is accepted wherever this one is).

    Attributes:
        DualChunkSwap: The sequence is cut into ``2 * cp`` chunks; rank ``r`` owns chunks
            ``r`` and ``2 * cp - 1 - r``.
        Striped: Rank ``r`` owns stripes ``r, r + cp, r + 2 * cp, ...`` of ``stripe_size``
            tokens.
    """

    DualChunkSwap = 0
    Striped = 1


def _check_cp_size(cp_size) -> int:
    if not isinstance(cp_size, (int, np.integer)) or isinstance(cp_size, bool) or cp_size < 1:
        raise ValueError(
            "cp_size must be a positive integer (the size of the context-parallel mesh axis), got"
            f" cp_size={cp_size!r}."
        )
    return int(cp_size)


def _check_stripe(stripe_size) -> int:
    if stripe_size is None:
        return 1
    if (
        not isinstance(stripe_size, (int, np.integer))
        or isinstance(stripe_size, bool)
        or stripe_size <= 0
    ):
        raise ValueError(
            "stripe_size must be a positive integer (or None for 1), got"
            f" stripe_size={stripe_size!r}."
        )
    return int(stripe_size)


def striped_permutation(seq_len: int, cp_size: int, stripe_size: int | None = 1) -> np.ndarray:
    """Source index of every position of the striped order.

    Rank ``r`` owns stripes ``r, r + cp, r + 2 * cp, ...`` of ``stripe_size`` tokens, so a
    contiguous split of the result gives every rank early and late tokens alike. Position
    ``p`` reads ``(p % L) // st * cp * st + (p // L) * st + p % st`` with ``L = seq_len / cp``.

    Args:
        seq_len: Length of the sequence axis.
        cp_size: Number of ranks on the context-parallel mesh axis.
        stripe_size: Tokens per stripe; ``None`` means 1.

    Returns:
        ``[seq_len]`` integer array ``perm`` with ``reordered = original[perm]``.

    Raises:
        ValueError: If ``cp_size`` or ``stripe_size`` is not a positive integer, or
            ``seq_len`` is not a multiple of ``cp_size * stripe_size``.
    """
    cp = _check_cp_size(cp_size)
    st = _check_stripe(stripe_size)
    rules.check_divisible_seq(seq_len, cp, st)
    p = np.arange(seq_len)
    shard = seq_len // cp
    return (p % shard) // st * cp * st + (p // shard) * st + p % st


def dual_chunk_permutation(seq_len: int, cp_size: int) -> np.ndarray:
    """Source index of every position of the DualChunkSwap order.

    The sequence is cut into ``2 * cp_size`` chunks and rank ``r`` gets chunks ``r`` and
    ``2 * cp_size - 1 - r``: one early and one late chunk, so causal work evens out.

    Args:
        seq_len: Length of the sequence axis; a multiple of ``2 * cp_size``.
        cp_size: Number of ranks on the context-parallel mesh axis; 1 or even.

    Returns:
        ``[seq_len]`` integer array ``perm`` with ``reordered = original[perm]`` (the
        identity when ``cp_size`` is 1).

    Raises:
        ValueError: If ``cp_size`` is not a positive integer, is odd (and not 1), or does not
            divide ``seq_len`` into ``2 * cp_size`` chunks.
    """
    cp = _check_cp_size(cp_size)
    if cp == 1:
        return np.arange(seq_len)
    if cp % 2 != 0:
        raise ValueError(
            f"cp_size={cp} must be a multiple of 2 for DualChunkSwap reordering; use an even"
            " cp_size or ReorderStrategy.Striped."
        )
    rules.check_dual_chunk(seq_len, cp)
    chunk = seq_len // (2 * cp)
    c = np.arange(2 * cp)
    src_chunk = np.where(c % 2 == 0, c // 2, 2 * cp - 1 - c // 2)
    return (src_chunk[:, None] * chunk + np.arange(chunk)[None, :]).reshape(-1)


def load_balancing_permutation(
    seq_len: int, strategy: ReorderStrategy, cp_size: int, stripe_size: int | None = None
) -> np.ndarray:
    """Permutation for either strategy, with TE's argument rules.

    One entry point for both strategies, so callers need not branch on the strategy and
    get TE's refusals (e.g. a stripe size with DualChunkSwap) in the same place.

    Args:
        seq_len: Length of the sequence axis.
        strategy: A :class:`ReorderStrategy`, or TE's enum of the same name.
        cp_size: Number of ranks on the context-parallel mesh axis.
        stripe_size: Tokens per stripe for ``Striped`` (``None`` means 1); must be ``None``
            for ``DualChunkSwap``.

    Returns:
        ``[seq_len]`` integer array ``perm`` with ``reordered = original[perm]``.

    Raises:
        ValueError: If ``strategy`` is not a reorder strategy, ``stripe_size`` is given with
            ``DualChunkSwap``, or the permutation's own checks fail (see
            :func:`striped_permutation` and :func:`dual_chunk_permutation`).
    """
    strategy = _check_strategy(strategy)
    if strategy is ReorderStrategy.DualChunkSwap:
        if stripe_size is not None:
            raise ValueError(
                f"stripe_size={stripe_size!r} is only meaningful for ReorderStrategy.Striped; pass"
                " stripe_size=None with DualChunkSwap."
            )
        return dual_chunk_permutation(seq_len, cp_size)
    return striped_permutation(seq_len, cp_size, stripe_size)


def rank_token_indices(
    seq_len: int, strategy: ReorderStrategy, cp_size: int, stripe_size: int | None = None
) -> np.ndarray:
    """Original token indices each rank holds after the reorder.

    Useful to see (or test) which tokens a rank owns without reordering any data.

    Args:
        seq_len: Length of the sequence axis.
        strategy: A :class:`ReorderStrategy`, or TE's enum of the same name.
        cp_size: Number of ranks on the context-parallel mesh axis.
        stripe_size: Tokens per stripe for ``Striped``; ``None`` for ``DualChunkSwap``.

    Returns:
        ``[cp_size, seq_len / cp_size]`` integer array; row ``r`` lists rank ``r``'s tokens
        in its local order.

    Raises:
        ValueError: As :func:`load_balancing_permutation`.
    """
    perm = load_balancing_permutation(seq_len, strategy, cp_size, stripe_size)
    return perm.reshape(_check_cp_size(cp_size), -1)


def _check_strategy(strategy) -> ReorderStrategy:
    if isinstance(strategy, ReorderStrategy):
        return strategy
    # Accept TE's own enum (same member names) so reordered data can come from either.
    name = getattr(strategy, "name", None)
    if name in ReorderStrategy.__members__:
        return ReorderStrategy[name]
    raise ValueError(
        "strategy must be ReorderStrategy.Striped or ReorderStrategy.DualChunkSwap, got"
        f" strategy={strategy!r}."
    )


def _apply(tensor, seq_dim: int, index: np.ndarray):
    if not isinstance(seq_dim, (int, np.integer)) or not -tensor.ndim <= seq_dim < tensor.ndim:
        raise ValueError(
            f"seq_dim={seq_dim!r} is not an axis of a tensor with shape {tuple(tensor.shape)}; use"
            " 1 for [batch, seq, ...] and 0 for [seq, batch, ...]."
        )
    if isinstance(tensor, np.ndarray):
        return np.take(tensor, index, axis=seq_dim)
    return jnp.take(tensor, jnp.asarray(index), axis=seq_dim)


def _seq_len(tensor, seq_dim) -> int:
    if not isinstance(seq_dim, (int, np.integer)) or not -tensor.ndim <= seq_dim < tensor.ndim:
        raise ValueError(
            f"seq_dim={seq_dim!r} is not an axis of a tensor with shape {tuple(tensor.shape)}; use"
            " 1 for [batch, seq, ...] and 0 for [seq, batch, ...]."
        )
    return int(tensor.shape[seq_dim])


def reorder_causal_load_balancing(
    tensor, strategy: ReorderStrategy, cp_size: int, seq_dim: int, stripe_size: int | None = None
):
    """Reorder ``tensor`` along ``seq_dim`` so that a contiguous CP split is load balanced.

    Every token-indexed tensor (Q, K, V, dO, segment ids and positions, RoPE positions) must
    go through the same call, and outputs and gradients through
    :func:`inverse_reorder_causal_load_balancing` afterwards. Same signature as TE's.

    Args:
        tensor: NumPy or JAX array; NumPy in gives NumPy out.
        strategy: A :class:`ReorderStrategy`, or TE's enum of the same name.
        cp_size: Number of ranks on the context-parallel mesh axis.
        seq_dim: The sequence axis: 1 for ``[batch, seq, ...]``, 0 for ``[seq, batch, ...]``.
        stripe_size: Tokens per stripe for ``Striped`` (``None`` means 1); must be ``None``
            for ``DualChunkSwap``.

    Returns:
        ``tensor`` with its sequence axis permuted.

    Raises:
        ValueError: If ``seq_dim`` is not an axis of ``tensor``, or as
            :func:`load_balancing_permutation`.
    """
    perm = load_balancing_permutation(_seq_len(tensor, seq_dim), strategy, cp_size, stripe_size)
    return _apply(tensor, seq_dim, perm)


def inverse_reorder_causal_load_balancing(
    tensor, strategy: ReorderStrategy, cp_size: int, seq_dim: int, stripe_size: int | None = None
):
    """Undo :func:`reorder_causal_load_balancing`.

    Brings outputs and gradients computed in the balanced order back to the natural order.

    Args:
        tensor: NumPy or JAX array in the reordered layout; NumPy in gives NumPy out.
        strategy: The strategy the data was reordered with.
        cp_size: The CP size the data was reordered for.
        seq_dim: The sequence axis: 1 for ``[batch, seq, ...]``, 0 for ``[seq, batch, ...]``.
        stripe_size: The stripe size the data was reordered with.

    Returns:
        ``tensor`` in the natural token order.

    Raises:
        ValueError: As :func:`reorder_causal_load_balancing`.
    """
    perm = load_balancing_permutation(_seq_len(tensor, seq_dim), strategy, cp_size, stripe_size)
    return _apply(tensor, seq_dim, np.argsort(perm))
