"""Checks for the inputs under which TransformerEngine silently returns wrong results.

Why: TE's THD context-parallel paths derive cuDNN's ragged metadata from segment ids and
positions with fast device-side tricks (bincount, run starts found from position jumps).
Those tricks assume a layout; outside it TE does not raise, it computes a *different*
attention. Every check here raises ``ValueError`` naming the parameter, the offending
value and the fix.

The checks are exact, not rules of thumb: for well-formed packed rows (segment ids 1..N in
order of appearance, each segment contiguous, positions counting from 0 inside it; padding
anywhere, with any positions) :func:`validate_packed_inputs` accepts a layout if and only if
TE 2.20.2's own code computes it correctly. ``tests/te_on_cpu/test_te_on_cpu.py`` checks both
directions against TE's code running on CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import rules
from .reorder import ReorderStrategy, striped_permutation
from .reorder import inverse_reorder_causal_load_balancing as undo

# re-exported under their old names; each rule's one home is tutorial_utils.rules
from .rules import check_divisible_seq, check_gqa_heads, check_ulysses_heads

__all__ = [
    "check_window",
    "check_gqa_heads",
    "check_divisible_seq",
    "check_qkv",
    "check_scaling_factor",
    "check_bias",
    "check_seqlens_offsets",
    "validate_packed_inputs",
    "first_violation",
    "allgather_mismatch",
    "reorder_mismatch",
]


def check_window(window, name: str = "window_size") -> tuple[int, int]:
    """Normalise a sliding window to ``(left, right)``; ``None`` means ``(-1, -1)``.

    Args:
        window: ``None`` or a ``(left, right)`` pair of ints, ``-1`` for an unbounded side.
        name: The parameter's name in error messages.

    Returns:
        ``(left, right)`` as Python ints.

    Raises:
        ValueError: If it is not a pair of ints, or a bound is below -1.
    """
    if window is None:
        return (-1, -1)
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(
            f"{name}={window!r} is not a (left, right) pair; pass e.g. (8192, 0) for a causal"
            " window of 8192 tokens, and -1 for an unbounded side."
        )
    left, right = window
    for side, value in (("left", left), ("right", right)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(
                f"{name}={window!r}: the {side} bound must be an int (-1 for unbounded), got"
                f" {value!r}."
            )
        if value < -1:
            raise ValueError(
                f"{name}={window!r}: the {side} bound {value} is negative; use -1 for unbounded"
                " (TE's kernel only recognises exactly -1) or a bound >= 0."
            )
    return (int(left), int(right))


def check_qkv(q, k, v, *, names=("q", "k", "v")) -> None:
    """Static checks of ``q [b, s_q, h_q, d]``, ``k [b, s_kv, h_kv, d]``, ``v [b, s_kv, h_kv, dv]``.

    Why: attention kernels broadcast and pad quietly. A ``v`` shorter than ``k`` gets
    zero-padded, a ``v`` with fewer heads gets broadcast, an int ``q`` gives an int output.
    Only shapes and dtypes are read (anything with ``.shape`` and ``.dtype``, including
    ``jax.ShapeDtypeStruct`` and tracers), so nothing is added to a traced computation.

    Args:
        q: The queries.
        k: The keys.
        v: The values.
        names: The three arrays' names in error messages.

    Raises:
        ValueError: If an input is not a 4-D floating array with no zero-sized axis, the
            dtypes or batch sizes differ, ``k`` and ``v`` differ in length or heads, ``q`` and
            ``k`` in head_dim, or the query heads are not a multiple of the kv heads.
    """
    arrays = dict(zip(names, (q, k, v)))
    for name, x in arrays.items():
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise ValueError(
                f"{name} is a {type(x).__name__}, not an array; pass a jax or NumPy array "
                "[batch, seq, heads, head_dim]."
            )
        if len(x.shape) != 4:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)}; attention inputs are 4-D [batch, seq, heads,"
                " head_dim]."
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):  # NumPy's own test misses bfloat16
            raise ValueError(
                f"{name}.dtype={np.dtype(x.dtype).name} is not a floating type; cast it, e.g. "
                f"{name}.astype(jnp.bfloat16)."
            )
        if 0 in tuple(x.shape):
            raise ValueError(
                f"{name} has shape {tuple(x.shape)} with a zero-sized axis; batch, seq, heads and "
                "head_dim must all be >= 1."
            )
    nq, nk, nv = names
    dtypes = {np.dtype(x.dtype).name for x in arrays.values()}
    if len(dtypes) > 1:
        raise ValueError(
            f"{nq}/{nk}/{nv} dtypes differ ({np.dtype(q.dtype).name}/{np.dtype(k.dtype).name}/"
            f"{np.dtype(v.dtype).name}); cast all three to one dtype (the fused kernel reads one)."
        )
    (b, _, hq, d), (bk, sk, hk, dk), (bv, sv, hv, _) = q.shape, k.shape, v.shape
    if not b == bk == bv:
        raise ValueError(
            f"batch sizes differ: {nq}.shape[0]={b}, {nk}.shape[0]={bk}, {nv}.shape[0]={bv}; "
            "pass the same batch for all three."
        )
    if sk != sv or hk != hv:
        raise ValueError(
            f"{nk} has shape {tuple(k.shape)} but {nv} has {tuple(v.shape)}: keys and values need"
            " the same sequence length (axis 1) and head count (axis 2); nothing is padded or"
            " broadcast."
        )
    if d != dk:
        raise ValueError(
            f"head_dim differs: {nq}.shape[3]={d} but {nk}.shape[3]={dk}; the logits q.k need one "
            "head_dim (only v's may differ)."
        )
    check_gqa_heads(hq, hk, name=f"kv heads ({nk}.shape[2])")


def check_scaling_factor(scaling_factor, name: str = "scaling_factor") -> float:
    """A finite real number; usually ``head_dim ** -0.5``. ``None`` or NaN would hide divergence.

    Args:
        scaling_factor: The softmax scale.
        name: The parameter's name in error messages.

    Returns:
        It, as a float.

    Raises:
        ValueError: If it is not a finite int or float (a bool is refused).
    """
    if (
        isinstance(scaling_factor, bool)
        or not isinstance(scaling_factor, (int, float, np.integer, np.floating))
        or not np.isfinite(scaling_factor)
    ):
        raise ValueError(
            f"{name}={scaling_factor!r} must be a finite real number; pass head_dim ** -0.5 "
            "(e.g. 128 ** -0.5 for head_dim 128)."
        )
    return float(scaling_factor)


def check_bias(bias, *, batch: int, num_q_heads: int, seq_q: int, seq_kv: int) -> None:
    """``bias`` must be ``[batch or 1, num_q_heads or 1, seq_q, seq_kv]``: TE's broadcasts only.

    Args:
        bias: The attention bias (anything with ``.shape``).
        batch: The batch size.
        num_q_heads: The query head count.
        seq_q: The query length.
        seq_kv: The key length.

    Raises:
        ValueError: If its shape is not one of those.
    """
    shape = tuple(getattr(bias, "shape", ()))
    ok = (
        len(shape) == 4
        and shape[0] in (1, batch)
        and shape[1] in (1, num_q_heads)
        and shape[2:] == (seq_q, seq_kv)
    )
    if not ok:
        raise ValueError(
            f"bias has shape {shape or type(bias).__name__}; it must be [batch or 1, heads or 1, "
            f"seq_q, seq_kv] = [{batch} or 1, {num_q_heads} or 1, {seq_q}, {seq_kv}]."
        )


def check_seqlens_offsets(seqlens, offsets, seq_len: int, name: str = "q") -> None:
    """Concrete THD ``(seqlens, offsets)``: each row's segments inside ``[0, seq_len)``, disjoint.

    Why: the kernel pairs the i-th positive length with the i-th non-negative offset, so an
    extra offset (a per-row end offset, say) or overlapping ranges create phantom segments
    instead of an error; and cuDNN's backward writes each segment's dK/dV, so key segments
    that overlap get wrong gradients silently (on an H200 with cuDNN 9.19, up to 216 times
    TE's bf16 tolerance; ``results/gpu-run/``). Lengths are padded with 0 or -1, offsets
    with -1.

    Args:
        seqlens: ``[batch, max_segments]`` segment lengths.
        offsets: ``[batch, max_segments]`` segment start offsets.
        seq_len: The row length.
        name: Which side (``"q"`` or ``"kv"``), for error messages.

    Raises:
        ValueError: If the shapes differ or are not 2-D, a row has more lengths than offsets
            (or fewer), or a segment overlaps the previous one or runs past ``seq_len``.
    """
    lens, offs = np.asarray(seqlens), np.asarray(offsets)
    if lens.ndim != 2 or lens.shape != offs.shape:
        raise ValueError(
            f"{name} seqlens/offsets have shapes {lens.shape}/{offs.shape}; both must be 2-D "
            "[batch, max_segments], padded with -1."
        )
    for row, (ln, of) in enumerate(zip(lens, offs)):
        used_l, used_o = ln[ln > 0], of[of >= 0]
        if len(used_l) != len(used_o):
            raise ValueError(
                f"{name} row {row}: {len(used_l)} positive seqlens but {len(used_o)} offsets >= 0"
                f" (seqlens {ln.tolist()}, offsets {of.tolist()}); pass one start offset per"
                " segment (no end offset) and pad both with -1."
            )
        end = 0
        for length, start in zip(used_l.tolist(), used_o.tolist()):
            if start < end or start + length > seq_len:
                raise ValueError(
                    f"{name} row {row}: segment [{start}, {start + length}) "
                    + (
                        "overlaps the previous one"
                        if start < end
                        else f"runs past seq_len={seq_len}"
                    )
                    + f" (seqlens {ln.tolist()}, offsets {of.tolist()}); segments must be"
                    " disjoint, "
                    "in order and inside the row."
                )
            end = start + length


def first_violation(
    segment_ids,
    segment_pos,
    *,
    max_segments_per_seq: int,
    cp_size: int = 1,
    stripe_size: int | None = None,
    strategy=None,
    window_size=None,
) -> str | None:
    """The first violated precondition as a message, or ``None`` when the inputs are safe.

    Args:
        segment_ids: As for :func:`validate_packed_inputs`.
        segment_pos: As for :func:`validate_packed_inputs`.
        max_segments_per_seq: As for :func:`validate_packed_inputs`.
        cp_size: As for :func:`validate_packed_inputs`.
        stripe_size: As for :func:`validate_packed_inputs`.
        strategy: As for :func:`validate_packed_inputs`.
        window_size: As for :func:`validate_packed_inputs`.

    Returns:
        :func:`validate_packed_inputs`' error message, or ``None``.
    """
    try:
        validate_packed_inputs(
            segment_ids,
            segment_pos,
            max_segments_per_seq=max_segments_per_seq,
            cp_size=cp_size,
            stripe_size=stripe_size,
            strategy=strategy,
            window_size=window_size,
        )
    except ValueError as err:
        return str(err)
    return None


def validate_packed_inputs(
    segment_ids,
    segment_pos,
    *,
    max_segments_per_seq: int,
    cp_size: int = 1,
    stripe_size: int | None = None,
    strategy=None,
    window_size=None,
    num_q_heads: int | None = None,
    num_kv_heads: int | None = None,
) -> None:
    """Raise ``ValueError`` if packed THD inputs violate a precondition of TE's THD (CP) paths.

    Pass the **global, un-reordered** ``[batch, seq]`` segment ids and positions (host arrays or
    concrete JAX arrays).

    Args:
        segment_ids: ``[batch, seq]`` ints: 0 for padding, segments 1..N in order of appearance.
        segment_pos: ``[batch, seq]`` positions, counting from 0 in each segment.
        max_segments_per_seq: The most segments a row may hold (TE's argument of that name).
        cp_size: The context-parallel size; 1 for none.
        stripe_size: The striped reorder's stripe; ``None`` for 1.
        strategy: ``'ring'``, ``'allgather'``, ``'ulysses'``, a ``CPStrategy`` or ``None``.
        window_size: A sliding window ``(left, right)``, or ``None``.
        num_q_heads: The query heads, for Ulysses' head split; ``None`` skips that check.
        num_kv_heads: The kv heads (default ``num_q_heads``).

    Raises:
        ValueError: Naming the parameter, the offending value and the fix, for the first
            precondition the inputs violate.
    """
    for name, value in (
        ("cp_size", cp_size),
        ("num_q_heads", num_q_heads),
        ("num_kv_heads", num_kv_heads),
    ):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1
        ):
            raise ValueError(
                f"{name}={value!r} must be a positive int"
                + (" (1 = no context parallelism)." if name == "cp_size" else ".")
            )
    for name, value in (("segment_ids", segment_ids), ("segment_pos", segment_pos)):
        if isinstance(value, jax.core.Tracer):
            raise ValueError(
                f"{name} is a traced array ({type(value).__name__}, shape {tuple(value.shape)}):"
                " validate_packed_inputs reads the values, so it needs concrete arrays. Call it"
                " outside jax.jit/grad/vmap, on the host batch (e.g. in the data pipeline), before"
                " the step."
            )
    ids = np.asarray(segment_ids)
    pos = np.asarray(segment_pos)
    if ids.ndim != 2:
        raise ValueError(
            f"segment_ids must be 2-D [batch, seq], got shape {ids.shape}; add a batch axis with"
            " ids[None]."
        )
    if pos.shape != ids.shape:
        raise ValueError(
            f"segment_pos has shape {pos.shape} but segment_ids has shape {ids.shape}; they must"
            " match token for token."
        )
    if not np.issubdtype(ids.dtype, np.integer) or not np.issubdtype(pos.dtype, np.integer):
        raise ValueError(
            f"segment_ids/segment_pos must be integer arrays, got {ids.dtype}/{pos.dtype}; cast"
            " with .astype(jnp.int32)."
        )
    rules.check_max_segments(max_segments_per_seq)
    if (ids < 0).any():
        b, t = np.argwhere(ids < 0)[0]
        raise ValueError(
            f"segment_ids[{b}, {t}]={ids[b, t]} is negative; use 0 for padding and 1..N for"
            " segments."
        )
    window = check_window(window_size)
    strat = rules.normalize_strategy(strategy, allow_none=True)
    st = rules.check_stripe_size(stripe_size)
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
        # AllGather raises the limit to seq/(cp*stripe) + max_segments_per_seq; its check is below
        if not (strat == "allgather" and cp_size > 1):
            rules.check_segment_ids_within(top, max_segments_per_seq, row=b)
        # order of first appearance must be 1, 2, 3, ... with no gaps
        _, first_idx = np.unique(present, return_index=True)
        order = present[np.sort(first_idx)]
        expected = np.arange(1, len(order) + 1)
        if not np.array_equal(order, expected):
            raise ValueError(
                f"segment_ids row {b} has ids in order of appearance {order[:8].tolist()}...,"
                f" expected {expected[:8].tolist()}...: ids must be 1..N, consecutive and in order"
                " of appearance. Renumber the segments of each row from 1."
            )
        for sid in order:
            idx = np.nonzero(row_ids == sid)[0]
            if idx[-1] - idx[0] + 1 != len(idx):
                gap = idx[np.nonzero(np.diff(idx) > 1)[0][0]] + 1
                raise ValueError(
                    f"segment_ids row {b}: segment {sid} is not contiguous (its tokens resume after"
                    f" position {gap}); each segment's valid tokens must be one contiguous run."
                    " Split it into two segments."
                )
            seg_pos = row_pos[idx]
            want = np.arange(len(idx))
            if not np.array_equal(seg_pos, want):
                bad = int(np.nonzero(seg_pos != want)[0][0])
                raise ValueError(
                    f"segment_pos row {b}, segment {sid}: token {bad} of the segment has pos"
                    f" {int(seg_pos[bad])}, expected {bad}; positions must count 0,1,2,... from"
                    " each segment's first token."
                )
    if strat == "allgather" and cp_size > 1:
        where = allgather_mismatch(
            ids,
            pos,
            cp_size=cp_size,
            stripe_size=st,
            max_segments_per_seq=max_segments_per_seq,
            window_size=window_size,
        )
        rules.check_allgather_layout(where, cp_size=cp_size, stripe_size=st)
    if strat == "ring" and cp_size > 1:
        rules.check_ring_stripe(st)
        rules.check_ring_window(window, cp_size)
    if strat == "ulysses" and cp_size > 1 and num_q_heads is not None:
        check_ulysses_heads(num_q_heads, num_kv_heads or num_q_heads, cp_size)


# ----------------------------------------------------------------------------- AllGather: TE's per-


def _first_true(mask, size):
    """``jnp.where(mask, size=size, fill_value=-1)[0]`` for a 1-D mask."""
    idx = np.nonzero(mask)[0][:size]
    return np.concatenate([idx, np.full(size - len(idx), -1, np.int64)])


def _compact(ids, pos):
    """Valid tokens moved to the front in order (padding zeros behind), as TE's helpers do."""
    keep = ids != 0
    vid, vpos = np.zeros_like(ids), np.zeros_like(pos)
    vid[: keep.sum()], vpos[: keep.sum()] = ids[keep], pos[keep]
    return vid, vpos, vid != 0


def _rank_metadata(ids, pos, ids_ag, pos_ag, max_segs):
    """One row of one rank: TE 2.20.2's ``*_for_striped_for_rank`` results.

    Returns ``(q lens, q offs, kv lens, kv offs)``.
    """
    n = len(ids)
    vid, vpos, valid = _compact(ids, pos)
    # q_seqlens_for_striped_for_rank: runs of valid tokens, split where the id changes or pos jumps
    change = np.concatenate([valid[:1], (vid[1:] != vid[:-1]) | (vpos[1:] != vpos[:-1] + 1)])
    run = np.where(valid, np.cumsum(change), 0)
    q_lens = np.bincount(run[run <= max_segs], minlength=max_segs + 1)[1 : max_segs + 1]
    q_lens = np.where(q_lens == 0, -1, q_lens)
    # q_seqoffsets_for_striped_for_rank: run starts seen from position jumps over all local tokens
    jump = np.concatenate([[True], pos[1:] != pos[:-1] + 1])
    q_offs = _first_true(jump & (ids != 0), max_segs)
    # kv_seqlens_for_striped_for_rank: last position of each run + 1
    end = np.concatenate(
        [((vid[1:] != vid[:-1]) & valid[1:]) | (vpos[1:] != vpos[:-1] + 1), valid[-1:]]
    )
    last = _first_true(end & valid, max_segs)
    kv_lens = np.where(last >= 0, vpos[np.maximum(last, 0)] + 1, -1)
    # kv_seqoffsets_for_striped_for_rank: the start of the run's segment in the gathered row
    seg_of_run = np.where(q_offs >= 0, ids[np.where(q_offs >= 0, q_offs, n - 1)], -1)
    jump_ag = np.concatenate([[True], pos_ag[1:] != pos_ag[:-1] + 1])
    starts_ag = _first_true(jump_ag & (ids_ag != 0), max_segs)
    kv_offs = np.where(seg_of_run > 0, starts_ag[np.clip(seg_of_run - 1, 0, max_segs - 1)], -1)
    return q_lens, q_offs, kv_lens, kv_offs


def _fix_len_take(x, keep, fill):
    flat, keep = x.reshape(-1), keep.reshape(-1)
    out = np.full(flat.shape, fill, flat.dtype)
    out[: keep.sum()] = flat[keep]
    return out


def _kernel_key_ranges(q_lens, q_offs, kv_lens, kv_offs, rows_q, rows_kv, left):
    """What cuDNN reads from the metadata (after ``FusedAttnFwdPrimitive.impl`` packs it).

    For each flattened query row, the inclusive range of gathered key rows it attends
    (PADDING_CAUSAL_BOTTOM_RIGHT).
    """
    batch = q_lens.shape[0]
    base = np.arange(batch)[:, None]
    ql = _fix_len_take(q_lens, q_lens > 0, 0)
    kl = _fix_len_take(kv_lens, kv_lens > 0, 0)
    qo = _fix_len_take(
        np.where(q_offs >= 0, q_offs + base * rows_q, q_offs), q_offs >= 0, batch * rows_q
    )
    ko = _fix_len_take(
        np.where(kv_offs >= 0, kv_offs + base * rows_kv, kv_offs), kv_offs >= 0, batch * rows_kv
    )
    lo = np.zeros(batch * rows_q, np.int64)
    hi = np.full(batch * rows_q, -1, np.int64)
    for s in range(
        len(ql)
    ):  # a later segment overwrites an earlier one's rows, as in the CPU kernel
        if ql[s] <= 0:
            continue
        rows = np.arange(qo[s], min(qo[s] + ql[s], batch * rows_q))
        diag = ko[s] + (rows - qo[s]) + (kl[s] - ql[s])
        hi[rows] = np.minimum(ko[s] + kl[s] - 1, diag)
        lo[rows] = np.maximum(ko[s], diag - left) if left >= 0 else ko[s]
    return lo, hi


def allgather_mismatch(
    segment_ids,
    segment_pos,
    *,
    cp_size: int,
    stripe_size: int,
    max_segments_per_seq: int,
    window_size=None,
) -> str | None:
    """Where TE's THD AllGather CP would pair a query with the wrong keys, or ``None``.

    Why: TE does not send segment ids to cuDNN. Each rank rebuilds run lengths and offsets
    from its *reordered local* ids and positions, and finds run starts in two different
    ways: from changes of id or position among the valid tokens (lengths), and from
    position jumps over all local tokens, padding included (offsets). When the two disagree,
    typically because the token before a run start (padding whose position keeps counting,
    or the end of another document) has position ``start - 1``, lengths and offsets fall
    out of step and whole runs attend the wrong keys, silently. This function replays that
    metadata (TE 2.20.2's ``*_for_striped_for_rank`` helpers) and the kernel's reading of
    it, and compares every query's key range with the true one.

    Args:
        segment_ids: Global, un-reordered ``[batch, seq]`` segment ids.
        segment_pos: Their positions.
        cp_size: The context-parallel size.
        stripe_size: The striped reorder's stripe.
        max_segments_per_seq: TE's argument of that name.
        window_size: A sliding window ``(left, right)``, or ``None``.

    Returns:
        The first wrong query (row, token, rank, the keys it would attend and the right ones),
        or ``None`` if every query attends its true keys.
    """
    ids = np.asarray(segment_ids)
    pos = np.asarray(segment_pos)
    batch, seq = ids.shape
    left = check_window(window_size)[0]
    local = seq // cp_size
    perm = striped_permutation(seq, cp_size, stripe_size)
    max_segs = seq // (stripe_size * cp_size) + max_segments_per_seq  # TE's adjusted count
    starts = np.zeros_like(ids)
    for b in range(batch):
        for sid in np.unique(ids[b][ids[b] > 0]):
            starts[b, ids[b] == sid] = np.nonzero(ids[b] == sid)[0][0]
    for r in range(cp_size):
        tokens = perm[r * local : (r + 1) * local]  # global index of each local row
        meta = [
            _rank_metadata(ids[b, tokens], pos[b, tokens], ids[b], pos[b], max_segs)
            for b in range(batch)
        ]
        q_lens, q_offs, kv_lens, kv_offs = (np.stack(m) for m in zip(*meta))
        lo, hi = _kernel_key_ranges(q_lens, q_offs, kv_lens, kv_offs, local, seq, left)
        for b in range(batch):
            for i, g in enumerate(tokens):
                row = b * local + i
                if ids[b, g] == 0:
                    want = None
                else:
                    first = starts[b, g] + (max(0, pos[b, g] - left) if left >= 0 else 0)
                    want = (b * seq + first, b * seq + starts[b, g] + pos[b, g])
                got = (
                    None if lo[row] > hi[row] else (int(lo[row]) - b * seq, int(hi[row]) - b * seq)
                )
                if want is not None:
                    want = (want[0] - b * seq, want[1] - b * seq)
                if got != want:
                    what = (
                        "padding (segment id 0)"
                        if want is None
                        else f"segment {ids[b, g]}, position {pos[b, g]}"
                    )
                    return (
                        f"row {b}, token {g} ({what}) lands on rank {r} and would attend keys "
                        f"{'none' if got is None else f'{got[0]}..{got[1]}'} instead of "
                        f"{'none' if want is None else f'{want[0]}..{want[1]}'}"
                    )
    return None


def reorder_mismatch(segment_ids, segment_pos, *, cp_size: int, stripe_size) -> str | None:
    """Why concrete ids/positions were not striped for ``(cp_size, stripe_size)``, or ``None``.

    Why: data striped for one CP size and sharded over a mesh of another is silently wrong in
    TE (a cp=4 reorder undone with cp=2, or no CP at all on one device). Undoing the reorder
    must give rows whose positions count 0, 1, 2, ... inside each segment; if another CP size
    (or no reorder) does that instead, the message names it.

    Args:
        segment_ids: Reordered ``[batch, seq]`` segment ids.
        segment_pos: Their positions.
        cp_size: The CP size the mesh has.
        stripe_size: The stripe; ``None`` for 1.

    Returns:
        A message naming the CP size the data was reordered for (or that it was not
        reordered) and the fix, or ``None`` if it fits ``cp_size`` or no other reading fits.
    """
    ids, pos = np.asarray(segment_ids), np.asarray(segment_pos)
    seq = ids.shape[-1]

    def fits(cp, st):
        if seq % (cp * st):
            return False
        args = [undo(x, ReorderStrategy.Striped, cp, 1, st) for x in (ids, pos)]
        return first_violation(*args, max_segments_per_seq=max(1, int(ids.max()))) is None

    stripe = stripe_size or 1
    if fits(cp_size, stripe):
        return None
    for cp in (1, 2, 4, 8, 16, 32, 64):
        if cp != cp_size and fits(cp, stripe):
            return (
                (
                    f"the segment ids/positions look reordered for cp_size={cp}"
                    if cp > 1
                    else "the segment ids/positions are not reordered"
                )
                + f", but the mesh's CP axis has {cp_size} devices; reorder every token-indexed"
                " input with reorder_causal_load_balancing(x, strategy=ReorderStrategy.Striped,"
                f" cp_size={cp_size}, seq_dim=1, stripe_size={stripe})."
            )
    return None  # no reading of the layout explains it better; the validator reports malformed rows
