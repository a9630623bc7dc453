"""``python -m tutorial_utils.cli.launch``: one process per device, and a CP demo to run in them.

On real clusters CP runs with one process per GPU, often across nodes: every process must join
one JAX distributed runtime before touching a device, and a dead or missing peer must turn
into a clear error, not a hang. Usage: ``python -m tutorial_utils.cli.launch -n 4 [--demo |
-- <module or script> [args]]``.

The parts: the worker side, :func:`initialize` (:mod:`.distributed_init`); the launcher that
starts, watches and stops the ranks, :func:`launch` (:mod:`.process_launcher`); the demo worker
(:mod:`.cp_demo`). This module parses the flags and runs one or the other.

The demo worker's module is imported inside a function, once this rank has set
``TUTORIAL_TE_BACKEND`` from ``--backend`` and joined the distributed runtime: it imports TE's
facade, which picks TE's backend from that variable at import, and JAX's backend must not start
before ``jax.distributed.initialize``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from tutorial_utils.cli.argtypes import positive_int
from tutorial_utils.cli.distributed_init import (
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_INIT_TIMEOUT,
    DEFAULT_SHUTDOWN_TIMEOUT,
    ENV_PROCESS_ID,
    EXIT_INIT_TIMEOUT,
    env_int,
    initialize,
)
from tutorial_utils.cli.process_launcher import (
    EXIT_LAUNCH_TIMEOUT,
    LaunchResult,
    child_env,
    free_port,
    launch,
)

__all__ = [
    "initialize",
    "launch",
    "LaunchResult",
    "free_port",
    "child_env",
    "main",
    "EXIT_INIT_TIMEOUT",
    "EXIT_LAUNCH_TIMEOUT",
]

#: The strategies ``--demo`` can run: TE's CP (``te-*``) and the tutorial's own.
DEMO_STRATEGIES = ("te-allgather", "te-ring", "allgather", "ring", "ulysses")
DEFAULT_DEMO_STRATEGIES = ["te-allgather", "te-ring"]


def _demo_worker(args) -> int:
    """One rank of the demo: the backend and an injected early failure, then join and run."""
    if args.backend:  # before tutorial_utils.te is imported: it reads the variable once
        os.environ["TUTORIAL_TE_BACKEND"] = args.backend
    rank_env = env_int(ENV_PROCESS_ID)
    if args.fail_rank is not None and args.fail_at == "before" and rank_env == args.fail_rank:
        print(
            f"rank {rank_env}: injected failure before jax.distributed.initialize (--fail-rank"
            f" {args.fail_rank})",
            flush=True,
        )
        return 2
    info = initialize()
    from tutorial_utils.cli import cp_demo

    return cp_demo.run_demo(args, info)


def _parse_strategies(text: str) -> list[str]:
    """``--strategies``: a comma-separated, non-empty subset of :data:`DEMO_STRATEGIES`."""
    allowed = DEMO_STRATEGIES
    out = [s.strip().lower() for s in text.split(",") if s.strip()]
    for s in out:
        if s not in allowed:
            raise argparse.ArgumentTypeError(
                f"unknown strategy {s!r}; choose from {','.join(allowed)}"
            )
    if not out:
        raise argparse.ArgumentTypeError("must list at least one strategy")
    return out


def build_parser() -> argparse.ArgumentParser:
    """The ``launch`` command line's parser: the launcher's options and the demo worker's.

    Returns:
        The parser.
    """
    p = argparse.ArgumentParser(
        prog="python -m tutorial_utils.cli.launch",
        usage=(
            "python -m tutorial_utils.cli.launch -n N [options] (--demo [demo options] | -- <module"
            " or script> [args])"
        ),
        description=(
            "Start N processes on 127.0.0.1, one per device, each with COORDINATOR_ADDRESS,"
            " NUM_PROCESSES and PROCESS_ID set; workers call"
            " tutorial_utils.cli.launch.initialize(). If a rank fails or --timeout passes, the"
            " others are stopped and the launcher exits non-zero naming the rank."
        ),
    )
    p.add_argument("-n", "--nprocs", type=positive_int, default=None, help="number of processes")
    p.add_argument(
        "--timeout", type=float, default=None, help="overall wall-clock limit in seconds"
    )
    p.add_argument(
        "--port", type=positive_int, default=None, help="coordinator port (default: a free one)"
    )
    p.add_argument(
        "--platform",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="cpu: one host device per process with gloo collectives; gpu: one GPU per process",
    )
    p.add_argument("--cpu-devices-per-process", type=positive_int, default=1)
    p.add_argument(
        "--init-timeout",
        type=positive_int,
        default=DEFAULT_INIT_TIMEOUT,
        help=f"seconds a rank waits for all peers to join (default {DEFAULT_INIT_TIMEOUT})",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=positive_int,
        default=DEFAULT_HEARTBEAT_TIMEOUT,
        help=(
            "seconds without heartbeats before a rank counts as dead (default"
            f" {DEFAULT_HEARTBEAT_TIMEOUT})"
        ),
    )
    p.add_argument("--shutdown-timeout", type=positive_int, default=DEFAULT_SHUTDOWN_TIMEOUT)
    p.add_argument(
        "--on-failure",
        choices=("kill", "wait"),
        default="kill",
        help=(
            "kill: stop the other ranks at the first failure (default); wait: let them fail on"
            " their own"
        ),
    )
    p.add_argument(
        "--skip-rank",
        type=int,
        action="append",
        default=[],
        help="do not start this rank (simulates a missing host); repeatable",
    )
    p.add_argument(
        "--demo", action="store_true", help="run the built-in CP demo worker on every rank"
    )
    p.add_argument("--worker-demo", action="store_true", help=argparse.SUPPRESS)
    g = p.add_argument_group("demo worker options (with --demo)")
    g.add_argument(
        "--preset",
        choices=("tiny", "cpu"),
        default="tiny",
        help=(
            "tiny (2 x 256 tokens at cp=4, default) or cpu (2 x 2,048 tokens); every rank also"
            " computes the one-process baselines itself"
        ),
    )
    g.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default="bfloat16",
        help=(
            "bfloat16 (default; what cuDNN takes) or float16; float32 only with --backend reference"
        ),
    )
    g.add_argument(
        "--backend",
        choices=("auto", "te", "te-cpu", "reference"),
        default=None,
        help=(
            "TUTORIAL_TE_BACKEND for every rank (default: inherited, else auto: real TE on a GPU,"
            " TE's JAX code with the CPU stand-in kernel elsewhere)"
        ),
    )
    g.add_argument(
        "--strategies",
        type=_parse_strategies,
        default=list(DEFAULT_DEMO_STRATEGIES),
        help="comma-separated subset of "
        + ",".join(DEMO_STRATEGIES)
        + " (default te-allgather,te-ring: TE's "
        "fused_attn CP; allgather,ring,ulysses: the tutorial's own shard_map versions)",
    )
    g.add_argument("--fail-rank", type=int, default=None, help="inject a failure on this rank")
    g.add_argument(
        "--fail-at",
        choices=("before", "after"),
        default="after",
        help="inject it before or after jax.distributed.initialize (default after)",
    )
    g.add_argument("--out", default=None, help="folder for per-rank demo JSON results")
    return p


def _demo_args(args) -> list[str]:
    """The demo worker's command line, from the launcher's options."""
    out = [
        "--worker-demo",
        "--preset",
        args.preset,
        "--dtype",
        args.dtype,
        "--strategies",
        ",".join(args.strategies),
        "--fail-at",
        args.fail_at,
    ]
    if args.fail_rank is not None:
        out += ["--fail-rank", str(args.fail_rank)]
    if args.out:
        out += ["--out", args.out]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Launch the ranks (``-n``), or be one rank of the demo (``--worker-demo``).

    Args:
        argv: The arguments (default: ``sys.argv[1:]``); what follows ``--`` is the target.

    Returns:
        The launcher's exit code (:class:`LaunchResult`'s ``returncode``), or the demo
        worker's; 2, through ``SystemExit``, for a bad argument.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    target: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, target = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker_demo:
        return _demo_worker(args)
    if args.nprocs is None:
        parser.error("argument -n/--nprocs: required (how many processes to start)")
    if args.demo and target:
        parser.error("argument --demo: give either --demo or `-- <module or script>`, not both")
    if not args.demo and not target:
        parser.error("nothing to launch: add --demo or `-- <module or script> [args]`")
    if args.fail_rank is not None and not 0 <= args.fail_rank < args.nprocs:
        parser.error(
            f"argument --fail-rank: {args.fail_rank} is not a rank of -n"
            f" {args.nprocs} (0..{args.nprocs - 1})"
        )
    for r in args.skip_rank:
        if not 0 <= r < args.nprocs:
            parser.error(
                f"argument --skip-rank: {r} is not a rank of -n"
                f" {args.nprocs} (0..{args.nprocs - 1})"
            )
    if args.timeout is not None and args.timeout <= 0:
        parser.error(f"argument --timeout: must be > 0 seconds, got {args.timeout}")
    backend = args.backend or os.environ.get("TUTORIAL_TE_BACKEND", "").strip().lower() or "auto"
    if (
        args.demo
        and args.dtype == "float32"
        and backend != "reference"
        and any(s.startswith("te-") for s in args.strategies)
    ):
        parser.error(
            f"argument --dtype: float32 with backend {backend!r}: TE's fused attention (cuDNN, and"
            " its CPU stand-in) takes bfloat16 or float16; use --dtype bfloat16, or add --backend"
            " reference for an fp32 run"
        )
    base_env = None if args.backend is None else dict(os.environ, TUTORIAL_TE_BACKEND=args.backend)
    run_target = ["tutorial_utils.cli.launch", *_demo_args(args)] if args.demo else target
    result = launch(
        args.nprocs,
        run_target,
        port=args.port,
        timeout=args.timeout,
        platform=args.platform,
        skip_ranks=args.skip_rank,
        on_failure=args.on_failure,
        init_timeout=args.init_timeout,
        heartbeat_timeout=args.heartbeat_timeout,
        shutdown_timeout=args.shutdown_timeout,
        cpu_devices_per_process=args.cpu_devices_per_process,
        base_env=base_env,
    )
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
