"""Where CP inputs live: TE's partitioner reads it, so the facade checks and pins it.

Why: TE 2.20.2's context-parallel ``fused_attn`` decides *what each rank computes* from the
shardings its custom partitioner is handed, not from the arrays' values. Run on CPU with
TE's own code (``tests/test_placement.py``):

* q/k/v that are not sharded over the CP axis (plain arrays, never ``device_put`` on the
  mesh), called eagerly: a wrong output, no error;
* the same arrays correctly placed but called eagerly (outside ``jax.jit``): wrong too, because
  TE's primitives are then dispatched one by one and the metadata they see is not sharded
  the way the partitioner assumes;
* under ``jax.jit`` without shardings: TE's partitioner stops with a bare
  ``AssertionError: cp is not a axis of the given mesh``;
* reordering inside ``jit`` (or any op whose sharding XLA must infer) in front of the call,
  and the output gradient behind it, can reach the partitioner as a sharding that has no
  name over the mesh: a bare ``explode_superdims`` assertion (NVIDIA/TransformerEngine#3516).

So, with a CP axis of size > 1, :func:`check_placement` refuses inputs whose placement is
*visible* (concrete arrays, or tracers whose type carries an explicit sharding) and not over
the CP axis on the sequence dimension, and :func:`pinned` runs TE's call compiled as a whole
with q/k/v, the segment ids/positions and the output constrained to that sharding. The
constraint on the output is also a constraint on its cotangent, which is the dO fix.
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = [
    "check_placement",
    "visible_sharding",
    "sequence_spec",
    "pin_sequence",
    "sharded_over",
    "guard_placement",
]

FIX = (
    "place it with jax.device_put(x, NamedSharding(mesh, P(None, '{axis}'))) (batch axes first if"
    " the batch is sharded), or pass in_shardings with the sequence on '{axis}' to jax.jit"
)


def visible_sharding(x) -> jax.sharding.Sharding | None:
    """The sharding of ``x`` when it is known at call time, else ``None``.

    Concrete ``jax.Array``: its ``.sharding``. A tracer: the sharding in its type, but only
    when the mesh axes are ``Explicit`` (under the default ``Auto`` axes a tracer's type says
    nothing about where its data will be).
    """
    if isinstance(x, jax.core.Tracer):
        try:
            sharding = jax.typeof(x).sharding
            mesh = sharding.mesh
            types = dict(zip(mesh.axis_names, mesh.axis_types))
        except Exception:  # noqa: BLE001 - no sharding in this tracer's type
            return None
        if any(t == jax.sharding.AxisType.Explicit for t in types.values()):
            return sharding
        return None
    return getattr(x, "sharding", None) if isinstance(x, jax.Array) else None


def sharded_over(sharding, axis: str, dim: int) -> bool:
    """True when ``sharding`` splits dimension ``dim`` over the mesh axis ``axis``."""
    spec = getattr(sharding, "spec", None)
    if not isinstance(sharding, NamedSharding) or spec is None or len(spec) <= dim:
        return False
    entry = spec[dim]
    names = entry if isinstance(entry, tuple) else (entry,)
    return axis in names


def check_placement(arrays, *, cp_axis: str, cp_size: int) -> None:
    """Raise ``ValueError`` for an input whose visible sharding leaves the sequence unsplit.

    ``arrays`` maps a name (``"q"``, ``"sequence_descriptor.segment_ids[0]"``, ...) to an
    array whose axis 1 is the sequence. Size-0 placeholders and arrays whose placement is
    not visible are skipped (:func:`pin_sequence` takes care of those).
    """
    if cp_size <= 1:
        return
    for name, x in arrays.items():
        if x is None or getattr(x, "size", 0) == 0 or getattr(x, "ndim", 0) < 2:
            continue
        sharding = visible_sharding(x)
        if sharding is None or sharded_over(sharding, cp_axis, 1):
            continue
        shown = getattr(sharding, "spec", None)
        shown = f"{type(sharding).__name__}({shown})" if shown is not None else repr(sharding)
        raise ValueError(
            f"{name} has sharding {shown}, which does not split its sequence axis (axis 1) over the"
            f" context-parallel axis '{cp_axis}' (size {cp_size}); TE 2.20.2 then computes wrong"
            " attention without an error. " + FIX.format(axis=cp_axis) + "."
        )


def sequence_spec(ndim: int, cp_axis: str, batch) -> P:
    """``P(batch, cp_axis, <unconstrained>...)`` for an array ``[batch, seq, ...]``."""
    return P(batch, cp_axis, *([P.UNCONSTRAINED] * (ndim - 2)))


def pin_sequence(x, cp_axis: str, batch):
    """``with_sharding_constraint`` of the sequence axis to ``cp_axis`` (the batch to ``batch``).

    A bare ``PartitionSpec``: it refers to the mesh made active with ``jax.set_mesh`` (or
    ``with mesh:``), the one TE's partitioner uses. Size-0 placeholders and 1-D arrays
    (``seqlens``) pass unchanged.
    """
    if x is None or getattr(x, "size", 0) == 0 or getattr(x, "ndim", 0) < 2:
        return x
    return jax.lax.with_sharding_constraint(x, sequence_spec(x.ndim, cp_axis, batch))


def _guard_message(name, mesh_shape, cp_axis, spec) -> str:
    where = (
        f"the jitted computation was partitioned without the mesh axis '{cp_axis}' (mesh axes "
        f"{dict(mesh_shape) or '{}: one device'}), because its inputs carry no sharding over it"
        if cp_axis not in mesh_shape
        else f"its sharding {spec} does not split axis 1 over '{cp_axis}'"
    )
    return (
        f"{name} is not placed for context parallelism: {where}. TE alone stops here with a bare "
        f"'AssertionError: {cp_axis} is not a axis of the given mesh'. To fix, "
        + FIX.format(axis=cp_axis)
        + "."
    )


def _checked_sharding(name: str, cp_axis: str, mesh, arg_shapes):
    sharding = arg_shapes[0].sharding
    shape = dict(getattr(mesh, "shape", {}) or {})
    if cp_axis not in shape or not sharded_over(sharding, cp_axis, 1):
        raise ValueError(_guard_message(name, shape, cp_axis, getattr(sharding, "spec", sharding)))
    return sharding


def _guard_infer(mesh, arg_shapes, result_shape):
    del mesh, result_shape
    return arg_shapes[0].sharding


def _identity(x):
    return x


def _guard_partition(name: str, cp_axis: str, mesh, arg_shapes, result_shape):
    del result_shape
    sharding = _checked_sharding(name, cp_axis, mesh, arg_shapes)
    return mesh, _identity, sharding, (sharding,)


@functools.cache
def _guard(name: str, cp_axis: str, ndim: int):
    """An identity whose partition callback checks the sharding XLA settled on for one input.

    This runs where TE's own partitioner would assert (the placement was not visible when
    ``fused_attn`` was traced), and raises a ``ValueError`` that names the input and the fix.
    The callbacks are module-level functions bound with ``functools.partial`` (not closures),
    so the test run's compilation cache can name them and cache the programs that use them.
    """
    from jax.experimental.custom_partitioning import custom_partitioning

    ident = custom_partitioning(_identity)
    letters = " ".join(f"d{i}" for i in range(ndim))
    ident.def_partition(
        infer_sharding_from_operands=_guard_infer,
        partition=functools.partial(_guard_partition, name, cp_axis),
        sharding_rule=f"{letters} -> {letters}",
    )

    @jax.custom_vjp
    def guarded(x):
        return ident(x)

    guarded.defvjp(lambda x: (ident(x), None), lambda _, g: (g,))
    return guarded


def guard_placement(x, name: str, cp_axis: str):
    """``x`` through :func:`_guard` (arrays with a sequence axis only)."""
    if x is None or getattr(x, "size", 0) == 0 or getattr(x, "ndim", 0) < 2:
        return x
    return _guard(name, cp_axis, x.ndim)(x)
