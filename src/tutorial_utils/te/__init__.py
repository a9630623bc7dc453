"""Drop-in for ``import transformer_engine.jax as te``: ``import tutorial_utils.te as te``.

Real TE on a GPU node; elsewhere TE's same JAX code with a CPU kernel in place of cuDNN, so
the chapters run anywhere. ``fused_attn`` adds static checks for inputs TE would silently get
wrong; ``te.backend_name()`` says which implementation produced your outputs.
"""

from __future__ import annotations

from contextlib import contextmanager

from . import attention, sharding  # noqa: F401
from ._backend import (
    REAL_TE,
    backend_kind,
    backend_name,
    using_real_te,
    using_te_code,
)  # noqa: F401
from .sharding import MeshResource  # noqa: F401

__all__ = [
    "attention",
    "sharding",
    "autocast",
    "MeshResource",
    "backend_name",
    "backend_kind",
    "using_real_te",
    "using_te_code",
]

if REAL_TE is not None:
    autocast = REAL_TE.autocast
else:

    @contextmanager
    def autocast(enabled: bool = False, recipe=None, mesh_resource: MeshResource | None = None):
        """Set the global ``MeshResource`` for the block, as ``te.autocast`` does.

        The reference backend's stand-in for TE's ``autocast``: TE finds the CP axis through
        the global ``MeshResource``, so the same user code works on both backends. FP8/FP4
        quantisation is not part of the reference.

        Args:
            enabled: Must be False (no FP8/FP4 in the reference).
            recipe: Must be ``None``.
            mesh_resource: The mesh axis names to use; default an empty ``MeshResource()``.

        Returns:
            A context manager; the ``MeshResource`` is set inside its block.

        Raises:
            ValueError: If ``enabled`` is true or a ``recipe`` is given.
        """
        if enabled or recipe is not None:
            raise ValueError(
                f"autocast(enabled={enabled}, recipe={recipe!r}): FP8/FP4 recipes need real TE on a"
                " GPU; the reference backend supports enabled=False, recipe=None."
            )
        with sharding.global_shard_guard(
            mesh_resource if mesh_resource is not None else MeshResource()
        ):
            yield
