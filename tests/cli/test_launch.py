"""Multi-process launch on 127.0.0.1 with gloo CPU collectives: results, a dead rank, a missing
rank.

The multi-process tests start real processes (one CPU device each); they are marked slow.
Each subprocess gets a clean environment: the test suite's XLA_FLAGS (8 simulated devices)
must not leak into the workers, and the launcher replaces it with one device per process.
The workers run the default backend (TE's own JAX code with the CPU stand-in kernel), not
the suite's ``TUTORIAL_TE_BACKEND=reference``. The 2-process demo runs here; the 4-process
demo is the command docs/multinode.md and README.md show, run as typed from a fresh clone
by tests/site/test_shown_commands.py (with the same checks, ``launch_demo_checks``).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import exit_status_and_stderr
from launch_demo_checks import assert_demo_passed

from tutorial_utils.cli import launch as L
from tutorial_utils.cli.process_launcher import target_argv

ROOT = Path(__file__).resolve().parents[2]
#: The launcher's --timeout and the subprocess's timeout: hang guards only, far above what any
#: run needs, so that a slow, busy machine passes; what each test checks is who stopped the ranks
#: and why, from the launcher's summary and the ranks' own output.
LAUNCH_TIMEOUT_S = 600
HANG_GUARD_S = LAUNCH_TIMEOUT_S + 60


def _env():
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("TUTORIAL_TE_BACKEND", None)  # the default backend: TE's code on CPU
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _launch(*args):
    """Run the launcher with ``args`` and --timeout LAUNCH_TIMEOUT_S (a hang guard)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tutorial_utils.cli.launch",
            *args,
            "--timeout",
            str(LAUNCH_TIMEOUT_S),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        cwd=ROOT,
    )


def _summary(stderr: str) -> str:
    """The launcher's last line: each rank's fate."""
    return stderr.strip().splitlines()[-1]


def _assert_not_timed_out(proc):
    """The ranks ended by themselves or by the launcher, never by the hang guard."""
    assert proc.returncode != L.EXIT_LAUNCH_TIMEOUT, proc.stderr[-2000:]
    assert "TIMEOUT after" not in proc.stderr
    assert not _summary(proc.stderr).startswith("FAILED: timed out"), proc.stderr[-2000:]


def _rank_lines(stdout: str, rank: int):
    prefix = f"[rank {rank}] "
    return [line[len(prefix) :] for line in stdout.splitlines() if line.startswith(prefix)]


# ----------------------------------------------------------------------------- fast unit tests


def test_child_env_replaces_the_device_count_and_sets_the_coordinator():
    base = {
        "XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=4",
        "SLURM_JOB_ID": "7",
        "PATH": "/bin",
    }
    env = L.child_env(
        2,
        4,
        12345,
        platform="cpu",
        init_timeout=20,
        heartbeat_timeout=10,
        shutdown_timeout=10,
        base=base,
    )
    assert env["COORDINATOR_ADDRESS"] == "127.0.0.1:12345"
    assert (env["NUM_PROCESSES"], env["PROCESS_ID"]) == ("4", "2")
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["XLA_FLAGS"].count("xla_force_host_platform_device_count") == 1
    assert (
        "--xla_force_host_platform_device_count=1" in env["XLA_FLAGS"]
        and "--xla_foo=1" in env["XLA_FLAGS"]
    )
    assert "SLURM_JOB_ID" not in env
    assert env["CP_LAUNCH_INIT_TIMEOUT"] == "20" and env["CP_LAUNCH_HEARTBEAT_TIMEOUT"] == "10"
    gpu = L.child_env(
        3, 4, 1, platform="gpu", init_timeout=20, heartbeat_timeout=10, shutdown_timeout=10, base={}
    )
    assert gpu["CP_LAUNCH_LOCAL_DEVICE_IDS"] == "3" and "JAX_PLATFORMS" not in gpu


def test_target_argv_module_or_script(tmp_path):
    script = tmp_path / "w.py"
    script.write_text("print(1)\n")
    assert target_argv(["pkg.mod", "--x"]) == [sys.executable, "-m", "pkg.mod", "--x"]
    assert target_argv([str(script), "a"]) == [sys.executable, str(script), "a"]
    with pytest.raises(ValueError, match="nothing to launch"):
        target_argv([])


def test_initialize_without_settings_runs_alone(monkeypatch):
    for var in (
        "COORDINATOR_ADDRESS",
        "NUM_PROCESSES",
        "PROCESS_ID",
        "SLURM_JOB_ID",
        "OMPI_COMM_WORLD_SIZE",
    ):
        monkeypatch.delenv(var, raising=False)
    info = L.initialize()
    assert info["distributed"] is False and info["num_processes"] == 1


def test_initialize_rejects_partial_settings(monkeypatch):
    monkeypatch.setenv("COORDINATOR_ADDRESS", "127.0.0.1:1")
    monkeypatch.delenv("NUM_PROCESSES", raising=False)
    monkeypatch.delenv("PROCESS_ID", raising=False)
    with pytest.raises(ValueError, match="NUM_PROCESSES, PROCESS_ID not set"):
        L.initialize()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--demo"], "-n/--nprocs"),
        (["-n", "4"], "nothing to launch"),
        (["-n", "4", "--demo", "--skip-rank", "5"], "--skip-rank"),
        (["-n", "4", "--demo", "--fail-rank", "4"], "--fail-rank"),
        (["-n", "0", "--demo"], "-n/--nprocs"),
        (["-n", "2", "--demo", "--strategies", "zigzag"], "--strategies"),
        (["-n", "2", "--demo", "--dtype", "float32"], "--dtype: float32 with backend 'auto'"),
        (
            ["-n", "2", "--demo", "--dtype", "float32", "--backend", "te-cpu"],
            "add --backend reference",
        ),
    ],
)
def test_cli_errors_name_the_parameter(args, needle, capsys, monkeypatch):
    monkeypatch.delenv("TUTORIAL_TE_BACKEND", raising=False)  # the default backend, as _env() gives
    monkeypatch.setattr(L, "launch", lambda *a, **k: pytest.fail(f"{args} started processes"))
    status, stderr = exit_status_and_stderr(L.main, args, capsys)
    assert status == 2
    assert needle in stderr


def test_the_backend_option_reaches_every_rank(monkeypatch):
    """``--backend reference`` (with fp32) stays available: the ranks get
    TUTORIAL_TE_BACKEND=reference."""
    seen = {}

    def fake_launch(nprocs, target, **kw):
        seen.update(nprocs=nprocs, target=list(target), base_env=kw["base_env"])
        return L.LaunchResult(0, {}, None, "OK", 0.0, {})

    monkeypatch.setattr(L, "launch", fake_launch)
    assert (
        L.main(
            [
                "-n",
                "2",
                "--demo",
                "--backend",
                "reference",
                "--dtype",
                "float32",
                "--strategies",
                "ring",
            ]
        )
        == 0
    )
    assert seen["base_env"]["TUTORIAL_TE_BACKEND"] == "reference"
    assert seen["target"][:2] == ["tutorial_utils.cli.launch", "--worker-demo"]
    assert (
        "--dtype" in seen["target"]
        and seen["target"][seen["target"].index("--dtype") + 1] == "float32"
    )
    assert (
        L.main(["-n", "2", "--demo"]) == 0
    )  # default: inherited backend, bf16, TE's AllGather and Ring
    assert seen["base_env"] is None
    assert seen["target"][seen["target"].index("--strategies") + 1] == "te-allgather,te-ring"
    assert seen["target"][seen["target"].index("--dtype") + 1] == "bfloat16"


# ----------------------------------------------------------------------------- multi-process (slow)


@pytest.mark.slow
def test_two_processes_run_te_s_allgather_and_ring_like_one_process(tmp_path):
    """The default demo on the default backend: TE's code in every process, bf16, both strategies in
    one launch."""
    proc = _launch("-n", "2", "--demo", "--out", str(tmp_path))
    assert_demo_passed(proc.returncode, proc.stdout, proc.stderr, tmp_path, nprocs=2)


@pytest.mark.slow
def test_a_rank_that_dies_makes_the_distributed_runtime_stop_the_others():
    """--on-failure wait: the launcher does not stop the others; JAX's coordination service must,
    through its heartbeats, long before the hang guard."""
    proc = _launch(
        "-n",
        "4",
        "--demo",
        "--strategies",
        "te-ring",
        "--fail-rank",
        "2",
        "--on-failure",
        "wait",
        "--heartbeat-timeout",
        "5",
        "--init-timeout",
        "120",
    )
    assert proc.returncode != 0
    _assert_not_timed_out(proc)
    assert "rank 2 failed first" in proc.stderr
    assert "injected failure on rank 2" in "\n".join(_rank_lines(proc.stdout, 2))
    summary = _summary(proc.stderr)
    for rank in (0, 1, 3):
        out = "\n".join(_rank_lines(proc.stdout, rank))
        # each survivor was stopped by the distributed runtime, which names the dead task
        assert "stopped sending heartbeats" in out or "Terminating process" in out, out[-2000:]
        assert f"rank {rank}: stopped by the launcher" not in summary
        assert re.search(rf"rank {rank}: (killed by|exit code [1-9])", summary), summary


@pytest.mark.slow
def test_the_launcher_stops_the_others_at_the_first_failure():
    """--on-failure kill (the default): the launcher stops every other rank itself, at once,
    rather than leaving them to the distributed runtime's heartbeat timeout or the hang guard."""
    proc = _launch("-n", "4", "--demo", "--strategies", "te-ring", "--fail-rank", "1")
    assert proc.returncode == 1
    _assert_not_timed_out(proc)
    assert "rank 1 failed first (exit code 1)" in proc.stderr
    assert "stopping ranks 0,2,3 because rank 1 failed" in proc.stderr
    summary = _summary(proc.stderr)
    assert "rank 1: exit code 1" in summary, summary
    for rank in (0, 2, 3):  # still running when the launcher saw rank 1 fail
        assert f"rank {rank}: stopped by the launcher" in summary, summary


@pytest.mark.slow
def test_a_rank_that_never_starts_makes_initialization_time_out():
    """The others' own init watchdog (--init-timeout) ends them with its exit code, not the
    launcher's hang guard."""
    proc = _launch(
        "-n",
        "4",
        "--demo",
        "--strategies",
        "te-ring",
        "--skip-rank",
        "3",
        "--init-timeout",
        "6",
        "--on-failure",
        "wait",
    )
    assert proc.returncode == L.EXIT_INIT_TIMEOUT
    _assert_not_timed_out(proc)
    assert "rank 3 is deliberately not started" in proc.stderr
    assert "Ranks 3 were never started" in proc.stderr
    summary = _summary(proc.stderr)
    assert "rank 3: not started (--skip-rank)" in summary, summary
    for rank in (0, 1, 2):
        assert f"rank {rank}: exit code 3 (distributed initialization timed out)" in summary
        out = "\n".join(_rank_lines(proc.stdout, rank))
        assert "distributed initialization timed out after 6 s" in out
        assert "not all 4 processes joined the coordinator" in out
