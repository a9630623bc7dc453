"""One run of ``python -m tutorial_utils.cli.bench``: time every case, predict the emulated
ones, and write the ``cp-bench/1`` record.

The CLI (:mod:`tutorial_utils.cli.bench`) imports this module only after it has parsed the flags
and set up the devices, because this module imports TE's facade (:mod:`tutorial_utils.te`).
tqdm, optional, is imported only when a progress bar is asked for.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import numpy as np

from tutorial_utils import te
from tutorial_utils.cli.bench_cases import BenchCases, fail, visible_pairs
from tutorial_utils.cli.bench_record import (
    gpu_versions,
    record_config,
    record_file_name,
    record_label,
    record_notes,
)
from tutorial_utils.cli.bench_subproblems import comm_bytes, predict_step_ms
from tutorial_utils.cli.bench_timed import time_cp, time_emulated, time_single
from tutorial_utils.perfmodel.hardware import PROFILES
from tutorial_utils.perfmodel.records import source_for, write_record
from tutorial_utils.perfmodel.timing import make_record
from tutorial_utils.perfmodel.workcount import attention_flops
from tutorial_utils.perfmodel.workload import make_qkv, workload_segments

__all__ = ["DEFAULT_LINK_GBPS", "Progress", "default_link_gbps", "run_cases"]

#: NVLink4 per direction (H100/H200), used when perfmodel.hardware does not know the GPU
DEFAULT_LINK_GBPS = 450.0

_TIMING_KEYS = ("mean_ms", "std_ms", "min_ms", "median_ms", "first_call_ms")


class Progress:
    """tqdm when installed, else one plain line per step on stderr.

    Args:
        total: The number of cases.
        enabled: ``False`` for no output at all (``--no-progress``).
    """

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.done, self.bar = total, enabled, 0, None
        if enabled:
            try:
                import tqdm  # type: ignore

                self.bar = tqdm.tqdm(total=total, file=sys.stderr, unit="case", dynamic_ncols=True)
            except ImportError:
                self.bar = None

    def start(self, text: str) -> None:
        """Show that the case ``text`` starts."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_description(text)
        else:
            print(f"[{self.done + 1}/{self.total}] {text} ...", file=sys.stderr, flush=True)

    def finish(self, text: str) -> None:
        """Count one case done and show its result ``text``."""
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(text)
            self.bar.update(1)
        else:
            print(f"[{self.done}/{self.total}] {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Close the bar, if any."""
        if self.bar is not None:
            self.bar.close()


def default_link_gbps(device_kind: str) -> tuple[float, str]:
    """The link bandwidth per direction for the emulated prediction, and where it came from.

    Args:
        device_kind: JAX's name of the device, e.g. ``NVIDIA H200``.

    Returns:
        ``(GB/s, source)``: the GPU's NVLink from :mod:`tutorial_utils.perfmodel.hardware`,
        else :data:`DEFAULT_LINK_GBPS`.
    """
    if PROFILES:
        kind = device_kind.upper().replace(" ", "")
        for key in sorted(PROFILES, key=len, reverse=True):
            if key in kind:
                prof = PROFILES[key]
                return (
                    float(prof.nvlink_gbps_per_direction),
                    f"tutorial_utils.perfmodel.hardware {key} NVLink per direction",
                )
    return DEFAULT_LINK_GBPS, "default 450 GB/s (NVLink4 per direction)"


def _emulated_row(case, per_rank, first_ms, comm, pred, link_gbps) -> dict:
    """The fields of an emulated CP row: the prediction and what it rests on."""
    row = {
        "emulated": True,
        "mean_ms": pred["predicted_ms"],
        "compute_ms": pred["compute_ms"],
        "comm_ms": pred["comm_ms"],
        "exposed_comm_ms": pred["exposed_comm_ms"],
        "comm_bytes_per_rank": comm,
        "link_gbps": link_gbps,
        ("rank_step_ms" if case.strategy == "ring" else "rank_ms"): (np.asarray(per_rank).tolist()),
        "first_call_ms": first_ms,
        "prediction": (
            "sum over steps of max(slowest rank's step, hop at link_gbps)"
            if case.strategy == "ring"
            else "slowest rank + all bytes at link_gbps (not overlapped)"
        ),
    }
    if case.strategy == "ring":
        row["step_ms"] = pred["step_ms"]
    return row


def run_cases(args: argparse.Namespace, parser: argparse.ArgumentParser, plan: BenchCases) -> dict:
    """Time ``plan``'s cases (single device first), then write one record.

    One failing case is recorded in ``failures`` and does not stop the others. The record is
    rewritten after each case (marked ``incomplete`` until the last), so that a run killed at
    its time limit keeps the rows that finished.

    Args:
        args: The parsed flags.
        parser: The parser, for the errors that name a flag.
        plan: The cases, from :func:`tutorial_utils.cli.bench_cases.resolve_cases`.

    Returns:
        ``{"path": the record's file, "record": the record}``.

    Raises:
        SystemExit: A flag the devices or the TE backend cannot honour, or every case failed.
    """
    preset, wl, cp, cases, skipped = plan.preset, plan.workload, plan.cp, plan.cases, plan.skipped
    emulate = args.emulate_ranks is not None
    platform = jax.default_backend()
    kernel = args.kernel
    if kernel == "auto":
        kernel = "te" if te.using_real_te() else "reference"
    if kernel == "te" and not te.using_real_te():
        fail(
            parser,
            "--kernel",
            "'te' needs real TransformerEngine on a GPU; the active backend is"
            f" {te.backend_name()!r}",
        )
    if not emulate and len(jax.devices()) < cp and any(c.strategy != "single" for c in cases):
        fail(
            parser,
            "--cp",
            f"CP size {cp} needs {cp} devices but JAX sees {len(jax.devices())} ({platform}); "
            f"use --emulate-ranks {cp} to time each rank's sub-problem on one device",
        )
    device_kind = jax.devices()[0].device_kind
    link_gbps, link_source = (
        (args.link_gbps, "--link-gbps") if args.link_gbps else default_link_gbps(device_kind)
    )
    row_kernel = kernel if emulate else ("te" if te.using_real_te() else "reference")

    q, k, v, dout = make_qkv(wl, seed=args.seed)
    ids_np, pos_np = workload_segments(wl)
    data = (q, k, v, dout, jax.numpy.asarray(ids_np), jax.numpy.asarray(pos_np))

    progress = Progress(len(cases), enabled=not args.no_progress)
    results, failures = [], []
    single_ms: dict[tuple[int, int], float] = {}
    # Single first, so every CP row can carry its speedup.
    ordered = sorted(cases, key=lambda c: c.strategy != "single")
    if not any(c.strategy == "single" for c in cases):
        ordered = cases
    t_start = time.perf_counter()
    versions, written = gpu_versions(), False
    source = source_for(platform, te.backend_kind(), emulated=bool(emulate))
    label = record_label(args, preset, cp, device_kind, emulate)
    config = record_config(
        args,
        wl,
        preset=preset,
        windows=plan.windows,
        stripes=plan.stripes,
        kernel=row_kernel,
        link_gbps=link_gbps,
        link_source=link_source,
    )
    name = args.name if args.name is not None else record_file_name(source, label)

    def write(done: int):
        """Write the record of the rows so far; until every case has run, marked incomplete (so
        that a run killed at its time limit keeps what finished)."""
        notes = record_notes(
            emulate=emulate,
            cp=cp,
            device_kind=device_kind,
            kernel=kernel,
            link_gbps=link_gbps,
            platform=platform,
            skipped=skipped,
            failures=failures,
        )
        if done < len(ordered):
            notes = (
                f"incomplete: {done} of {len(ordered)} cases had run when this was written. "
                + notes
            ).strip()
        record = make_record(
            label, source, config, results, warmup=args.warmup, iters=args.iters, notes=notes
        )
        record["hardware"].update(versions)
        record["hardware"]["te_backend"] = te.backend_name()
        record["skipped"] = skipped
        record["failures"] = failures
        record["wall_seconds"] = time.perf_counter() - t_start
        if done < len(ordered):
            record["incomplete"] = {"cases_run": done, "cases": len(ordered)}
        overwrite = args.force or written
        return write_record(record, args.out, name=name, overwrite=overwrite), record

    for done, case in enumerate(ordered):
        if results:  # the cases so far, before the next one starts
            write(done)
            written = True
        progress.start(case.desc)
        pairs = visible_pairs(ids_np, pos_np, case.window)
        flops = attention_flops(pairs, wl.num_q_heads, wl.head_dim, backward=True)
        row = {
            "strategy": case.strategy,
            "stripe_size": case.stripe,
            "window": list(case.window),
            "cp_size": 1 if case.strategy == "single" else cp,
            "visible_pairs_per_head": int(pairs),
            "flops": flops,
            "kernel": row_kernel,
        }
        try:
            if case.strategy == "single":
                timing = time_single(wl, data, case.window, args.warmup, args.iters)
                row.update({key: timing[key] for key in _TIMING_KEYS})
                single_ms[case.window] = timing["mean_ms"]
            elif emulate:
                per_rank, first_ms = time_emulated(
                    wl, data, case, cp, kernel, args.warmup, args.iters
                )
                comm = comm_bytes(case.strategy, wl, cp)
                pred = predict_step_ms(case.strategy, per_rank, comm, link_gbps)
                row.update(_emulated_row(case, per_rank, first_ms, comm, pred, link_gbps))
            else:
                timing = time_cp(wl, data, case, cp, args.warmup, args.iters)
                row.update({key: timing[key] for key in _TIMING_KEYS})
        except Exception as err:  # noqa: BLE001 - one failing case must not lose the others
            failures.append(
                {
                    "strategy": case.strategy,
                    "stripe_size": case.stripe,
                    "window": list(case.window),
                    "error": f"{type(err).__name__}: {err}"[:2000],
                }
            )
            progress.finish(f"{case.desc}: FAILED ({type(err).__name__})")
            continue
        if row["mean_ms"] <= 0:
            row["mean_ms"] = 1e-6
        row["tflops"] = flops / (row["mean_ms"] * 1e-3) / 1e12
        if row["cp_size"] > 1:
            row["tflops_per_device"] = row["tflops"] / row["cp_size"]
        if case.strategy != "single" and case.window in single_ms:
            row["speedup"] = single_ms[case.window] / row["mean_ms"]
        results.append(row)
        progress.finish(
            f"{case.desc}: {row['mean_ms']:.3f} ms" + (" (emulated)" if row.get("emulated") else "")
        )
    progress.close()
    if not results:
        raise SystemExit(
            "bench: every case failed:\n"
            + "\n".join(
                f"  {f['strategy']} stripe={f['stripe_size']} window={f['window']}: {f['error']}"
                for f in failures
            )
        )

    path, record = write(len(ordered))
    return {"path": path, "record": record}
