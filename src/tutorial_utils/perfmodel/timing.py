"""Honest timing of forward+backward attention, and the JSON records it produces.

A benchmark that includes compilation, skips warm-up or forgets that JAX dispatch is
asynchronous reports fiction; :func:`time_fn` avoids all three.
"""

from __future__ import annotations

import datetime as _dt
import statistics
import time
from collections.abc import Callable, Sequence

import jax

from tutorial_utils.pages.runtime import environment_record

__all__ = ["time_fn", "make_record"]


def time_fn(fn: Callable, *args, warmup: int = 2, iters: int = 5) -> dict:
    """Time ``fn(*args)``: first call (compile) timed apart, ``warmup`` untimed calls, ``iters``
    timed calls.

    Every call is wrapped in ``block_until_ready``, because JAX dispatch is asynchronous.
    Returns ``mean_ms``, ``std_ms``, ``min_ms``, ``median_ms`` of the timed calls, the first
    call's time as ``first_call_ms``, and ``iters`` and ``warmup``.
    """
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be an int >= 0.")
    if not isinstance(iters, int) or iters < 1:
        raise ValueError(
            f"iters={iters!r} must be an int >= 1 (timing needs at least one iteration)."
        )
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    compile_ms = (time.perf_counter() - t0) * 1e3
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(iters):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append((time.perf_counter() - t) * 1e3)
    return {
        "mean_ms": statistics.fmean(samples),
        "std_ms": statistics.pstdev(samples) if len(samples) > 1 else 0.0,
        "min_ms": min(samples),
        "median_ms": statistics.median(samples),
        "first_call_ms": compile_ms,
        "iters": iters,
        "warmup": warmup,
    }


def make_record(
    label: str,
    source: str,
    config: dict,
    results: Sequence[dict],
    *,
    warmup: int | None = None,
    iters: int | None = None,
    notes: str = "",
    backend: tuple[str, str] | None = None,
) -> dict:
    """A ``cp-bench/1`` record with this machine's hardware and software facts.

    ``backend``: ``(description, kind)`` for a run that calls kernels directly instead of
    going through the process's TE backend (a kernel benchmark), so the record says what
    computed its numbers; ``kind`` is one of ``'te'``, ``'te-cpu'``, ``'reference'``.
    """
    hardware = environment_record()
    if backend is not None:
        hardware["backend"], hardware["backend_kind"] = backend
    rec = {
        "schema": "cp-bench/1",
        "source": source,
        "label": label,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "hardware": hardware,
        "config": dict(config),
        "timing": {
            "warmup_iters": warmup,
            "timing_iters": iters,
            "compile_excluded": True,
            "block_until_ready": True,
        },
        "results": [dict(r) for r in results],
    }
    if notes:
        rec["notes"] = notes
    return rec
