"""Exact work accounting for packed causal sliding-window attention under context parallelism.

"CP gives a 4x speedup on 4 GPUs" is only true if every rank gets a quarter of the *visible*
query-key pairs, in dense tiles; this counts both exactly, without building an S x S mask.
Counts are **per query head**; multiply by ``num_q_heads`` (or use :func:`attention_flops`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tutorial_utils import rules
from tutorial_utils.perfmodel.workload import workload_segments
from tutorial_utils.reorder import ReorderStrategy, rank_token_indices
from tutorial_utils.validation import check_window

__all__ = [
    "LAYOUTS",
    "WorkCount",
    "local_token_order",
    "visible_pairs_per_query",
    "total_visible_pairs",
    "pair_matrix",
    "ring_step_pairs",
    "count_work",
    "count_workload",
    "attention_flops",
    "BWD_FWD_RATIO",
]

#: Layouts understood here. ``contiguous``: rank r owns tokens [r*S/cp, (r+1)*S/cp) (no reorder).
LAYOUTS = ("contiguous", "striped", "dual_chunk")

#: Backward attention costs 2.5x the forward (5 matmuls incl. the QK^T recompute vs 2), the
#: FlashAttention benchmark convention (anchors.md C.1).
BWD_FWD_RATIO = 2.5


# --------------------------------------------------------------------------------------------
# input checks


def _check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(
            f"layout={layout!r} is unknown; use one of {LAYOUTS} (striped = TE's"
            " ReorderStrategy.Striped)."
        )
    return layout


def _check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {name}={value!r}.")
    return int(value)


def _check_ids_pos(segment_ids, segment_pos) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(segment_ids)
    pos = np.asarray(segment_pos)
    if ids.ndim == 1:
        ids = ids[None]
    if pos.ndim == 1:
        pos = pos[None]
    if ids.ndim != 2:
        raise ValueError(
            f"segment_ids must be [batch, seq] (or [seq]), got shape {ids.shape}; reshape it to"
            " 2-D."
        )
    if pos.shape != ids.shape:
        raise ValueError(
            f"segment_pos has shape {pos.shape} but segment_ids has shape {ids.shape}; pass one"
            " position per token."
        )
    if not np.issubdtype(ids.dtype, np.integer) or not np.issubdtype(pos.dtype, np.integer):
        raise ValueError(
            f"segment_ids/segment_pos must be integer arrays, got {ids.dtype}/{pos.dtype}; convert"
            " with .astype(np.int32)."
        )
    if ids.size and ids.min() < 0:
        raise ValueError(
            f"segment_ids has a negative id {int(ids.min())}; use 0 for padding and 1..N for"
            " segments."
        )
    return ids.astype(np.int64), pos.astype(np.int64)


def _check_tile(tile) -> tuple[int, int]:
    if isinstance(tile, (int, np.integer)) and not isinstance(tile, bool):
        tile = (tile, tile)
    if not isinstance(tile, (tuple, list)) or len(tile) != 2:
        raise ValueError(f"tile={tile!r} must be an int or a (rows, cols) pair such as (128, 128).")
    return _check_positive_int("tile rows", tile[0]), _check_positive_int("tile cols", tile[1])


# --------------------------------------------------------------------------------------------
# layouts


def local_token_order(
    seq_len: int, cp_size: int, layout: str = "striped", stripe_size: int = 1
) -> np.ndarray:
    """``[cp, seq_len/cp]``: the original token indices each rank holds, in its local memory order.

    Why: a rank's kernel sees its tokens in this order, which decides both its share of
    the work and how contiguous (tile-friendly) its query runs are.
    """
    seq_len = _check_positive_int("seq_len", seq_len)
    cp = _check_positive_int("cp_size", cp_size)
    layout = _check_layout(layout)
    rules.check_divisible_seq(seq_len, cp, None)
    if layout == "contiguous":
        return np.arange(seq_len).reshape(cp, -1)
    if layout == "striped":
        return rank_token_indices(
            seq_len, ReorderStrategy.Striped, cp, _check_positive_int("stripe_size", stripe_size)
        )
    return rank_token_indices(seq_len, ReorderStrategy.DualChunkSwap, cp, None)


# --------------------------------------------------------------------------------------------
# the coding trick


class _Coder:
    """Integer codes so that "same row and segment, pos in [lo, hi]" is one code interval.

    Every valid key gets the code ``group * span + pos`` (group = batch row and segment id).
    The keys a query can see form one contiguous code interval, so a count is two lookups
    into a running count of one rank's keys over the code range (:class:`_Below`): O(S) per
    rank.
    """

    def __init__(self, ids: np.ndarray, pos: np.ndarray, left: int):
        batch, seq = ids.shape
        self.valid = ids > 0
        n_groups_per_row = int(ids.max()) + 1 if ids.size else 1
        self.group = np.arange(batch)[:, None] * n_groups_per_row + ids  # [B, S]
        self.pmin = int(pos.min()) if pos.size else 0
        self.span = int(pos.max()) - self.pmin + 1 if pos.size else 1
        self.code = self.group * self.span + (pos - self.pmin)
        lo_pos = pos - left if left >= 0 else np.full_like(pos, self.pmin)
        self.lo = self.group * self.span + (np.maximum(lo_pos, self.pmin) - self.pmin)
        self.hi = self.code  # causal: pos_kv <= pos_q
        self.group_start = self.group * self.span
        self.size = int(self.code.max()) + 1 if self.code.size else 1  # codes lie in [0, size)

    def below(self, mask: np.ndarray) -> _Below:
        """Running counts of the valid keys where ``mask`` holds."""
        return _Below(self.code[mask & self.valid], self.size)


class _Below:
    """How many of a set of integer codes are < x (``left``) or <= x (``right``), as
    ``np.searchsorted`` gives.

    Why: the cost model counts a million queries against every rank's keys. Codes are dense
    (row, segment, position) numbers, so a running count over the code range answers each
    query with one lookup instead of a binary search. Where that range is much larger than the
    set (sparse ids or positions), it falls back to ``np.searchsorted``.
    """

    def __init__(self, codes: np.ndarray, size: int):
        codes = np.asarray(codes, np.int64)
        if size <= 8 * codes.size + 4096:
            self._table = np.zeros(size + 1, np.int64)
            np.cumsum(np.bincount(codes, minlength=size), out=self._table[1:])
            self._sorted = None
        else:
            self._table, self._sorted = None, np.sort(codes)

    def left(self, x: np.ndarray) -> np.ndarray:
        """Codes < x (``searchsorted(..., side="left")``)."""
        return (
            self._table[x]
            if self._sorted is None
            else np.searchsorted(self._sorted, x, side="left")
        )

    def right(self, x: np.ndarray) -> np.ndarray:
        """Codes <= x (``searchsorted(..., side="right")``)."""
        return (
            self._table[x + 1]
            if self._sorted is None
            else np.searchsorted(self._sorted, x, side="right")
        )


def _distinct_sorted(values: np.ndarray) -> int:
    """``len(np.unique(values))`` for values already in non-decreasing order."""
    return int(values.size and 1 + np.count_nonzero(values[1:] != values[:-1]))


def _counts_in(codes: _Below, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return codes.right(hi) - codes.left(lo)


def _rank_of(seq_len: int, cp: int, layout: str, stripe_size: int) -> np.ndarray:
    order = local_token_order(seq_len, cp, layout, stripe_size)
    rank = np.empty(seq_len, np.int64)
    rank[order.reshape(-1)] = np.repeat(np.arange(cp), seq_len // cp)
    return rank


# --------------------------------------------------------------------------------------------
# pair counts


def visible_pairs_per_query(segment_ids, segment_pos, window=(-1, 0)) -> np.ndarray:
    """``[batch, seq]`` number of visible keys of every query (0 for padding queries).

    Why: the per-row key count is the natural unit of attention work (FLOPs = 4*d per pair
    per head) and shows at a glance how a window caps the cost of late tokens.

    Semantics (TE's THD + PADDING_CAUSAL), for one batch row::

        visible(i, j) <=> seg_q[i] == seg_kv[j] != 0
                          and pos_kv[j] <= pos_q[i]
                          and (left < 0 or pos_kv[j] >= pos_q[i] - left)

    The right window bound never matters once causal applies (it is -1 or >= 0).
    """
    ids, pos = _check_ids_pos(segment_ids, segment_pos)
    left, _ = check_window(window)
    coder = _Coder(ids, pos, left)
    counts = _counts_in(coder.below(np.ones_like(coder.valid)), coder.lo, coder.hi)
    return np.where(coder.valid, counts, 0)


def total_visible_pairs(segment_ids, segment_pos, window=(-1, 0)) -> int:
    """Visible (query, key) pairs summed over batch and segments, per head."""
    return int(visible_pairs_per_query(segment_ids, segment_pos, window).sum())


def pair_matrix(
    segment_ids,
    segment_pos,
    window=(-1, 0),
    *,
    cp_size: int,
    layout: str = "striped",
    stripe_size: int = 1,
) -> np.ndarray:
    """``M[q_rank, kv_rank]``: visible pairs whose query lives on ``q_rank`` and key on ``kv_rank``.

    Why: every CP strategy is a way of visiting this matrix. AllGather rank r does row r in
    one call; Ring rank r does entry ``(r, (r - t) mod cp)`` at step t.
    """
    ids, pos = _check_ids_pos(segment_ids, segment_pos)
    left, _ = check_window(window)
    cp = _check_positive_int("cp_size", cp_size)
    rank = _rank_of(ids.shape[1], cp, _check_layout(layout), stripe_size)
    coder = _Coder(ids, pos, left)
    out = np.zeros((cp, cp), np.int64)
    q_rank = np.broadcast_to(rank[None, :], ids.shape)
    for k in range(cp):
        codes_k = coder.below(q_rank == k)
        counts = np.where(coder.valid, _counts_in(codes_k, coder.lo, coder.hi), 0)
        out[:, k] = np.bincount(
            q_rank.reshape(-1), weights=counts.reshape(-1), minlength=cp
        ).astype(np.int64)
    return out


def ring_step_pairs(matrix: np.ndarray) -> np.ndarray:
    """``[rank, step]`` pairs from a :func:`pair_matrix`: at step t rank r holds rank (r-t) mod cp's
    KV."""
    m = np.asarray(matrix)
    cp = m.shape[0]
    r = np.arange(cp)[:, None]
    t = np.arange(cp)[None, :]
    return m[r, (r - t) % cp]


# --------------------------------------------------------------------------------------------
# tiles


def _tile_counts(run_id, row_in_run, lo, hi, tq: int, tk: int, owner: np.ndarray, n_owner: int):
    """Touched and fully visible ``tq x tk`` tiles, summed per ``owner``.

    Rows must be sorted by (run, row); ``lo..hi`` are the inclusive kv-run-local indices a
    row sees (empty if lo > hi), and both ends are non-decreasing along a run (true for
    causal windows on position-sorted runs). Tiles are anchored at each run's first query
    and at its kv run's first key, as a ragged (THD) kernel anchors them.
    """
    touched = np.zeros(n_owner, np.int64)
    full = np.zeros(n_owner, np.int64)
    if run_id.size == 0:
        return touched, full
    tile_key = run_id * (int(row_in_run.max()) // tq + 1) + row_in_run // tq
    nonempty = lo <= hi
    # touched: union of per-row tile intervals [lo//tk, hi//tk] within each q tile
    sel = np.nonzero(nonempty)[0]
    a, b, key = lo[sel] // tk, hi[sel] // tk, tile_key[sel]
    first = np.ones(sel.size, bool)
    first[1:] = key[1:] != key[:-1]
    prev_b = np.empty_like(b)
    prev_b[1:] = b[:-1]
    new = np.where(first, b - a + 1, np.maximum(0, b - np.maximum(a, prev_b + 1) + 1))
    touched += np.bincount(owner[sel], weights=new, minlength=n_owner).astype(np.int64)
    # full: a complete q tile whose rows are all non-empty; full kv tiles lie inside every row's
    # range
    boundaries = np.nonzero(np.r_[True, tile_key[1:] != tile_key[:-1]])[0]
    ends = np.r_[boundaries[1:], tile_key.size] - 1
    sizes = ends - boundaries + 1
    all_nonempty = np.minimum.reduceat(nonempty.astype(np.int8), boundaries).astype(bool)
    ok = (sizes == tq) & all_nonempty
    first_hi = hi[boundaries]
    last_lo = lo[ends]
    n_full = np.maximum(0, (first_hi + 1) // tk - (-(-last_lo // tk)))
    n_full = np.where(ok, n_full, 0)
    full += np.bincount(owner[boundaries], weights=n_full, minlength=n_owner).astype(np.int64)
    return touched, full


def _runs_allgather(ids_loc: np.ndarray, pos_loc: np.ndarray):
    """Run id and row-in-run for a rank's local queries, broken like TE's AllGather THD path.

    A run is a maximal stretch of local tokens with the same non-zero segment id whose
    positions increase by exactly 1; padding belongs to no run (run id -1).
    """
    valid = ids_loc > 0
    start = valid.copy()
    start[..., 1:] &= ~(
        (ids_loc[..., 1:] == ids_loc[..., :-1])
        & (pos_loc[..., 1:] == pos_loc[..., :-1] + 1)
        & valid[..., :-1]
    )
    return _runs_from_starts(start, valid)


def _runs_by_segment(ids_loc: np.ndarray):
    """Run id and row-in-run when one run is all local tokens of a segment (TE's Ring THD path)."""
    valid = ids_loc > 0
    start = valid.copy()
    start[..., 1:] &= ids_loc[..., 1:] != ids_loc[..., :-1]
    return _runs_from_starts(start, valid)


def _runs_from_starts(start: np.ndarray, valid: np.ndarray):
    flat_start = start.reshape(-1)
    flat_valid = valid.reshape(-1)
    run_id = np.cumsum(flat_start) - 1
    idx = np.arange(flat_start.size)
    start_idx = np.maximum.accumulate(np.where(flat_start, idx, 0))
    row = idx - start_idx
    run_id = np.where(flat_valid, run_id, -1).reshape(start.shape)
    row = np.where(flat_valid, row, -1).reshape(start.shape)
    return run_id, row


# --------------------------------------------------------------------------------------------
# the full accounting


@dataclasses.dataclass(frozen=True)
class WorkCount:
    """Per-rank and per-ring-step work of one layout, per query head.

    ``pairs`` arrays count visible (query, key) pairs; ``tiles`` arrays count ``tile``-sized
    blocks a ragged kernel has to touch (a tile with at least one visible pair), and
    ``full_tiles`` those with every pair visible. ``tile_efficiency`` = pairs / (tiles * area)
    is the fraction of touched tile area that is useful work: a kernel-efficiency proxy.
    """

    cp_size: int
    layout: str
    stripe_size: int
    window: tuple[int, int]
    tile: tuple[int, int] | None
    total_pairs: int
    pair_matrix: np.ndarray  # [q_rank, kv_rank]
    ring_pairs: np.ndarray  # [rank, step]
    allgather_pairs: np.ndarray  # [rank]
    allgather_runs: np.ndarray  # [rank] query runs (pos-contiguous, same segment)
    ring_runs: np.ndarray  # [rank] query runs (one per local segment piece)
    allgather_tiles: np.ndarray | None = None  # [rank]
    allgather_full_tiles: np.ndarray | None = None  # [rank]
    ring_tiles: np.ndarray | None = None  # [rank, step]
    ring_full_tiles: np.ndarray | None = None  # [rank, step]

    @property
    def tile_area(self) -> int:
        """Pairs one tile covers (0 when tiles were not counted)."""
        return 0 if self.tile is None else self.tile[0] * self.tile[1]

    def imbalance(self, strategy: str = "allgather") -> float:
        """Slowest rank / mean rank, in pairs. Ring sums each step's slowest rank (steps are
        lock-stepped)."""
        mean = self.total_pairs / self.cp_size
        if mean == 0:
            return 1.0
        if strategy == "ring":
            return float(self.ring_pairs.max(axis=0).sum() / mean)
        if strategy == "allgather":
            return float(self.allgather_pairs.max() / mean)
        raise ValueError(f"strategy={strategy!r} is not 'ring' or 'allgather'.")

    def tile_efficiency(self, strategy: str = "allgather") -> float:
        """Useful pairs / touched tile area over all ranks (1.0 = no masked-out work in touched
        tiles)."""
        if self.tile is None:
            raise ValueError(
                "tile_efficiency needs tile counts; call count_work(..., tile=(128, 128))."
            )
        tiles = self.ring_tiles.sum() if strategy == "ring" else self.allgather_tiles.sum()
        return float(self.total_pairs / (tiles * self.tile_area)) if tiles else 1.0

    def as_dict(self) -> dict:
        """Plain-JSON view (lists instead of arrays)."""
        d = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            d[f.name] = (
                v.tolist()
                if isinstance(v, np.ndarray)
                else (list(v) if isinstance(v, tuple) else v)
            )
        return d


def count_work(
    segment_ids,
    segment_pos,
    window=(-1, 0),
    *,
    cp_size: int = 1,
    layout: str = "striped",
    stripe_size: int = 1,
    tile=(128, 128),
) -> WorkCount:
    """Count pairs per rank and per ring step, runs, and (optionally) touched tiles for one layout.

    Why: this is the input of the cost model. ``segment_ids`` / ``segment_pos`` are the
    global, **un-reordered** ``[batch, seq]`` arrays; the layout decides which rank owns
    which token. With ``cp_size=1`` the AllGather fields describe the single-device kernel.
    Pass ``tile=None`` to skip tile counting (pair counts only).

    Tile model: AllGather (TE THD striped) runs one ragged kernel per rank whose query runs
    break on a segment change or a position jump, each run reading its segment's keys from
    position 0 (bottom-right aligned). Ring runs one kernel per step whose runs are the
    rank's local tokens of one segment against the held KV block's tokens of that segment.
    """
    ids, pos = _check_ids_pos(segment_ids, segment_pos)
    left, right = check_window(window)
    cp = _check_positive_int("cp_size", cp_size)
    layout = _check_layout(layout)
    stripe = _check_positive_int("stripe_size", stripe_size)
    if layout != "striped":
        stripe = 1
    tq, tk = _check_tile(tile) if tile is not None else (None, None)
    batch, seq = ids.shape
    order = local_token_order(seq, cp, layout, stripe)  # [cp, n]
    coder = _Coder(ids, pos, left)

    # local (rank-major) views: [cp, batch, n]
    def local(x):
        return np.transpose(x[:, order], (1, 0, 2))

    ids_l, pos_l = local(ids), local(pos)
    valid_l = ids_l > 0
    lo_l, hi_l, gstart_l = local(coder.lo), local(coder.hi), local(coder.group_start)
    code_l = local(coder.code)
    rank_l = np.broadcast_to(np.arange(cp)[:, None, None], ids_l.shape)

    # key codes of each rank's block, and of all keys, as running counts over the code range
    block_codes = [_Below(code_l[k][valid_l[k]], coder.size) for k in range(cp)]
    all_codes = coder.below(np.ones_like(coder.valid))

    matrix = np.zeros((cp, cp), np.int64)
    ring_tiles = np.zeros((cp, cp), np.int64) if tile is not None else None
    ring_full = np.zeros((cp, cp), np.int64) if tile is not None else None
    seg_run, seg_row = _runs_by_segment(ids_l)
    ag_run, ag_row = _runs_allgather(ids_l, pos_l)
    # run ids come from a running count, so each rank's are non-decreasing
    ring_runs = np.array(
        [_distinct_sorted(seg_run[k][seg_run[k] >= 0]) for k in range(cp)], np.int64
    )
    ag_runs = np.array([_distinct_sorted(ag_run[k][ag_run[k] >= 0]) for k in range(cp)], np.int64)

    vq = valid_l.reshape(-1)
    q_lo, q_hi, q_gs = lo_l.reshape(-1)[vq], hi_l.reshape(-1)[vq], gstart_l.reshape(-1)[vq]
    q_rank = rank_l.reshape(-1)[vq]
    for k in range(cp):
        codes_k = block_codes[k]
        lo_i = codes_k.left(q_lo)
        hi_i = codes_k.right(q_hi) - 1
        cnt = hi_i - lo_i + 1
        matrix[:, k] = np.bincount(q_rank, weights=cnt, minlength=cp).astype(np.int64)
        if tile is not None:
            base = codes_k.left(q_gs)
            step = (q_rank - k) % cp  # rank r holds block k at step (r - k) mod cp
            owner = q_rank * cp + step
            t, f = _tile_counts(
                seg_run.reshape(-1)[vq],
                seg_row.reshape(-1)[vq],
                lo_i - base,
                hi_i - base,
                tq,
                tk,
                owner,
                cp * cp,
            )
            ring_tiles += t.reshape(cp, cp)
            ring_full += f.reshape(cp, cp)

    ag_tiles = ag_full = None
    if tile is not None:
        lo_i = all_codes.left(q_lo)
        hi_i = all_codes.right(q_hi) - 1
        base = all_codes.left(q_gs)
        ag_tiles, ag_full = _tile_counts(
            ag_run.reshape(-1)[vq],
            ag_row.reshape(-1)[vq],
            lo_i - base,
            hi_i - base,
            tq,
            tk,
            q_rank,
            cp,
        )

    return WorkCount(
        cp_size=cp,
        layout=layout,
        stripe_size=stripe,
        window=(left, right),
        tile=None if tile is None else (tq, tk),
        total_pairs=int(matrix.sum()),
        pair_matrix=matrix,
        ring_pairs=ring_step_pairs(matrix),
        allgather_pairs=matrix.sum(axis=1),
        allgather_runs=ag_runs,
        ring_runs=ring_runs,
        allgather_tiles=ag_tiles,
        allgather_full_tiles=ag_full,
        ring_tiles=ring_tiles,
        ring_full_tiles=ring_full,
    )


def count_workload(
    workload,
    *,
    layout: str = "striped",
    stripe_size: int | None = None,
    cp_size: int | None = None,
    tile=(128, 128),
) -> WorkCount:
    """:func:`count_work` for a :class:`~tutorial_utils.perfmodel.workload.Workload` (its fixed-slot
    packing)."""
    ids, pos = workload_segments(workload)
    return count_work(
        ids,
        pos,
        workload.window,
        cp_size=workload.cp_size if cp_size is None else cp_size,
        layout=layout,
        stripe_size=workload.stripe_size if stripe_size is None else stripe_size,
        tile=tile,
    )


def attention_flops(pairs, num_q_heads: int, head_dim: int, *, backward: bool = True) -> float:
    """FLOPs for ``pairs`` visible pairs per head: 4*d per pair per query head forward, x3.5 with
    backward.

    Why: the forward does two matmuls (QK^T and PV) at 2 FLOPs per multiply-add; the
    backward does five (2.5x). This is the FlashAttention/Megatron convention, so the
    TFLOP/s numbers it gives are comparable with published ones.
    """
    _check_positive_int("num_q_heads", num_q_heads)
    _check_positive_int("head_dim", head_dim)
    fwd = 4.0 * head_dim * num_q_heads * np.asarray(pairs, dtype=np.float64)
    out = fwd * (1.0 + BWD_FWD_RATIO) if backward else fwd
    return float(out) if np.ndim(out) == 0 else out
