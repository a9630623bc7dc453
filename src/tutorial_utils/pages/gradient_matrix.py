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


class MatrixTable:
    """The matrix as a Markdown table with its source and its count of wrong verdicts."""

    def __init__(self, record: dict, path: Path):
        self.record, self.path = record, path

    def markdown(self) -> str:
        rows, direct = self.record["rows"], "TE's `fused_attn` called directly"
        lines = [
            "| model | CP (stripe) | run | err_cp | err_one | bound | verdict |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            run = r["run"] + ("" if r["dtype"] == "bfloat16" else f", {r['dtype']}")
            run += " †" if "directly" in r["note"] else ""
            verdict = r["verdict"] + ("" if r["verdict"] == r["expected"] else " (WRONG)")
            lines.append(
                f"| {MODEL_NAMES.get(r['model'], r['model'])} |"
                f" {STRATEGY_NAMES.get(r['strategy'], r['strategy'])}, {r['cp']} ({r['stripe']})"
                f" | {run} | {_num(r['err_cp'])} | {_num(r['err_one'])} | {_num(r['bound'])} |"
                f" {verdict} |"
            )
        summary = self.record["summary"]
        wrong = len(summary["false_alarms"]) + len(summary["misses"])
        correct = sum(r["expected"] == "pass" for r in rows)
        return (
            f"Source: `results/gradient_check/{self.path.name}`, {self.record['source']}"
            f" ({self.record['created'][:10]}). {correct} correct and {len(rows) - correct}"
            f" broken runs, {wrong} wrong verdicts.\n\n" + "\n".join(lines) + f"\n\n† {direct}:"
            " the facade refuses these settings with an error, TE computes them without one.\n"
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
