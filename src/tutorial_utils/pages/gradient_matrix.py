"""Chapter 9's table of the committed gradient-check calibration.

``benchmarks/gradient_check_matrix.py`` runs correct and broken CP ports through TE's code and
writes ``results/gradient_check/matrix.json``; the chapter shows that record as it was
committed (it does not run the matrix), naming where it ran.
"""

from __future__ import annotations

import json
from pathlib import Path

from tutorial_utils.perfmodel.records import default_results_dir

__all__ = ["MatrixTable", "gradient_check_matrix"]

MODEL_NAMES = {"ch9": "ch. 9 decoder", "ch7": "ch. 7 LM", "gqa": "GQA local/global"}
STRATEGY_NAMES = {"ring": "Ring", "allgather": "AllGather"}


def _num(x: float) -> str:
    """A number that a narrow cell never splits at its exponent's hyphen."""
    return f"<span class='cp-num'>{x:.3g}</span>"


def _groupable(row: dict) -> bool:
    """A correct bfloat16 run whose verdict was right: one of those a model's row stands for."""
    return (
        row["run"] == "correct" and row["dtype"] == "bfloat16" and row["verdict"] == row["expected"]
    )


def _strategy(row: dict) -> str:
    """The strategy's name as the chapters write it (Ring, AllGather)."""
    return STRATEGY_NAMES.get(row["strategy"], row["strategy"])


def _shared_rows_note(entries: list[list[dict]]) -> str:
    """What the shared rows stand for, e.g. ``Ring and AllGather on 2, 4 and 8 devices``."""
    runs = [r for e in entries if len(e) > 1 for r in e]
    if not runs:
        return ""
    strategies = " and ".join(dict.fromkeys(_strategy(r) for r in runs))
    cps = [str(cp) for cp in sorted({r["cp"] for r in runs})]
    devices = ", ".join(cps[:-1]) + f" and {cps[-1]}" if len(cps) > 1 else cps[0]
    return (
        f" Each model's correct bfloat16 runs ({strategies} on {devices} devices) share a row:"
        " the run nearest its bound."
    )


class MatrixTable:
    """The matrix as a Markdown table with its source and its count of wrong verdicts.

    Each model's correct bfloat16 runs with right verdicts share one row: the run nearest its
    bound (the largest err_cp / bound). Every other run has a row of its own.
    """

    def __init__(self, record: dict, path: Path):
        self.record, self.path = record, path

    def entries(self) -> list[list[dict]]:
        """The table's rows in the record's order, each as the runs it stands for (the shown
        run first)."""
        shared: dict[str, list[dict]] = {}
        for r in self.record["rows"]:
            if _groupable(r):
                shared.setdefault(r["model"], []).append(r)
        entries = []
        for r in self.record["rows"]:
            if not _groupable(r):
                entries.append([r])
            elif r is shared[r["model"]][0]:
                runs = shared[r["model"]]
                worst = max(runs, key=lambda x: x["err_cp"] / x["bound"])
                entries.append([worst] + [x for x in runs if x is not worst])
        return entries

    def markdown(self) -> str:
        rows, direct = self.record["rows"], "TE's `fused_attn` called directly"
        lines = [
            "| model | CP (stripe) | run | err_cp | err_one | bound | verdict |",
            "|---|---|---|---|---|---|---|",
        ]
        entries = self.entries()
        for runs in entries:
            r = runs[0]
            run = r["run"] + ("" if r["dtype"] == "bfloat16" else f", {r['dtype']}")
            run += f", worst of {len(runs)}" if len(runs) > 1 else ""
            run += " †" if "directly" in r["note"] else ""
            verdict = r["verdict"] + ("" if r["verdict"] == r["expected"] else " (WRONG)")
            lines.append(
                f"| {MODEL_NAMES.get(r['model'], r['model'])} |"
                f" {_strategy(r)}, {r['cp']} ({r['stripe']}) | {run} |"
                f" {_num(r['err_cp'])} | {_num(r['err_one'])} | {_num(r['bound'])} | {verdict} |"
            )
        summary = self.record["summary"]
        wrong = len(summary["false_alarms"]) + len(summary["misses"])
        correct = sum(r["expected"] == "pass" for r in rows)
        return (
            f"Source: `results/gradient_check/{self.path.name}`, {self.record['source']}"
            f" ({self.record['created'][:10]}). {correct} correct and {len(rows) - correct}"
            f" broken runs, {wrong} wrong verdicts.{_shared_rows_note(entries)}\n\n"
            + "\n".join(lines)
            + f"\n\n† {direct}: TE computes these without an error; the facade refuses them.\n"
        )

    def _repr_markdown_(self) -> str:
        return self.markdown()

    def __repr__(self) -> str:
        return self.markdown()


def gradient_check_matrix(path: str | Path | None = None) -> MatrixTable:
    """The committed calibration matrix, shown by Jupyter as a table.

    Args:
        path: The record to show; default ``results/gradient_check/matrix.json``.

    Returns:
        A :class:`MatrixTable` (Markdown output in a notebook).

    Raises:
        FileNotFoundError: The record is missing; the message names the command that writes it.
    """
    path = Path(path) if path else default_results_dir() / "gradient_check" / "matrix.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist; write it with `.venv/bin/python -m tutorial_utils.te_on_cpu"
            " --devices 8 benchmarks/gradient_check_matrix.py`."
        )
    return MatrixTable(json.loads(path.read_text()), path)
