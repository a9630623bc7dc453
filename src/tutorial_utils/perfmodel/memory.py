"""Peak bytes of the attention tensors on one rank, per CP strategy: counted, not fitted.

The attention tensors only (weights, optimizer state and the rest of the model's activations
come on top), as the larger of two phases:

* forward: the local Q, K, V, O shards, the fp32 softmax statistics (one LSE per query row
  and head) and the int32 segment ids and positions, plus the strategy's forward buffers;
* backward: the same plus dO, dQ, dK, dV, plus the strategy's backward buffers.

Strategy buffers (TE's THD primitives in ``transformer_engine/jax/cpp_extensions/attention.py``):
AllGather holds the gathered full-length K, V, ids and pos (forward; re-gathered in
backward) and, in backward, the full-length dK, dV before the reduce-scatter. Ring (the
striped THD ring) holds one K|V block in flight (double buffering) with its ids/pos, and in
forward the fp32 running output, one step's partial output and its LSE; in backward the
stacked ``[K|V, dK|dV]`` block in flight plus one step's dQ and dK|dV. Ulysses holds the
head-sharded full-sequence Q, K, V, O (``hq/cp`` and ``hkv/cp`` heads) and LSE, the
gathered ids/pos, and in backward the head-sharded dO, dQ, dK, dV. Short-lived copies
(e.g. the striped reorder of the gathered K/V) and allocator slack are not counted.
"""

from __future__ import annotations

from tutorial_utils import rules
from tutorial_utils.perfmodel.comm import dtype_bytes
from tutorial_utils.perfmodel.workload import Workload, get_workload

__all__ = ["MEMORY_STRATEGIES", "memory_bytes"]


_LSE_BYTES = 4  # TE's softmax_aux: float32, one value per query row and head
_ID_BYTES = 4  # int32 segment ids and segment positions
MEMORY_STRATEGIES = ("single", "ring", "allgather", "ulysses")


def memory_bytes(workload, strategy: str = "single", *, cp_size: int | None = None) -> dict:
    """Peak bytes of the attention tensors on one rank, itemized per phase.

    Why: CP is often needed because one GPU cannot *hold* the sequence, not because it is
    slow; a time prediction for a configuration that does not fit in HBM is meaningless.
    ``strategy='single'`` is one device holding the whole workload (``cp_size`` ignored).
    Returns ``peak_bytes``, ``peak_phase`` (``'fwd'`` or ``'bwd'``), ``fwd_bytes``,
    ``bwd_bytes`` and the items of each phase (``fwd``, ``bwd``: name -> bytes); the
    module docstring lists what each strategy holds.
    """
    wl = get_workload(workload) if isinstance(workload, str) else workload
    if not isinstance(wl, Workload):
        raise ValueError(
            f"workload={workload!r} must be a Workload or a preset name such as 'seed'."
        )
    if strategy not in MEMORY_STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is unknown; use one of {MEMORY_STRATEGIES}.")
    cp = 1 if strategy == "single" else (wl.cp_size if cp_size is None else cp_size)
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp_size must be a positive integer, got cp_size={cp!r}.")
    rules.check_divisible_seq(wl.seq_len, cp, None)
    e = dtype_bytes(wl.dtype)
    tokens = wl.batch * wl.seq_len // cp  # local tokens (all rows)
    q = tokens * wl.num_q_heads * wl.head_dim * e  # one of Q, O, dO, dQ (local shard)
    kv = tokens * wl.num_kv_heads * wl.head_dim * e  # one of K, V, dK, dV (local shard)
    lse = tokens * wl.num_q_heads * _LSE_BYTES  # softmax statistics of the local queries
    ids = tokens * _ID_BYTES  # one of segment ids, segment pos (local)
    fwd = {"Q": q, "K,V": 2 * kv, "O": q, "LSE (fp32)": lse, "segment ids,pos (int32)": 2 * ids}
    bwd = dict(fwd, **{"dO": q, "dQ": q, "dK,dV": 2 * kv})
    if strategy == "ring":
        fwd["ring: K|V block in flight"] = 2 * kv
        fwd["ring: ids,pos in flight"] = 2 * ids
        fwd["ring: fp32 running O"] = tokens * wl.num_q_heads * wl.head_dim * 4
        fwd["ring: one step's O"] = q
        fwd["ring: one step's LSE"] = lse
        bwd["ring: [K|V, dK|dV] block in flight"] = 4 * kv
        bwd["ring: ids,pos in flight"] = 2 * ids
        bwd["ring: one step's dQ"] = q
        bwd["ring: one step's dK|dV"] = 2 * kv
    elif strategy == "allgather":
        for phase in (fwd, bwd):
            phase["allgather: gathered K,V"] = 2 * cp * kv
            phase["allgather: gathered ids,pos"] = 2 * cp * ids
        bwd["allgather: full-length dK,dV"] = 2 * cp * kv
    elif strategy == "ulysses":
        # head-sharded, full sequence: batch * seq_len * (heads / cp) = tokens * heads elements
        for phase in (fwd, bwd):
            phase["ulysses: head-sharded Q,O"] = 2 * q
            phase["ulysses: head-sharded K,V"] = 2 * kv
            phase["ulysses: head-sharded LSE"] = lse
            phase["ulysses: gathered ids,pos"] = 2 * cp * ids
        bwd["ulysses: head-sharded dO,dQ"] = 2 * q
        bwd["ulysses: head-sharded dK,dV"] = 2 * kv
    f, b = int(sum(fwd.values())), int(sum(bwd.values()))
    return {
        "strategy": strategy,
        "cp_size": cp,
        "peak_bytes": max(f, b),
        "peak_phase": "bwd" if b >= f else "fwd",
        "fwd_bytes": f,
        "bwd_bytes": b,
        "fwd": {k: int(v) for k, v in fwd.items()},
        "bwd": {k: int(v) for k, v in bwd.items()},
    }
