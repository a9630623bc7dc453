"""Device set-up and the one-line provenance every notebook prints.

XLA reads ``--xla_force_host_platform_device_count`` only when JAX starts its CPU backend, so
the flag is set before the first JAX computation (only when no GPU is visible); and every
executed output says which backend and devices produced it.

The facade, ``tutorial_utils.te``, is imported inside the functions that report the backend:
importing it picks the backend and imports TE, which must wait until :func:`setup_devices` has
run (JAX itself is imported with the package, which starts no backend).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import textwrap
from importlib.metadata import version

import jax

from tutorial_utils import te_on_cpu
from tutorial_utils.gpu import gpu_present, preload_te_libraries
from tutorial_utils.pages.plots.style import use_page_figures

__all__ = ["setup_devices", "gpu_present", "backend_line", "environment_record"]

_FLAG = "--xla_force_host_platform_device_count"


def setup_devices(num_cpu_devices: int = 4) -> None:
    """Give JAX ``num_cpu_devices`` simulated CPU devices unless a GPU is present, and, on
    CPU, load TE's JAX code with the stand-in kernel (:mod:`tutorial_utils.te_on_cpu`).

    In a notebook it also shows figures as SVG sized for the page
    (:func:`tutorial_utils.pages.plots.style.use_page_figures`).

    Must run before the first ``import jax``; raises if JAX is already initialised with
    fewer devices, because silently running CP on one device would teach nothing. A device
    count already set in ``XLA_FLAGS`` is the caller's choice (a 1-, 2- or 8-device run) and
    is kept; each page then says what it can do with that many.

    Why TE-on-CPU here: the pages import TE's own names (``import transformer_engine.jax``),
    as a model does; without a GPU that import needs the stand-in loaded first. Under
    ``TUTORIAL_TE_BACKEND=reference`` nothing is loaded.
    """
    if not isinstance(num_cpu_devices, int) or num_cpu_devices < 1:
        raise ValueError(f"num_cpu_devices must be a positive int, got {num_cpu_devices!r}.")
    use_page_figures()  # in a notebook: SVG figures sized for the page
    if gpu_present():
        preload_te_libraries()  # for the page's `import transformer_engine.jax`
        return
    flags = os.environ.get("XLA_FLAGS", "")
    chosen = (
        _FLAG in flags
    )  # the caller fixed the device count (e.g. a 1-, 2- or 8-device run): keep it
    if not chosen:
        os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={num_cpu_devices}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if not chosen:
        have = len(jax.devices())
        if have < num_cpu_devices and jax.default_backend() == "cpu":
            raise RuntimeError(
                f"JAX was imported before setup_devices() and sees {have} CPU device(s), not"
                f" {num_cpu_devices}. Restart the kernel and call setup_devices() (or set"
                f" XLA_FLAGS={_FLAG}={num_cpu_devices}) before importing jax."
            )
    if os.environ.get("TUTORIAL_TE_BACKEND", "auto").strip().lower() in ("", "auto", "te-cpu"):
        te_on_cpu.install()  # TE's Python, with a CPU kernel in place of cuDNN


def _devices_summary():
    devs = jax.devices()
    kinds = sorted({d.device_kind for d in devs})
    return jax.default_backend(), len(devs), ", ".join(kinds)


def backend_line(workload=None) -> str:
    """``Backend: ...`` and ``Devices: ... | preset: ...``: print it at the top of every notebook.

    Args:
        workload: the page's workload, whose CP size and preset are added when given.

    Returns:
        Two lines (three with one device, which says why there is no CP).
    """
    from tutorial_utils import te

    platform_name, count, kinds = _devices_summary()
    simulated = " (simulated host devices)" if platform_name == "cpu" and count > 1 else ""
    # two short lines, so that neither is wider than a page's output box
    line = f"Backend: {te.backend_name()}\nDevices: {count} x {platform_name} [{kinds}]{simulated}"
    if workload is not None:
        line += f" | cp: {workload.cp_size} | preset: {workload.name}"
        if workload.cp_size == 1:
            line += "\n" + textwrap.fill(
                "Only one device, so CP size 1: every CP call below runs without context"
                " parallelism (still correct). To see CP on this machine, run on simulated CPU"
                " devices with TE-on-CPU:",
                width=88,
            )
            line += "\n  CUDA_VISIBLE_DEVICES= XLA_FLAGS=--xla_force_host_platform_device_count=4"
    return line


def _pkg_version(name: str):
    try:
        return version(name)
    except Exception:  # noqa: BLE001 - absent package
        return None


def _first_version(*names):
    """Version of the first installed package among ``names`` (cu13 and cu12 wheels differ in
    name)."""
    for name in names:
        ver = _pkg_version(name)
        if ver:
            return f"{ver} ({name})"
    return None


def environment_record() -> dict:
    """Hardware and software facts to store with every benchmark record."""
    from tutorial_utils import te

    platform_name, count, kinds = _devices_summary()
    rec = {
        "backend": te.backend_name(),
        "backend_kind": te.backend_kind(),
        "platform": platform_name,
        "device_count": count,
        "device_kind": kinds,
        "simulated_devices": platform_name == "cpu" and count > 1,
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": _pkg_version("jaxlib"),
        "transformer_engine": (
            _pkg_version("transformer-engine") or _pkg_version("transformer_engine")
        ),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    if platform_name == "gpu":
        smi = shutil.which("nvidia-smi")
        if smi:
            out = subprocess.run(
                [smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
            )
            rec["gpu"] = out.stdout.strip()
        rec["cuda"] = _first_version(
            "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12"
        )
        rec["cudnn"] = _first_version("nvidia-cudnn-cu13", "nvidia-cudnn-cu12")
        rec["cudnn_frontend"] = _pkg_version("nvidia-cudnn-frontend")
    return rec
