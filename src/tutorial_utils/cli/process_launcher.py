"""The launcher: start one process per device on 127.0.0.1, watch them, stop them, say why.

:func:`launch` gives each rank the settings :func:`~tutorial_utils.cli.distributed_init.initialize`
reads (:func:`child_env`), prefixes its output with ``[rank i]``, and when a rank fails or the
overall timeout passes stops the others (``on_failure='kill'``) or lets the distributed runtime
stop them (``'wait'``); its last line names each rank's fate (:class:`LaunchResult`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from tutorial_utils.cli.distributed_init import (
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_INIT_TIMEOUT,
    DEFAULT_SHUTDOWN_TIMEOUT,
    ENV_COORDINATOR,
    ENV_HEARTBEAT_TIMEOUT,
    ENV_INIT_TIMEOUT,
    ENV_LOCAL_DEVICE_IDS,
    ENV_NUM_PROCESSES,
    ENV_PLATFORM,
    ENV_PROCESS_ID,
    ENV_SHUTDOWN_TIMEOUT,
    EXIT_INIT_TIMEOUT,
)
from tutorial_utils.gpu import gpu_present

__all__ = [
    "launch",
    "LaunchResult",
    "free_port",
    "child_env",
    "target_argv",
    "describe_exit",
    "EXIT_LAUNCH_TIMEOUT",
]

#: Exit code of the launcher when ``--timeout`` passed.
EXIT_LAUNCH_TIMEOUT = 124
_DEVICE_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S+")


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1 (the coordinator binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(
    rank: int,
    nprocs: int,
    port: int,
    *,
    platform: str,
    init_timeout: int,
    heartbeat_timeout: int,
    shutdown_timeout: int,
    cpu_devices_per_process: int = 1,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """Environment of rank ``rank``: coordinator settings, timeouts, and one CPU device (or one GPU)
    per process.

    Any ``--xla_force_host_platform_device_count`` inherited from the parent (e.g. the test
    suite's 4 simulated devices) is replaced, so a CPU rank owns exactly its own device(s).

    Args:
        rank: The rank.
        nprocs: How many ranks.
        port: The coordinator's port on 127.0.0.1.
        platform: ``"cpu"`` or ``"gpu"``.
        init_timeout: Seconds a rank waits for its peers.
        heartbeat_timeout: Seconds without heartbeats before a rank counts as dead.
        shutdown_timeout: Seconds the shutdown barrier waits.
        cpu_devices_per_process: Simulated CPU devices per rank.
        base: The environment to start from (default: this process's).

    Returns:
        The rank's environment.
    """
    env = dict(os.environ if base is None else base)
    env.update(
        {
            ENV_COORDINATOR: f"127.0.0.1:{port}",
            ENV_NUM_PROCESSES: str(nprocs),
            ENV_PROCESS_ID: str(rank),
            ENV_INIT_TIMEOUT: str(init_timeout),
            ENV_HEARTBEAT_TIMEOUT: str(heartbeat_timeout),
            ENV_SHUTDOWN_TIMEOUT: str(shutdown_timeout),
            ENV_PLATFORM: platform,
            "PYTHONUNBUFFERED": "1",
        }
    )
    for var in (
        "SLURM_JOB_ID",
        "OMPI_COMM_WORLD_SIZE",
    ):  # the launcher's settings win over a surrounding job's
        env.pop(var, None)
    if platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        flags = _DEVICE_FLAG.sub("", env.get("XLA_FLAGS", "")).strip()
        env["XLA_FLAGS"] = (
            f"{flags} --xla_force_host_platform_device_count={cpu_devices_per_process}".strip()
        )
    else:
        env[ENV_LOCAL_DEVICE_IDS] = str(rank)
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    return env


@dataclasses.dataclass
class LaunchResult:
    """What :func:`launch` observed. ``exit_codes[r]`` is None for a rank never started."""

    returncode: int
    exit_codes: dict[int, int | None]
    first_failure: int | None
    message: str
    elapsed: float
    output: dict[int, list[str]]


def describe_exit(code: int | None) -> str:
    """A rank's exit status in words, as the launcher's summary says it.

    Args:
        code: The return code (negative: killed by that signal), or ``None``: never started.

    Returns:
        ``not started``, ``killed by SIG...`` (with why for SIGABRT), or ``exit code N``.
    """
    if code is None:
        return "not started"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = (
            " (JAX's distributed runtime aborts a rank whose peer died)"
            if -code == signal.SIGABRT
            else ""
        )
        return f"killed by {name}{why}"
    if code == EXIT_INIT_TIMEOUT:
        return f"exit code {code} (distributed initialization timed out)"
    return f"exit code {code}"


def target_argv(target: Sequence[str]) -> list[str]:
    """The command line that runs ``target`` with this Python.

    Args:
        target: ``[module_or_script, *args]``; a name ending in ``.py`` or an existing file is a
            script, anything else a module (``-m``).

    Returns:
        The argv.

    Raises:
        ValueError: ``target`` is empty.
    """
    if not target:
        raise ValueError("nothing to launch: give `-- <module or script> [args]` or --demo.")
    first, rest = target[0], list(target[1:])
    if first.endswith(".py") or os.path.isfile(first):
        return [sys.executable, first, *rest]
    return [sys.executable, "-m", first, *rest]


def launch(
    nprocs: int,
    target: Sequence[str],
    *,
    port: int | None = None,
    timeout: float | None = None,
    platform: str = "auto",
    skip_ranks: Sequence[int] = (),
    on_failure: str = "kill",
    init_timeout: int = DEFAULT_INIT_TIMEOUT,
    heartbeat_timeout: int = DEFAULT_HEARTBEAT_TIMEOUT,
    shutdown_timeout: int = DEFAULT_SHUTDOWN_TIMEOUT,
    cpu_devices_per_process: int = 1,
    stream=None,
    log=None,
    base_env: dict[str, str] | None = None,
) -> LaunchResult:
    """Start ``nprocs`` ranks of ``target`` (``[module_or_script, *args]``) on 127.0.0.1 and watch
    them.

    Each rank gets ``COORDINATOR_ADDRESS``, ``NUM_PROCESSES`` and ``PROCESS_ID`` (on CPU also
    ``JAX_PLATFORMS=cpu`` and its host devices), and its output is prefixed with ``[rank i]``.
    ``on_failure='kill'`` stops the other ranks as soon as one exits non-zero; ``'wait'`` lets
    them fail by themselves (to see the distributed runtime's own error), still bounded by
    ``timeout``. ``skip_ranks`` are never started (a missing host).

    Args:
        nprocs: How many ranks.
        target: ``[module_or_script, *args]`` (:func:`target_argv`).
        port: The coordinator's port (default: a free one).
        timeout: Overall seconds before every rank still running is stopped.
        platform: ``"auto"``, ``"cpu"`` or ``"gpu"``.
        skip_ranks: Ranks not to start.
        on_failure: ``"kill"`` or ``"wait"``.
        init_timeout: Seconds a rank waits for its peers.
        heartbeat_timeout: Seconds without heartbeats before a rank counts as dead.
        shutdown_timeout: Seconds the shutdown barrier waits.
        cpu_devices_per_process: Simulated CPU devices per rank.
        stream: Where the ranks' prefixed output goes (default: stdout).
        log: Where the launcher's own ``[launch]`` lines go (default: stderr).
        base_env: The ranks' base environment (default: this process's).

    Returns:
        What happened; ``returncode`` is 0 only if every rank ran and exited 0.

    Raises:
        ValueError: A bad ``nprocs``, ``skip_ranks``, ``on_failure`` or ``platform``.
    """
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs (-n) must be a positive integer, got {nprocs!r}.")
    bad = [r for r in skip_ranks if not 0 <= r < nprocs]
    if bad:
        raise ValueError(f"--skip-rank {bad[0]} is not a rank of -n {nprocs} (0..{nprocs - 1}).")
    if on_failure not in ("kill", "wait"):
        raise ValueError(f"on_failure={on_failure!r} must be 'kill' or 'wait'.")
    if platform == "auto":
        platform = "gpu" if gpu_present() else "cpu"
    if platform not in ("cpu", "gpu"):
        raise ValueError(f"platform={platform!r} must be auto, cpu or gpu.")
    argv = target_argv(target)
    port = port or free_port()
    stream = stream or sys.stdout
    log = log or sys.stderr
    lock = threading.Lock()
    output: dict[int, list[str]] = {r: [] for r in range(nprocs)}

    def say(text: str) -> None:
        with lock:
            log.write(f"[launch] {text}\n")
            log.flush()

    def pump(rank: int, pipe) -> None:
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with lock:
                output[rank].append(line)
                stream.write(f"[rank {rank}] {line}\n")
                stream.flush()
        pipe.close()

    procs: dict[int, subprocess.Popen] = {}
    threads = []
    t0 = time.monotonic()
    say(
        f"starting {nprocs - len(set(skip_ranks))} of {nprocs} ranks on"
        f" 127.0.0.1:{port} ({platform}): {' '.join(argv[1:])}"
    )
    for r in sorted(set(skip_ranks)):
        say(f"rank {r} is deliberately not started (--skip-rank {r}: a missing host)")
    for rank in range(nprocs):
        if rank in skip_ranks:
            continue
        env = child_env(
            rank,
            nprocs,
            port,
            platform=platform,
            init_timeout=init_timeout,
            heartbeat_timeout=heartbeat_timeout,
            shutdown_timeout=shutdown_timeout,
            cpu_devices_per_process=cpu_devices_per_process,
            base=base_env,
        )
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        procs[rank] = proc
        th = threading.Thread(target=pump, args=(rank, proc.stdout), daemon=True)
        th.start()
        threads.append(th)

    codes: dict[int, int | None] = {r: None for r in range(nprocs)}
    finished_at: dict[int, float] = {}
    first_failure: int | None = None
    killed: list[int] = []
    timed_out = False

    def stop(ranks: Sequence[int]) -> None:
        for r in ranks:
            p = procs[r]
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        for r in ranks:
            p = procs[r]
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()

    def stop_and_record(ranks: Sequence[int]) -> None:
        """Stop ``ranks`` and record their exit codes and end times as killed."""
        stop(ranks)
        killed.extend(ranks)
        for x in ranks:
            codes[x] = procs[x].returncode
            finished_at[x] = time.monotonic() - t0

    while True:
        running = [r for r, p in procs.items() if r not in finished_at]
        for r in running:
            code = procs[r].poll()
            if code is not None:
                codes[r] = code
                finished_at[r] = time.monotonic() - t0
                if code != 0 and first_failure is None:
                    first_failure = r
                    say(f"rank {r} failed: {describe_exit(code)} after {finished_at[r]:.1f} s")
                    if on_failure == "kill":
                        rest = [
                            x for x in procs if x not in finished_at and procs[x].poll() is None
                        ]
                        if rest:
                            say(
                                f"stopping ranks {','.join(map(str, rest))} because rank {r} failed"
                            )
                            stop_and_record(rest)
        if len(finished_at) == len(procs):
            break
        if timeout is not None and time.monotonic() - t0 > timeout:
            timed_out = True
            rest = [x for x in procs if x not in finished_at]
            say(
                f"TIMEOUT after {timeout:g} s: ranks {','.join(map(str, rest))} still running;"
                " stopping them"
            )
            stop_and_record(rest)
            break
        time.sleep(0.05)
    for th in threads:
        th.join(timeout=5)
    elapsed = time.monotonic() - t0

    parts = []
    for r in range(nprocs):
        if r in skip_ranks:
            parts.append(f"rank {r}: not started (--skip-rank)")
        elif r in killed:
            parts.append(f"rank {r}: stopped by the launcher")
        else:
            parts.append(f"rank {r}: {describe_exit(codes[r])} after {finished_at[r]:.1f} s")
    if timed_out:
        rc = EXIT_LAUNCH_TIMEOUT
        message = f"FAILED: timed out after {timeout:g} s; " + "; ".join(parts)
    elif first_failure is not None:
        code = codes[first_failure]
        rc = code if code and code > 0 else 1
        message = (
            f"FAILED: rank {first_failure} failed first ({describe_exit(code)}); "
            + "; ".join(parts)
        )
        if skip_ranks:
            message += (
                f". Ranks {','.join(map(str, sorted(set(skip_ranks))))} were never started, so the"
                " others could not complete initialization"
            )
    elif skip_ranks:
        rc = 1
        message = "FAILED: not every rank ran; " + "; ".join(parts)
    else:
        rc = 0
        message = f"OK: all {nprocs} ranks exited 0 in {elapsed:.1f} s"
    say(message)
    return LaunchResult(
        returncode=rc,
        exit_codes=codes,
        first_failure=first_failure,
        message=message,
        elapsed=elapsed,
        output=output,
    )
