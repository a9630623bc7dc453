"""Drop-in for ``import transformer_engine.jax as te``: ``import tutorial_utils.te as te``.

On a GPU node with TransformerEngine installed, ``te.attention``, ``te.sharding``,
``te.autocast`` and ``te.MeshResource`` come from real TE. On a machine without CUDA they come
from TE's same JAX code, with :mod:`tutorial_utils.te_on_cpu`'s reference kernel in place of
cuDNN. ``fused_attn`` is TE's, behind a few static checks for inputs TE would silently get
wrong. ``TUTORIAL_TE_BACKEND=reference`` selects the pure-JAX re-implementation instead.
``te.backend_name()`` says which one produced your outputs.
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
        """Set the global ``MeshResource`` (FP8/FP4 quantisation is not part of the reference)."""
        if enabled or recipe is not None:
            raise ValueError(
                f"autocast(enabled={enabled}, recipe={recipe!r}): FP8/FP4 recipes need real TE on a"
                " GPU; the reference backend supports enabled=False, recipe=None."
            )
        with sharding.global_shard_guard(
            mesh_resource if mesh_resource is not None else MeshResource()
        ):
            yield
