"""Printing helpers for chapters 1 and 2: what a packed batch, its descriptor and its shards hold.

Those chapters teach the arrays (segment ids and positions, TE's ``SequenceDescriptor``, each
device's slice of the sequence), not the loops that format them, so the formatting lives here
and the chapter cells stay the code a reader would type.
"""

from __future__ import annotations

import dataclasses
import textwrap

import numpy as np

from tutorial_utils.perfmodel.workload import get_workload

__all__ = [
    "DESCRIPTOR_FIELDS",
    "descriptor_fields",
    "named_axes",
    "preset_table",
    "token_ranges",
    "shard_table",
    "local_rows",
    "wrapped",
]

#: The attributes of TE's ``SequenceDescriptor``; each holds a ``(q, kv)`` pair of arrays.
DESCRIPTOR_FIELDS = ("seqlens", "seq_offsets", "segment_ids", "segment_pos")


def _spec(x):
    """The ``PartitionSpec`` of a ``NamedSharding``-placed array, else ``None``."""
    return getattr(getattr(x, "sharding", None), "spec", None)


def descriptor_fields(descriptor) -> str:
    """One line per field of a ``SequenceDescriptor``: its ``(q, kv)`` shapes and sharding.

    Why: TE's ``SequenceDescriptor`` prints as ``<... object at 0x...>``. It stores four
    ``(q, kv)`` pairs; a constructor fills some and leaves the others as empty ``(0,)``
    placeholders. All eight arrays are pytree leaves, which is why a descriptor can be
    passed through ``jax.jit`` and placed on a mesh like any other argument; a leaf placed
    with a ``NamedSharding`` shows its ``PartitionSpec``.
    """
    lines = []
    for field in DESCRIPTOR_FIELDS:
        pair = getattr(descriptor, field, None)
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise ValueError(
                f"descriptor.{field} is {type(pair).__name__}, not a (q, kv) pair; pass a"
                " SequenceDescriptor (from tutorial_utils.te.attention or"
                " transformer_engine.jax.attention)."
            )
        q, kv = pair
        if q.size == 0 and kv.size == 0:
            lines.append(f"{field:12s} empty")
            continue
        text = f"{field:12s} q {str(tuple(q.shape)):12s} kv {str(tuple(kv.shape)):12s}"
        if _spec(q) is not None:
            text += f" q sharded {_spec(q)}"
        lines.append(text.rstrip())
    return "\n".join(lines)


def named_axes(mesh_resource) -> dict[str, str]:
    """``{field: axis name}`` for the fields of a ``MeshResource`` that name a mesh axis.

    Why: a ``MeshResource`` prints all seven of its fields, six of them ``None``; the one
    that matters (which field holds ``"cp"``) is easy to miss in that line. A positional
    ``MeshResource("cp")`` puts ``"cp"`` on ``dp_resource``, and this shows it at a glance.
    """
    if not dataclasses.is_dataclass(mesh_resource) or isinstance(mesh_resource, type):
        raise ValueError(
            f"named_axes needs a MeshResource instance, got {type(mesh_resource).__name__}."
        )
    return {
        f.name: getattr(mesh_resource, f.name)
        for f in dataclasses.fields(mesh_resource)
        if getattr(mesh_resource, f.name) is not None
    }


def preset_table(*names: str) -> str:
    """The named workload presets as an aligned text table, one preset per row.

    Why: the chapters run one preset but describe the family; the table shows that the
    ``cpu`` preset keeps the structure of TE's published example (``seed``): two rows of
    four padded slots, GQA, a causal window of half a slot.
    """
    if not names:
        raise ValueError(
            "preset_table() needs at least one preset name, e.g. preset_table('seed', 'cpu')."
        )
    head = (
        "preset",
        "batch",
        "seq_len",
        "slots",
        "tokens/slot",
        "heads q/kv",
        "head_dim",
        "window",
        "dtype",
    )
    rows = [head]
    for name in names:
        p = get_workload(name)
        rows.append(
            (
                p.name,
                str(p.batch),
                str(p.seq_len),
                str(p.segments_per_row),
                f"{p.valid_per_slot}/{p.slot_len}",
                f"{p.num_q_heads}/{p.num_kv_heads}",
                str(p.head_dim),
                str(tuple(p.window)),
                p.dtype,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def token_ranges(array, axis: int = 1) -> dict[int, tuple[int, int]]:
    """``{device id: (start, stop)}``: the indices along ``axis`` each device holds.

    Why: under context parallelism, token ``t``'s data and its metadata must sit on the
    same device. Comparing the ranges of Q and of the segment ids says so in one ``==``.
    ``array`` must be a ``jax.Array`` (its ``addressable_shards`` are read).
    """
    shards = getattr(array, "addressable_shards", None)
    if shards is None:
        raise ValueError(
            f"token_ranges needs a jax.Array placed on devices, got {type(array).__name__}."
        )
    if not -array.ndim <= axis < array.ndim:
        raise ValueError(f"axis={axis} is out of range for an array of shape {array.shape}.")
    n = array.shape[axis]
    out = {}
    for shard in shards:
        sl = shard.index[axis]
        out[shard.device.id] = (sl.start or 0, n if sl.stop is None else sl.stop)
    return dict(sorted(out.items()))


def shard_table(axis: int = 1, **arrays) -> str:
    """Per device, the token range (``start:stop`` along ``axis``) of each named array.

    Why: one glance shows that Q, K, V and the token-indexed metadata are split at the same
    places. ``arrays`` are ``jax.Array`` s sharded over the same devices, passed by name:
    ``shard_table(q=q, segment_ids=ids)``.
    """
    if not arrays:
        raise ValueError(
            "shard_table() needs at least one array, passed by name: shard_table(q=q)."
        )
    ranges = {name: token_ranges(x, axis) for name, x in arrays.items()}
    devices = sorted(set().union(*ranges.values()))
    cols = [["device", *map(str, devices)]]
    for name, r in ranges.items():
        cols.append([name, *(f"{r[d][0]}:{r[d][1]}" if d in r else "-" for d in devices)])
    widths = [max(map(len, c)) for c in cols]
    return "\n".join(
        "  ".join(c[i].ljust(w) for c, w in zip(cols, widths)).rstrip()
        for i in range(len(devices) + 1)
    )


def local_rows(row: int = 0, **arrays) -> str:
    """Each device's local values of ``[batch, seq]`` arrays (one batch row), one line per array.

    Why: a kernel on one device sees only its local slice. Printing the slices of the
    segment ids and positions shows what that device knows about its tokens: a local index
    0 can be token 8 of a document, and only the position says so.
    """
    if not arrays:
        raise ValueError("local_rows() needs at least one [batch, seq] array, passed by name.")
    for name, x in arrays.items():
        if getattr(x, "ndim", None) != 2 or not hasattr(x, "addressable_shards"):
            raise ValueError(f"{name} must be a 2-D [batch, seq] jax.Array placed on devices.")
    width = max(map(len, arrays))
    lines = []
    first = next(iter(arrays.values()))
    for device in sorted(token_ranges(first)):
        lines.append(f"device {device}:")
        for name, x in arrays.items():
            shard = next(s for s in x.addressable_shards if s.device.id == device)
            lo = shard.index[0].start or 0
            if not lo <= row < (x.shape[0] if shard.index[0].stop is None else shard.index[0].stop):
                continue
            values = np.asarray(shard.data)[row - lo]
            lines.append(f"  {name:{width}s} {' '.join(f'{int(v):2d}' for v in values)}")
    return "\n".join(lines)


def wrapped(text: str, width: int = 76, indent: str = "    ") -> str:
    """``text`` folded to ``width`` columns, continuation lines indented (error messages on a
    page)."""
    return textwrap.fill(str(text), width, subsequent_indent=indent)
