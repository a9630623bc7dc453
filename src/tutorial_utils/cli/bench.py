"""``python -m tutorial_utils.cli.bench``: time forward+backward attention per CP strategy, store
one record.

Why: the tutorial's claims about Ring, AllGather and Ulysses must be checked where users run
them: on GPU nodes with real TransformerEngine. This command times each strategy the way TE's
CP tutorial does (``jax.jit(jax.value_and_grad(loss))`` with explicit shardings, warm-up,
compile excluded, ``block_until_ready``; see :func:`tutorial_utils.cli.bench.time_fn`), sweeps
the AllGather stripe size and the sliding window, and writes ONE ``cp-bench/1`` record with
the GPU model, driver, CUDA/cuDNN/JAX/TE versions and achieved TFLOP/s.

``--emulate-ranks N`` answers "what would N GPUs do?" on one device. Each rank's own
sub-problem (its queries in the striped layout against the keys it really sees, with its
real mask) is timed on the single device, and the N-device step is *predicted* as the slowest
rank plus communication at ``--link-gbps``. Such rows are labelled ``emulated``; they are a
model, not a measurement of N devices.

Sub-problems (``q_index`` / ``kv_index`` are original token indices of one batch row layout):

* AllGather rank ``r``: its striped queries against the full (gathered) K/V.
* Ring rank ``r``, step ``t``: its queries against the K/V block of rank ``(r - t) mod N``.
* Ulysses rank ``r``: all tokens, query heads ``[r*Hq/N, (r+1)*Hq/N)`` and their KV heads.

Two kernels time them: ``reference`` (the pure-JAX blockwise kernel with the per-token mask,
any platform) and ``te`` (real TE ``fused_attn`` on a GPU). TE's public call has no per-token
mask for striped queries, so each sub-problem becomes ragged THD runs
(``SequenceDescriptor.from_seqlens_and_offsets``): AllGather runs are bottom-right aligned
against their segment's keys from position 0 (the construction TE's own AllGather uses:
``_FusedAttnCPWithAllGatherHelper.get_adjusted_mask`` and the ``*_for_striped_for_rank``
helpers in ``transformer_engine/jax/cpp_extensions/attention.py``), and Ring steps are top-left
runs whose window is converted to local indices. :func:`ragged_visibility` turns such runs back
into a mask, and the tests check it equals the per-token mask, so the descriptors are verified
on CPU even though the TE kernel itself has not been run here.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import functools
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

from tutorial_utils import rules
from tutorial_utils.cli.argtypes import nonneg_int, positive_float, positive_int

__all__ = [
    "SubProblem",
    "RaggedCall",
    "te_descriptor",
    "rank_subproblems",
    "allgather_ragged_calls",
    "ring_ragged_calls",
    "ragged_visibility",
    "subproblem_visibility",
    "visible_pairs",
    "emulate_strategy_reference",
    "comm_bytes",
    "predict_step_ms",
    "build_parser",
    "main",
]

STRATEGY_CHOICES = ("single", "ring", "allgather", "ulysses")
DEFAULT_STRIPES = (1, 128, 512)
#: NVLink4 per direction (H100/H200), used when perfmodel.hardware does not know the GPU
DEFAULT_LINK_GBPS = 450.0


# ============================================================================ work counting


def visible_pairs(segment_ids, segment_pos, window=(-1, 0)) -> int:
    """Visible pairs per head summed over the batch (exact count from
    :mod:`tutorial_utils.perfmodel.workcount`)."""
    from tutorial_utils.perfmodel.workcount import total_visible_pairs

    left = -1 if window is None else int(window[0])
    return int(total_visible_pairs(np.asarray(segment_ids), np.asarray(segment_pos), (left, 0)))


# ============================================================================ per-rank sub-problems


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
    """
    from tutorial_utils.reorder import ReorderStrategy, rank_token_indices

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
    semantics)."""
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


def te_descriptor(ta, call: RaggedCall):
    """``ta.SequenceDescriptor.from_seqlens_and_offsets`` for ``call``.

    Shapes follow TE's own tests: seqlens ``[batch, K]`` and offsets ``[batch, K + 1]`` (start
    offsets with one trailing -1), both padded with -1.
    """
    import jax.numpy as jnp

    offsets_q = np.pad(call.q_offsets, ((0, 0), (0, 1)), constant_values=-1)
    offsets_kv = np.pad(call.kv_offsets, ((0, 0), (0, 1)), constant_values=-1)
    return ta.SequenceDescriptor.from_seqlens_and_offsets(
        (jnp.asarray(call.q_seqlens, jnp.int32), jnp.asarray(call.kv_seqlens, jnp.int32)),
        (jnp.asarray(offsets_q, jnp.int32), jnp.asarray(offsets_kv, jnp.int32)),
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
    """AllGather rank sub-problem (local queries vs the full row of keys) as one bottom-right ragged
    call.

    A run is a maximal stretch of local queries with one segment id, consecutive original
    indices and consecutive positions. Its keys are its segment's tokens from position 0 to
    the run's last position ``P`` (``kv_len = P + 1``); bottom-right alignment then lets query
    position ``p`` see key positions ``[p - left, p]``, the per-token rule.
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
            runs.append((e - a, a, last_pos + 1, seg_start))
            a = e
        rows.append(runs)
    return [_stack_runs(rows, True, None if left < 0 else (left, 0))]


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
    keys)."""
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


# ============================================================================ emulation with the re


def _take(x, index, axis):
    import jax.numpy as jnp

    return jnp.take(x, jnp.asarray(index), axis=axis)


def _block(n: int, block: int) -> int:
    return max(1, min(block, n))


def emulate_strategy_reference(
    strategy: str,
    q,
    k,
    v,
    dout,
    segment_ids,
    segment_pos,
    *,
    cp_size: int,
    stripe_size: int = 1,
    window=(-1, 0),
    scale: float | None = None,
    block: int = 128,
):
    """Run ``strategy`` as ``cp_size`` ranks one after another on one device, and merge.

    Returns ``(out, (dq, dk, dv))`` in the original token order for the loss
    ``vdot(out, dout)``, computed rank by rank with the reference kernel: AllGather ranks see
    the full K/V (dK/dV summed as the reduce-scatter would), Ring ranks merge their ``cp_size``
    steps with the fp32 log-sum-exp merge, Ulysses ranks own whole heads. Comparing this with
    the single-device result checks the decomposition that ``--emulate-ranks`` times.
    """
    import jax
    import jax.numpy as jnp

    from tutorial_utils.context_parallel import merge_partial
    from tutorial_utils.reference import MaskSpec, blockwise_attention

    b, s, hq, d = q.shape
    hkv = k.shape[2]
    scale = d**-0.5 if scale is None else float(scale)
    spec = MaskSpec(padding=True, causal=True, window=(-1, 0) if window is None else tuple(window))
    ids = jnp.asarray(segment_ids, jnp.int32)
    pos = jnp.asarray(segment_pos, jnp.int32)
    subs = rank_subproblems(strategy, s, cp_size, stripe_size, num_q_heads=hq, num_kv_heads=hkv)

    def attn(qq, kk, vv, iq, ik, pq, pk):
        return blockwise_attention(
            qq,
            kk,
            vv,
            iq,
            ik,
            pq,
            pk,
            scale=scale,
            spec=spec,
            block_q=_block(qq.shape[1], block),
            block_kv=_block(kk.shape[1], block),
        )

    out = np.zeros(q.shape, np.float32)
    dq = np.zeros(q.shape, np.float32)
    dk = np.zeros(k.shape, np.float32)
    dv = np.zeros(v.shape, np.float32)

    if strategy in ("single", "allgather", "ulysses"):

        @jax.jit
        def rank_step(qq, kk, vv, iq, ik, pq, pk, do):
            o, vjp = jax.vjp(lambda a, bb, c: attn(a, bb, c, iq, ik, pq, pk)[0], qq, kk, vv)
            return (o,) + vjp(do.astype(o.dtype))

        for sub in subs:
            if strategy == "ulysses":
                hs, ks = slice(*sub.heads), slice(*sub.kv_heads)
                o, gq, gk, gv = rank_step(
                    q[:, :, hs], k[:, :, ks], v[:, :, ks], ids, ids, pos, pos, dout[:, :, hs]
                )
                out[:, :, hs], dq[:, :, hs] = o, gq
                dk[:, :, ks] += np.asarray(gk, np.float32)
                dv[:, :, ks] += np.asarray(gv, np.float32)
            else:
                qi, ki = sub.q_index, sub.kv_index
                o, gq, gk, gv = rank_step(
                    _take(q, qi, 1),
                    _take(k, ki, 1),
                    _take(v, ki, 1),
                    ids[:, qi],
                    ids[:, ki],
                    pos[:, qi],
                    pos[:, ki],
                    _take(dout, qi, 1),
                )
                out[:, qi], dq[:, qi] = o, gq
                dk[:, ki] += np.asarray(gk, np.float32)
                dv[:, ki] += np.asarray(gv, np.float32)
    else:  # ring: one jitted function per rank (all ranks share its shapes): cp steps + merge
        cp = cp_size

        @jax.jit
        def rank_ring(qq, kb, vb, iq, ikb, pq, pkb, do):
            def f(qq, kb, vb):
                acc = lse = None
                for t in range(cp):
                    o_s, l_s = attn(qq, kb[t], vb[t], iq, ikb[t], pq, pkb[t])
                    if acc is None:
                        acc, lse = o_s.astype(jnp.float32), l_s
                    else:
                        acc, lse = merge_partial(acc, lse, o_s, l_s)
                return acc.astype(qq.dtype)

            o, vjp = jax.vjp(f, qq, kb, vb)
            return (o,) + vjp(do.astype(o.dtype))

        for r in range(cp):
            steps = [sub for sub in subs if sub.rank == r]
            qi = steps[0].q_index
            kis = np.stack([sub.kv_index for sub in steps])  # [cp, n_loc], step order
            kb = jnp.stack([_take(k, ki, 1) for ki in kis])
            vb = jnp.stack([_take(v, ki, 1) for ki in kis])
            o, gq, gkb, gvb = rank_ring(
                _take(q, qi, 1),
                kb,
                vb,
                ids[:, qi],
                jnp.stack([ids[:, ki] for ki in kis]),
                pos[:, qi],
                jnp.stack([pos[:, ki] for ki in kis]),
                _take(dout, qi, 1),
            )
            out[:, qi], dq[:, qi] = o, gq
            for t, ki in enumerate(kis):
                dk[:, ki] += np.asarray(gkb[t], np.float32)
                dv[:, ki] += np.asarray(gvb[t], np.float32)
    return out, (dq, dk, dv)


# ============================================================================ communication model


def comm_bytes(strategy: str, workload, cp_size: int) -> dict[str, int]:
    """Bytes one rank sends per step (``fwd``, ``bwd``) under TE's schedule, from
    :mod:`tutorial_utils.perfmodel.comm`."""
    if strategy == "single" or cp_size == 1:
        return {"fwd": 0, "bwd": 0}
    from tutorial_utils.perfmodel.comm import comm_volume

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


# ============================================================================ the CLI


def _int_list(minimum: int):
    def parse(text: str) -> list[int]:
        out = []
        for part in text.split(","):
            part = part.strip()
            try:
                value = int(part)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"must be a comma-separated list of integers, got {text!r}"
                ) from None
            if value < minimum:
                raise argparse.ArgumentTypeError(
                    f"every value must be >= {minimum}, got {value} in {text!r}"
                )
            if value not in out:
                out.append(value)
        if not out:
            raise argparse.ArgumentTypeError("must list at least one value")
        return out

    return parse


def _strategy_list(text: str) -> list[str]:
    out = []
    for part in text.split(","):
        name = {"single": "single", "ag": "allgather"}.get(part.strip().lower())
        if name is None:  # TE's names and their spellings: the one normaliser
            try:
                name = rules.normalize_strategy(part.strip())
            except ValueError:
                pass
        if name not in STRATEGY_CHOICES:
            raise argparse.ArgumentTypeError(
                f"unknown strategy {part.strip()!r}; choose from {','.join(STRATEGY_CHOICES)}"
            )
        if name not in out:
            out.append(name)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tutorial_utils.cli.bench",
        description=(
            "Time forward+backward attention (single device, Ring, AllGather, Ulysses) and write"
            " one cp-bench/1 record. With --emulate-ranks N, time each rank's sub-problem on one"
            " device and predict N devices."
        ),
    )
    p.add_argument(
        "--preset",
        choices=("seed", "cpu", "tiny"),
        default=None,
        help=(
            "workload preset (default: $CP_TUTORIAL_PRESET, else 'seed' on a GPU node and 'cpu'"
            " elsewhere)"
        ),
    )
    p.add_argument(
        "--strategies",
        type=_strategy_list,
        default=list(STRATEGY_CHOICES),
        help="comma-separated subset of single,ring,allgather,ulysses (default: all)",
    )
    p.add_argument(
        "--stripes",
        type=_int_list(1),
        default=None,
        help=(
            "AllGather stripe sizes, e.g. 1,128,512 (default: those of 1,128,512 that fit the"
            " preset, plus the preset's own). Ring always uses stripe 1."
        ),
    )
    p.add_argument(
        "--windows",
        type=_int_list(-1),
        default=None,
        help=(
            "left sliding-window sizes, -1 = full causal, e.g. 8192,-1 (default: the preset's"
            " window and -1)"
        ),
    )
    p.add_argument(
        "--iters",
        type=positive_int,
        default=5,
        help="timed iterations (default 5, as TE's tutorial)",
    )
    p.add_argument(
        "--warmup",
        type=nonneg_int,
        default=2,
        help="untimed warm-up iterations after compilation (default 2)",
    )
    p.add_argument("--out", default="results", help="folder for the record (default results/)")
    p.add_argument(
        "--name", default=None, help="record file name (default <source>-<label>-<UTC time>.json)"
    )
    p.add_argument(
        "--force", action="store_true", help="replace an existing record of the same --name"
    )
    p.add_argument(
        "--label", default=None, help="record label (default derived from preset and devices)"
    )
    p.add_argument(
        "--cp",
        type=positive_int,
        default=None,
        help="CP size for real multi-device runs (default: the preset's cp_size)",
    )
    p.add_argument(
        "--emulate-ranks",
        type=positive_int,
        default=None,
        metavar="N",
        help=(
            "time each of N ranks' sub-problems on one device and predict the N-device step"
            " (emulated)"
        ),
    )
    p.add_argument(
        "--link-gbps",
        type=positive_float,
        default=None,
        help=(
            "per-direction link bandwidth in GB/s for --emulate-ranks (default: the GPU's NVLink"
            " from tutorial_utils.perfmodel.hardware, else 450)"
        ),
    )
    p.add_argument(
        "--kernel",
        choices=("auto", "reference", "te"),
        default="auto",
        help=(
            "kernel timing the emulated sub-problems: te (real TE, GPU), reference (pure JAX); auto"
            " = te when real TE is active"
        ),
    )
    p.add_argument("--seed", type=int, default=2026, help="random seed of the inputs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


@dataclasses.dataclass
class _Case:
    strategy: str
    stripe: int | None
    window: tuple[int, int]

    @property
    def desc(self) -> str:
        st = "" if self.stripe is None else f" stripe={self.stripe}"
        return f"{self.strategy}{st} window={self.window[0]}"


class _Progress:
    """tqdm when installed, else one plain line per step on stderr."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.done, self.bar = total, enabled, 0, None
        if enabled:
            try:
                import tqdm  # type: ignore

                self.bar = tqdm.tqdm(total=total, file=sys.stderr, unit="case", dynamic_ncols=True)
            except ImportError:
                self.bar = None

    def start(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_description(text)
        else:
            print(f"[{self.done + 1}/{self.total}] {text} ...", file=sys.stderr, flush=True)

    def finish(self, text: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(text)
            self.bar.update(1)
        else:
            print(f"[{self.done}/{self.total}] {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _window_tuple(left: int) -> tuple[int, int]:
    return (-1, -1) if left < 0 else (int(left), 0)


def _default_link_gbps(device_kind: str) -> tuple[float, str]:
    try:
        from tutorial_utils.perfmodel.hardware import PROFILES
    except ImportError:
        PROFILES = None
    if PROFILES:
        kind = device_kind.upper().replace(" ", "")
        for key in sorted(PROFILES, key=len, reverse=True):
            if key in kind:
                prof = PROFILES[key]
                return (
                    float(prof.nvlink_gbps_per_direction),
                    f"tutorial_utils.perfmodel.hardware {key} NVLink per direction",
                )
    return DEFAULT_LINK_GBPS, "default 450 GB/s (NVLink4 per direction)"


def _gpu_versions() -> dict:
    """cuDNN / CUDA versions as JAX's CUDA plugin reports them, plus compute capability (empty off
    GPU)."""
    out = {}
    try:
        import jax

        devs = jax.devices()
        if devs and devs[0].platform == "gpu":
            cc = getattr(devs[0], "compute_capability", None)
            if cc is not None:
                out["compute_capability"] = str(cc)
            try:
                from jax._src.lib import cuda_versions  # private; moved between JAX versions

                if cuda_versions is not None:
                    for key, fn in (
                        ("cudnn_version", "cudnn_get_version"),
                        ("cuda_runtime_version", "cuda_runtime_get_version"),
                        ("cuda_driver_version", "cuda_driver_get_version"),
                    ):
                        if hasattr(cuda_versions, fn):
                            out[key] = getattr(cuda_versions, fn)()
            except Exception:  # noqa: BLE001 - best effort
                pass
    except Exception:  # noqa: BLE001
        pass
    return out


def _fail(parser: argparse.ArgumentParser, option: str, message: str):
    parser.error(f"argument {option}: {message}")


def _resolve(args, parser):
    """Workload, strategies, stripes, windows after checking them against the preset; errors name
    the option."""
    from tutorial_utils.pages.runtime import gpu_present
    from tutorial_utils.perfmodel.workload import fit_cp_to_devices, get_workload

    preset = (
        args.preset or os.environ.get("CP_TUTORIAL_PRESET") or ("seed" if gpu_present() else "cpu")
    )
    if preset not in ("seed", "cpu", "tiny"):
        _fail(
            parser,
            "--preset",
            f"unknown preset {preset!r} (from $CP_TUTORIAL_PRESET); choose seed, cpu or tiny",
        )
    wl = get_workload(preset)
    if not (args.emulate_ranks or args.cp):  # the CP size a mesh over the visible devices can have
        import jax

        try:
            wl = fit_cp_to_devices(wl, len(jax.devices()))
        except ValueError as err:
            _fail(parser, "--cp", str(err))
    cp = args.emulate_ranks or args.cp or wl.cp_size
    if args.emulate_ranks and args.cp and args.cp != args.emulate_ranks:
        _fail(
            parser,
            "--cp",
            f"--cp {args.cp} contradicts --emulate-ranks {args.emulate_ranks}; give one of them",
        )
    cp_option = "--emulate-ranks" if args.emulate_ranks else "--cp"
    why = rules.reason(rules.check_divisible_seq, wl.seq_len, cp, None, cp_name=cp_option)
    if why:
        _fail(parser, cp_option, f"preset {preset!r}: {why}")

    def stripe_fits(s):
        return not rules.reason(rules.check_divisible_seq, wl.seq_len, cp, s)

    try:
        wl = wl.replace(
            cp_size=cp, stripe_size=wl.stripe_size if stripe_fits(wl.stripe_size) else 1
        )
    except ValueError as err:
        _fail(parser, cp_option, str(err))
    explicit_stripes = args.stripes is not None
    stripes = (
        list(args.stripes)
        if explicit_stripes
        else sorted({s for s in DEFAULT_STRIPES if stripe_fits(s)} | {wl.stripe_size})
    )
    for s in stripes:
        why = rules.reason(
            rules.check_divisible_seq, wl.seq_len, cp, s, cp_name="cp", stripe_name="stripe"
        )
        if why:
            _fail(parser, "--stripes", f"stripe {s}: {why}")
    windows = (
        list(args.windows) if args.windows is not None else sorted({wl.window[0], -1}, reverse=True)
    )
    cases, skipped = [], []
    for strategy in args.strategies:
        for left in windows:
            window = _window_tuple(left)
            if strategy == "single":
                cases.append(_Case("single", None, window))
            elif strategy == "ring":
                why = rules.reason(rules.check_ring_window, rules.te_window_size(window), cp)
                if why:
                    skipped.append({"strategy": "ring", "window": list(window), "reason": why})
                else:
                    cases.append(_Case("ring", 1, window))
            elif strategy == "allgather":
                cases.extend(_Case("allgather", s, window) for s in stripes)
            else:
                why = rules.reason(rules.check_ulysses_heads, wl.num_q_heads, wl.num_kv_heads, cp)
                if why:
                    skipped.append({"strategy": "ulysses", "window": list(window), "reason": why})
                else:
                    cases.append(_Case("ulysses", 1, window))
    if not cases:
        _fail(
            parser,
            "--strategies",
            "no runnable case is left after the checks: " + "; ".join(s["reason"] for s in skipped),
        )
    return preset, wl, cp, stripes, windows, cases, skipped


# ---------------------------------------------------------------------------- timed functions


def _facade():
    from tutorial_utils import te
    from tutorial_utils.te import attention as ta

    return te, ta


def _thd_fused(ta, q, k, v, desc, *, wl, window, max_segments, mask=None, cp_kwargs=None):
    from tutorial_utils.te.fused_call import call_fused_attn

    options = dict(cp_kwargs or {})
    if mask is not None:
        options["attn_mask_type"] = mask
    return call_fused_attn(
        ta,
        (q, k, v),
        desc,
        scaling_factor=wl.scaling_factor,
        max_segments_per_seq=max_segments,
        window_size=rules.te_window_size(window),
        **options,
    )


def _loss(out, dout):
    import jax.numpy as jnp

    return jnp.vdot(out.astype(jnp.float32), dout.astype(jnp.float32))


def _time_single(wl, data, window, warmup, iters):
    import jax

    te, ta = _facade()
    q, k, v, dout, ids, pos = data
    desc = ta.SequenceDescriptor.from_segment_ids_and_pos(ids, pos)

    def loss_fn(qkv, desc_arg, dout_arg):
        return _loss(
            _thd_fused(
                ta, *qkv, desc_arg, wl=wl, window=window, max_segments=wl.max_segments_per_seq
            ),
            dout_arg,
        )

    from tutorial_utils.perfmodel.timing import time_fn

    return time_fn(
        jax.jit(jax.value_and_grad(loss_fn)), (q, k, v), desc, dout, warmup=warmup, iters=iters
    )


def _time_cp(wl, data, case: _Case, cp: int, warmup, iters):
    """TE tutorial pattern: reorder, shard, jit with explicit shardings, run under set_mesh +
    autocast."""
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from tutorial_utils.context_parallel import context_parallel_attention
    from tutorial_utils.perfmodel.timing import time_fn

    te, ta = _facade()
    q, k, v, dout, ids, pos = data
    mesh = Mesh(np.asarray(jax.devices()[:cp]), axis_names=("cp",))
    stripe = case.stripe
    reorder = functools.partial(
        ta.reorder_causal_load_balancing,
        strategy=ta.ReorderStrategy.Striped,
        cp_size=cp,
        seq_dim=1,
        stripe_size=stripe,
    )
    x_sh = NamedSharding(mesh, P(None, "cp", None, None))
    t_sh = NamedSharding(mesh, P(None, "cp"))
    qkv = tuple(jax.device_put(reorder(x), x_sh) for x in (q, k, v))
    dout_r = jax.device_put(reorder(dout), x_sh)
    ids_r, pos_r = jax.device_put(reorder(ids), t_sh), jax.device_put(reorder(pos), t_sh)

    if case.strategy == "ulysses":

        def te_kernel(
            qq, kk, vv, iq, ik, pq, pk
        ):  # per-rank full-sequence attention on a head slice
            d = ta.SequenceDescriptor.from_segment_ids_and_pos((iq, ik), (pq, pk))
            return (
                _thd_fused(
                    ta,
                    qq,
                    kk,
                    vv,
                    d,
                    wl=wl,
                    window=case.window,
                    max_segments=wl.max_segments_per_seq,
                ),
                None,
            )

        kernel = te_kernel if te.using_real_te() else None

        def loss_fn(qkv_arg, ids_arg, pos_arg, dout_arg):
            out = context_parallel_attention(
                *qkv_arg,
                ids_arg,
                pos_arg,
                mesh=mesh,
                axis_name="cp",
                strategy="ulysses",
                stripe_size=stripe,
                window_size=case.window if case.window[0] >= 0 else (-1, 0),
                scaling_factor=wl.scaling_factor,
                kernel=kernel,
            )
            return _loss(out, dout_arg)

        qkv_sh = tuple(x.sharding for x in qkv)
        fn = jax.jit(
            jax.value_and_grad(loss_fn),
            in_shardings=(qkv_sh, t_sh, t_sh, x_sh),
            out_shardings=(None, qkv_sh),
        )
        # The per-rank kernel must not see a CP axis: an empty MeshResource (real TE reads it
        # whenever a mesh is active).
        with jax.set_mesh(mesh), te.autocast(mesh_resource=te.MeshResource()):
            return time_fn(fn, qkv, ids_r, pos_r, dout_r, warmup=warmup, iters=iters)

    strategy = ta.CPStrategy.RING if case.strategy == "ring" else ta.CPStrategy.ALL_GATHER
    desc = jax.tree.map(
        lambda x: jax.device_put(x, NamedSharding(mesh, P(None) if x.ndim == 1 else P(None, "cp"))),
        ta.SequenceDescriptor.from_segment_ids_and_pos(ids_r, pos_r),
    )
    cp_kwargs = dict(
        context_parallel_strategy=strategy,
        context_parallel_causal_load_balanced=True,
        context_parallel_axis="cp",
        stripe_size=stripe,
    )

    def loss_fn(qkv_arg, desc_arg, dout_arg):
        out = _thd_fused(
            ta,
            *qkv_arg,
            desc_arg,
            wl=wl,
            window=case.window,
            max_segments=wl.max_segments_per_seq,
            cp_kwargs=cp_kwargs,
        )
        return _loss(out, dout_arg)

    qkv_sh = tuple(x.sharding for x in qkv)
    desc_sh = jax.tree.map(lambda x: x.sharding, desc)
    fn = jax.jit(
        jax.value_and_grad(loss_fn),
        in_shardings=(qkv_sh, desc_sh, x_sh),
        out_shardings=(None, qkv_sh),
    )
    with jax.set_mesh(mesh), te.autocast(mesh_resource=te.MeshResource(cp_resource="cp")):
        return time_fn(fn, qkv, desc, dout_r, warmup=warmup, iters=iters)


#: The pure-JAX reference kernel is code XLA generates, so its speed follows XLA's backend
#: optimisation level, while TE's path spends its time in cuDNN or the stand-in's compiled C++
#: kernel. Its emulated sub-problems are compiled at XLA's default CPU level whatever
#: ``XLA_FLAGS`` says: the test run's fast-compile flag (level 0) made them run 2 to 3 times
#: slower, which made the emulated prediction depend on a compile setting.
REFERENCE_KERNEL_XLA_OPTIONS = {"xla_backend_optimization_level": 3}


def _emulated_fns(kernel: str, wl, window):
    """``(make_args(sub), fn)`` pairs: ``fn(*args)`` runs one sub-problem's forward+backward."""
    import jax

    from tutorial_utils.reference import MaskSpec, blockwise_attention

    te, ta = _facade()
    spec = MaskSpec(padding=True, causal=True, window=(-1, 0) if window[0] < 0 else window)

    if kernel == "reference":

        def loss_fn(qkv, iq, ik, pq, pk, dout):
            qq, kk, vv = qkv
            out, _ = blockwise_attention(
                qq,
                kk,
                vv,
                iq,
                ik,
                pq,
                pk,
                scale=wl.scaling_factor,
                spec=spec,
                block_q=_block(qq.shape[1], 128),
                block_kv=_block(kk.shape[1], 128),
            )
            return _loss(out, dout)

        return jax.jit(jax.value_and_grad(loss_fn), compiler_options=REFERENCE_KERNEL_XLA_OPTIONS)

    def loss_fn(qkv, calls, dout, max_segments, bottom_right_windows):
        total = 0.0
        for desc, (bottom_right, win) in zip(calls, bottom_right_windows):
            mask = (
                ta.AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK
                if bottom_right
                else ta.AttnMaskType.PADDING_CAUSAL_MASK
            )
            out = _thd_fused(
                ta,
                *qkv,
                desc,
                wl=wl,
                window=win if win is not None else (-1, -1),
                max_segments=max_segments,
                mask=mask,
            )
            total = total + _loss(out, dout)
        return total

    return jax.jit(jax.value_and_grad(loss_fn), static_argnums=(3, 4))


def _run_emulated(wl, data, case: _Case, cp: int, kernel: str, warmup: int, iters: int):
    """Time every sub-problem of ``case`` on one device; return per-rank (or per rank-step) timings
    in ms."""
    import jax.numpy as jnp

    from tutorial_utils.perfmodel.timing import time_fn

    te, ta = _facade()
    q, k, v, dout, ids, pos = data
    ids_np, pos_np = np.asarray(ids), np.asarray(pos)
    subs = rank_subproblems(
        case.strategy,
        wl.seq_len,
        cp,
        case.stripe or 1,
        num_q_heads=wl.num_q_heads,
        num_kv_heads=wl.num_kv_heads,
    )
    fn = _emulated_fns(kernel, wl, case.window)
    first_call = []

    def gather(sub):
        qi, ki = sub.q_index, sub.kv_index
        hs = slice(*sub.heads) if sub.heads else slice(None)
        ks = slice(*sub.kv_heads) if sub.kv_heads else slice(None)
        qq = _take(q, qi, 1)[:, :, hs]
        kk, vv = _take(k, ki, 1)[:, :, ks], _take(v, ki, 1)[:, :, ks]
        do = _take(dout, qi, 1)[:, :, hs]
        return qq, kk, vv, do, qi, ki

    ragged = {}
    if kernel == "te":
        win = case.window if case.window[0] >= 0 else (-1, 0)
        for sub in subs:
            if case.strategy == "allgather":
                ragged[(sub.rank, sub.step)] = allgather_ragged_calls(
                    ids_np, pos_np, sub.q_index, win
                )
            elif case.strategy == "ring":
                ragged[(sub.rank, sub.step)] = ring_ragged_calls(
                    ids_np, pos_np, sub.q_index, sub.kv_index, cp, win
                )
        kmax = max((c.max_segments for calls in ragged.values() for c in calls), default=1)
        ragged = {key: [c.padded(kmax) for c in calls] for key, calls in ragged.items()}

    times = {}
    for sub in subs:
        qq, kk, vv, do, qi, ki = gather(sub)
        if kernel == "reference":
            args = (
                (qq, kk, vv),
                jnp.asarray(ids_np[:, qi]),
                jnp.asarray(ids_np[:, ki]),
                jnp.asarray(pos_np[:, qi]),
                jnp.asarray(pos_np[:, ki]),
                do,
            )
        elif case.strategy in ("allgather", "ring"):
            calls = ragged[(sub.rank, sub.step)]
            if (
                not calls
            ):  # nothing visible in this ring step: TE skips no step, but the kernel has no work
                times[(sub.rank, sub.step)] = 0.0
                continue
            descs = tuple(te_descriptor(ta, c) for c in calls)
            args = (
                (qq, kk, vv),
                descs,
                do,
                calls[0].max_segments,
                tuple((c.bottom_right, c.window) for c in calls),
            )
        else:  # single / ulysses with TE: the plain THD call on the (head-sliced) full sequence
            desc = ta.SequenceDescriptor.from_segment_ids_and_pos(
                jnp.asarray(ids_np), jnp.asarray(pos_np)
            )
            args = (
                (qq, kk, vv),
                (desc,),
                do,
                wl.max_segments_per_seq,
                ((False, rules.te_window_size(case.window)),),
            )
        timing = time_fn(fn, *args, warmup=warmup, iters=iters)
        first_call.append(timing["first_call_ms"])
        times[(sub.rank, sub.step)] = timing["mean_ms"]
    if case.strategy == "ring":
        grid = np.zeros((cp, cp))
        for (r, t), ms in times.items():
            grid[r, t] = ms
        return grid, max(first_call) if first_call else 0.0
    return np.array([times[(sub.rank, sub.step)] for sub in subs]), (
        max(first_call) if first_call else 0.0
    )


# ---------------------------------------------------------------------------- main


def run(argv: Sequence[str] | None = None) -> dict:
    """Parse ``argv``, run the benchmark, write the record; return ``{"path", "record"}``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from tutorial_utils.cli.argtypes import record_file
    from tutorial_utils.gpu import jax_started
    from tutorial_utils.pages.runtime import gpu_present

    try:  # before any work: a bad --out/--name must not cost a whole benchmark
        record_file(args.out, args.name, force=args.force)
    except ValueError as err:
        parser.error(str(err))

    emulate = args.emulate_ranks is not None
    # Before JAX starts: simulated CPU devices for a real multi-device CP run on a machine without
    # GPUs.
    if not emulate and not gpu_present() and not jax_started():
        from tutorial_utils.pages.runtime import setup_devices
        from tutorial_utils.perfmodel.workload import get_workload

        cp_guess = (
            args.cp
            or get_workload(args.preset or os.environ.get("CP_TUTORIAL_PRESET") or "cpu").cp_size
        )
        if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
            setup_devices(cp_guess)

    preset, wl, cp, stripes, windows, cases, skipped = _resolve(args, parser)

    import jax

    from tutorial_utils import te
    from tutorial_utils.perfmodel.records import source_for, write_record
    from tutorial_utils.perfmodel.timing import make_record
    from tutorial_utils.perfmodel.workcount import attention_flops
    from tutorial_utils.perfmodel.workload import make_qkv, workload_segments

    platform = jax.default_backend()
    kernel = args.kernel
    if kernel == "auto":
        kernel = "te" if te.using_real_te() else "reference"
    if kernel == "te" and not te.using_real_te():
        _fail(
            parser,
            "--kernel",
            "'te' needs real TransformerEngine on a GPU; the active backend is"
            f" {te.backend_name()!r}",
        )
    if not emulate and len(jax.devices()) < cp and any(c.strategy != "single" for c in cases):
        _fail(
            parser,
            "--cp",
            f"CP size {cp} needs {cp} devices but JAX sees {len(jax.devices())} ({platform}); "
            f"use --emulate-ranks {cp} to time each rank's sub-problem on one device",
        )
    device_kind = jax.devices()[0].device_kind
    link_gbps, link_source = (
        (args.link_gbps, "--link-gbps") if args.link_gbps else _default_link_gbps(device_kind)
    )

    q, k, v, dout = make_qkv(wl, seed=args.seed)
    ids_np, pos_np = workload_segments(wl)
    data = (q, k, v, dout, jax.numpy.asarray(ids_np), jax.numpy.asarray(pos_np))

    progress = _Progress(len(cases), enabled=not args.no_progress)
    results, failures = [], []
    single_ms: dict[tuple[int, int], float] = {}
    # Single first, so every CP row can carry its speedup.
    ordered = sorted(cases, key=lambda c: c.strategy != "single")
    if not any(c.strategy == "single" for c in cases):
        ordered = cases
    t_start = time.perf_counter()
    for case in ordered:
        progress.start(case.desc)
        pairs = visible_pairs(ids_np, pos_np, case.window)
        flops = attention_flops(pairs, wl.num_q_heads, wl.head_dim, backward=True)
        row = {
            "strategy": case.strategy,
            "stripe_size": case.stripe,
            "window": list(case.window),
            "cp_size": 1 if case.strategy == "single" else cp,
            "visible_pairs_per_head": int(pairs),
            "flops": flops,
            "kernel": kernel if emulate else ("te" if te.using_real_te() else "reference"),
        }
        try:
            if case.strategy == "single":
                timing = _time_single(wl, data, case.window, args.warmup, args.iters)
                row.update(
                    {
                        k2: timing[k2]
                        for k2 in ("mean_ms", "std_ms", "min_ms", "median_ms", "first_call_ms")
                    }
                )
                single_ms[case.window] = timing["mean_ms"]
            elif emulate:
                per_rank, first_ms = _run_emulated(
                    wl, data, case, cp, kernel, args.warmup, args.iters
                )
                comm = comm_bytes(case.strategy, wl, cp)
                pred = predict_step_ms(case.strategy, per_rank, comm, link_gbps)
                row.update(
                    {
                        "emulated": True,
                        "mean_ms": pred["predicted_ms"],
                        "compute_ms": pred["compute_ms"],
                        "comm_ms": pred["comm_ms"],
                        "exposed_comm_ms": pred["exposed_comm_ms"],
                        "comm_bytes_per_rank": comm,
                        "link_gbps": link_gbps,
                        ("rank_step_ms" if case.strategy == "ring" else "rank_ms"): (
                            np.asarray(per_rank).tolist()
                        ),
                        "first_call_ms": first_ms,
                        "prediction": (
                            "sum over steps of max(slowest rank's step, hop at link_gbps)"
                            if case.strategy == "ring"
                            else "slowest rank + all bytes at link_gbps (not overlapped)"
                        ),
                    }
                )
                if case.strategy == "ring":
                    row["step_ms"] = pred["step_ms"]
            else:
                timing = _time_cp(wl, data, case, cp, args.warmup, args.iters)
                row.update(
                    {
                        k2: timing[k2]
                        for k2 in ("mean_ms", "std_ms", "min_ms", "median_ms", "first_call_ms")
                    }
                )
        except Exception as err:  # noqa: BLE001 - one failing case must not lose the others
            failures.append(
                {
                    "strategy": case.strategy,
                    "stripe_size": case.stripe,
                    "window": list(case.window),
                    "error": f"{type(err).__name__}: {err}"[:2000],
                }
            )
            progress.finish(f"{case.desc}: FAILED ({type(err).__name__})")
            continue
        if row["mean_ms"] <= 0:
            row["mean_ms"] = 1e-6
        row["tflops"] = flops / (row["mean_ms"] * 1e-3) / 1e12
        if row["cp_size"] > 1:
            row["tflops_per_device"] = row["tflops"] / row["cp_size"]
        if case.strategy != "single" and case.window in single_ms:
            row["speedup"] = single_ms[case.window] / row["mean_ms"]
        results.append(row)
        progress.finish(
            f"{case.desc}: {row['mean_ms']:.3f} ms" + (" (emulated)" if row.get("emulated") else "")
        )
    progress.close()
    if not results:
        raise SystemExit(
            "bench: every case failed:\n"
            + "\n".join(
                f"  {f['strategy']} stripe={f['stripe_size']} window={f['window']}: {f['error']}"
                for f in failures
            )
        )

    source = source_for(platform, te.backend_kind(), emulated=bool(emulate))
    n_dev = 1 if emulate else cp  # devices the CP mesh used (not all the visible ones)
    label = args.label or (
        f"{preset} on {n_dev}x {device_kind}" + (f", {cp} ranks emulated" if emulate else "")
    )
    config = wl.as_dict()
    config.update(
        {
            "preset": preset,
            "window": list(_window_tuple(windows[0])) if len(windows) == 1 else None,
            "windows": [list(_window_tuple(w)) for w in windows],
            "stripes": stripes,
            "strategies": list(args.strategies),
            "emulate_ranks": args.emulate_ranks,
            "kernel": kernel if emulate else ("te" if te.using_real_te() else "reference"),
            "seed": args.seed,
            "timed": (
                "jax.jit(jax.value_and_grad(vdot(out, dout))) w.r.t. (q, k, v): forward + backward"
            ),
        }
    )
    if emulate:
        config.update({"link_gbps": link_gbps, "link_gbps_source": link_source})
        if (
            kernel == "reference"
        ):  # compiled with these, whatever XLA_FLAGS in the record's environment says
            config["reference_kernel_xla_options"] = dict(REFERENCE_KERNEL_XLA_OPTIONS)
    notes = []
    if emulate:
        notes.append(
            f"emulated: each of {cp} ranks' sub-problems was timed one at a time on ONE"
            f" {device_kind} ({kernel} kernel); CP rows are predictions (slowest rank +"
            f" communication at {link_gbps:g} GB/s), not measurements on several devices."
        )
    if platform != "gpu":
        notes.append(
            "CPU timings of the pure-JAX reference: they show relative costs only, not GPU"
            " performance."
        )
    if skipped:
        notes.append(
            "skipped: "
            + "; ".join(f"{s['strategy']} window={s['window']}: {s['reason']}" for s in skipped)
        )
    if failures:
        notes.append(f"{len(failures)} case(s) failed; see 'failures'.")
    record = make_record(
        label, source, config, results, warmup=args.warmup, iters=args.iters, notes=" ".join(notes)
    )
    record["hardware"].update(_gpu_versions())
    record["hardware"]["te_backend"] = te.backend_name()
    record["skipped"] = skipped
    record["failures"] = failures
    record["wall_seconds"] = time.perf_counter() - t_start
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    name = args.name
    if name is None:
        import re

        slug = re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-").lower() or "bench"
        name = f"{source}-{slug}-{stamp}.json"
    path = write_record(record, args.out, name=name, overwrite=args.force)
    return {"path": path, "record": record}


def _summary(record: dict) -> str:
    lines = [f"{record['label']} [{record['source']}]"]
    for r in record["results"]:
        st = "" if r.get("stripe_size") is None else f" stripe={r['stripe_size']}"
        extra = f" speedup={r['speedup']:.2f}x" if "speedup" in r else ""
        em = " (emulated)" if r.get("emulated") else ""
        lines.append(
            f"  {r['strategy']:<9}{st:<12} window={r['window'][0]:<6} {r['mean_ms']:10.3f} ms "
            f"{r['tflops']:9.3f} TFLOP/s{extra}{em}"
        )
    for f in record.get("failures", []):
        lines.append(
            f"  FAILED {f['strategy']} stripe={f['stripe_size']} window={f['window']}:"
            f" {f['error'][:200]}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    out = run(argv)
    print(_summary(out["record"]))
    print(f"wrote {out['path']}")
    return 1 if out["record"].get("failures") else 0


if __name__ == "__main__":
    sys.exit(main())
