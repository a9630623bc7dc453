"""Drop-in for ``import transformer_engine.jax as te``: ``import tutorial_utils.te as te``.

``te.attention``, ``te.sharding``, ``te.autocast`` and ``te.MeshResource`` are TE's own objects
when real TransformerEngine imports and a GPU is present, and the pure-JAX reference
otherwise. ``te.backend_name()`` says which one produced your outputs.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

from . import attention, sharding  # noqa: F401
from ._backend import REAL_TE, backend_name, using_real_te  # noqa: F401
from .sharding import MeshResource  # noqa: F401

__all__ = ["attention", "sharding", "autocast", "MeshResource", "backend_name", "using_real_te"]

if REAL_TE is not None:
    autocast = REAL_TE.autocast
else:

    @contextmanager
    def autocast(enabled: bool = False, recipe=None, mesh_resource: Optional[MeshResource] = None):
        """Set the global ``MeshResource`` (FP8/FP4 quantisation is not part of the reference)."""
        if enabled or recipe is not None:
            raise ValueError(f"autocast(enabled={enabled}, recipe={recipe!r}): FP8/FP4 recipes need real TE on a GPU; "
                             "the reference backend supports enabled=False, recipe=None.")
        with sharding.global_shard_guard(mesh_resource if mesh_resource is not None else MeshResource()):
            yield
