"""``python -m tutorial_utils.cli.bench``: time forward+backward attention per CP strategy, store
one record.

Why: the tutorial's claims about Ring, AllGather and Ulysses must be checked where users run
them: on GPU nodes with real TransformerEngine. This command times each strategy the way TE's
CP tutorial does (``jax.jit(jax.value_and_grad(loss))`` with explicit shardings, warm-up,
compile excluded, ``block_until_ready``; see :func:`tutorial_utils.perfmodel.timing.time_fn`),
sweeps the AllGather stripe size and the sliding window, and writes ONE ``cp-bench/1`` record
with the GPU model, driver, CUDA/cuDNN/JAX/TE versions and achieved TFLOP/s.

``--emulate-ranks N`` answers "what would N GPUs do?" on one device. Each rank's own
sub-problem (its queries in the striped layout against the keys it really sees, with its
real mask) is timed on the single device, and the N-device step is *predicted* as the slowest
rank plus communication at ``--link-gbps``. Such rows are labelled ``emulated``; they are a
model, not a measurement of N devices. Two kernels time them: ``reference`` (the pure-JAX
blockwise kernel with the per-token mask, any platform) and ``te`` (real TE ``fused_attn`` on a
GPU, on ragged THD runs).

The command in modules: this one parses the flags and sets up the devices;
:mod:`~tutorial_utils.cli.bench_cases` checks the cases against the preset and TE's rules;
:mod:`~tutorial_utils.cli.bench_timed` holds the timed functions;
:mod:`~tutorial_utils.cli.bench_subproblems` and :mod:`~tutorial_utils.cli.bench_emulation` the
per-rank sub-problems of ``--emulate-ranks``; :mod:`~tutorial_utils.cli.bench_run` times the
cases and writes the record that :mod:`~tutorial_utils.cli.bench_record` describes.

:func:`run` imports :mod:`~tutorial_utils.cli.bench_run` inside the function: that module
imports TE's facade (:mod:`tutorial_utils.te`), which must come after the flags have set
``XLA_FLAGS`` for simulated CPU devices (:func:`tutorial_utils.pages.runtime.setup_devices`,
which also installs TE's code on CPU) and after the devices have been counted.

The names other code imports from here (the sub-problems, :func:`te_descriptor`,
:func:`emulate_strategy_reference`, :func:`visible_pairs`, ``_gpu_versions``) are re-exported
from the modules that hold them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

# Some names are imported only to be re-exported: `cli.check` and the tests import them from here.
from tutorial_utils import rules
from tutorial_utils.cli.argtypes import nonneg_int, positive_float, positive_int, record_file
from tutorial_utils.cli.bench_cases import resolve_cases, visible_pairs  # noqa: F401
from tutorial_utils.cli.bench_emulation import (  # noqa: F401
    emulate_strategy_reference,
    te_descriptor,
)
from tutorial_utils.cli.bench_record import gpu_versions as _gpu_versions  # noqa: F401
from tutorial_utils.cli.bench_record import summary
from tutorial_utils.cli.bench_subproblems import (  # noqa: F401
    STRATEGY_CHOICES,
    RaggedCall,
    SubProblem,
    allgather_ragged_calls,
    comm_bytes,
    predict_step_ms,
    ragged_visibility,
    rank_subproblems,
    ring_ragged_calls,
    subproblem_visibility,
)
from tutorial_utils.gpu import jax_started
from tutorial_utils.pages.runtime import gpu_present, setup_devices
from tutorial_utils.perfmodel.workload import get_workload

__all__ = ["build_parser", "run", "main"]


def _int_list(minimum: int):
    """An argparse type: a comma-separated list of ints, each at least ``minimum``, no repeats."""

    def parse(text: str) -> list[int]:
        out = []
        for part in text.split(","):
            part = part.strip()
            try:
                value = int(part)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"must be a comma-separated list of integers, got {text!r}"
                ) from None
            if value < minimum:
                raise argparse.ArgumentTypeError(
                    f"every value must be >= {minimum}, got {value} in {text!r}"
                )
            if value not in out:
                out.append(value)
        if not out:
            raise argparse.ArgumentTypeError("must list at least one value")
        return out

    return parse


def _strategy_list(text: str) -> list[str]:
    """An argparse type: comma-separated strategies, in any of TE's spellings, no repeats."""
    out = []
    for part in text.split(","):
        name = {"single": "single", "ag": "allgather"}.get(part.strip().lower())
        if name is None:  # TE's names and their spellings: the one normaliser
            try:
                name = rules.normalize_strategy(part.strip())
            except ValueError:
                pass
        if name not in STRATEGY_CHOICES:
            raise argparse.ArgumentTypeError(
                f"unknown strategy {part.strip()!r}; choose from {','.join(STRATEGY_CHOICES)}"
            )
        if name not in out:
            out.append(name)
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command's flags.

    Returns:
        The parser of ``python -m tutorial_utils.cli.bench``.
    """
    p = argparse.ArgumentParser(
        prog="python -m tutorial_utils.cli.bench",
        description=(
            "Time forward+backward attention (single device, Ring, AllGather, Ulysses) and write"
            " one cp-bench/1 record. With --emulate-ranks N, time each rank's sub-problem on one"
            " device and predict N devices."
        ),
    )
    p.add_argument(
        "--preset",
        choices=("seed", "cpu", "tiny"),
        default=None,
        help=(
            "workload preset (default: $CP_TUTORIAL_PRESET, else 'seed' on a GPU node and 'cpu'"
            " elsewhere)"
        ),
    )
    p.add_argument(
        "--strategies",
        type=_strategy_list,
        default=list(STRATEGY_CHOICES),
        help="comma-separated subset of single,ring,allgather,ulysses (default: all)",
    )
    p.add_argument(
        "--stripes",
        type=_int_list(1),
        default=None,
        help=(
            "AllGather stripe sizes, e.g. 1,128,512 (default: those of 1,128,512 that fit the"
            " preset, plus the preset's own). Ring always uses stripe 1."
        ),
    )
    p.add_argument(
        "--windows",
        type=_int_list(-1),
        default=None,
        help=(
            "left sliding-window sizes, -1 = full causal, e.g. 8192,-1 (default: the preset's"
            " window and -1)"
        ),
    )
    p.add_argument(
        "--iters",
        type=positive_int,
        default=5,
        help="timed iterations (default 5, as TE's tutorial)",
    )
    p.add_argument(
        "--warmup",
        type=nonneg_int,
        default=2,
        help="untimed warm-up iterations after compilation (default 2)",
    )
    p.add_argument("--out", default="results", help="folder for the record (default results/)")
    p.add_argument(
        "--name", default=None, help="record file name (default <source>-<label>-<UTC time>.json)"
    )
    p.add_argument(
        "--force", action="store_true", help="replace an existing record of the same --name"
    )
    p.add_argument(
        "--label", default=None, help="record label (default derived from preset and devices)"
    )
    p.add_argument(
        "--cp",
        type=positive_int,
        default=None,
        help="CP size for real multi-device runs (default: the preset's cp_size)",
    )
    p.add_argument(
        "--emulate-ranks",
        type=positive_int,
        default=None,
        metavar="N",
        help=(
            "time each of N ranks' sub-problems on one device and predict the N-device step"
            " (emulated)"
        ),
    )
    p.add_argument(
        "--link-gbps",
        type=positive_float,
        default=None,
        help=(
            "per-direction link bandwidth in GB/s for --emulate-ranks (default: the GPU's NVLink"
            " from tutorial_utils.perfmodel.hardware, else 450)"
        ),
    )
    p.add_argument(
        "--kernel",
        choices=("auto", "reference", "te"),
        default="auto",
        help=(
            "kernel timing the emulated sub-problems: te (real TE, GPU), reference (pure JAX); auto"
            " = te when real TE is active"
        ),
    )
    p.add_argument("--seed", type=int, default=2026, help="random seed of the inputs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def run(argv: Sequence[str] | None = None) -> dict:
    """Parse ``argv``, run the benchmark, write the record; return ``{"path", "record"}``.

    Args:
        argv: The command's arguments (default ``sys.argv[1:]``).

    Returns:
        ``{"path": the record's file, "record": the record}``.

    Raises:
        SystemExit: A bad flag (status 2, naming it), or every case failed.
    """
    parser = build_parser()
    args = parser.parse_args(argv)

    try:  # before any work: a bad --out/--name must not cost a whole benchmark
        record_file(args.out, args.name, force=args.force)
    except ValueError as err:
        parser.error(str(err))

    emulate = args.emulate_ranks is not None
    # Before JAX starts: simulated CPU devices for a real multi-device CP run on a machine without
    # GPUs.
    if not emulate and not gpu_present() and not jax_started():
        cp_guess = (
            args.cp
            or get_workload(args.preset or os.environ.get("CP_TUTORIAL_PRESET") or "cpu").cp_size
        )
        if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
            setup_devices(cp_guess)

    plan = resolve_cases(args, parser)

    from tutorial_utils.cli import bench_run

    return bench_run.run_cases(args, parser, plan)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print its summary and the record's path.

    Args:
        argv: The command's arguments (default ``sys.argv[1:]``).

    Returns:
        1 when a case failed, else 0.
    """
    out = run(argv)
    print(summary(out["record"]))
    print(f"wrote {out['path']}")
    return 1 if out["record"].get("failures") else 0


if __name__ == "__main__":
    sys.exit(main())
