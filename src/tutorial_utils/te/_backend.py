"""Decide once whether ``tutorial_utils.te`` hands over to real TransformerEngine.

Why: the same notebook cell must run real TE on a GPU node and the pure-JAX reference
everywhere else. ``TUTORIAL_TE_BACKEND`` forces a choice: ``auto`` (default: real TE when
``transformer_engine.jax`` imports *and* an NVIDIA GPU is visible), ``reference`` or ``te``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

from ..runtime import gpu_present

_ENV = "TUTORIAL_TE_BACKEND"
_CHOICES = ("auto", "reference", "te")
REFERENCE_NAME = "reference (pure JAX, TE 2.20.2 semantics)"


def _decide():
    choice = os.environ.get(_ENV, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"{_ENV}={choice!r} is not one of {_CHOICES}; unset it or pick one of those.")
    if choice == "reference":
        return None
    if choice == "auto" and (not gpu_present() or importlib.util.find_spec("transformer_engine") is None):
        return None
    try:
        return importlib.import_module("transformer_engine.jax")
    except Exception as err:  # noqa: BLE001 - TE raises many kinds when CUDA is missing
        if choice == "te":
            raise ImportError(
                f"{_ENV}=te but transformer_engine.jax failed to import ({err!r}). On a CUDA machine run `make gpu-setup` "
                "(JAX first, then TE built against it; needs the CUDA toolkit headers and cuDNN), or unset the variable."
            ) from err
        return None


REAL_TE = _decide()


def using_real_te() -> bool:
    return REAL_TE is not None


def backend_name() -> str:
    """``'TransformerEngine <version> (real kernels)'`` or the reference's name."""
    if REAL_TE is None:
        return REFERENCE_NAME
    try:
        from importlib.metadata import version

        ver = version("transformer-engine")
    except Exception:  # noqa: BLE001
        ver = getattr(REAL_TE, "__version__", "unknown")
    return f"TransformerEngine {ver} (real cuDNN kernels)"
