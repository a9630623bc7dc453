"""Is an NVIDIA GPU visible? Answered without starting JAX.

Whether to simulate CPU devices and which TE backend to use must both be decided before
JAX starts, and both depend on this answer; TE's library preloads live here too.

JAX is imported only inside :func:`jax_started` and :func:`gpu_present`, and only once it is
already loaded: this module answers before JAX, and never imports it itself.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "default_cudnn_home",
    "gpu_present",
    "jax_started",
    "nccl_library",
    "pip_cudnn_home",
    "preload_nccl",
    "preload_te_libraries",
]


def jax_started() -> bool:
    """Whether JAX has created its backends; importing JAX alone does not start them.

    XLA reads the simulated-device flag when the backends start, not at ``import jax``, and
    this package imports JAX, so "is JAX imported?" is the wrong question for device set-up.

    Returns:
        True once the backends exist (or when JAX's private API has moved and it cannot
        tell: the answer that never simulates devices too late).
    """
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except Exception:  # noqa: BLE001 - private API moved: assume started (the answer that never simulates late)
        return True


def _cuda_plugin_installed() -> bool:
    names = (
        "jax_cuda12_plugin",
        "jax_cuda13_plugin",
        "jax_plugins.xla_cuda12",
        "jax_plugins.xla_cuda13",
    )
    for name in names:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except ModuleNotFoundError:  # a missing parent package (jax_plugins)
            continue
    return False


def gpu_present() -> bool:
    """Whether an NVIDIA GPU is visible, asked without starting JAX.

    Device set-up must happen before JAX starts, so the driver is asked: ``nvidia-smi -L``,
    or, where ``nvidia-smi`` is not on the PATH, an NVIDIA device node plus JAX's CUDA
    plugin. If JAX's backends are already running, JAX itself is asked.

    Returns:
        True when a GPU is visible; False also when ``CUDA_VISIBLE_DEVICES`` hides them all.
    """
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    if jax_started():  # asking a JAX that has not started would start it, before any device set-up
        import jax

        try:
            return any(d.platform == "gpu" for d in jax.devices())
        except RuntimeError:
            return False
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
            if out.returncode == 0 and "GPU" in out.stdout:
                return True
        except (OSError, subprocess.TimeoutExpired):
            pass
    has_node = any(os.path.exists(f"/dev/nvidia{i}") for i in range(16))
    return has_node and _cuda_plugin_installed()


# ----------------------------------------------------------------------------- NCCL before TE


def _site_dirs() -> list[str]:
    dirs = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")] + [
        p for p in sys.path if p
    ]
    return list(dict.fromkeys(d for d in dirs if d and os.path.isdir(d)))


def _nvidia_dirs(sites: Sequence[str] | None) -> list[Path]:
    return [
        Path(s) / "nvidia"
        for s in (_site_dirs() if sites is None else sites)
        if (Path(s) / "nvidia").is_dir()
    ]


def nccl_library(sites: Sequence[str] | None = None) -> Path | None:
    """Find ``libnccl.so.2`` from pip's NCCL wheel.

    TE's libraries need NCCL but carry no RPATH, so :func:`preload_nccl` must find it first.

    Args:
        sites: Directories to search (each for ``nvidia/nccl/lib`` or the
            ``nvidia/cu13|cu12/lib`` layout); default: this interpreter's site directories
            and ``sys.path``.

    Returns:
        Path of the library, or ``None`` when pip's NCCL is not installed.
    """
    for nv in _nvidia_dirs(sites):
        for sub in ("nccl", "cu13", "cu12"):
            lib = nv / sub / "lib" / "libnccl.so.2"
            if lib.is_file():
                return lib
    return None


def pip_cudnn_home(sites: Sequence[str] | None = None) -> Path | None:
    """Find pip's cuDNN (``nvidia/cudnn``), the one JAX's CUDA plugin loads.

    TE loads ``$CUDNN_HOME``'s cuDNN first, then a CUDA toolkit's, then ``libcudnn.so`` on the
    loader path (the system's, through ``ldconfig``), and pip's only last: on a node with an
    older system cuDNN TE and JAX would run two cuDNNs, and TE's the older one.

    Args:
        sites: Directories to search, as :func:`nccl_library`.

    Returns:
        The folder to give TE as ``CUDNN_HOME``, or ``None`` when pip's cuDNN is not installed.
    """
    for nv in _nvidia_dirs(sites):
        for root in (nv / "cudnn", nv / "cu13" / "cudnn", nv / "cu12" / "cudnn"):
            if any((root / "lib").glob("libcudnn.so.*")):
                return root
    return None


def default_cudnn_home(env, sites: Sequence[str] | None = None) -> None:
    """Point ``env["CUDNN_HOME"]`` at pip's cuDNN (:func:`pip_cudnn_home`) unless it is set.

    Args:
        env: The environment to change: ``os.environ``, or a child process's ``dict``.
        sites: Directories to search, as :func:`nccl_library`.
    """
    if not env.get("CUDNN_HOME") and (home := pip_cudnn_home(sites)):
        env["CUDNN_HOME"] = str(home)


def preload_nccl(sites: Sequence[str] | None = None) -> str | None:
    """Load pip's ``libnccl.so.2`` into the process (``RTLD_GLOBAL``) before TE's libraries load.

    ``libtransformer_engine.so`` and TE's JAX extension need ``libnccl.so.2`` and carry no
    RPATH; they load only if NCCL is already in the process (JAX's CUDA plugin loads it when
    its backend starts) or on the loader path. Call this before ``import transformer_engine.jax``.

    Args:
        sites: Directories to search, as :func:`nccl_library`.

    Returns:
        The path loaded, or ``None`` when pip's NCCL is not installed (a system NCCL on the
        loader path then serves).
    """
    lib = nccl_library(sites)
    if lib is None:
        return None
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    return str(lib)


# TE's core library needs these too and has no RUNPATH; TE preloads them from pip itself only
# when it finds no system NVRTC or cuRAND (its ``load_libs_for_no_ctk``), so a node with a system
# ``nvcc`` but pip's cuBLAS fails with "libcublas.so.13: cannot open shared object file".
_TE_RUNTIME = ("libcudart.so", "libcublasLt.so", "libcublas.so")


def preload_te_libraries(sites: Sequence[str] | None = None) -> list[str]:
    """Load what TE's libraries need before ``import transformer_engine.jax``.

    On either of TE's loader branches: pip's NCCL, then cudart, cuBLASLt and cuBLAS, each from
    the loader path when it has them (a system copy wins, as in TE's own order), else from
    pip's wheels.

    Unless ``CUDNN_HOME`` is set, it is pointed at pip's cuDNN (:func:`default_cudnn_home`), so
    that TE uses the cuDNN JAX uses rather than an older system copy.

    Args:
        sites: Directories to search, as :func:`nccl_library`.

    Returns:
        The libraries loaded from pip, by path (empty when the loader path had them all or
        pip's CUDA wheels are not installed: TE's own loader then decides).
    """
    default_cudnn_home(os.environ, sites)
    loaded = [lib] if (lib := preload_nccl(sites)) else []
    for stem in _TE_RUNTIME:
        candidates = sorted(
            (f for nv in _nvidia_dirs(sites) for f in nv.glob(f"*/lib/{stem}.1[0-9]")),
            reverse=True,  # the newest major version first
        )
        for path in candidates:
            try:
                ctypes.CDLL(path.name, mode=ctypes.RTLD_GLOBAL)  # on the loader path already
            except OSError:
                ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
                loaded.append(str(path))
            break
    return loaded
