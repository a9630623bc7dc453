"""The one-GPU run: every step of a GPU node's install and measurements, each under a time limit.

``python -m tutorial_utils.cli.gpu_setup run`` takes the steps of :data:`STEP_SECONDS` in order
(preflight, verify, build, install, gate, the benchmarks, the check), each a command of its own
in its own process group, streams their output to ``OUT/gpu-run/<log>.log`` and rewrites a
summary next to it before and after each step, so a killed run still leaves both. Nothing at
its top imports JAX or TE: the run's first steps install TE.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tutorial_utils.cli.gpu_bundle import shell_line
from tutorial_utils.cli.gpu_cuda import library_env

__all__ = ["STEP_SECONDS", "STOPPING", "run_commands", "run_step", "run"]

#: ``(name, seconds allowed)`` of every step, in the order a run takes them: the benchmarks,
#: which are the point of the run, before the check. Sized for the lent H200 node (16 cores, a
#: cold disk): every step that imports TE also imports torch (TE's ``__init__`` imports its
#: PyTorch side whenever torch is installed) and starts JAX on the GPU; the build takes about
#: 90 s on 16 cores (``attention.cpp`` alone about 80 s of one core); ``check --quick`` took
#: 44 s on a CPU and adds about 12 cuDNN graph builds on a GPU.
STEP_SECONDS = {
    "preflight": 30,
    "verify": 5,
    "build": 150,
    "install": 45,
    "gate": 60,
    "bench-single": 90,
    "bench-emulated": 120,
    "check": 120,
}
#: Steps whose failure makes the rest meaningless: the run stops there.
STOPPING = ("preflight", "verify", "build", "install", "gate")


def run_commands(
    bundle_dir: Path, out: Path, python: str | None = None, steps: Sequence[str] | None = None
) -> list[tuple[str, int, list[str]]]:
    """``(name, seconds, command)`` of ``steps`` (all of :data:`STEP_SECONDS` when ``None``).

    Every command can run again in the same tree: the build is kept, and ``--force``
    replaces the previous check report and records.
    """
    python = sys.executable if python is None else python  # this Python, at call time
    bundle_dir, out = Path(bundle_dir), Path(out)
    me = [python, "-m", "tutorial_utils.cli.gpu_setup"]
    bench = [
        python,
        "-m",
        "tutorial_utils.cli.bench",
        "--preset",
        "seed",
        "--windows",
        "8192",
        "--out",
        str(out),
        "--no-progress",
        "--force",
    ]
    every = {
        "preflight": me + ["preflight", str(bundle_dir)],
        "verify": me + ["verify", str(bundle_dir)],
        "build": me + ["build-ext", str(bundle_dir), "--out", str(out)],
        "install": me + ["install", str(bundle_dir)],
        "gate": me + ["gate"],
        "bench-single": bench + ["--strategies", "single", "--name", "gpu-seed-single"],
        "bench-emulated": (
            bench
            + [
                "--emulate-ranks",
                "4",
                "--strategies",
                "single,ring,allgather",
                "--stripes",
                "512",
                "--name",
                "gpu-seed-emulated-4",
            ]
        ),
        "check": [
            python,
            "-m",
            "tutorial_utils.cli.check",
            "--quick",
            "--out",
            str(out / "checks" / "gpu-check.json"),
            "--force",
        ],
    }
    names = list(STEP_SECONDS) if steps is None else list(steps)
    unknown = [n for n in names if n not in every]
    if unknown:
        raise ValueError(f"steps={unknown}: choose from {list(every)}.")
    return [(name, STEP_SECONDS[name], every[name]) for name in names]


def run_step(
    cmd: Sequence[str], limit: float, log, env: dict[str, str] | None = None
) -> tuple[object, float]:
    """Run ``cmd`` in its own process group, its output appended to the open file ``log`` as it
    comes.

    On timeout the whole group is killed (pip's and the compiler's children too), so nothing
    from this step goes on into the next. Returns ``(returncode or "timeout", seconds)``.
    """
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        rc = "timeout"
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=5)
                time.sleep(0.2)  # let the group's other members take the signal too
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything of the group still alive
        except ProcessLookupError:
            pass
    return rc, round(time.perf_counter() - start, 1)


def run(
    bundle_dir: Path,
    out: Path,
    *,
    dry_run: bool = False,
    python: str | None = None,
    steps: list[tuple[str, int, list[str]]] | None = None,
    log_name: str = "run",
    tail: int = 6000,
) -> dict:
    """Run ``steps`` (every step of :func:`run_commands` when ``None``), each under its limit.

    Each step's output is streamed to ``out/gpu-run/<log_name>.log`` and the summary rewritten to
    ``out/gpu-run/<log_name>.json`` before and after each step, so a killed run still leaves both
    (a subfolder: every ``*.json`` directly in ``out`` must be a ``cp-bench/1`` record). A failed
    preflight, verify, build, install or import gate stops the run; the benchmarks and the check
    run with ``TUTORIAL_TE_BACKEND=te``, so they fail rather than fall back to the reference.
    Every step gets :func:`~tutorial_utils.cli.gpu_cuda.library_env`'s ``LD_LIBRARY_PATH``, so
    TE's core library finds cuBLAS and cudart on either of TE's loader branches. The last
    ``tail`` characters of the log are printed at the end (the whole log stays in the file).
    """
    python = sys.executable if python is None else python  # this Python, at call time
    out, bundle_dir = Path(out), Path(bundle_dir)
    steps = run_commands(bundle_dir, out, python) if steps is None else steps
    summary = {"limit_s": sum(limit for _, limit, _ in steps), "steps": []}
    if dry_run:
        for name, limit, cmd in steps:
            print(f"+ [{name}, <= {limit} s]", shell_line(cmd))
        return summary
    folder = out / "gpu-run"
    folder.mkdir(parents=True, exist_ok=True)
    env = library_env()
    env["TUTORIAL_TE_BACKEND"] = "te"
    env["PYTHONUNBUFFERED"] = "1"
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(
        [src] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    stopped = None
    with open(folder / f"{log_name}.log", "w") as log:
        for name, limit, cmd in steps:
            entry = {"name": name, "limit_s": limit, "command": shell_line(cmd)}
            if stopped:
                summary["steps"].append({**entry, "rc": None, "note": f"not run: {stopped} failed"})
                continue
            summary["steps"].append({**entry, "rc": "running"})
            (folder / f"{log_name}.json").write_text(json.dumps(summary, indent=2))
            line = f"+ [{name}, <= {limit} s] {shell_line(cmd)}"
            print(line, flush=True)
            log.write(line + "\n")
            log.flush()
            rc, seconds = run_step(cmd, limit, log, env)
            log.write(f"= [{name}] rc={rc} in {seconds} s\n")
            log.flush()
            print(f"= [{name}] rc={rc} in {seconds} s", flush=True)
            summary["steps"][-1].update(rc=rc, seconds=seconds)
            if rc != 0 and name in STOPPING:
                stopped = name
                print(
                    f"!! {name} failed: the run stops here; see {folder / (log_name + '.log')}",
                    flush=True,
                )
            (folder / f"{log_name}.json").write_text(json.dumps(summary, indent=2))
    summary["ok"] = all(s["rc"] == 0 for s in summary["steps"])
    (folder / f"{log_name}.json").write_text(json.dumps(summary, indent=2))
    with open(folder / f"{log_name}.log") as f:
        if tail:
            print(f.read()[-tail:], flush=True)
    return summary
