"""``python -m tutorial_utils.cli.check``: is this installation right, on the devices present?

A GPU node has many ways to be subtly wrong (no fused THD kernel on this GPU, a cuDNN without
GQA/SWA support, a JAX that cannot see every device); this answers "does what runs here agree
with the reference semantics?" before any chapter or benchmark is trusted.

The parts: the one-device comparisons (:mod:`.check_one_device`), the CP ones
(:mod:`.check_cp`), the facade's signatures (:mod:`.check_signatures`), the list of checks
(:mod:`.check_suite`), the verdicts and the JSON report (:mod:`.check_report`); the numerics
``launch --demo`` shares are in :mod:`.attention_compare`.

The checks are imported inside a function (:func:`_checks`), after :func:`main` has set up the
devices from ``--devices``: JAX reads ``XLA_FLAGS``/``JAX_PLATFORMS`` when it starts, and the
checks' modules import TE's facade, which picks TE's backend and on CPU loads TE's code at
import.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType

from tutorial_utils.cli import check_report
from tutorial_utils.cli.argtypes import output_file, positive_int
from tutorial_utils.cli.attention_compare import compare, cp_workload_for, tolerance
from tutorial_utils.cli.check_report import CheckResult
from tutorial_utils.cli.check_signatures import (
    FUSED_ATTN_PARAMS,
    KERNEL_AVAILABLE_PARAMS,
    MESH_RESOURCE_FIELDS,
)
from tutorial_utils.pages import runtime

__all__ = [
    "CheckResult",
    "tolerance",
    "compare",
    "run_checks",
    "build_parser",
    "main",
    "cp_workload_for",
    "simulate_cpu_devices",
    "FUSED_ATTN_PARAMS",
    "KERNEL_AVAILABLE_PARAMS",
    "MESH_RESOURCE_FIELDS",
]

DEFAULT_CPU_DEVICES = 4
_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def _checks() -> ModuleType:
    """The checks' module, imported once the devices are set up (see the module docstring)."""
    from tutorial_utils.cli import check_suite

    return check_suite


def run_checks(
    *,
    quick: bool = False,
    devices=None,
    te_plumbing: bool = False,
    only: str | None = None,
    echo: Callable[[str], None] = print,
    list_only: bool = False,
) -> list[CheckResult]:
    """Run every check (names containing ``only`` when given) and return their results.

    Each check prints one line ``PASS|FAIL|SKIP <name>: <detail>``; the CLI's ``--out`` stores
    them with the hardware and software facts as JSON, and its exit code is non-zero when any
    check fails.

    Checks:

    * ``te-*`` (TE's own code: real TE on a GPU node, TE-on-CPU elsewhere, each labelled; SKIP
      under ``TUTORIAL_TE_BACKEND=reference``): TE's ``fused_attn`` against the reference on
      small THD and BSHD configurations and on the seed shape (a subset of query rows),
      outputs and gradients within TE's bf16 tolerance
      (``rtol = atol = eps**(2/3) = 0.039``), padded rows ~0; TE's Ring and AllGather CP on the
      devices present; and the ragged sub-problems that ``bench --emulate-ranks`` times.
      ``--te-plumbing`` runs the same code against the facade's *reference* backend (a self-test
      of the check's own plumbing, not a TE check).
    * ``reference-vs-oracle:*``: the reference (dense and blockwise) against
      ``jax.nn.dot_product_attention(implementation="xla")``, fp32, outputs and gradients.
    * ``cp-*``: every CP strategy on the devices present (``cp = number of devices``) against the
      single-device result; ``cp-emulated-*`` runs a 4-rank split one rank at a time and merges.
      On a machine without a GPU the CLI first gives JAX simulated CPU devices, as the notebooks
      do (``--devices``, default 4), so these checks shard over ``cp > 1``. With one device a
      ``cp-<strategy>`` check is SKIP with the reason: at ``cp = 1`` nothing is sharded and the
      comparison could not fail.
    * ``emulation-descriptors``: the ragged descriptors of the emulated TE sub-problems induce
      exactly the per-token masks (pure numpy).
    * ``facade-signatures``: ``tutorial_utils.te`` has TE 2.20.2's parameter names and order (and,
      with real TE, the installed TE's).

    Args:
        quick: Fewer configurations, no seed-shape TE check.
        devices: The devices for the CP checks (default: all of JAX's).
        te_plumbing: Without TE's code, run the te-* checks on the facade's reference backend.
        only: Run only the checks whose name contains this text.
        echo: Called with each result's line.
        list_only: Run nothing; return one SKIP result per check name.

    Returns:
        The results, in the order they ran.
    """
    return _checks().run_checks(
        quick=quick,
        devices=devices,
        te_plumbing=te_plumbing,
        only=only,
        echo=echo,
        list_only=list_only,
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``check`` command line's parser.

    Returns:
        The parser of ``--out``, ``--quick``, ``--te-plumbing``, ``--only``, ``--force`` and
        ``--devices``.
    """
    p = argparse.ArgumentParser(
        prog="python -m tutorial_utils.cli.check",
        description=(
            "Check real TE (when active), the reference and every CP strategy on the devices "
            "present. Prints PASS|FAIL|SKIP lines; exit code 1 if any check fails."
        ),
    )
    p.add_argument(
        "--out",
        default=None,
        help="write the JSON report here (e.g. results/checks/gpu-check.json)",
    )
    p.add_argument(
        "--quick", action="store_true", help="fewer configurations; no seed-shape TE check"
    )
    p.add_argument(
        "--te-plumbing",
        action="store_true",
        help=(
            "without real TE, run the te-* checks against the facade's reference backend (self-test"
            " only)"
        ),
    )
    p.add_argument(
        "--only", default=None, metavar="TEXT", help="run only checks whose name contains TEXT"
    )
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument(
        "--devices",
        type=positive_int,
        default=None,
        metavar="N",
        help=(
            "without a GPU: N simulated CPU devices, set before JAX starts (default"
            f" {DEFAULT_CPU_DEVICES}, as the notebooks; an XLA_FLAGS device count already set is"
            " kept unless --devices is given; 1 = no CP: the cp-* checks SKIP)"
        ),
    )
    return p


def simulate_cpu_devices(requested: int | None) -> int | None:
    """Before JAX starts its backend, give it simulated CPU devices as the notebooks do.

    No GPU: ``requested`` devices (replacing an inherited count), else an inherited
    ``XLA_FLAGS`` count is kept, else :data:`DEFAULT_CPU_DEVICES`. With a GPU nothing changes.

    Args:
        requested: ``--devices``, or ``None``.

    Returns:
        The count set, or ``None`` where nothing was set.

    Raises:
        RuntimeError: JAX already started with fewer devices.
    """
    if runtime.gpu_present():
        return None
    flags = os.environ.get("XLA_FLAGS", "")
    if requested is None and _DEVICE_COUNT_FLAG in flags:
        return None
    os.environ["XLA_FLAGS"] = " ".join(
        f for f in flags.split() if not f.startswith(_DEVICE_COUNT_FLAG)
    )
    count = requested or DEFAULT_CPU_DEVICES
    runtime.setup_devices(count)
    return count


def _echo(line: str) -> None:
    print(line, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks from the command line.

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).

    Returns:
        0 when no check failed, else 1 (2, through ``SystemExit``, for a bad argument).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.out:
        try:  # before the checks run, so that their results are never lost
            output_file("--out", args.out, force=args.force)
        except ValueError as err:
            parser.error(str(err))
    try:
        simulate_cpu_devices(args.devices)
    except RuntimeError as err:  # JAX already started with fewer devices (main() called in-process)
        parser.error(f"argument --devices: {err}")
    checks = _checks()
    print("\n".join(f"# {line}" for line in runtime.backend_line().splitlines()), flush=True)
    started = time.perf_counter()
    chosen = {"quick": args.quick, "te_plumbing": args.te_plumbing}
    options = {**chosen, "only": args.only, "devices": args.devices}
    facts = checks.run_facts()
    done: list[CheckResult] = []

    def echo(line: str) -> None:
        """Print a check's line and, with ``--out``, rewrite the report with the checks so far
        (``"complete": false``), so that a run killed at its time limit keeps them."""
        _echo(line)
        if not args.out:
            return
        verdict, _, rest = line.partition(" ")
        name, _, detail = rest.partition(": ")
        done.append(CheckResult(name, verdict, detail))
        partial = check_report.build_report(done, options=options, facts=facts, started=started)
        check_report.finish_report({**partial, "ok": False, "complete": False}, args.out)

    results = checks.run_checks(**chosen, only=args.only, echo=echo)
    if args.only is not None and not results:
        names = [r.name for r in checks.run_checks(**chosen, list_only=True)]
        parser.error(
            f"argument --only: {args.only!r} matches no check; names are: {', '.join(names)}"
        )
    report = check_report.build_report(results, options=options, facts=facts, started=started)
    print(check_report.finish_report(report, args.out), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
