"""What one page of the site build costs: each process's CPU, peak memory and XLA compiles.

Why: ``make docs`` prints a table of pages (``devtools/docs_execute.py``), and a page's time
alone does not say whether it goes to compiling, to running or to starting processes. A page's
kernel and every Python process it starts (the recipes page runs scripts) load this module
through ``sitecustomize.py`` when ``CP_PAGE_STATS`` names a file. Each appends one JSON line at
exit: its CPU seconds, its peak resident memory, the number and seconds of XLA's backend
compiles (JAX's own ``/jax/core/compile/backend_compile_duration`` event), and its programs
that took at least :data:`LARGE_COMPILE_S` to compile, by name (the build's largest are what
a cheaper page has to change).

Standard library only until JAX is imported by the page itself: importing JAX here would start
it before a page has set its device count.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

ENV = "CP_PAGE_STATS"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
LARGE_COMPILE_S = 1.0

_compiles = {"n": 0, "s": 0.0, "hits": 0, "large": []}


def _on_duration(event: str, seconds: float, **kw) -> None:
    if event == COMPILE_EVENT:
        _compiles["n"] += 1
        _compiles["s"] += seconds
        if seconds >= LARGE_COMPILE_S:
            _compiles["large"].append([str(kw.get("fun_name", "?")), round(seconds, 2)])


def _on_event(event: str, **_kw) -> None:
    if event == CACHE_HIT_EVENT:
        _compiles["hits"] += 1


def _after_jax(_module) -> None:
    from jax import monitoring

    monitoring.register_event_duration_secs_listener(_on_duration)
    monitoring.register_event_listener(_on_event)


def _register_quietly(module) -> None:
    try:
        _after_jax(module)
    except Exception:  # noqa: BLE001 - statistics must never break a page
        pass


def _write(path: str, started: float) -> None:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    record = {
        "pid": os.getpid(),
        "argv": sys.argv[:4],
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "wall_s": round(time.time() - started, 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024),
        "compiles": _compiles["n"],
        "compile_s": round(_compiles["s"], 2),
        "cache_hits": _compiles["hits"],
        "large_compiles": _compiles["large"],
    }
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    except OSError:
        pass


def install() -> None:
    """Record this process (once) in the file ``CP_PAGE_STATS`` names."""
    path = os.environ.get(ENV)
    if not path or getattr(sys, "_cp_page_stats", False):
        return
    sys._cp_page_stats = True
    atexit.register(_write, path, time.time())
    if "jax" in sys.modules:
        _after_jax(sys.modules["jax"])
    else:
        from run_hooks import _AfterImport  # the run's own after-import hook, next to this file

        sys.meta_path.insert(0, _AfterImport("jax", _register_quietly))


def summarize(path) -> dict:
    """One page's totals from its file: processes, CPU, compiles, compile seconds, the largest
    peak memory of any one of its processes, and its compiles of at least
    :data:`LARGE_COMPILE_S` (``[program, seconds]``, longest first)."""
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        pass
    return {
        "processes": len(rows),
        "cpu_s": round(sum(r["cpu_s"] for r in rows), 1),
        "compiles": sum(r["compiles"] for r in rows),
        "compile_s": round(sum(r["compile_s"] for r in rows), 1),
        "cache_hits": sum(r.get("cache_hits", 0) for r in rows),
        "peak_rss_mib": max((r["peak_rss_mib"] for r in rows), default=0),
        "large_compiles": sorted(
            (
                [_label(name, r.get("argv", [])), s]
                for r in rows
                for name, s in r.get("large_compiles", [])
            ),
            key=lambda c: -c[1],
        ),
    }


def _label(program: str, argv: list) -> str:
    """``program``, with the script that compiled it unless that is the page's own kernel."""
    script = next((a for a in argv if a.endswith(".py")), "")
    if not script or script.endswith("ipykernel_launcher.py"):
        return program
    return f"{program} in {os.path.relpath(script) if os.path.isabs(script) else script}"
