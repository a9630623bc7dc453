"""Where CP inputs live: TE's partitioner reads it, so the facade checks and pins it.

TE 2.20.2's context-parallel ``fused_attn`` decides *what each rank computes* from the
shardings its partitioner is handed, not from the arrays' values: misplaced inputs give
wrong outputs or bare assertions (shown on TE's own code in ``tests/te/test_placement.py``).
"""

from __future__ import annotations

import functools

import jax
from jax.experimental.custom_partitioning import custom_partitioning
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

    Only a visible placement can be checked before TE's call; the rest is left to
    :func:`guard_placement` at partitioning time.

    Args:
        x: Any value; a concrete ``jax.Array`` or a tracer may carry a sharding.

    Returns:
        A concrete array's ``.sharding``; a tracer's type's sharding, but only when the mesh
        axes are ``Explicit`` (under the default ``Auto`` axes a tracer's type says nothing
        about where its data will be); otherwise ``None``.
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
    """Whether ``sharding`` splits dimension ``dim`` over the mesh axis ``axis``.

    The one test behind both placement checks: the sequence must be split over the CP axis.

    Args:
        sharding: Any sharding; only a ``NamedSharding`` can qualify.
        axis: Mesh axis name.
        dim: Array dimension.

    Returns:
        True when ``axis`` is (one of) the mesh axes of ``dim`` in the sharding's spec.
    """
    spec = getattr(sharding, "spec", None)
    if not isinstance(sharding, NamedSharding) or spec is None or len(spec) <= dim:
        return False
    entry = spec[dim]
    names = entry if isinstance(entry, tuple) else (entry,)
    return axis in names


def check_placement(arrays, *, cp_axis: str, cp_size: int) -> None:
    """Refuse inputs whose visible sharding leaves the sequence unsplit over the CP axis.

    Called eagerly with q/k/v not sharded over the CP axis, TE returns a wrong output and no
    error; this names the input and the fix instead. Size-0 placeholders and arrays whose
    placement is not visible are skipped (:func:`pin_sequence` takes care of those).

    Args:
        arrays: Maps a name (``"q"``, ``"sequence_descriptor.segment_ids[0]"``, ...) to an
            array whose axis 1 is the sequence.
        cp_axis: Name of the CP mesh axis.
        cp_size: Its size; with 1 nothing is checked.

    Returns:
        None.

    Raises:
        ValueError: If an input's visible sharding does not split axis 1 over ``cp_axis``.
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
    """The partition spec that puts an array's sequence axis on the CP axis.

    Other axes are left unconstrained so that XLA keeps (e.g.) a head sharding it chose.

    Args:
        ndim: Rank of the array, at least 2.
        cp_axis: Name of the CP mesh axis.
        batch: Mesh axis (or axes) for the batch, or ``None`` to replicate it.

    Returns:
        ``P(batch, cp_axis, P.UNCONSTRAINED, ...)`` for an array ``[batch, seq, ...]``.
    """
    return P(batch, cp_axis, *([P.UNCONSTRAINED] * (ndim - 2)))


def pin_sequence(x, cp_axis: str, batch):
    """Constrain ``x``'s sequence axis to ``cp_axis`` (and its batch axis to ``batch``).

    Under ``jax.jit``, an input whose sharding XLA must infer (e.g. reordered inside the jit)
    can reach TE's partitioner unsharded, or as a sharding with no name over the mesh; both
    stop TE with a bare assertion. Pinned inputs and output avoid that, and the constraint on
    the output also constrains its cotangent (dO). The spec is a bare ``PartitionSpec``: it
    refers to the mesh made active with ``jax.set_mesh`` (or ``with mesh:``), the one TE's
    partitioner uses.

    Args:
        x: Array ``[batch, seq, ...]``; ``None``, size-0 placeholders and 1-D arrays
            (``seqlens``) pass unchanged.
        cp_axis: Name of the CP mesh axis.
        batch: Mesh axis (or axes) for the batch, or ``None``.

    Returns:
        ``x`` under ``jax.lax.with_sharding_constraint``, or ``x`` itself.
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
    """Pass ``x`` through an identity that checks its sharding when XLA partitions.

    Where the placement was not visible when ``fused_attn`` was traced, TE's own partitioner
    would stop with a bare ``AssertionError: cp is not a axis of the given mesh``; the guard
    runs first and names the input and the fix.

    Args:
        x: Array ``[batch, seq, ...]``; ``None``, size-0 placeholders and 1-D arrays pass
            unchanged.
        name: The input's name for the error message, e.g. ``"q"``.
        cp_axis: Name of the CP mesh axis.

    Returns:
        ``x`` (through the guard when it has a sequence axis); the gradient passes unchanged.

    Raises:
        ValueError: At partitioning time, if the sharding XLA settled on does not split axis
            1 over ``cp_axis``.
    """
    if x is None or getattr(x, "size", 0) == 0 or getattr(x, "ndim", 0) < 2:
        return x
    return _guard(name, cp_axis, x.ndim)(x)
