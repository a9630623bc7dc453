"""One process per device: a local launcher, the worker-side ``initialize()``, and a CP demo worker.

On real clusters CP runs with one process per GPU, often across nodes: every process must join
one JAX distributed runtime before touching a device, and a dead or missing peer must turn
into a clear error, not a hang. Usage: ``python -m tutorial_utils.cli.launch -n 4 [--demo |
-- <module or script> [args]]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence

from tutorial_utils.cli.argtypes import positive_int

__all__ = [
    "initialize",
    "launch",
    "LaunchResult",
    "free_port",
    "child_env",
    "main",
    "EXIT_INIT_TIMEOUT",
    "EXIT_LAUNCH_TIMEOUT",
]

ENV_COORDINATOR = "COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "NUM_PROCESSES"
ENV_PROCESS_ID = "PROCESS_ID"
ENV_INIT_TIMEOUT = "CP_LAUNCH_INIT_TIMEOUT"
ENV_HEARTBEAT_TIMEOUT = "CP_LAUNCH_HEARTBEAT_TIMEOUT"
ENV_SHUTDOWN_TIMEOUT = "CP_LAUNCH_SHUTDOWN_TIMEOUT"
ENV_PLATFORM = "CP_LAUNCH_PLATFORM"
ENV_LOCAL_DEVICE_IDS = "CP_LAUNCH_LOCAL_DEVICE_IDS"

#: Exit code of a worker whose ``initialize()`` timed out waiting for its peers.
EXIT_INIT_TIMEOUT = 3
#: Exit code of the launcher when ``--timeout`` passed.
EXIT_LAUNCH_TIMEOUT = 124

DEFAULT_INIT_TIMEOUT = 120
DEFAULT_HEARTBEAT_TIMEOUT = 30
DEFAULT_SHUTDOWN_TIMEOUT = 30
_DEVICE_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S+")


# ============================================================================ worker side


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} must be an integer.") from None


def _cluster_detected() -> str | None:
    if all(
        v in os.environ
        for v in (
            "SLURM_JOB_ID",
            "SLURM_STEP_NODELIST",
            "SLURM_NTASKS",
            "SLURM_PROCID",
            "SLURM_LOCALID",
        )
    ):
        return "slurm"
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        return "openmpi"
    return None


def _rank_tag() -> str:
    pid = (
        os.environ.get(ENV_PROCESS_ID)
        or os.environ.get("SLURM_PROCID")
        or os.environ.get("OMPI_COMM_WORLD_RANK")
        or "?"
    )
    n = (
        os.environ.get(ENV_NUM_PROCESSES)
        or os.environ.get("SLURM_NTASKS")
        or os.environ.get("OMPI_COMM_WORLD_SIZE")
        or "?"
    )
    return f"rank {pid}/{n}"


def _fail_fast_hook(exc_type, exc, tb):
    """Uncaught exception in a worker: print it and leave at once.

    A normal interpreter exit would enter JAX's shutdown barrier and wait there for peers
    that will never arrive; leaving without it lets the coordination service report this
    rank as dead to the others within the heartbeat timeout.
    """
    sys.stderr.write(f"[{_rank_tag()}] ERROR: uncaught {exc_type.__name__}: {exc}\n")
    traceback.print_exception(exc_type, exc, tb, file=sys.stderr)
    sys.stderr.write(
        f"[{_rank_tag()}] exiting with code 1 without the distributed shutdown barrier; "
        "the other ranks will see this rank stop sending heartbeats.\n"
    )
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)


def initialize(
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: Sequence[int] | None = None,
    initialization_timeout: int | None = None,
    heartbeat_timeout: int | None = None,
    shutdown_timeout: int | None = None,
    platform: str | None = None,
    fail_fast: bool = True,
) -> dict:
    """Join the JAX distributed runtime; call it first in every worker, before any JAX computation.

    Arguments default to ``COORDINATOR_ADDRESS`` / ``NUM_PROCESSES`` / ``PROCESS_ID`` (set by
    :func:`launch`), else to JAX's own detection of SLURM (``SLURM_PROCID``, ``SLURM_NTASKS``)
    or Open MPI. Without any of them the process runs alone (nothing is initialised).

    Timeouts (seconds; env ``CP_LAUNCH_INIT_TIMEOUT``, ``CP_LAUNCH_HEARTBEAT_TIMEOUT``,
    ``CP_LAUNCH_SHUTDOWN_TIMEOUT``): a rank that cannot gather all peers within
    ``initialization_timeout`` prints why and exits with :data:`EXIT_INIT_TIMEOUT`; a peer that
    dies later makes the coordination service stop every rank within ``heartbeat_timeout``.
    On CPU (``platform='cpu'`` or ``JAX_PLATFORMS=cpu``) the gloo collectives are selected,
    which must happen before JAX creates its backend. With ``fail_fast`` an uncaught exception
    exits the process at once instead of waiting in the shutdown barrier.

    Returns ``{"process_id", "num_processes", "coordinator_address", "platform",
    "distributed", "local_devices", "global_devices"}``.
    """
    import jax

    coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR) or None
    num_processes = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
    process_id = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    if local_device_ids is None and os.environ.get(ENV_LOCAL_DEVICE_IDS):
        local_device_ids = [int(x) for x in os.environ[ENV_LOCAL_DEVICE_IDS].split(",")]
    init_t = initialization_timeout or _env_int(ENV_INIT_TIMEOUT) or DEFAULT_INIT_TIMEOUT
    hb_t = heartbeat_timeout or _env_int(ENV_HEARTBEAT_TIMEOUT) or DEFAULT_HEARTBEAT_TIMEOUT
    sd_t = shutdown_timeout or _env_int(ENV_SHUTDOWN_TIMEOUT) or DEFAULT_SHUTDOWN_TIMEOUT
    for name, value in (
        ("initialization_timeout", init_t),
        ("heartbeat_timeout", hb_t),
        ("shutdown_timeout", sd_t),
    ):
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1 second.")

    cluster = _cluster_detected()
    explicit = (
        coordinator_address is not None or num_processes is not None or process_id is not None
    )
    if explicit and None in (coordinator_address, num_processes, process_id):
        missing = [
            n
            for n, v in (
                (ENV_COORDINATOR, coordinator_address),
                (ENV_NUM_PROCESSES, num_processes),
                (ENV_PROCESS_ID, process_id),
            )
            if v is None
        ]
        raise ValueError(
            f"incomplete distributed settings: {', '.join(missing)} not set. Set all of"
            f" {ENV_COORDINATOR}, {ENV_NUM_PROCESSES} and {ENV_PROCESS_ID} (python -m"
            " tutorial_utils.cli.launch does), or none of them under SLURM / Open MPI."
        )
    if explicit and not 0 <= process_id < num_processes:
        raise ValueError(
            f"{ENV_PROCESS_ID}={process_id} must be in [0, {ENV_NUM_PROCESSES}={num_processes})."
        )

    if platform is None:
        platform = os.environ.get(ENV_PLATFORM)
    if platform is None:
        requested = os.environ.get("JAX_PLATFORMS", "")
        if requested:
            platform = "cpu" if requested.split(",")[0].strip() == "cpu" else "gpu"
        else:
            from tutorial_utils.pages.runtime import gpu_present

            platform = "gpu" if gpu_present() else "cpu"
    if platform not in ("cpu", "gpu"):
        raise ValueError(f"platform={platform!r} must be 'cpu' or 'gpu'.")

    info = {
        "distributed": False,
        "process_id": 0,
        "num_processes": 1,
        "coordinator_address": None,
        "platform": platform,
        "cluster": cluster,
    }
    if not explicit and cluster is None:
        info.update(
            local_devices=[str(d) for d in jax.local_devices()],
            global_devices=[str(d) for d in jax.devices()],
        )
        return info
    from tutorial_utils.gpu import jax_started

    if jax_started():
        raise RuntimeError(
            "tutorial_utils.cli.launch.initialize() must run before any JAX computation (JAX's"
            " backends are already initialised in this process); call it first thing in the worker."
        )
    if platform == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")

    where = coordinator_address or f"the address {cluster} provides"
    pid = process_id if process_id is not None else "?"
    tag = f"rank {pid}/{num_processes if num_processes is not None else '?'}"
    done = threading.Event()

    def watchdog():
        if done.wait(init_t):
            return
        sys.stderr.write(
            f"[{tag}] ERROR: distributed initialization timed out after {init_t} s: not all"
            f" {num_processes if num_processes is not None else 'expected'} processes joined the"
            f" coordinator at {where}. A rank was not started, crashed before initialize(), or"
            f" cannot reach rank 0's host and port (firewall, wrong {ENV_COORDINATOR}). Exiting"
            f" with code {EXIT_INIT_TIMEOUT}.\n"
        )
        sys.stderr.flush()
        os._exit(EXIT_INIT_TIMEOUT)

    threading.Thread(target=watchdog, name="cp-launch-init-watchdog", daemon=True).start()
    try:
        # JAX's own deadline is later than the watchdog's, so the clear message above wins.
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
            local_device_ids=local_device_ids,
            initialization_timeout=init_t + 30,
            heartbeat_timeout_seconds=hb_t,
            shutdown_timeout_seconds=sd_t,
        )
    except Exception as err:
        done.set()
        raise RuntimeError(
            f"[{tag}] jax.distributed.initialize failed for coordinator {where}:"
            f" {type(err).__name__}: {err}"
        ) from err
    done.set()
    if fail_fast:
        sys.excepthook = _fail_fast_hook
    info.update(
        distributed=True,
        process_id=jax.process_index(),
        num_processes=jax.process_count(),
        coordinator_address=coordinator_address,
        local_devices=[str(d) for d in jax.local_devices()],
        global_devices=[str(d) for d in jax.devices()],
        timeouts={"initialization": init_t, "heartbeat": hb_t, "shutdown": sd_t},
    )
    return info


# ============================================================================ launcher side


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


def _describe(code: int | None) -> str:
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


def _target_argv(target: Sequence[str]) -> list[str]:
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
    """
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs (-n) must be a positive integer, got {nprocs!r}.")
    bad = [r for r in skip_ranks if not 0 <= r < nprocs]
    if bad:
        raise ValueError(f"--skip-rank {bad[0]} is not a rank of -n {nprocs} (0..{nprocs - 1}).")
    if on_failure not in ("kill", "wait"):
        raise ValueError(f"on_failure={on_failure!r} must be 'kill' or 'wait'.")
    if platform == "auto":
        from tutorial_utils.pages.runtime import gpu_present

        platform = "gpu" if gpu_present() else "cpu"
    if platform not in ("cpu", "gpu"):
        raise ValueError(f"platform={platform!r} must be auto, cpu or gpu.")
    argv = _target_argv(target)
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
                    say(f"rank {r} failed: {_describe(code)} after {finished_at[r]:.1f} s")
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
            parts.append(f"rank {r}: {_describe(codes[r])} after {finished_at[r]:.1f} s")
    if timed_out:
        rc = EXIT_LAUNCH_TIMEOUT
        message = f"FAILED: timed out after {timeout:g} s; " + "; ".join(parts)
    elif first_failure is not None:
        code = codes[first_failure]
        rc = code if code and code > 0 else 1
        message = f"FAILED: rank {first_failure} failed first ({_describe(code)}); " + "; ".join(
            parts
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


# ============================================================================ the demo worker


DEMO_STRATEGIES = ("te-allgather", "te-ring", "allgather", "ring", "ulysses")
DEFAULT_DEMO_STRATEGIES = ["te-allgather", "te-ring"]


def demo_workload(preset: str, n: int, dtype: str | None = None):
    """The demo's workload at ``cp = n``: the tiny preset resized for ``n`` (or the ``cpu`` preset),
    in ``dtype``."""
    from tutorial_utils.cli.check import cp_workload_for
    from tutorial_utils.perfmodel.workload import get_workload

    wl = cp_workload_for(n) if preset == "tiny" else get_workload(preset).replace(cp_size=n)
    return wl.replace(dtype=dtype) if dtype else wl


def _te_demo_loss(ta, wl, cp_strategy=None, stripe: int = 1):
    """``vdot(out, dout)`` of TE's ``fused_attn`` on THD inputs, with CP over mesh axis ``cp`` when
    a strategy is given."""
    import jax.numpy as jnp

    cp_kw = (
        {}
        if cp_strategy is None
        else dict(
            context_parallel_strategy=cp_strategy,
            context_parallel_causal_load_balanced=True,
            context_parallel_axis="cp",
            stripe_size=stripe,
        )
    )

    def loss(qkv_arg, desc_arg, dout_arg):
        out = ta.fused_attn(
            qkv_arg,
            None,
            desc_arg,
            None,
            attn_bias_type=ta.AttnBiasType.NO_BIAS,
            attn_mask_type=ta.AttnMaskType.PADDING_CAUSAL_MASK,
            qkv_layout=ta.QKVLayout.THD_THD_THD,
            softmax_type=ta.AttnSoftmaxType.VANILLA_SOFTMAX,
            scaling_factor=wl.scaling_factor,
            dropout_probability=0.0,
            is_training=True,
            max_segments_per_seq=wl.max_segments_per_seq,
            window_size=wl.window,
            **cp_kw,
        )
        return jnp.vdot(out.astype(jnp.float32), dout_arg.astype(jnp.float32)), out

    return loss


def _demo_worker(args) -> int:
    """Run CP strategies on a global mesh over all processes; compare each local shard with
    one-process runs.

    Two one-process baselines, both computed once, by rank 0 on its own device, and broadcast to
    every rank (the ranks would all compute the same thing, each compiling it): the fp32
    reference (dense, full matmul precision) for every strategy, and, for ``te-*``, TE's
    ``fused_attn`` without CP on the same bf16 inputs (what TE's own CP tests compare with).
    Tolerance: TE's ``rtol = atol = eps**(2/3)`` of the demo's dtype.
    """
    if args.backend:  # before tutorial_utils.te is imported: it reads the variable once
        os.environ["TUTORIAL_TE_BACKEND"] = args.backend
    rank_env = _env_int(ENV_PROCESS_ID)
    if args.fail_rank is not None and args.fail_at == "before" and rank_env == args.fail_rank:
        print(
            f"rank {rank_env}: injected failure before jax.distributed.initialize (--fail-rank"
            f" {args.fail_rank})",
            flush=True,
        )
        return 2

    info = initialize()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from tutorial_utils import te
    from tutorial_utils.cli.attention_compare import reference_fwd_bwd as _reference_fwd_bwd
    from tutorial_utils.cli.attention_compare import tolerance
    from tutorial_utils.context_parallel import context_parallel_attention
    from tutorial_utils.perfmodel.workload import make_qkv, workload_segments
    from tutorial_utils.reorder import ReorderStrategy, reorder_causal_load_balancing
    from tutorial_utils.te import attention as ta

    rank, nproc = info["process_id"], info["num_processes"]
    print(
        f"joined: process {rank} of {nproc}, local devices {info['local_devices']},"
        f" {len(info['global_devices'])} devices in total ({info['platform']}); backend:"
        f" {te.backend_name()}",
        flush=True,
    )
    if args.fail_rank is not None and args.fail_at == "after" and rank == args.fail_rank:
        raise RuntimeError(
            f"injected failure on rank {rank} after jax.distributed.initialize (--fail-rank"
            f" {args.fail_rank})"
        )

    n = jax.device_count()
    wl = demo_workload(args.preset, n, args.dtype)
    uses_te = any(s.startswith("te-") for s in args.strategies)
    if uses_te and te.using_te_code() and wl.dtype == "float32":
        raise ValueError(
            f"--dtype float32 with {te.backend_kind()!r}: TE's fused attention (cuDNN, and its CPU"
            " stand-in) takes bfloat16 or float16; use --dtype bfloat16, or --backend reference"
            " for fp32."
        )
    q, k, v, dout = make_qkv(wl, seed=31)
    ids, pos = workload_segments(wl)
    names = ["reference"] + (["one_process_te"] if uses_te else [])
    if rank == 0:  # the one-process runs, on rank 0's own device; every rank gets them below
        ref_out, ref_grads = _reference_fwd_bwd(
            q,
            k,
            v,
            dout,
            jnp.asarray(ids),
            jnp.asarray(ids),
            jnp.asarray(pos),
            jnp.asarray(pos),
            scale=wl.scaling_factor,
            window=wl.window,
            dense=True,
        )
        baselines = {"reference": [np.asarray(x, np.float32) for x in (ref_out, *ref_grads)]}
        if uses_te:  # TE without CP: the one-process run TE's CP must reproduce
            desc1 = ta.SequenceDescriptor.from_segment_ids_and_pos(
                jnp.asarray(ids), jnp.asarray(pos)
            )
            (_, out1), grads1 = jax.jit(jax.value_and_grad(_te_demo_loss(ta, wl), has_aux=True))(
                (q, k, v), desc1, dout
            )
            baselines["one_process_te"] = [
                np.asarray(x, np.float32) for x in (out1, *grads1)
            ]  # bf16 -> f32: exact
    else:
        shapes = (q.shape[:-1] + v.shape[-1:], q.shape, k.shape, v.shape)  # out, dq, dk, dv
        baselines = {name: [np.zeros(s, np.float32) for s in shapes] for name in names}
    baselines = {
        name: [np.asarray(x, np.float64) for x in arrays]
        for name, arrays in multihost_utils.broadcast_one_to_all(baselines).items()
    }
    mesh = Mesh(np.asarray(jax.devices()), ("cp",))
    x_sh = NamedSharding(mesh, P(None, "cp", None, None))
    t_sh = NamedSharding(mesh, P(None, "cp"))
    tol = tolerance(wl.jnp_dtype)
    results, worst = [], 0.0  # worst: largest error / tolerance ratio over strategies and baselines

    for strategy in args.strategies:
        facade = strategy.startswith("te-")
        base = strategy[3:] if facade else strategy
        stripe = wl.stripe_for(base)
        perm_np = lambda x: np.asarray(
            reorder_causal_load_balancing(np.asarray(x), ReorderStrategy.Striped, n, 1, stripe)  # noqa: B023 (used in this iteration)
        )  # noqa: E731

        def global_array(x, sharding):
            host = perm_np(x)  # noqa: B023 (used in this iteration)
            return jax.make_array_from_callback(
                host.shape, sharding, lambda idx, host=host: host[idx]
            )

        def global_array_replicated(host):
            return jax.make_array_from_callback(
                host.shape, NamedSharding(mesh, P()), lambda idx, host=host: host[idx]
            )

        qkv = tuple(global_array(x, x_sh) for x in (q, k, v))
        dout_g = global_array(dout, x_sh)
        ids_g, pos_g = global_array(ids, t_sh), global_array(pos, t_sh)
        if facade:
            desc = ta.SequenceDescriptor.from_segment_ids_and_pos(ids_g, pos_g)
            # TE's descriptor also holds small process-local leaves (e.g. empty seqlens): replicate
            # them on the mesh
            desc = jax.tree.map(
                lambda x: (
                    x
                    if isinstance(x, jax.Array) and not x.is_fully_addressable
                    else global_array_replicated(np.asarray(x))
                ),
                desc,
            )
            cp_strategy = ta.CPStrategy.RING if base == "ring" else ta.CPStrategy.ALL_GATHER
            desc_sh = jax.tree.map(lambda x: x.sharding, desc)
            fn = jax.jit(
                jax.value_and_grad(_te_demo_loss(ta, wl, cp_strategy, stripe), has_aux=True),
                in_shardings=((x_sh,) * 3, desc_sh, x_sh),
                out_shardings=((None, x_sh), (x_sh,) * 3),
            )
            with jax.set_mesh(mesh), te.autocast(mesh_resource=te.MeshResource(cp_resource="cp")):
                (loss_v, out), grads = fn(qkv, desc, dout_g)
        else:

            def loss(qkv_arg, ids_arg, pos_arg, dout_arg):
                out = context_parallel_attention(
                    *qkv_arg,
                    ids_arg,
                    pos_arg,
                    mesh=mesh,
                    axis_name="cp",
                    strategy=base,  # noqa: B023 (used in this iteration)
                    stripe_size=stripe,  # noqa: B023 (used in this iteration)
                    window_size=wl.window,
                    scaling_factor=wl.scaling_factor,
                    block_q=64,
                    block_kv=64,
                )
                return jnp.vdot(out.astype(jnp.float32), dout_arg.astype(jnp.float32)), out

            fn = jax.jit(
                jax.value_and_grad(loss, has_aux=True),
                in_shardings=((x_sh,) * 3, t_sh, t_sh, x_sh),
                out_shardings=((None, x_sh), (x_sh,) * 3),
            )
            (loss_v, out), grads = fn(qkv, ids_g, pos_g, dout_g)
        checksum = float(
            jax.jit(
                lambda x: jnp.sum(x.astype(jnp.float32)), out_shardings=NamedSharding(mesh, P())
            )(out)
        )
        against = ("reference", "one_process_te") if facade else ("reference",)
        local = {}  # baseline -> {tensor: max |err| on this rank's shards}, ratio
        stats = []
        for which in against:
            expected = dict(zip(("out", "dq", "dk", "dv"), (perm_np(x) for x in baselines[which])))
            errs, ratio = {}, 0.0
            for name, arr in (("out", out), ("dq", grads[0]), ("dk", grads[1]), ("dv", grads[2])):
                err = 0.0
                for shard in arr.addressable_shards:
                    want = expected[name][shard.index]
                    diff = np.abs(np.asarray(shard.data, np.float64) - want)
                    err = max(err, float(diff.max()))
                    ratio = max(
                        ratio, float(np.max(diff / (tol * (1.0 + np.abs(want)))))
                    )  # allclose(rtol=atol=tol)
                errs[name] = err
            local[which] = errs
            stats += [max(errs.values()), ratio]
        gathered = np.max(
            np.reshape(multihost_utils.process_allgather(np.array(stats)), (-1, len(stats))), axis=0
        )
        all_ranks = {
            which: {
                "max_abs_err": float(gathered[2 * i]),
                "worst_ratio_to_tol": float(gathered[2 * i + 1]),
            }
            for i, which in enumerate(against)
        }
        global_ratio = max(v["worst_ratio_to_tol"] for v in all_ranks.values())
        worst = max(worst, global_ratio)
        row = {
            "rank": rank,
            "strategy": strategy,
            "cp": n,
            "stripe": stripe,
            "dtype": wl.dtype,
            "tolerance": tol,
            "backend": te.backend_kind(),
            "loss": float(loss_v),
            "reference_loss": float(
                np.vdot(baselines["reference"][0].astype(np.float64), np.asarray(dout, np.float64))
            ),
            "checksum": checksum,
            "reference_checksum": float(baselines["reference"][0].astype(np.float64).sum()),
            "max_abs_err_local": local,
            "max_abs_err_all_ranks": all_ranks["reference"]["max_abs_err"],
            "all_ranks": all_ranks,
            "worst_ratio_to_tol": global_ratio,
            "ok": global_ratio <= 1.0,
        }
        results.append(row)
        print("DEMO-RESULT " + json.dumps(row), flush=True)
        if rank == 0:
            vs = "; ".join(
                f"vs {w.replace('_', ' ')}: max|err|"
                f" {a['max_abs_err']:.2e} ({a['worst_ratio_to_tol']:.2f}x tol)"
                for w, a in all_ranks.items()
            )
            print(
                f"{'PASS' if row['ok'] else 'FAIL'} {strategy} (cp={n}, stripe {stripe},"
                f" {wl.dtype}): {vs}",
                flush=True,
            )
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"demo-rank{rank}.json"), "w", encoding="utf-8") as fh:
            json.dump(
                {
                    "info": info,
                    "backend": te.backend_name(),
                    "workload": wl.as_dict(),
                    "results": results,
                    "tolerance": tol,
                },
                fh,
                indent=2,
                default=str,
            )
    ok = worst <= 1.0
    max_err = (
        max(max(a["max_abs_err"] for a in r["all_ranks"].values()) for r in results)
        if results
        else 0.0
    )
    print(
        f"{'PASS' if ok else 'FAIL'} demo on {nproc} processes x"
        f" {len(info['local_devices'])} device(s), {wl.dtype}: max |err| over all ranks, strategies"
        f" and baselines {max_err:.2e}, worst {worst:.2f}x of allclose(rtol=atol={tol:.3g})"
        f" ({te.backend_name()})",
        flush=True,
    )
    return 0 if ok else 1


# ============================================================================ CLI


def _parse_strategies(text: str) -> list[str]:
    allowed = DEMO_STRATEGIES
    out = [s.strip().lower() for s in text.split(",") if s.strip()]
    for s in out:
        if s not in allowed:
            raise argparse.ArgumentTypeError(
                f"unknown strategy {s!r}; choose from {','.join(allowed)}"
            )
    if not out:
        raise argparse.ArgumentTypeError("must list at least one strategy")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tutorial_utils.cli.launch",
        usage=(
            "python -m tutorial_utils.cli.launch -n N [options] (--demo [demo options] | -- <module"
            " or script> [args])"
        ),
        description=(
            "Start N processes on 127.0.0.1, one per device, each with COORDINATOR_ADDRESS,"
            " NUM_PROCESSES and PROCESS_ID set; workers call"
            " tutorial_utils.cli.launch.initialize(). If a rank fails or --timeout passes, the"
            " others are stopped and the launcher exits non-zero naming the rank."
        ),
    )
    p.add_argument("-n", "--nprocs", type=positive_int, default=None, help="number of processes")
    p.add_argument(
        "--timeout", type=float, default=None, help="overall wall-clock limit in seconds"
    )
    p.add_argument(
        "--port", type=positive_int, default=None, help="coordinator port (default: a free one)"
    )
    p.add_argument(
        "--platform",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="cpu: one host device per process with gloo collectives; gpu: one GPU per process",
    )
    p.add_argument("--cpu-devices-per-process", type=positive_int, default=1)
    p.add_argument(
        "--init-timeout",
        type=positive_int,
        default=DEFAULT_INIT_TIMEOUT,
        help=f"seconds a rank waits for all peers to join (default {DEFAULT_INIT_TIMEOUT})",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=positive_int,
        default=DEFAULT_HEARTBEAT_TIMEOUT,
        help=(
            "seconds without heartbeats before a rank counts as dead (default"
            f" {DEFAULT_HEARTBEAT_TIMEOUT})"
        ),
    )
    p.add_argument("--shutdown-timeout", type=positive_int, default=DEFAULT_SHUTDOWN_TIMEOUT)
    p.add_argument(
        "--on-failure",
        choices=("kill", "wait"),
        default="kill",
        help=(
            "kill: stop the other ranks at the first failure (default); wait: let them fail on"
            " their own"
        ),
    )
    p.add_argument(
        "--skip-rank",
        type=int,
        action="append",
        default=[],
        help="do not start this rank (simulates a missing host); repeatable",
    )
    p.add_argument(
        "--demo", action="store_true", help="run the built-in CP demo worker on every rank"
    )
    p.add_argument("--worker-demo", action="store_true", help=argparse.SUPPRESS)
    g = p.add_argument_group("demo worker options (with --demo)")
    g.add_argument(
        "--preset",
        choices=("tiny", "cpu"),
        default="tiny",
        help=(
            "tiny (2 x 256 tokens at cp=4, default) or cpu (2 x 2,048 tokens); every rank also"
            " computes the one-process baselines itself"
        ),
    )
    g.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default="bfloat16",
        help=(
            "bfloat16 (default; what cuDNN takes) or float16; float32 only with --backend reference"
        ),
    )
    g.add_argument(
        "--backend",
        choices=("auto", "te", "te-cpu", "reference"),
        default=None,
        help=(
            "TUTORIAL_TE_BACKEND for every rank (default: inherited, else auto: real TE on a GPU,"
            " TE's JAX code with the CPU stand-in kernel elsewhere)"
        ),
    )
    g.add_argument(
        "--strategies",
        type=_parse_strategies,
        default=list(DEFAULT_DEMO_STRATEGIES),
        help="comma-separated subset of "
        + ",".join(DEMO_STRATEGIES)
        + " (default te-allgather,te-ring: TE's "
        "fused_attn CP; allgather,ring,ulysses: the tutorial's own shard_map versions)",
    )
    g.add_argument("--fail-rank", type=int, default=None, help="inject a failure on this rank")
    g.add_argument(
        "--fail-at",
        choices=("before", "after"),
        default="after",
        help="inject it before or after jax.distributed.initialize (default after)",
    )
    g.add_argument("--out", default=None, help="folder for per-rank demo JSON results")
    return p


def _demo_args(args) -> list[str]:
    out = [
        "--worker-demo",
        "--preset",
        args.preset,
        "--dtype",
        args.dtype,
        "--strategies",
        ",".join(args.strategies),
        "--fail-at",
        args.fail_at,
    ]
    if args.fail_rank is not None:
        out += ["--fail-rank", str(args.fail_rank)]
    if args.out:
        out += ["--out", args.out]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    target: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, target = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker_demo:
        return _demo_worker(args)
    if args.nprocs is None:
        parser.error("argument -n/--nprocs: required (how many processes to start)")
    if args.demo and target:
        parser.error("argument --demo: give either --demo or `-- <module or script>`, not both")
    if not args.demo and not target:
        parser.error("nothing to launch: add --demo or `-- <module or script> [args]`")
    if args.fail_rank is not None and not 0 <= args.fail_rank < args.nprocs:
        parser.error(
            f"argument --fail-rank: {args.fail_rank} is not a rank of -n"
            f" {args.nprocs} (0..{args.nprocs - 1})"
        )
    for r in args.skip_rank:
        if not 0 <= r < args.nprocs:
            parser.error(
                f"argument --skip-rank: {r} is not a rank of -n"
                f" {args.nprocs} (0..{args.nprocs - 1})"
            )
    if args.timeout is not None and args.timeout <= 0:
        parser.error(f"argument --timeout: must be > 0 seconds, got {args.timeout}")
    backend = args.backend or os.environ.get("TUTORIAL_TE_BACKEND", "").strip().lower() or "auto"
    if (
        args.demo
        and args.dtype == "float32"
        and backend != "reference"
        and any(s.startswith("te-") for s in args.strategies)
    ):
        parser.error(
            f"argument --dtype: float32 with backend {backend!r}: TE's fused attention (cuDNN, and"
            " its CPU stand-in) takes bfloat16 or float16; use --dtype bfloat16, or add --backend"
            " reference for an fp32 run"
        )
    base_env = None if args.backend is None else dict(os.environ, TUTORIAL_TE_BACKEND=args.backend)
    run_target = ["tutorial_utils.cli.launch", *_demo_args(args)] if args.demo else target
    result = launch(
        args.nprocs,
        run_target,
        port=args.port,
        timeout=args.timeout,
        platform=args.platform,
        skip_ranks=args.skip_rank,
        on_failure=args.on_failure,
        init_timeout=args.init_timeout,
        heartbeat_timeout=args.heartbeat_timeout,
        shutdown_timeout=args.shutdown_timeout,
        cpu_devices_per_process=args.cpu_devices_per_process,
        base_env=base_env,
    )
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
