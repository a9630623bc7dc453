"""Causal load-balancing reorders (striped and dual-chunk-swap) and their inverses.

Why: with a causal mask, the last rank of a contiguous sequence split sees almost all
keys while the first sees almost none. Reordering the sequence before sharding gives
each rank a fair mix of early and late tokens. Every tensor that is indexed by token
(Q, K, V, dO, segment ids, segment positions, RoPE positions) must be reordered with
the *same* call, and outputs and gradients are inverse-reordered afterwards.

The permutations are exactly TransformerEngine's (``reorder_causal_load_balancing``):

* Striped, stripe ``st``: rank ``r`` owns stripes ``r, r+cp, r+2cp, ...`` of ``st`` tokens.
  Output position ``p`` reads input ``(p % L)//st * cp*st + (p//L)*st + p % st`` with ``L = S/cp``.
* DualChunkSwap: the sequence is cut into ``2*cp`` chunks; rank ``r`` owns chunks ``r`` and
  ``2*cp-1-r``.
"""

from __future__ import annotations

import enum

import numpy as np

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
    """Same members and values as ``transformer_engine.jax.attention.ReorderStrategy``."""

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
    """Source index for every reordered position: ``reordered = original[perm]``."""
    cp = _check_cp_size(cp_size)
    st = _check_stripe(stripe_size)
    if seq_len % (cp * st) != 0:
        raise ValueError(
            f"sequence length {seq_len} is not divisible by"
            f" cp_size*stripe_size={cp}*{st}={cp * st}; pad the sequence to a multiple of"
            f" {cp * st} or choose a stripe_size that divides"
            f" {seq_len // cp if seq_len % cp == 0 else seq_len}/cp."
        )
    p = np.arange(seq_len)
    shard = seq_len // cp
    return (p % shard) // st * cp * st + (p // shard) * st + p % st


def dual_chunk_permutation(seq_len: int, cp_size: int) -> np.ndarray:
    """Source index for every reordered position under DualChunkSwap."""
    cp = _check_cp_size(cp_size)
    if cp == 1:
        return np.arange(seq_len)
    if cp % 2 != 0:
        raise ValueError(
            f"cp_size={cp} must be a multiple of 2 for DualChunkSwap reordering; use an even"
            " cp_size or ReorderStrategy.Striped."
        )
    if seq_len % (2 * cp) != 0:
        raise ValueError(
            f"sequence length {seq_len} is not a multiple of cp_size*2={2 * cp}; pad the sequence"
            f" to a multiple of {2 * cp}."
        )
    chunk = seq_len // (2 * cp)
    c = np.arange(2 * cp)
    src_chunk = np.where(c % 2 == 0, c // 2, 2 * cp - 1 - c // 2)
    return (src_chunk[:, None] * chunk + np.arange(chunk)[None, :]).reshape(-1)


def load_balancing_permutation(
    seq_len: int, strategy: ReorderStrategy, cp_size: int, stripe_size: int | None = None
) -> np.ndarray:
    """Permutation for either strategy, with TE's argument rules."""
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
    """``[cp_size, seq_len/cp_size]`` original token indices owned by each rank."""
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
    import jax.numpy as jnp

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
    """Reorder ``tensor`` along ``seq_dim`` so that a contiguous CP split is load balanced."""
    perm = load_balancing_permutation(_seq_len(tensor, seq_dim), strategy, cp_size, stripe_size)
    return _apply(tensor, seq_dim, perm)


def inverse_reorder_causal_load_balancing(
    tensor, strategy: ReorderStrategy, cp_size: int, seq_dim: int, stripe_size: int | None = None
):
    """Undo :func:`reorder_causal_load_balancing` (same arguments)."""
    perm = load_balancing_permutation(_seq_len(tensor, seq_dim), strategy, cp_size, stripe_size)
    return _apply(tensor, seq_dim, np.argsort(perm))
