"""``check``'s list of checks: which run, which SKIP and why, and the line each prints.

:func:`run_checks` is what ``python -m tutorial_utils.cli.check`` runs (its checks are
described at :func:`tutorial_utils.cli.check.run_checks`); :func:`run_facts` is what the report
records of the software and devices.

Imports JAX's devices and TE's facade at its top, so it is imported only once ``check`` has set
up its devices (``check.py`` imports it inside a function).
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from tutorial_utils import te
from tutorial_utils.cli import check_cp, check_one_device
from tutorial_utils.cli.attention_compare import cp_workload_for
from tutorial_utils.cli.bench import _gpu_versions
from tutorial_utils.cli.check_report import CheckResult, run_check, worst, worst_output
from tutorial_utils.cli.check_signatures import signature_case
from tutorial_utils.pages.runtime import environment_record
from tutorial_utils.validation import check_ulysses_heads

__all__ = ["NOT_ACTIVE", "run_checks", "run_facts"]

NOT_ACTIVE = "TE's code not active (TUTORIAL_TE_BACKEND=reference)"
STRATEGIES = ("allgather", "ring", "ulysses")


def _te_suffix() -> str:
    """What the te-* lines add to say whose code ran."""
    if te.using_real_te():
        return ""
    if te.using_te_code():
        return " [TE-on-CPU: TE's JAX code, CPU reference kernel in place of cuDNN]"
    return " [reference facade: plumbing self-test, not TE]"


def run_checks(
    *,
    quick: bool = False,
    devices=None,
    te_plumbing: bool = False,
    only: str | None = None,
    echo: Callable[[str], None] = print,
    list_only: bool = False,
) -> list[CheckResult]:
    """Run every check (or those whose name contains ``only``); see ``check.run_checks``.

    Args:
        quick: Fewer configurations, no seed-shape TE check.
        devices: The devices for the CP checks (default: all of JAX's).
        te_plumbing: Without TE's code, run the te-* checks on the facade's reference backend.
        only: Run only the checks whose name contains this text.
        echo: Called with each result's line.
        list_only: Run nothing; one SKIP result per check name.

    Returns:
        The results, in the order they ran.
    """
    devices = list(jax.devices()) if devices is None else list(devices)
    results: list[CheckResult] = []
    real = te.using_real_te()  # real TE with cuDNN on a GPU
    te_code = te.using_te_code()  # real TE, or TE's JAX code on CPU
    te_mode = te_code or te_plumbing
    suffix = _te_suffix()

    def want(name: str) -> bool:
        return only is None or only in name

    def add(name, fn, detail_fn):
        if list_only:
            results.append(CheckResult(name, "SKIP", "listed"))
        elif want(name):
            results.append(run_check(name, fn, detail_fn))
            echo(results[-1].line())

    def skip(name, why):
        if list_only:
            results.append(CheckResult(name, "SKIP", "listed"))
        elif want(name):
            results.append(CheckResult(name, "SKIP", why))
            echo(results[-1].line())

    # (a) TE vs reference
    for cfg in check_one_device.te_configs(quick):
        name = f"te-fused-attn:{cfg['name']}"
        if not te_mode:
            skip(name, NOT_ACTIVE)
        elif cfg.get("seed_shape"):

            def seed_fn():
                metrics, wl = check_one_device.seed_shape_case(plumbing=not real)
                metrics["shape"] = {
                    "batch": wl.batch,
                    "seq": wl.seq_len,
                    "heads": [wl.num_q_heads, wl.num_kv_heads],
                    "head_dim": wl.head_dim,
                    "window": list(wl.window),
                }
                return metrics

            add(
                name,
                seed_fn,
                lambda m: (
                    f"{worst_output(m)}, shape {m['shape']['batch']}x{m['shape']['seq']}{suffix}"
                ),
            )
        else:
            params = {k: v for k, v in cfg.items() if k != "name"}
            add(
                name,
                lambda params=params: check_one_device.te_vs_reference(**params),
                lambda m: (
                    f"out/dq/dk/dv {worst_output(m)},"
                    f" padded rows max|out| {m['padded_rows']['max_abs_out']:.1e}{suffix}"
                ),
            )
    for strategy in ("allgather", "ring"):
        name = f"te-cp-{strategy}"
        if not te_mode:
            skip(name, NOT_ACTIVE)
        elif len(devices) < 2:
            skip(name, f"needs >= 2 devices, found {len(devices)}")
        else:
            add(
                name,
                lambda s=strategy: check_cp.te_cp_case(s, devices),
                lambda m: (
                    f"cp={m['config']['cp']} stripe={m['config']['stripe']}: "
                    f"{worst_output(m)}{suffix}"
                ),
            )
    name = "te-emulated-subproblems"
    if not te_mode:
        skip(name, NOT_ACTIVE)
    else:
        strategies = ("allgather", "ring") if te_code else ("ring",)
        note = "" if te_code else " (allgather: overlapping key runs need TE's code)"
        add(
            name,
            lambda: check_cp.te_emulated_case(strategies),
            lambda m: (
                f"{len(m)} sub-problems, worst {max(m.values()) if m else 0:.2f}x tol{note}{suffix}"
            ),
        )

    # (b) reference vs oracle
    for cfg in check_one_device.oracle_configs(quick):
        add(
            f"reference-vs-oracle:{cfg['name']}",
            lambda cfg=cfg: check_one_device.oracle_case(cfg),
            lambda m: "dense " + worst(m["dense"]) + "; blockwise " + worst(m["blockwise"]),
        )

    # (c) CP strategies on the devices present, and the per-rank emulation
    n = len(devices)
    for strategy in STRATEGIES:
        name = f"cp-{strategy} (cp={n}, {devices[0].platform})"
        if n < 2:
            skip(
                name,
                f"CP needs >= 2 devices, found {n}: at cp=1 nothing is sharded, so the comparison"
                " could not fail. On CPU run `python -m tutorial_utils.cli.check --devices 4`"
                " (simulated devices); on GPUs, expose more of them",
            )
            continue
        wl = cp_workload_for(n)
        try:
            if strategy == "ulysses":
                check_ulysses_heads(wl.num_q_heads, wl.num_kv_heads, n)
        except ValueError as err:
            skip(name, str(err))
            continue
        add(
            name,
            lambda s=strategy: check_cp.cp_case(s, devices),
            lambda m: (
                f"{worst_output(m)} vs single device (seq {m['config']['seq']},"
                f" stripe {m['config']['stripe']})"
            ),
        )
    if n == 1 or not quick:
        for strategy in STRATEGIES:
            add(
                f"cp-emulated-{strategy} (4 ranks, one at a time)",
                lambda s=strategy: check_cp.cp_emulated_case(s, 4),
                lambda m: f"merged ranks vs single device: {worst_output(m)}",
            )
    add(
        "emulation-descriptors",
        lambda: check_cp.descriptor_case(quick),
        lambda m: f"ragged runs == per-token masks on {m['subproblems_checked']} sub-problems",
    )

    # (d) facade signatures
    add(
        "facade-signatures",
        lambda: signature_case(te),
        lambda m: (
            "fused_attn, is_fused_attn_kernel_available, reorder functions, MeshResource,"
            " CPStrategy match TE 2.20.2"
            + (f" and the installed TE {m['installed_te']}" if "installed_te" in m else "")
        ),
    )
    return results


def run_facts() -> dict:
    """What the report records of this run's TE backend, devices and software.

    Returns:
        ``te_backend``, ``real_te``, ``te_backend_kind``, ``devices`` and ``environment`` (the
        pages' environment record with the GPU's driver and library versions).
    """
    env = environment_record()
    env.update(_gpu_versions())
    return {
        "te_backend": te.backend_name(),
        "real_te": te.using_real_te(),
        "te_backend_kind": te.backend_kind(),
        "devices": [str(d) for d in jax.devices()],
        "environment": env,
    }
