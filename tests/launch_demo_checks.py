"""What a passing ``launch --demo`` run must show; shared by test_launch.py (2 processes) and
test_shown_commands.py (the 4-process command the docs show, run from a fresh clone)."""

import json
from pathlib import Path

import pytest

BF16_TOL = 0.0394  # TE's rtol = atol = eps(bf16)**(2/3)
DEFAULT_STRATEGIES = ("te-allgather", "te-ring")


def demo_rows(stdout: str):
    return [
        json.loads(line.split("DEMO-RESULT ", 1)[1])
        for line in stdout.splitlines()
        if "DEMO-RESULT " in line
    ]


def assert_demo_passed(
    returncode: int,
    stdout: str,
    stderr: str,
    out_dir: Path,
    *,
    nprocs: int,
    strategies=DEFAULT_STRATEGIES,
) -> dict:
    """Every rank ran TE's code (TE-on-CPU) in bf16; outputs and gradients of both strategies match
    one process.

    Returns ``{strategy: {baseline: max |err| over all ranks}}`` for the report.
    """
    assert returncode == 0, stdout[-4000:] + stderr[-2000:]
    assert f"OK: all {nprocs} ranks exited 0" in stderr
    rows = demo_rows(stdout)
    assert len(rows) == nprocs * len(strategies)
    errors = {}
    for strategy in strategies:
        mine = [r for r in rows if r["strategy"] == strategy]
        assert sorted(r["rank"] for r in mine) == list(range(nprocs))
        for r in mine:
            assert r["cp"] == nprocs and r["dtype"] == "bfloat16" and r["backend"] == "te-cpu", r
            assert r["tolerance"] == pytest.approx(BF16_TOL, abs=1e-4)
            # both one-process baselines: the fp32 reference and TE's fused_attn without CP
            assert set(r["all_ranks"]) == {"reference", "one_process_te"}
            assert r["ok"] and r["worst_ratio_to_tol"] <= 1.0, r
            for baseline in r["all_ranks"].values():
                assert 0.0 < baseline["max_abs_err"] < BF16_TOL * 4, (
                    r
                )  # bf16 rounding is visible, never large
        # one replicated global checksum, equal on every rank, close to the fp32 reference
        assert len({r["checksum"] for r in mine}) == 1
        assert mine[0]["checksum"] == pytest.approx(
            mine[0]["reference_checksum"], rel=BF16_TOL, abs=1.0
        )
        assert mine[0]["loss"] == pytest.approx(mine[0]["reference_loss"], rel=BF16_TOL, abs=1.0)
        errors[strategy] = {k: v["max_abs_err"] for k, v in mine[0]["all_ranks"].items()}
    for rank in range(nprocs):
        saved = json.loads((Path(out_dir) / f"demo-rank{rank}.json").read_text())
        assert saved["info"]["distributed"] is True and saved["info"]["num_processes"] == nprocs
        assert "CPU reference kernel in place of cuDNN" in saved["backend"]
    return errors
