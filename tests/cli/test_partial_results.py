"""A step of the GPU run killed at its time limit keeps what finished: ``bench`` rewrites its
record after each case and ``check`` its report after each check, each marked incomplete until
the end. Shown on CPU by interrupting the run after its first case (a ``KeyboardInterrupt``,
which no case's error handling catches, as a kill is not)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tutorial_utils.perfmodel.records import validate_record

ROOT = Path(__file__).resolve().parents[2]

BENCH = """
import sys
from tutorial_utils.cli import bench_run
def killed(*args, **kwargs):
    raise KeyboardInterrupt("killed at its limit")
bench_run.time_cp = killed
from tutorial_utils.cli import bench
sys.exit(bench.main(sys.argv[1:]))
"""

CHECK = """
import sys
from tutorial_utils.cli import check, check_suite
def two_then_killed(*, echo, **kwargs):
    echo("PASS reference-vs-oracle:dense: worst out 1e-7")
    echo("FAIL te-fused-attn:thd: worst dq 0.5 > 0.039")
    raise KeyboardInterrupt("killed at its limit")
check_suite.run_checks = two_then_killed
sys.exit(check.main(sys.argv[1:]))
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_PLATFORMS="cpu",
        TUTORIAL_TE_BACKEND="reference",
        PYTHONPATH=str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", ""),
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def test_a_killed_bench_keeps_the_rows_that_finished(tmp_path):
    proc = _run(
        BENCH,
        *("--preset", "tiny", "--iters", "1", "--warmup", "0", "--windows", "32"),
        *("--strategies", "single,ring", "--out", str(tmp_path), "--name", "seed", "--no-progress"),
    )
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr
    record = json.loads((tmp_path / "seed.json").read_text())
    validate_record(record)
    assert [r["strategy"] for r in record["results"]] == ["single"]
    assert record["incomplete"] == {"cases_run": 1, "cases": 2}
    assert record["notes"].startswith("incomplete: 1 of 2 cases had run")


def test_a_killed_check_keeps_the_checks_that_finished(tmp_path):
    out = tmp_path / "checks" / "gpu-check.json"
    proc = _run(CHECK, "--quick", "--out", str(out))
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr
    report = json.loads(out.read_text())
    assert report["complete"] is False and report["ok"] is False
    assert [(c["name"], c["verdict"]) for c in report["checks"]] == [
        ("reference-vs-oracle:dense", "PASS"),
        ("te-fused-attn:thd", "FAIL"),
    ]
    assert report["checks"][1]["detail"] == "worst dq 0.5 > 0.039"
    assert report["summary"] == {"PASS": 1, "FAIL": 1, "SKIP": 0}
