"""The per-rank sub-problems of one CP attention step, their ragged THD form, and the N-device
step predicted from their times: what ``python -m tutorial_utils.cli.bench --emulate-ranks N``
times on one device.

Sub-problems (``q_index`` / ``kv_index`` are original token indices of one batch row layout):

* AllGather rank ``r``: its striped queries against the full (gathered) K/V.
* Ring rank ``r``, step ``t``: its queries against the K/V block of rank ``(r - t) mod N``.
* Ulysses rank ``r``: all tokens, query heads ``[r*Hq/N, (r+1)*Hq/N)`` and their KV heads.

TE's public call has no per-token mask for striped queries, so each sub-problem becomes ragged
THD runs (:class:`RaggedCall`, for ``SequenceDescriptor.from_seqlens_and_offsets``). AllGather
runs are bottom-right aligned against their segment's keys from position 0, the construction
TE's own AllGather uses (``_FusedAttnCPWithAllGatherHelper.get_adjusted_mask`` and the
``*_for_striped_for_rank`` helpers in ``transformer_engine/jax/cpp_extensions/attention.py``).
Ring steps are top-left runs whose window is converted to local indices.
:func:`ragged_visibility` turns such runs back into a mask, and the tests check it equals the
per-token mask (:func:`subproblem_visibility`), so the descriptors are verified on CPU even
though the TE kernel itself has not been run here.

Everything here is NumPy: no JAX, no TE.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from tutorial_utils import rules
from tutorial_utils.perfmodel.comm import comm_volume
from tutorial_utils.reorder import ReorderStrategy, rank_token_indices

__all__ = [
    "STRATEGY_CHOICES",
    "SubProblem",
    "RaggedCall",
    "rank_subproblems",
    "subproblem_visibility",
    "allgather_ragged_calls",
    "ring_ragged_calls",
    "ragged_visibility",
    "comm_bytes",
    "predict_step_ms",
]

STRATEGY_CHOICES = ("single", "ring", "allgather", "ulysses")


@dataclasses.dataclass(frozen=True)
class SubProblem:
    """One rank's (and, for Ring, one step's) share of a CP attention step."""

    strategy: str
    rank: int
    step: int
    q_index: np.ndarray  # original token indices of the queries, in local order
    kv_index: np.ndarray  # original token indices of the keys, in local order
    heads: tuple[int, int] | None = None  # query-head range (Ulysses); None = all heads
    kv_heads: tuple[int, int] | None = None


def rank_subproblems(
    strategy: str,
    seq_len: int,
    cp_size: int,
    stripe_size: int = 1,
    *,
    num_q_heads: int | None = None,
    num_kv_heads: int | None = None,
) -> list[SubProblem]:
    """Every sub-problem of ``strategy`` (``single``, ``allgather``, ``ring``, ``ulysses``) for
    ``cp_size`` ranks.

    The token layout is TE's striped load balancing with ``stripe_size``
    (:func:`tutorial_utils.reorder.rank_token_indices`).

    Args:
        strategy: One of :data:`STRATEGY_CHOICES`.
        seq_len: Tokens per batch row.
        cp_size: The number of ranks.
        stripe_size: TE's stripe for the striped layout (Ring needs 1).
        num_q_heads: Query heads (Ulysses only).
        num_kv_heads: Key/value heads (Ulysses only).

    Returns:
        The sub-problems, rank by rank (and, for Ring, step by step within a rank).

    Raises:
        ValueError: An unknown strategy, a bad ``cp_size``, or a layout TE's rules refuse.
    """
    if strategy not in STRATEGY_CHOICES:
        raise ValueError(f"strategy={strategy!r} is unknown; use one of {STRATEGY_CHOICES}.")
    if not isinstance(cp_size, int) or cp_size < 1:
        raise ValueError(f"cp_size={cp_size!r} must be a positive int.")
    everything = np.arange(seq_len)
    if strategy == "single":
        return [SubProblem("single", 0, 0, everything, everything)]
    if strategy == "ulysses":
        if num_q_heads is None or num_kv_heads is None:
            raise ValueError("Ulysses sub-problems need num_q_heads and num_kv_heads.")
        rules.check_ulysses_heads(num_q_heads, num_kv_heads, cp_size)
        hq, hk = num_q_heads // cp_size, num_kv_heads // cp_size
        return [
            SubProblem(
                "ulysses",
                r,
                0,
                everything,
                everything,
                (r * hq, (r + 1) * hq),
                (r * hk, (r + 1) * hk),
            )
            for r in range(cp_size)
        ]
    rules.check_divisible_seq(seq_len, cp_size, stripe_size, name="seq_len")
    owned = rank_token_indices(seq_len, ReorderStrategy.Striped, cp_size, stripe_size)
    if strategy == "allgather":
        return [SubProblem("allgather", r, 0, owned[r], everything) for r in range(cp_size)]
    if cp_size > 1:
        rules.check_ring_stripe(stripe_size)
    return [
        SubProblem("ring", r, t, owned[r], owned[(r - t) % cp_size])
        for r in range(cp_size)
        for t in range(cp_size)
    ]


def subproblem_visibility(segment_ids, segment_pos, sub: SubProblem, window=(-1, 0)) -> np.ndarray:
    """``[batch, len(q_index), len(kv_index)]`` per-token mask of ``sub`` (TE's THD PADDING_CAUSAL
    semantics).

    Args:
        segment_ids: ``[batch, seq]`` segment ids, 0 for padding.
        segment_pos: ``[batch, seq]`` positions within each segment.
        sub: The sub-problem.
        window: TE's ``(left, right)`` window; ``left = -1`` (or ``None``) for full causal.

    Returns:
        The boolean mask of which query sees which key.
    """
    ids, pos = np.asarray(segment_ids), np.asarray(segment_pos)
    left = -1 if window is None else int(window[0])
    iq, ik = ids[:, sub.q_index][:, :, None], ids[:, sub.kv_index][:, None, :]
    pq, pk = pos[:, sub.q_index][:, :, None], pos[:, sub.kv_index][:, None, :]
    vis = (iq == ik) & (iq > 0) & (pk <= pq)
    if left >= 0:
        vis &= pk >= pq - left
    return vis


@dataclasses.dataclass(frozen=True)
class RaggedCall:
    """One THD fused-attention call on a sub-problem's local tensors, in ragged form.

    Arrays are ``[batch, K]`` int32 padded with -1 (TE's convention): run ``n`` of row ``b``
    covers local query rows ``[q_offsets, q_offsets + q_seqlens)`` and local key rows
    ``[kv_offsets, kv_offsets + kv_seqlens)``. Inside a run, query ``a`` may see key ``m`` iff
    ``m <= a + d`` and (``left >= 0``) ``m >= a + d - left``, with ``d = kv_len - q_len`` when
    ``bottom_right`` and 0 otherwise. ``window`` is what the call passes as ``window_size``.
    """

    q_seqlens: np.ndarray
    q_offsets: np.ndarray
    kv_seqlens: np.ndarray
    kv_offsets: np.ndarray
    bottom_right: bool
    window: tuple[int, int] | None

    @property
    def max_segments(self) -> int:
        return int(self.q_seqlens.shape[1])

    def padded(self, k: int) -> RaggedCall:
        """The same call with ``K`` widened to ``k`` (so calls of several ranks share one compiled
        shape)."""
        extra = k - self.max_segments
        if extra < 0:
            raise ValueError(f"cannot pad {self.max_segments} runs down to {k}.")
        pad = functools.partial(np.pad, pad_width=((0, 0), (0, extra)), constant_values=-1)
        return dataclasses.replace(
            self,
            q_seqlens=pad(self.q_seqlens),
            q_offsets=pad(self.q_offsets),
            kv_seqlens=pad(self.kv_seqlens),
            kv_offsets=pad(self.kv_offsets),
        )


def _stack_runs(
    rows: list[list[tuple[int, int, int, int]]], bottom_right: bool, window
) -> RaggedCall:
    k = max(1, max(len(r) for r in rows))
    arr = np.full((4, len(rows), k), -1, np.int32)
    for b, runs in enumerate(rows):
        for n, run in enumerate(runs):
            arr[:, b, n] = run
    return RaggedCall(
        q_seqlens=arr[0],
        q_offsets=arr[1],
        kv_seqlens=arr[2],
        kv_offsets=arr[3],
        bottom_right=bottom_right,
        window=window,
    )


def allgather_ragged_calls(segment_ids, segment_pos, q_index, window=(-1, 0)) -> list[RaggedCall]:
    """AllGather rank sub-problem (local queries vs the full row of keys) as bottom-right ragged
    calls whose runs never share a key.

    A run is a maximal stretch of local queries with one segment id, consecutive original
    indices and consecutive positions ``p0 .. P``. Its keys are its segment's tokens from
    position ``max(0, p0 - left)`` (0 without a window) to ``P``; bottom-right alignment then
    lets query position ``p`` see key positions ``[p - left, p]``, the per-token rule.

    The runs of one segment overlap in their keys, and cuDNN's THD backward writes each run's
    ``dK``/``dV`` rather than adding them: on an H200 (cuDNN 9.19) one call with overlapping runs
    gave ``dK``/``dV`` up to 216 times the bf16 tolerance on the shared keys, with the output
    and ``dQ`` right. The runs are therefore dealt into calls, first fit, so that within a call
    no two runs of a row share a key; the calls' gradients add up in JAX.

    Args:
        segment_ids: ``[batch, seq]`` segment ids, 0 for padding.
        segment_pos: ``[batch, seq]`` positions, counting 0, 1, 2, ... in each segment.
        q_index: The rank's query tokens (original indices, in local order).
        window: TE's ``(left, right)`` window; ``left = -1`` (or ``None``) for full causal.

    Returns:
        The :class:`RaggedCall` list (one call when no two runs share a key).

    Raises:
        ValueError: A segment's positions do not start at 0 where its first token is.
    """
    ids, pos = np.asarray(segment_ids), np.asarray(segment_pos)
    q_index = np.asarray(q_index)
    left = -1 if window is None else int(window[0])
    rows = []
    for b in range(ids.shape[0]):
        idq, pq = ids[b, q_index], pos[b, q_index]
        runs, a = [], 0
        n = len(q_index)
        while a < n:
            if idq[a] <= 0:
                a += 1
                continue
            e = a + 1
            while (
                e < n
                and idq[e] == idq[a]
                and pq[e] == pq[e - 1] + 1
                and q_index[e] == q_index[e - 1] + 1
            ):
                e += 1
            last_pos = int(pq[e - 1])
            seg_start = int(q_index[a]) - int(
                pq[a]
            )  # original index of the segment's position-0 token
            if seg_start < 0 or ids[b, seg_start] != idq[a] or pos[b, seg_start] != 0:
                raise ValueError(
                    f"row {b}: segment {int(idq[a])} does not start at position 0 where its"
                    " positions say; THD inputs need positions counting 0,1,2,... from each"
                    " segment's first token."
                )
            first_key = 0 if left < 0 else max(0, int(pq[a]) - left)
            runs.append((e - a, a, last_pos + 1 - first_key, seg_start + first_key))
            a = e
        rows.append(runs)
    return [_stack_runs(g, True, None if left < 0 else (left, 0)) for g in _disjoint_keys(rows)]


def _disjoint_keys(rows: list[list[tuple[int, int, int, int]]]) -> list[list[list[tuple]]]:
    """``rows``' runs ``(q_len, q_off, kv_len, kv_off)`` dealt first fit into groups in which no
    two runs of a row share a key (at least one group)."""
    groups: list[list[list[tuple]]] = []
    for b, runs in enumerate(rows):
        for run in runs:
            lo, hi = run[3], run[3] + run[2]
            for g in groups:
                if all(hi <= r[3] or lo >= r[3] + r[2] for r in g[b]):
                    g[b].append(run)
                    break
            else:
                groups.append([[] for _ in rows])
                groups[-1][b].append(run)
    return groups or [[[] for _ in rows]]


def ring_ragged_calls(
    segment_ids, segment_pos, q_index, kv_index, cp_size: int, window=(-1, 0)
) -> list[RaggedCall]:
    """Ring step sub-problem (local queries vs one rank's key block, stripe 1) as top-left ragged
    calls.

    Within one segment a rank's queries have positions ``p0q, p0q + N, ...`` and the block's keys
    ``p0k, p0k + N, ...`` (``N = cp_size``). With ``delta = p0q - p0k`` (``|delta| < N``), query
    ``a`` sees key ``m`` iff ``m <= a + floor(delta/N)`` and ``m >= a - floor((left - delta)/N)``.
    ``floor(delta/N) = -1`` is made top-left by dropping the run's first query (it sees nothing).
    Runs are grouped by their local window (one call per distinct window); runs with no
    visible pair are dropped.

    Args:
        segment_ids: ``[batch, seq]`` segment ids, 0 for padding.
        segment_pos: ``[batch, seq]`` positions, counting 0, 1, 2, ... in each segment.
        q_index: The rank's query tokens (original indices, in local order).
        kv_index: The key block's tokens (original indices, in local order).
        cp_size: The number of ranks.
        window: TE's ``(left, right)`` window; ``left = -1`` (or ``None``) for full causal.

    Returns:
        The :class:`RaggedCall` list, one per local window (empty when nothing is visible).

    Raises:
        ValueError: The tokens are not TE's striped layout with stripe 1.
    """
    ids, pos = np.asarray(segment_ids), np.asarray(segment_pos)
    q_index, kv_index = np.asarray(q_index), np.asarray(kv_index)
    left = -1 if window is None else int(window[0])
    n_cp = int(cp_size)
    groups: dict[int | None, list[list[tuple[int, int, int, int]]]] = {}
    batch = ids.shape[0]
    for b in range(batch):
        idq, pq = ids[b, q_index], pos[b, q_index]
        idk, pk = ids[b, kv_index], pos[b, kv_index]
        for seg in np.unique(idq[idq > 0]):
            qa = np.flatnonzero(idq == seg)
            ka = np.flatnonzero(idk == seg)
            if ka.size == 0:
                continue
            for name, loc, p in (("query", qa, pq), ("key", ka, pk)):
                if np.any(np.diff(loc) != 1) or np.any(np.diff(p[loc]) != n_cp):
                    raise ValueError(
                        f"row {b}, segment {int(seg)}: the rank's {name} tokens are not one run"
                        f" with positions stepping by cp_size={n_cp}; ring emulation needs"
                        " stripe_size=1 and positions 0,1,2,..."
                    )
            delta = int(pq[qa[0]]) - int(pk[ka[0]])
            if not -n_cp < delta < n_cp:
                raise ValueError(
                    f"row {b}, segment {int(seg)}: first positions {int(pq[qa[0]])} and"
                    f" {int(pk[ka[0]])} are {abs(delta)} >= cp_size apart; the layout is not TE's"
                    " striped layout."
                )
            trim = 1 if delta < 0 else 0
            local_left = None if left < 0 else (left - delta) // n_cp - trim
            q_len = qa.size - trim
            if q_len <= 0 or (local_left is not None and local_left < 0):
                continue  # no visible pair in this run
            groups.setdefault(local_left, [[] for _ in range(batch)])[b].append(
                (q_len, int(qa[0]) + trim, ka.size, int(ka[0]))
            )
    return [
        _stack_runs(rows, False, None if key is None else (key, 0))
        for key, rows in sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
    ]


def ragged_visibility(call: RaggedCall, seq_q: int, seq_kv: int) -> np.ndarray:
    """``[batch, seq_q, seq_kv]`` mask a ragged call asks the kernel for (runs may overlap in
    keys).

    Args:
        call: The ragged call.
        seq_q: Local query rows.
        seq_kv: Local key rows.

    Returns:
        The boolean mask, to compare with :func:`subproblem_visibility`.
    """
    batch, k = call.q_seqlens.shape
    vis = np.zeros((batch, seq_q, seq_kv), bool)
    left = -1 if call.window is None else int(call.window[0])
    for b in range(batch):
        for n in range(k):
            ql, qo, kl, ko = (
                int(call.q_seqlens[b, n]),
                int(call.q_offsets[b, n]),
                int(call.kv_seqlens[b, n]),
                int(call.kv_offsets[b, n]),
            )
            if ql <= 0 or kl <= 0 or qo < 0 or ko < 0:
                continue
            d = kl - ql if call.bottom_right else 0
            a = np.arange(ql)[:, None]
            m = np.arange(kl)[None, :]
            ok = m <= a + d
            if left >= 0:
                ok &= m >= a + d - left
            vis[b, qo : qo + ql, ko : ko + kl] |= ok
    return vis


def comm_bytes(strategy: str, workload, cp_size: int) -> dict[str, int]:
    """Bytes one rank sends per step (``fwd``, ``bwd``) under TE's schedule, from
    :mod:`tutorial_utils.perfmodel.comm`.

    Args:
        strategy: ``single``, ``ring``, ``allgather`` or ``ulysses``.
        workload: The :class:`~tutorial_utils.perfmodel.workload.Workload`.
        cp_size: The number of ranks.

    Returns:
        ``{"fwd": bytes, "bwd": bytes}``.
    """
    if strategy == "single" or cp_size == 1:
        return {"fwd": 0, "bwd": 0}
    vol = comm_volume(
        strategy,
        batch=workload.batch,
        seq_len=workload.seq_len,
        num_q_heads=workload.num_q_heads,
        num_kv_heads=workload.num_kv_heads,
        head_dim=workload.head_dim,
        cp_size=cp_size,
        dtype=workload.dtype,
        schedule="te",
    )
    return {"fwd": int(vol.fwd_sent), "bwd": int(vol.bwd_sent)}


def predict_step_ms(
    strategy: str, compute_ms, comm: dict[str, int], link_gbps: float
) -> dict[str, float]:
    """Predicted N-device step from per-rank compute times (ms) and bytes per rank.

    ``compute_ms``: ``[rank]`` for AllGather/Ulysses/single, ``[rank, step]`` for Ring.
    AllGather and Ulysses: slowest rank + all bytes / link (collectives not overlapped).
    Ring: per step, the slower of the slowest rank's compute and that step's hop
    (bytes spread evenly over the ``N`` steps, overlapped with compute), summed over steps.

    Args:
        strategy: ``single``, ``ring``, ``allgather`` or ``ulysses``.
        compute_ms: The timed sub-problems, shaped as above.
        comm: Bytes per rank, as :func:`comm_bytes` gives them.
        link_gbps: Link bandwidth per direction, GB/s.

    Returns:
        ``predicted_ms``, its ``compute_ms`` and ``comm_ms`` parts, ``exposed_comm_ms``, and
        for Ring each step's ``step_ms``.
    """
    comm_ms = (comm["fwd"] + comm["bwd"]) / (link_gbps * 1e9) * 1e3
    t = np.asarray(compute_ms, np.float64)
    if strategy == "ring":
        step_compute = t.max(axis=0)
        hop = comm_ms / t.shape[1]
        steps = np.maximum(step_compute, hop)
        return {
            "predicted_ms": float(steps.sum()),
            "compute_ms": float(step_compute.sum()),
            "comm_ms": comm_ms,
            "exposed_comm_ms": float(steps.sum() - step_compute.sum()),
            "step_ms": steps.tolist(),
        }
    slowest = float(t.max())
    return {
        "predicted_ms": slowest + comm_ms,
        "compute_ms": slowest,
        "comm_ms": comm_ms,
        "exposed_comm_ms": comm_ms,
    }
