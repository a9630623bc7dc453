"""Multi-process launch on 127.0.0.1 with gloo CPU collectives: results, a dead rank, a missing rank.

The multi-process tests start real processes (one CPU device each); they are marked slow.
Each subprocess gets a clean environment: the test suite's XLA_FLAGS (4 simulated devices)
must not leak into the workers, and the launcher replaces it with one device per process.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tutorial_utils.tools import launch as L

ROOT = Path(__file__).resolve().parents[1]
BOUND_S = 120  # a failure must surface within this many seconds


def _env():
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    env["TUTORIAL_TE_BACKEND"] = "reference"
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _launch(*args, timeout=170):
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tutorial_utils.tools.launch", *args], env=_env(), capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    return proc, time.monotonic() - t0


def _rank_lines(stdout: str, rank: int):
    prefix = f"[rank {rank}] "
    return [line[len(prefix):] for line in stdout.splitlines() if line.startswith(prefix)]


# ----------------------------------------------------------------------------- fast unit tests


def test_child_env_replaces_the_device_count_and_sets_the_coordinator():
    base = {"XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=4", "SLURM_JOB_ID": "7", "PATH": "/bin"}
    env = L.child_env(2, 4, 12345, platform="cpu", init_timeout=20, heartbeat_timeout=10, shutdown_timeout=10, base=base)
    assert env["COORDINATOR_ADDRESS"] == "127.0.0.1:12345"
    assert (env["NUM_PROCESSES"], env["PROCESS_ID"]) == ("4", "2")
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["XLA_FLAGS"].count("xla_force_host_platform_device_count") == 1
    assert "--xla_force_host_platform_device_count=1" in env["XLA_FLAGS"] and "--xla_foo=1" in env["XLA_FLAGS"]
    assert "SLURM_JOB_ID" not in env
    assert env["CP_LAUNCH_INIT_TIMEOUT"] == "20" and env["CP_LAUNCH_HEARTBEAT_TIMEOUT"] == "10"
    gpu = L.child_env(3, 4, 1, platform="gpu", init_timeout=20, heartbeat_timeout=10, shutdown_timeout=10, base={})
    assert gpu["CP_LAUNCH_LOCAL_DEVICE_IDS"] == "3" and "JAX_PLATFORMS" not in gpu


def test_target_argv_module_or_script(tmp_path):
    script = tmp_path / "w.py"
    script.write_text("print(1)\n")
    assert L._target_argv(["pkg.mod", "--x"]) == [sys.executable, "-m", "pkg.mod", "--x"]
    assert L._target_argv([str(script), "a"]) == [sys.executable, str(script), "a"]
    with pytest.raises(ValueError, match="nothing to launch"):
        L._target_argv([])


def test_initialize_without_settings_runs_alone(monkeypatch):
    for var in ("COORDINATOR_ADDRESS", "NUM_PROCESSES", "PROCESS_ID", "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    info = L.initialize()
    assert info["distributed"] is False and info["num_processes"] == 1


def test_initialize_rejects_partial_settings(monkeypatch):
    monkeypatch.setenv("COORDINATOR_ADDRESS", "127.0.0.1:1")
    monkeypatch.delenv("NUM_PROCESSES", raising=False)
    monkeypatch.delenv("PROCESS_ID", raising=False)
    with pytest.raises(ValueError, match="NUM_PROCESSES, PROCESS_ID not set"):
        L.initialize()


@pytest.mark.parametrize("args, needle", [
    (["--demo"], "-n/--nprocs"),
    (["-n", "4"], "nothing to launch"),
    (["-n", "4", "--demo", "--skip-rank", "5"], "--skip-rank"),
    (["-n", "4", "--demo", "--fail-rank", "4"], "--fail-rank"),
    (["-n", "0", "--demo"], "-n/--nprocs"),
    (["-n", "2", "--demo", "--strategies", "zigzag"], "--strategies"),
])
def test_cli_errors_name_the_parameter(args, needle):
    proc = subprocess.run([sys.executable, "-m", "tutorial_utils.tools.launch", *args], env=_env(), capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 2
    assert needle in proc.stderr


# ----------------------------------------------------------------------------- multi-process (slow)


@pytest.mark.slow
def test_four_processes_match_the_single_process_run(tmp_path):
    strategies = ["ring", "allgather", "ulysses", "te-allgather"]
    proc, wall = _launch("-n", "4", "--timeout", "160", "--demo", "--strategies", ",".join(strategies), "--out",
                         str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "OK: all 4 ranks exited 0" in proc.stderr
    rows = [json.loads(line.split("DEMO-RESULT ", 1)[1]) for line in proc.stdout.splitlines() if "DEMO-RESULT " in line]
    assert len(rows) == 4 * len(strategies)
    for strategy in strategies:
        mine = [r for r in rows if r["strategy"] == strategy]
        assert sorted(r["rank"] for r in mine) == [0, 1, 2, 3]
        assert all(r["cp"] == 4 for r in mine)
        # every rank's shards of out, dq, dk, dv match the single-process computation (fp32)
        assert max(r["max_abs_err_all_ranks"] for r in mine) < 1e-5
        # the global checksum is one replicated value, equal on every rank, and matches the reference
        assert len({r["checksum"] for r in mine}) == 1
        assert mine[0]["checksum"] == pytest.approx(mine[0]["reference_checksum"], abs=1e-3)
        assert mine[0]["loss"] == pytest.approx(mine[0]["reference_loss"], rel=1e-5)
    for rank in range(4):
        saved = json.loads((tmp_path / f"demo-rank{rank}.json").read_text())
        assert saved["info"]["distributed"] is True and saved["info"]["num_processes"] == 4
    assert wall < 170


@pytest.mark.slow
def test_a_custom_script_gets_the_coordinator_settings(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(
        "from tutorial_utils.tools.launch import initialize\n"
        "info = initialize()\n"
        "import numpy as np\n"
        "from jax.experimental import multihost_utils\n"
        "got = multihost_utils.process_allgather(np.array([info['process_id']]))\n"
        "print('GATHERED', sorted(int(x) for x in np.ravel(got)), len(info['global_devices']))\n")
    proc, _ = _launch("-n", "3", "--timeout", "90", "--", str(script))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    for rank in range(3):
        assert "GATHERED [0, 1, 2] 3" in _rank_lines(proc.stdout, rank)


@pytest.mark.slow
def test_a_rank_that_dies_makes_the_others_fail_within_the_bound():
    # --on-failure wait: the launcher does not stop the others; JAX's coordination service must.
    proc, wall = _launch("-n", "4", "--timeout", "110", "--demo", "--strategies", "ring", "--fail-rank", "2",
                         "--on-failure", "wait", "--heartbeat-timeout", "10", "--init-timeout", "40")
    assert proc.returncode != 0
    assert wall < BOUND_S
    assert "rank 2 failed first" in proc.stderr
    assert "injected failure on rank 2" in "\n".join(_rank_lines(proc.stdout, 2))
    summary = proc.stderr.strip().splitlines()[-1]
    for rank in (0, 1, 3):
        out = "\n".join(_rank_lines(proc.stdout, rank))
        # each survivor was stopped by the distributed runtime, which names the dead task
        assert "stopped sending heartbeats" in out or "Terminating process" in out, out[-2000:]
        assert f"rank {rank}: stopped by the launcher" not in summary
        assert re.search(rf"rank {rank}: (killed by|exit code [1-9])", summary), summary


@pytest.mark.slow
def test_the_launcher_stops_the_others_at_the_first_failure():
    proc, wall = _launch("-n", "4", "--timeout", "110", "--demo", "--strategies", "ring", "--fail-rank", "1")
    assert proc.returncode == 1
    assert wall < 60
    assert "rank 1 failed first (exit code 1)" in proc.stderr
    assert "because rank 1 failed" in proc.stderr


@pytest.mark.slow
def test_a_rank_that_never_starts_makes_initialization_time_out():
    proc, wall = _launch("-n", "4", "--timeout", "110", "--demo", "--strategies", "ring", "--skip-rank", "3",
                         "--init-timeout", "15", "--on-failure", "wait")
    assert proc.returncode == L.EXIT_INIT_TIMEOUT
    assert wall < 60
    assert "rank 3 is deliberately not started" in proc.stderr
    assert "Ranks 3 were never started" in proc.stderr
    for rank in (0, 1, 2):
        out = "\n".join(_rank_lines(proc.stdout, rank))
        assert "distributed initialization timed out after 15 s" in out
        assert "not all 4 processes joined the coordinator" in out
