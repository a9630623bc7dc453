"""What the ``cp-bench/1`` record of ``python -m tutorial_utils.cli.bench`` says beyond the
timings: its label, its config, its notes, the GPU's versions, its file name, and the summary
the command prints.

The record itself is made and written by :mod:`tutorial_utils.perfmodel.timing` and
:mod:`tutorial_utils.perfmodel.records`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import re

import jax

from tutorial_utils.cli.bench_cases import window_tuple
from tutorial_utils.cli.bench_emulation import REFERENCE_KERNEL_XLA_OPTIONS

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


def gpu_versions() -> dict:
    """cuDNN / CUDA versions as JAX's CUDA plugin reports them, plus compute capability (empty off
    GPU).

    Returns:
        ``compute_capability``, ``cudnn_version``, ``cuda_runtime_version`` and
        ``cuda_driver_version``, those that JAX knows.
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
