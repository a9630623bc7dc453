"""Bytes each rank sends and receives for Ring, AllGather and Ulysses context parallelism.

"Is CP communication-bound?" is a question about bytes per rank per direction versus link
bandwidth, so every collective is written down here, for the cost model, the reader, and a
test that holds it against the collectives XLA actually compiles.
"""

from __future__ import annotations

import dataclasses
import re

from tutorial_utils import rules

__all__ = [
    "Transfer",
    "CommVolume",
    "comm_volume",
    "comm_for_workload",
    "ring_step_bytes",
    "hlo_collective_bytes",
    "STRATEGIES",
    "SCHEDULES",
    "dtype_bytes",
]

STRATEGIES = ("ring", "allgather", "ulysses")
SCHEDULES = ("te", "reference")

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8": 1, "fp8": 1}


def dtype_bytes(dtype) -> int:
    """Bytes per element of ``dtype`` (a name such as ``'bfloat16'`` or an int passed through)."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if dtype < 1:
            raise ValueError(
                f"dtype={dtype} bytes must be positive; pass 2 for bf16 or a dtype name."
            )
        return dtype
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    if name not in _DTYPE_BYTES:
        raise ValueError(
            f"dtype={dtype!r} is unknown; use one of {sorted(_DTYPE_BYTES)} or a byte count."
        )
    return _DTYPE_BYTES[name]


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One kind of collective issued ``count`` times; bytes are per rank per issue."""

    phase: str  # "fwd" or "bwd"
    op: str  # collective-permute | all-gather | reduce-scatter | all-to-all
    tensor: str  # what moves, e.g. "K|V" (stacked), "segment_ids", "dK"
    count: int
    bytes_sent: int
    bytes_received: int

    @property
    def total_sent(self) -> int:
        """Bytes this rank sends over all ``count`` issues."""
        return self.count * self.bytes_sent

    @property
    def total_received(self) -> int:
        """Bytes this rank receives over all ``count`` issues."""
        return self.count * self.bytes_received


@dataclasses.dataclass(frozen=True)
class CommVolume:
    """All collectives of one strategy's forward+backward, per rank."""

    strategy: str
    schedule: str
    cp_size: int
    transfers: tuple[Transfer, ...]

    def _sum(self, phase=None, attr="total_sent") -> int:
        return int(
            sum(getattr(t, attr) for t in self.transfers if phase is None or t.phase == phase)
        )

    @property
    def fwd_sent(self) -> int:
        """Bytes one rank sends in the forward pass."""
        return self._sum("fwd")

    @property
    def bwd_sent(self) -> int:
        """Bytes one rank sends in the backward pass."""
        return self._sum("bwd")

    @property
    def fwd_received(self) -> int:
        """Bytes one rank receives in the forward pass."""
        return self._sum("fwd", "total_received")

    @property
    def bwd_received(self) -> int:
        """Bytes one rank receives in the backward pass."""
        return self._sum("bwd", "total_received")

    @property
    def total_sent(self) -> int:
        """Bytes one rank sends, forward plus backward (what the advisor reports per rank)."""
        return self._sum()

    @property
    def total_received(self) -> int:
        """Bytes one rank receives, forward plus backward."""
        return self._sum(attr="total_received")

    def by_op(self, phase=None) -> dict[str, int]:
        """Bytes sent per collective kind (e.g. to compare with a compiled HLO)."""
        out: dict[str, int] = {}
        for t in self.transfers:
            if phase is None or t.phase == phase:
                out[t.op] = out.get(t.op, 0) + t.total_sent
        return out

    def as_dict(self) -> dict:
        """Plain-JSON view for records and the advisor's ``--json`` output."""
        return {
            "strategy": self.strategy,
            "schedule": self.schedule,
            "cp_size": self.cp_size,
            "fwd_sent": self.fwd_sent,
            "bwd_sent": self.bwd_sent,
            "total_sent": self.total_sent,
            "transfers": [dataclasses.asdict(t) for t in self.transfers],
        }


def _pos_int(name, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {name}={value!r}.")
    return value


def _shards(batch, seq_len, num_q_heads, num_kv_heads, head_dim, cp_size, dtype, id_bytes):
    for name, v in (
        ("batch", batch),
        ("seq_len", seq_len),
        ("num_q_heads", num_q_heads),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("cp_size", cp_size),
        ("id_bytes", id_bytes),
    ):
        _pos_int(name, v)
    rules.check_divisible_seq(seq_len, cp_size, None)
    b = dtype_bytes(dtype)
    tokens = batch * seq_len // cp_size
    return {
        "q": tokens * num_q_heads * head_dim * b,
        "kv": tokens * num_kv_heads * head_dim * b,  # one of K or V
        "ids": tokens * id_bytes,  # one of segment_ids or segment_pos
    }


def ring_step_bytes(
    phase: str,
    *,
    batch: int,
    seq_len: int,
    num_kv_heads: int,
    head_dim: int,
    cp_size: int,
    dtype="bfloat16",
    id_bytes: int = 4,
    schedule: str = "te",
    num_q_heads: int = 1,
) -> int:
    """Bytes one rank sends in one overlapped ring hop (``phase`` ``'fwd'`` or ``'bwd'``).

    Why: Ring hides a hop behind one step's attention; the cost model compares this with
    the step's compute to find the exposed part.
    """
    if schedule not in SCHEDULES:
        raise ValueError(
            f"schedule={schedule!r} is unknown; use 'te' (TransformerEngine's primitives) or"
            " 'reference'."
        )
    s = _shards(batch, seq_len, num_q_heads, num_kv_heads, head_dim, cp_size, dtype, id_bytes)
    if phase == "fwd":
        return 2 * s["kv"] + 2 * s["ids"]
    if phase == "bwd":
        return (4 * s["kv"] + 2 * s["ids"]) if schedule == "te" else 2 * s["kv"]
    raise ValueError(f"phase={phase!r} must be 'fwd' or 'bwd'.")


def comm_volume(
    strategy: str,
    *,
    batch: int,
    seq_len: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    cp_size: int,
    dtype="bfloat16",
    id_bytes: int = 4,
    schedule: str = "te",
) -> CommVolume:
    """Every collective of ``strategy`` (``ring``, ``allgather``, ``ulysses``) with per-rank bytes.

    Why: the volume decides whether CP can be communication-bound. GQA makes K/V 8-16x
    smaller than Q, which is why KV-passing strategies (Ring, AllGather) move so little, while
    Ulysses has to move Q and O too.

    Accounting rules (per rank, one collective, local shard of ``n`` bytes, ``cp`` ranks):

    * ``collective-permute`` (one ring hop): sends ``n``, receives ``n``.
    * ``all-gather`` of an ``n``-byte shard into ``cp*n`` bytes: sends and receives
      ``(cp-1)*n`` (what a ring or a direct NVSwitch all-gather moves; the rank's own shard
      stays put).
    * ``reduce-scatter`` of a ``cp*n``-byte full tensor into an ``n``-byte shard: sends and
      receives ``(cp-1)*n``.
    * ``all-to-all`` of an ``n``-byte local tensor: sends and receives ``(cp-1)/cp * n`` (the
      1/cp slice addressed to itself never leaves the rank).

    Two schedules:

    * ``"te"``: TransformerEngine's THD CP primitives as read in ``transformer_engine/jax/
      cpp_extensions/attention.py`` at commit d0067d0 (custom VJPs). Ring forward rotates a
      stacked K|V block and the kv ids/pos ``cp-1`` times (the permutes issued in the last of
      the ``cp`` unrolled steps feed nothing and are dropped by XLA). Ring backward rotates
      the stacked ``[K|V, dK|dV]`` block at each of its ``cp`` steps, the kv ids/pos ``cp-1``
      times, and sends dK|dV one final hop home. AllGather backward **re-gathers** K, V, ids
      and pos (the backward primitive receives only the local shards) before
      reduce-scattering dK, dV.
    * ``"reference"``: what ``jax.grad`` of this project's ``shard_map`` implementation
      (:mod:`tutorial_utils.context_parallel`) compiles to. JAX differentiates through the
      collectives, and the forward's gathered / rotated K, V are saved, so the backward only
      moves gradients: Ring sends dK and dV back around the ring ``cp-1`` times (the
      transpose of each forward hop), AllGather reduce-scatters dK and dV (the transpose of
      all-gather). ``tests/perfmodel/test_comm.py`` checks this schedule against the compiled HLO.

    Ulysses (no TE JAX implementation; same in both schedules): forward all-to-alls Q, K, V
    from sequence-sharded to head-sharded and O back, and all-gathers the int32 ids and
    positions once (self-attention: every head group needs the whole sequence's mask
    metadata; the reference gathers the query and key copies separately before XLA's CSE
    merges them). Backward all-to-alls dO forward and dQ, dK, dV back.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is unknown; use one of {STRATEGIES}.")
    if schedule not in SCHEDULES:
        raise ValueError(
            f"schedule={schedule!r} is unknown; use 'te' (TransformerEngine's primitives) or"
            " 'reference'."
        )
    s = _shards(batch, seq_len, num_q_heads, num_kv_heads, head_dim, cp_size, dtype, id_bytes)
    cp = cp_size
    T = []

    def add(phase, op, tensor, count, n):
        if count <= 0 or cp == 1:
            return
        if op == "collective-permute":
            moved = n
        elif op in ("all-gather", "reduce-scatter"):
            moved = (cp - 1) * n
        elif op == "all-to-all":
            moved = (cp - 1) * n // cp
        else:  # pragma: no cover - internal
            raise AssertionError(op)
        T.append(Transfer(phase, op, tensor, count, moved, moved))

    kv, ids, q = s["kv"], s["ids"], s["q"]
    if strategy == "ring":
        if schedule == "te":
            add("fwd", "collective-permute", "K|V", cp - 1, 2 * kv)
            add("fwd", "collective-permute", "segment_ids", cp - 1, ids)
            add("fwd", "collective-permute", "segment_pos", cp - 1, ids)
            add("bwd", "collective-permute", "[K|V, dK|dV]", cp, 4 * kv)
            add("bwd", "collective-permute", "segment_ids", cp - 1, ids)
            add("bwd", "collective-permute", "segment_pos", cp - 1, ids)
            add("bwd", "collective-permute", "dK|dV (home)", 1, 2 * kv)
        else:
            for name in ("K", "V"):
                add("fwd", "collective-permute", name, cp - 1, kv)
            for name in ("segment_ids", "segment_pos"):
                add("fwd", "collective-permute", name, cp - 1, ids)
            for name in ("dK", "dV"):
                add("bwd", "collective-permute", name, cp - 1, kv)
    elif strategy == "allgather":
        for name, n in (("K", kv), ("V", kv), ("segment_ids", ids), ("segment_pos", ids)):
            add("fwd", "all-gather", name, 1, n)
        if schedule == "te":
            for name, n in (("K", kv), ("V", kv), ("segment_ids", ids), ("segment_pos", ids)):
                add("bwd", "all-gather", name, 1, n)
        for name in ("dK", "dV"):
            add("bwd", "reduce-scatter", name, 1, kv)
    else:  # ulysses
        for name, n in (("Q", q), ("K", kv), ("V", kv), ("O", q)):
            add("fwd", "all-to-all", name, 1, n)
        for name in ("segment_ids", "segment_pos"):
            add("fwd", "all-gather", name, 1, ids)
        for name, n in (("dO", q), ("dQ", q), ("dK", kv), ("dV", kv)):
            add("bwd", "all-to-all", name, 1, n)
    return CommVolume(strategy=strategy, schedule=schedule, cp_size=cp, transfers=tuple(T))


def comm_for_workload(workload, strategy: str, *, cp_size=None, schedule: str = "te") -> CommVolume:
    """:func:`comm_volume` for a :class:`~tutorial_utils.perfmodel.workload.Workload`."""
    return comm_volume(
        strategy,
        batch=workload.batch,
        seq_len=workload.seq_len,
        num_q_heads=workload.num_q_heads,
        num_kv_heads=workload.num_kv_heads,
        head_dim=workload.head_dim,
        cp_size=workload.cp_size if cp_size is None else cp_size,
        dtype=workload.dtype,
        schedule=schedule,
    )


_HLO_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "bf16": 2,
    "f16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
}
_HLO_OPS = ("all-gather", "reduce-scatter", "all-to-all", "collective-permute", "all-reduce")
_HLO_LINE = re.compile(
    r"=\s*(?P<type>\([^=]*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+"
    r"(?P<op>all-gather|reduce-scatter|all-to-all|collective-permute|all-reduce)\("
)
_HLO_ARRAY = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")
_HLO_GROUPS = re.compile(r"replica_groups=\{\{([0-9,]*)\}")


def _hlo_type_bytes(text: str) -> int:
    total = 0
    for dtype, dims in _HLO_ARRAY.findall(text):
        if dtype not in _HLO_BYTES:
            raise ValueError(
                f"HLO element type {dtype!r} is not known to hlo_collective_bytes; add it to"
                " _HLO_BYTES."
            )
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _HLO_BYTES[dtype]
    return total


def hlo_collective_bytes(hlo_text: str, cp_size: int) -> dict[str, dict[str, int]]:
    """Per-rank bytes sent by every synchronous collective in an HLO module's text, by op kind.

    Why: the only way to know what a ``shard_map`` program really moves is to read the
    program XLA built. Sizes come from each op's result shape with the rules of
    :func:`comm_volume` (all-gather result ``R``: ``R*(cp-1)/cp``; reduce-scatter result ``r``:
    ``(cp-1)*r``; all-to-all of total size ``n``, array or tuple form: ``n*(cp-1)/cp``;
    collective-permute: its result; all-reduce: ``2*n*(cp-1)/cp`` as a ring would move).
    The group size is read from ``replica_groups`` when present, else ``cp_size``. Async
    ``*-start`` / ``*-done`` pairs (GPU schedules) are not parsed: use the text of
    ``jit(f).lower(...)`` or of a CPU compilation. Returns ``{op: {"count", "bytes"}}``.
    """
    _pos_int("cp_size", cp_size)
    out = {op: {"count": 0, "bytes": 0} for op in _HLO_OPS}
    for line in hlo_text.splitlines():
        m = _HLO_LINE.search(line)
        if not m:
            continue
        op, size = m.group("op"), _hlo_type_bytes(m.group("type"))
        g = _HLO_GROUPS.search(line)
        n = len(g.group(1).split(",")) if g and g.group(1) else cp_size
        if op == "all-gather":
            moved = size * (n - 1) // n
        elif op == "reduce-scatter":
            moved = size * (n - 1)
        elif op == "all-to-all":
            moved = size * (n - 1) // n
        elif op == "all-reduce":
            moved = 2 * size * (n - 1) // n
        else:
            moved = size
        out[op]["count"] += 1
        out[op]["bytes"] += moved
    return out
