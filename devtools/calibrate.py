"""A fixed CPU workload that says how fast this machine is right now, for ratio budgets.

Why: a budget in CPU seconds passes on the machine that measured it and fails on a slower one
(a clean site build used 244 CPU s of pages on one 2-core machine and 397 s on another). A
budget written as a multiple of this workload, timed in the same run, gives the same verdict
on both. The workload is what the pages spend their CPU on: a fresh Python that imports JAX
and compiles and runs a few small attention-shaped programs on the CPU, with no compile cache.

``python devtools/calibrate.py`` prints the figure.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys

WORKLOAD = """
import jax, jax.numpy as jnp
for n in range(8):
    f = jax.jit(lambda x, n=n: jax.nn.softmax((x @ x.T) * (n + 1), axis=-1) @ x)
    f(jnp.ones((512 + 16 * n, 128), jnp.float32)).block_until_ready()
"""


def _child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def calibration_cpu_s(repeats: int = 2) -> float:
    """CPU seconds of the workload in a fresh process: the least of ``repeats`` runs.

    Args:
        repeats: How many times to run it; the least is kept (noise only ever adds).

    Returns:
        The CPU seconds (user + system) of the fastest run.

    Raises:
        RuntimeError: If the workload's process fails.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("XLA_FLAGS", "TUTORIAL_COMPILE_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR")
    }
    env.update(JAX_PLATFORMS="cpu", CP_PAGE_STATS="")
    best = float("inf")
    for _ in range(repeats):
        before = _child_cpu_s()
        proc = subprocess.run(
            [sys.executable, "-c", WORKLOAD], env=env, capture_output=True, text=True, timeout=600
        )
        if proc.returncode != 0:
            raise RuntimeError(f"the calibration workload failed:\n{proc.stderr[-2000:]}")
        best = min(best, _child_cpu_s() - before)
    return round(best, 2)


if __name__ == "__main__":
    print(f"calibration workload: {calibration_cpu_s()} CPU s")
