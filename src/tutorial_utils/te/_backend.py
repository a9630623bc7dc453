"""Decide once, at import, which implementation ``tutorial_utils.te`` hands over to.

The same notebook cell must run real TE on a GPU node and TE's own Python everywhere else.
``TUTORIAL_TE_BACKEND`` chooses: ``auto`` (default: real TE if a GPU is visible and TE
imports, else TE-on-CPU, else the pure-JAX reference), ``te``, ``te-cpu`` or ``reference``.

:mod:`tutorial_utils.te_on_cpu` is imported inside the functions that use it: only the
``te-cpu`` backend needs it, and choosing real TE or the reference does not load it.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import version

from ..gpu import gpu_present, preload_te_libraries

_ENV = "TUTORIAL_TE_BACKEND"
CHOICES = ("auto", "te", "te-cpu", "reference")
REFERENCE_NAME = "reference (pure JAX, TE 2.20.2 semantics)"


def _te_version(module) -> str:
    try:
        return version("transformer-engine")
    except Exception:  # noqa: BLE001 - metadata missing in source builds
        return getattr(module, "__version__", "unknown")


def _import_real_te():
    # TE's libraries need NCCL, cuBLAS and cudart and carry no RPATH: load them first, so the
    # import works on either of TE's loader branches (gpu.preload_te_libraries)
    preload_te_libraries()
    return importlib.import_module("transformer_engine.jax")


def _import_te_on_cpu():
    from .. import te_on_cpu

    return te_on_cpu.install()


def _decide():
    """``(module or None, kind, why_not)`` where kind is 'te', 'te-cpu' or 'reference'."""
    choice = os.environ.get(_ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(
            f"{_ENV}={choice!r} is not one of {CHOICES}; unset it or pick one of those."
        )
    if choice == "reference":
        return None, "reference", ""
    if choice == "te" or (choice == "auto" and gpu_present()):
        try:
            return _import_real_te(), "te", ""
        except Exception as err:  # noqa: BLE001 - TE raises many kinds when CUDA/cuDNN are missing
            if choice == "te":
                raise ImportError(
                    f"{_ENV}=te but transformer_engine.jax failed to import ({err}). On a CUDA"
                    " machine run `make gpu-setup` (JAX first, then TE built against it; needs"
                    " cuDNN >= 9.12 and the CUDA headers), or unset the variable."
                ) from err
            return None, "reference", f"TE not used: {str(err).splitlines()[0][:160]}"
    try:
        return _import_te_on_cpu(), "te-cpu", ""
    except Exception as err:  # noqa: BLE001
        if choice == "te-cpu":
            raise ImportError(
                f"{_ENV}=te-cpu but TE's JAX code could not be loaded on CPU ({err}). Reinstall the"
                " package (`make venv`), which brings transformer-engine==2.20.2 and flax."
            ) from err
        return None, "reference", f"TE-on-CPU not used: {str(err).splitlines()[0][:160]}"


REAL_TE, BACKEND_KIND, WHY_NOT_TE = _decide()


def using_real_te() -> bool:
    """Whether real TransformerEngine runs, with cuDNN kernels (a GPU node).

    Lets a page say (or a test require) that its outputs came from real GPU kernels.

    Returns:
        True for the ``te`` backend.
    """
    return BACKEND_KIND == "te"


def using_te_code() -> bool:
    """Whether TE's own Python runs: real TE, or TE-on-CPU with the stand-in kernel.

    Only TE's own code shows TE's failure modes; the pure-JAX reference is more forgiving
    (it ignores token order).

    Returns:
        True for the ``te`` and ``te-cpu`` backends, False for ``reference``.
    """
    return REAL_TE is not None


def backend_kind() -> str:
    """The kind of backend ``tutorial_utils.te`` hands over to, as a short key.

    For code that branches on the backend; :func:`backend_name` is the readable form.

    Returns:
        ``'te'`` (real TE on a GPU), ``'te-cpu'`` (TE's JAX code on CPU) or ``'reference'``.
    """
    return BACKEND_KIND


def backend_name() -> str:
    """Which implementation produced the outputs, in words.

    Every executed page prints it (e.g. on its ``Backend:`` line), so a reader knows what
    produced the numbers.

    Returns:
        A description with TE's version and kernel, or the reference's name with the reason
        TE was not used, if there was one.
    """
    if BACKEND_KIND == "te":
        return f"TransformerEngine {_te_version(REAL_TE)} (real cuDNN kernels)"
    if BACKEND_KIND == "te-cpu":
        from ..te_on_cpu import BACKEND_DESCRIPTION

        return f"TransformerEngine {_te_version(REAL_TE)} ({BACKEND_DESCRIPTION})"
    return REFERENCE_NAME + (f" ({WHY_NOT_TE})" if WHY_NOT_TE else "")
