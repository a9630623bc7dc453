"""``initialize()``: a worker joins JAX's distributed runtime, or says clearly why it cannot.

On real clusters CP runs with one process per GPU, often across nodes: every process must join
one JAX distributed runtime before touching a device, and a dead or missing peer must turn
into a clear error, not a hang. :func:`initialize` reads the settings that
``python -m tutorial_utils.cli.launch`` (or SLURM, or Open MPI) gives each process, bounds the
wait for the peers with a watchdog (exit code :data:`EXIT_INIT_TIMEOUT`), and makes an uncaught
exception leave at once so that the others learn of it within the heartbeat timeout. The
environment variables' names and the default timeouts are here too: the launcher sets them.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Sequence

import jax

from tutorial_utils.gpu import gpu_present, jax_started

__all__ = [
    "initialize",
    "env_int",
    "EXIT_INIT_TIMEOUT",
    "DEFAULT_INIT_TIMEOUT",
    "DEFAULT_HEARTBEAT_TIMEOUT",
    "DEFAULT_SHUTDOWN_TIMEOUT",
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

DEFAULT_INIT_TIMEOUT = 120
DEFAULT_HEARTBEAT_TIMEOUT = 30
DEFAULT_SHUTDOWN_TIMEOUT = 30


def env_int(name: str) -> int | None:
    """The integer in environment variable ``name``, or ``None`` when it is unset or empty.

    Args:
        name: The variable.

    Returns:
        Its value as an int, or ``None``.

    Raises:
        ValueError: The value is not an integer; the message names the variable.
    """
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
    ``python -m tutorial_utils.cli.launch``), else to JAX's own detection of SLURM
    (``SLURM_PROCID``, ``SLURM_NTASKS``) or Open MPI. Without any of them the process runs alone
    (nothing is initialised).

    Timeouts (seconds; env ``CP_LAUNCH_INIT_TIMEOUT``, ``CP_LAUNCH_HEARTBEAT_TIMEOUT``,
    ``CP_LAUNCH_SHUTDOWN_TIMEOUT``): a rank that cannot gather all peers within
    ``initialization_timeout`` prints why and exits with :data:`EXIT_INIT_TIMEOUT`; a peer that
    dies later makes the coordination service stop every rank within ``heartbeat_timeout``.
    On CPU (``platform='cpu'`` or ``JAX_PLATFORMS=cpu``) the gloo collectives are selected,
    which must happen before JAX creates its backend. With ``fail_fast`` an uncaught exception
    exits the process at once instead of waiting in the shutdown barrier.

    Args:
        coordinator_address: ``host:port`` of rank 0's coordination service.
        num_processes: How many processes join.
        process_id: This process's rank.
        local_device_ids: The GPUs this process owns (env ``CP_LAUNCH_LOCAL_DEVICE_IDS``).
        initialization_timeout: Seconds to wait for every peer to join.
        heartbeat_timeout: Seconds without heartbeats before a peer counts as dead.
        shutdown_timeout: Seconds the shutdown barrier waits.
        platform: ``"cpu"`` or ``"gpu"`` (default: env ``CP_LAUNCH_PLATFORM``, else from
            ``JAX_PLATFORMS``, else whether a GPU is present).
        fail_fast: Make an uncaught exception exit at once.

    Returns:
        ``{"process_id", "num_processes", "coordinator_address", "platform", "cluster",
        "distributed", "local_devices", "global_devices"}`` (and ``"timeouts"`` when
        distributed).

    Raises:
        ValueError: Incomplete or inconsistent settings, a timeout below 1 s, an unknown
            platform.
        RuntimeError: JAX already started in this process, or JAX's own initialisation failed.
    """
    coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR) or None
    num_processes = num_processes if num_processes is not None else env_int(ENV_NUM_PROCESSES)
    process_id = process_id if process_id is not None else env_int(ENV_PROCESS_ID)
    if local_device_ids is None and os.environ.get(ENV_LOCAL_DEVICE_IDS):
        local_device_ids = [int(x) for x in os.environ[ENV_LOCAL_DEVICE_IDS].split(",")]
    init_t = initialization_timeout or env_int(ENV_INIT_TIMEOUT) or DEFAULT_INIT_TIMEOUT
    hb_t = heartbeat_timeout or env_int(ENV_HEARTBEAT_TIMEOUT) or DEFAULT_HEARTBEAT_TIMEOUT
    sd_t = shutdown_timeout or env_int(ENV_SHUTDOWN_TIMEOUT) or DEFAULT_SHUTDOWN_TIMEOUT
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
