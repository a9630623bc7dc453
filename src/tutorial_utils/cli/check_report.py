"""``check``'s verdicts and its report.

A check is a function that returns its numbers (a dict) or raises :class:`CheckFailed`.
:func:`run_check` times it and makes the :class:`CheckResult` whose line the CLI prints
(``PASS|FAIL|SKIP <name>: <detail>``); any other exception is a FAIL too, its traceback kept.
:func:`build_report` assembles the ``cp-check/1`` JSON that ``--out`` stores, and
:func:`finish_report` writes it and returns the run's closing line.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from tutorial_utils.cli.attention_compare import compare

__all__ = [
    "VERDICTS",
    "OUTPUTS",
    "CheckResult",
    "CheckFailed",
    "compare_all",
    "compare_outputs",
    "worst",
    "worst_output",
    "run_check",
    "build_report",
    "finish_report",
]

VERDICTS = ("PASS", "FAIL", "SKIP")
#: The attention output and its three gradients, the tensors every comparison covers.
OUTPUTS = ("out", "dq", "dk", "dv")


@dataclasses.dataclass
class CheckResult:
    """One check's verdict (``PASS``, ``FAIL`` or ``SKIP``), its one-line detail and numbers."""

    name: str
    verdict: str
    detail: str
    metrics: dict = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    def line(self) -> str:
        """The line the CLI prints: ``<verdict> <name>: <detail>``."""
        return f"{self.verdict} {self.name}: {self.detail}"

    def as_dict(self) -> dict:
        """The result as the JSON report stores it."""
        return dataclasses.asdict(self)


class CheckFailed(Exception):
    """A check's FAIL, with the numbers measured up to the failure."""

    def __init__(self, detail: str, metrics: dict | None = None):
        super().__init__(detail)
        self.metrics = metrics or {}


def compare_all(pairs: dict[str, tuple], tol: float) -> dict:
    """Compare named ``(actual, expected)`` pairs with :func:`compare`.

    Args:
        pairs: ``{name: (actual, expected)}``.
        tol: The tolerance of every pair.

    Returns:
        ``{name: {"max_abs_err", "worst_ratio", ...}}``.

    Raises:
        CheckFailed: A pair is beyond ``tol``; the message names each such pair.
    """
    metrics, bad = {}, []
    for name, (a, e) in pairs.items():
        m = compare(a, e, tol)
        metrics[name] = {k: v for k, v in m.items() if k != "ok"}
        if not m["ok"]:
            bad.append(f"{name} max|err|={m['max_abs_err']:.3g} ({m['worst_ratio']:.2f}x tol)")
    if bad:
        raise CheckFailed(f"beyond tol {tol:.3g}: " + "; ".join(bad), metrics)
    return metrics


def compare_outputs(out, grads: Sequence, ref_out, ref_grads: Sequence, tol: float) -> dict:
    """:func:`compare_all` on the output and ``(dq, dk, dv)`` against the reference's.

    Args:
        out: The attention output under test.
        grads: Its ``(dq, dk, dv)``.
        ref_out: The reference output.
        ref_grads: The reference ``(dq, dk, dv)``.
        tol: The tolerance.

    Returns:
        The numbers of ``out``, ``dq``, ``dk`` and ``dv``.

    Raises:
        CheckFailed: One of them is beyond ``tol``.
    """
    return compare_all(dict(zip(OUTPUTS, zip((out, *grads), (ref_out, *ref_grads)))), tol)


def worst(metrics: dict) -> str:
    """``max|err| <e>, worst <r>x tol`` over the compared tensors in ``metrics``."""
    ratio = max(metrics.values(), key=lambda m: m.get("worst_ratio", 0.0))["worst_ratio"]
    return f"max|err| {max(m['max_abs_err'] for m in metrics.values()):.2e}, worst {ratio:.2f}x tol"


def worst_output(metrics: dict) -> str:
    """:func:`worst` over the output and gradients only (not a check's other numbers)."""
    return worst({k: v for k, v in metrics.items() if k in OUTPUTS})


def run_check(name: str, fn: Callable[[], dict], detail_fn: Callable[[dict], str]) -> CheckResult:
    """Run one check and time it.

    Args:
        name: The check's name.
        fn: The check: returns its numbers, or raises.
        detail_fn: The PASS line's detail, from the numbers.

    Returns:
        PASS with ``detail_fn``'s text; FAIL with the failure (a crash counts as a failure).
    """
    t0 = time.perf_counter()
    try:
        metrics = fn()
        res = CheckResult(name, "PASS", detail_fn(metrics), metrics)
    except CheckFailed as fail:
        res = CheckResult(name, "FAIL", str(fail), fail.metrics)
    except Exception as err:  # noqa: BLE001 - a crashing check is a failing check
        res = CheckResult(
            name,
            "FAIL",
            f"error: {type(err).__name__}: {str(err)[:500]}",
            {"traceback": traceback.format_exc()[-4000:]},
        )
    res.seconds = time.perf_counter() - t0
    return res


def build_report(
    results: Sequence[CheckResult], *, options: dict, facts: dict, started: float
) -> dict:
    """The ``cp-check/1`` report.

    Args:
        results: The checks' results.
        options: The CLI options the run used.
        facts: ``te_backend``, ``real_te``, ``te_backend_kind``, ``devices`` and ``environment``
            (``check_suite.run_facts()``).
        started: ``time.perf_counter()`` when the checks started.

    Returns:
        The report; ``"ok"`` is whether no check failed.
    """
    summary = {v: sum(r.verdict == v for r in results) for v in VERDICTS}
    return {
        "schema": "cp-check/1",
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "ok": summary["FAIL"] == 0,
        "summary": summary,
        "te_backend": facts["te_backend"],
        "real_te": facts["real_te"],
        "te_backend_kind": facts["te_backend_kind"],
        "devices": facts["devices"],
        "options": options,
        "environment": facts["environment"],
        "seconds": time.perf_counter() - started,
        "checks": [r.as_dict() for r in results],
    }


def finish_report(report: dict, out: str | None) -> str:
    """Write ``report`` to ``out`` (when given) and return the run's closing line.

    Args:
        report: :func:`build_report`'s report.
        out: The JSON file to write (its folder is created), or ``None``.

    Returns:
        ``check: <n> PASS, <n> FAIL, <n> SKIP in <s> s`` and, with ``out``, ``; report: <out>``.
    """
    summary = report["summary"]
    tail = (
        f"check: {summary['PASS']} PASS, {summary['FAIL']} FAIL, {summary['SKIP']} SKIP in"
        f" {report['seconds']:.1f} s"
    )
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
        tail += f"; report: {path}"
    return tail
