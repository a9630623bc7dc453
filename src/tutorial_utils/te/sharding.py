"""``MeshResource`` and the global mesh-resource guard, as in ``transformer_engine.jax.sharding``.

TE finds the context-parallel mesh axis through a global ``MeshResource``; the reference
backend finds it the same way, so the same user code shards the same way.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import jax

from ._backend import REAL_TE

try:  # JAX's private home of the ``with mesh:`` context; if it moves, only that lookup is lost
    from jax._src.mesh import thread_resources
except ImportError:
    thread_resources = None

__all__ = [
    "MeshResource",
    "global_shard_guard",
    "global_mesh_resource",
    "active_mesh",
    "cp_axis_and_size",
]

if REAL_TE is not None:  # hand over to the real thing
    from transformer_engine.jax.sharding import (  # noqa: F401
        MeshResource,
        global_mesh_resource,
        global_shard_guard,
    )
else:

    @dataclasses.dataclass
    class MeshResource:
        """Names of the mesh axes used for each kind of parallelism (``None`` = unused).

        TE's class, for the reference backend. Field order matches TE: positional
        ``MeshResource("dp", "cp")`` would put ``"cp"`` on ``tp_resource``. Use keywords.

        Attributes:
            dp_resource: Data-parallel axis (shards the batch).
            tp_resource: Tensor-parallel axis.
            tpsp_resource: Tensor-sequence-parallel axis.
            fsdp_resource: Fully-sharded data-parallel axis (shards the batch).
            pp_resource: Pipeline-parallel axis.
            cp_resource: Context-parallel axis (shards the sequence).
            ep_resource: Expert-parallel axis.
        """

        dp_resource: str = None
        tp_resource: str = None
        tpsp_resource: str = None
        fsdp_resource: str = None
        pp_resource: str = None
        cp_resource: str = None
        ep_resource: str = None

    _GLOBAL = None

    @contextmanager
    def global_shard_guard(resource: MeshResource):
        """Set the global ``MeshResource`` for the duration of the block.

        TE's attention reads the CP axis from it; the previous value is restored on exit.

        Args:
            resource: The ``MeshResource`` to make global, or ``None``.

        Returns:
            A context manager.

        Raises:
            ValueError: If ``resource`` is neither a ``MeshResource`` nor ``None``.
        """
        global _GLOBAL
        if resource is not None and not isinstance(resource, MeshResource):
            raise ValueError(
                f"resource must be a MeshResource, got {resource!r}; build one with"
                " MeshResource(cp_resource='cp')."
            )
        old = _GLOBAL
        _GLOBAL = resource
        try:
            yield
        finally:
            _GLOBAL = old

    def global_mesh_resource() -> MeshResource:
        """The global ``MeshResource`` set by :func:`global_shard_guard`.

        Returns:
            The active ``MeshResource``.

        Raises:
            ValueError: If none was set (TE asserts there).
        """
        if _GLOBAL is None:
            raise ValueError(
                "No global MeshResource is set. Wrap the call in `with"
                " te.autocast(mesh_resource=MeshResource(cp_resource='cp')):` or pass"
                " context_parallel_axis='cp' explicitly."
            )
        return _GLOBAL


def active_mesh():
    """The mesh made active with ``jax.set_mesh(mesh)`` or ``with mesh:``.

    TE's partitioner uses that mesh, so the facade looks up the CP axis on it too.

    Returns:
        The abstract mesh set with ``jax.set_mesh``, else the physical mesh of a
        ``with mesh:`` block, else ``None``.
    """
    abstract = jax.sharding.get_abstract_mesh()
    if abstract is not None and not getattr(abstract, "empty", False) and abstract.axis_names:
        return abstract
    if thread_resources is None:
        return None
    try:
        physical = thread_resources.env.physical_mesh
        if physical is not None and not physical.empty:
            return physical
    except Exception:  # noqa: BLE001 - private API moved
        pass
    return None


def cp_axis_and_size(context_parallel_axis: str = ""):
    """Find the CP axis as TE does: the explicit name, else ``MeshResource.cp_resource``.

    TE reads the global ``MeshResource`` only under an active mesh; doing the same means the
    facade shards exactly when TE would.

    Args:
        context_parallel_axis: The axis name passed to ``fused_attn``; empty to look it up.

    Returns:
        ``(mesh, axis, size)``: the active mesh (or ``None``), the CP axis name (``""`` when
        there is none) and its size (1 without CP).

    Raises:
        ValueError: If an axis is named but no mesh is active, or the active mesh has no axis
            of that name.
    """
    mesh = active_mesh()
    axis = context_parallel_axis
    if not axis and mesh is not None:
        try:
            axis = global_mesh_resource().cp_resource or ""
        except (ValueError, AssertionError):
            axis = ""
    if not axis:
        return mesh, "", 1
    if mesh is None:
        raise ValueError(
            f"context_parallel_axis={axis!r} but no mesh is active; call inside `with"
            " jax.set_mesh(mesh):` (and jit with explicit in_shardings) so the sequence can be"
            " sharded."
        )
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    if axis not in sizes:
        raise ValueError(
            f"context_parallel_axis={axis!r} is not an axis of the active mesh (axes"
            f" {tuple(sizes)}); use one of them."
        )
    return mesh, axis, int(sizes[axis])


def batch_axes(mesh):
    """Mesh axes that shard the batch: ``MeshResource.dp_resource`` and ``fsdp_resource``.

    The facade pins the sequence axis to the CP axis and must keep the batch axis where the
    user's data-parallel sharding puts it.

    Args:
        mesh: The active mesh, or ``None``.

    Returns:
        ``None`` (batch replicated), one axis name, or a tuple of names, ready for a
        ``PartitionSpec``; axes of size 1 are left out.
    """
    if mesh is None:
        return None
    try:
        resource = global_mesh_resource()
    except (ValueError, AssertionError):
        return None
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    names = [n for n in (resource.dp_resource, resource.fsdp_resource) if n and sizes.get(n, 1) > 1]
    if not names:
        return None
    return names[0] if len(names) == 1 else tuple(names)
