"""What the ``cp-bench/1`` record of ``python -m tutorial_utils.cli.bench`` says beyond the
timings: its label, its config, its notes, the GPU's versions, its file name, and the summary
the command prints.

The record itself is made and written by :mod:`tutorial_utils.perfmodel.timing` and
:mod:`tutorial_utils.perfmodel.records`.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as _dt
import re
import sys

import jax

from tutorial_utils.cli.bench_cases import window_tuple
from tutorial_utils.cli.bench_emulation import REFERENCE_KERNEL_XLA_OPTIONS
from tutorial_utils.cli.gpu_cuda import decode_cudnn_version, loaded_path

try:  # private; moved between JAX versions
    from jax._src.lib import cuda_versions
except Exception:  # noqa: BLE001 - best effort
    cuda_versions = None

__all__ = [
    "gpu_versions",
    "record_label",
    "record_config",
    "record_notes",
    "record_file_name",
    "summary",
]


def _loaded_cudnn() -> tuple[tuple[int, int, int] | None, str | None]:
    """The cuDNN this process has loaded: ``cudnnGetVersion`` of real TE's extension (the
    library TE calls), else of the ``libcudnn.so`` in the process's maps, through ctypes."""
    ext = sys.modules.get("transformer_engine_jax")
    if ext is not None and hasattr(ext, "get_cudnn_version"):
        try:
            return decode_cudnn_version(int(ext.get_cudnn_version())), "transformer_engine_jax"
        except Exception:  # noqa: BLE001 - the CPU stand-in raises
            pass
    path = loaded_path("libcudnn.so.9") or loaded_path("libcudnn.so.8")
    if path is None:
        return None, None
    try:
        fn = ctypes.CDLL(path).cudnnGetVersion
    except (OSError, AttributeError):
        return None, None
    fn.restype = ctypes.c_size_t
    return decode_cudnn_version(int(fn())), path


def _compiled_frontend() -> tuple[int, int, int] | None:
    """The cudnn-frontend TE's extension was compiled with (its ``CUDNN_FRONTEND_VERSION``, which
    ``get_cudnn_frontend_version`` returns: 13200 for 1.32.0)."""
    ext = sys.modules.get("transformer_engine_jax")
    try:
        v = int(ext.get_cudnn_frontend_version())
    except Exception:  # noqa: BLE001 - no real TE, or the CPU stand-in
        return None
    return (v // 10000, v // 100 % 100, v % 100)


def gpu_versions() -> dict:
    """cuDNN / CUDA versions as JAX's CUDA plugin reports them, plus compute capability, and the
    cuDNN and cudnn-frontend that TE runs with (empty off GPU).

    ``cudnn`` is the loaded library's ``cudnnGetVersion`` (not a package's metadata: a system
    cuDNN may be the one loaded), ``cudnn_frontend`` the version compiled into TE's extension
    (the pip package is only a build dependency); each with its source.

    Returns:
        ``compute_capability``, ``cudnn_version``, ``cuda_runtime_version`` and
        ``cuda_driver_version``, those that JAX knows; ``cudnn`` and ``cudnn_frontend`` with
        ``cudnn_source`` and ``cudnn_frontend_source`` when found.
    """
    out = {}
    try:
        devs = jax.devices()
        if devs and devs[0].platform == "gpu":
            cc = getattr(devs[0], "compute_capability", None)
            if cc is not None:
                out["compute_capability"] = str(cc)
            try:
                if cuda_versions is not None:
                    for key, fn in (
                        ("cudnn_version", "cudnn_get_version"),
                        ("cuda_runtime_version", "cuda_runtime_get_version"),
                        ("cuda_driver_version", "cuda_driver_get_version"),
                    ):
                        if hasattr(cuda_versions, fn):
                            out[key] = getattr(cuda_versions, fn)()
            except Exception:  # noqa: BLE001 - best effort
                pass
            cudnn, source = _loaded_cudnn()
            if cudnn is not None:
                out["cudnn"], out["cudnn_source"] = ".".join(map(str, cudnn)), source
            frontend = _compiled_frontend()
            if frontend is not None:
                out["cudnn_frontend"] = ".".join(map(str, frontend))
                out["cudnn_frontend_source"] = "transformer_engine_jax (compiled in)"
    except Exception:  # noqa: BLE001
        pass
    return out


def record_label(
    args: argparse.Namespace, preset: str, cp: int, device_kind: str, emulate: bool
) -> str:
    """``--label``, else the preset, the devices and the ranks emulated.

    Args:
        args: The parsed flags.
        preset: The workload preset.
        cp: The CP size (ranks, real or emulated).
        device_kind: JAX's name of the device, e.g. ``NVIDIA H200``.
        emulate: Whether the ranks were emulated on one device.

    Returns:
        The label.
    """
    n_dev = 1 if emulate else cp  # devices the CP mesh used (not all the visible ones)
    return args.label or (
        f"{preset} on {n_dev}x {device_kind}" + (f", {cp} ranks emulated" if emulate else "")
    )


def record_config(
    args: argparse.Namespace,
    wl,
    *,
    preset: str,
    windows: list[int],
    stripes: list[int],
    kernel: str,
    link_gbps: float,
    link_source: str,
) -> dict:
    """The record's ``config``: the workload and what the flags chose.

    Args:
        args: The parsed flags.
        wl: The workload timed.
        preset: The workload preset.
        windows: The left windows timed (``-1`` for full causal).
        stripes: The AllGather stripes timed.
        kernel: The kernel that timed the rows (``te`` or ``reference``).
        link_gbps: The link bandwidth of the emulated prediction.
        link_source: Where ``link_gbps`` came from.

    Returns:
        The config dictionary.
    """
    emulate = args.emulate_ranks is not None
    config = wl.as_dict()
    config.update(
        {
            "preset": preset,
            "window": list(window_tuple(windows[0])) if len(windows) == 1 else None,
            "windows": [list(window_tuple(w)) for w in windows],
            "stripes": stripes,
            "strategies": list(args.strategies),
            "emulate_ranks": args.emulate_ranks,
            "kernel": kernel,
            "seed": args.seed,
            "timed": (
                "jax.jit(jax.value_and_grad(vdot(out, dout))) w.r.t. (q, k, v): forward + backward"
            ),
        }
    )
    if emulate:
        config.update({"link_gbps": link_gbps, "link_gbps_source": link_source})
        if (
            kernel == "reference"
        ):  # compiled with these, whatever XLA_FLAGS in the record's environment says
            config["reference_kernel_xla_options"] = dict(REFERENCE_KERNEL_XLA_OPTIONS)
    return config


def record_notes(
    *,
    emulate: bool,
    cp: int,
    device_kind: str,
    kernel: str,
    link_gbps: float,
    platform: str,
    skipped: list[dict],
    failures: list[dict],
) -> str:
    """The record's ``notes``: emulation, CPU timings, skipped and failed cases.

    Args:
        emulate: Whether the ranks were emulated on one device.
        cp: The CP size.
        device_kind: JAX's name of the device.
        kernel: The kernel that timed the emulated sub-problems.
        link_gbps: The link bandwidth of the emulated prediction.
        platform: JAX's backend, ``gpu`` or ``cpu``.
        skipped: The cases TE's rules skipped, with the reason.
        failures: The cases that raised.

    Returns:
        The notes, one sentence per point.
    """
    notes = []
    if emulate:
        notes.append(
            f"emulated: each of {cp} ranks' sub-problems was timed one at a time on ONE"
            f" {device_kind} ({kernel} kernel); CP rows are predictions (slowest rank +"
            f" communication at {link_gbps:g} GB/s), not measurements on several devices."
        )
    if platform != "gpu":
        notes.append(
            "CPU timings of the pure-JAX reference: they show relative costs only, not GPU"
            " performance."
        )
    if skipped:
        notes.append(
            "skipped: "
            + "; ".join(f"{s['strategy']} window={s['window']}: {s['reason']}" for s in skipped)
        )
    if failures:
        notes.append(f"{len(failures)} case(s) failed; see 'failures'.")
    return " ".join(notes)


def record_file_name(source: str, label: str) -> str:
    """``<source>-<label as a slug>-<UTC time>.json``, the name when ``--name`` is not given.

    Args:
        source: The record's source, e.g. ``cpu-reference``.
        label: The record's label.

    Returns:
        The file name.
    """
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    slug = re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-").lower() or "bench"
    return f"{source}-{slug}-{stamp}.json"


def summary(record: dict) -> str:
    """The lines the command prints: one per timed row, one per failed case.

    Args:
        record: The ``cp-bench/1`` record.

    Returns:
        The summary text.
    """
    lines = [f"{record['label']} [{record['source']}]"]
    for r in record["results"]:
        st = "" if r.get("stripe_size") is None else f" stripe={r['stripe_size']}"
        extra = f" speedup={r['speedup']:.2f}x" if "speedup" in r else ""
        em = " (emulated)" if r.get("emulated") else ""
        lines.append(
            f"  {r['strategy']:<9}{st:<12} window={r['window'][0]:<6} {r['mean_ms']:10.3f} ms "
            f"{r['tflops']:9.3f} TFLOP/s{extra}{em}"
        )
    for f in record.get("failures", []):
        lines.append(
            f"  FAILED {f['strategy']} stripe={f['stripe_size']} window={f['window']}:"
            f" {f['error'][:200]}"
        )
    return "\n".join(lines)
