"""Execute the site's notebooks side by side before Sphinx reads them, and measure each page.

Why: myst-nb executes a notebook while Sphinx reads it, and Sphinx reads one page at a time
(``-j`` does not help: not every extension declares parallel reading safe), so a clean
``make docs`` used one core of two. Here every page that myst-nb would execute (a miss in its
jupyter-cache) runs first, several at once, longest first (by the previous build's times), with
myst-nb's own reader, jupyter-cache's ``single_nb_execution`` and myst-nb's settings (working
directory, timeout, errors not allowed). Each result goes into myst-nb's cache, as myst-nb
itself stores it, and Sphinx then reads every page from there. Every page is still executed in
this build; only the order changes. A page that fails here is not cached: Sphinx executes it
again and reports its error as it always does.

Pages marked ``execution_mode: force`` are left to Sphinx (they must run at every build).

Each page's kernel and the processes it starts write their CPU, peak memory and XLA compiles to
``_build/page-stats/<page>.jsonl`` (:mod:`page_stats`); :func:`report` prints the table.

``CP_DOCS_JOBS`` sets the number of pages at once (default: :func:`jobs`, one more than the
CPUs: on 2 cores, three pages at once built the site in 154 s, two in 179 s). The order comes
from the last build's ``page-times.json`` or, after ``make docs-clean``, from
``page_costs.json`` next to this file (seconds on a 2-core machine; ``python
devtools/docs_execute.py`` refreshes it from the last build). Only the order depends on it: a
page missing there runs first.

:func:`report` writes, for every build, the pages Sphinx read, the notebooks executed and the
pages written (an unchanged rebuild has none of the first two), and for a clean build its cost
in XLA programs (compiles plus compile-cache hits: the same on any machine) against
:data:`BUDGET_PROGRAMS`. Its CPU seconds depend on the machine, so ``tests/site/test_site.py``
judges them as a ratio to a calibration workload timed in the same run
(``devtools/calibrate.py``, :data:`BUDGET_CPU_RATIO`).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import page_stats
from traitlets.config import Config

# The largest page's kernel peaks near 1.9 GiB (chapter 3's oracle check; page_stats).
GIB_PER_PAGE = 2.5
# The budgets of a clean build (measured figures in devtools/README.md, "The site build's cost"):
# XLA programs the pages ask for (compiles + compile-cache hits; the same on any machine), and
# the pages' CPU seconds as a multiple of devtools/calibrate.py's workload timed in the same run.
# Measured on 2026-12-04 (2-core machines, clean builds): 852 programs. The CPU ratio moves with
# the load beside the build (contention inflates the pages' CPU more than the short calibration's):
# 222 CPU s of pages idle; in a make test run, 304 CPU s against a 1.16 s calibration (ratio 262)
# with four other busy processes on the two cores. The program count is the precise guard; the
# ratio catches a page that doubles its CPU. Each budget leaves about a fifth above its worst.
BUDGET_PROGRAMS = 1050
BUDGET_CPU_RATIO = 320.0
STATS_DIR = "page-stats"
TIMES_FILE = "page-times.json"
COSTS = Path(__file__).with_name("page_costs.json")
FORCED = re.compile(r"^\s*execution_mode:\s*force\s*$", re.MULTILINE)  # in a page's front matter


def available_memory_gib() -> float:
    """Memory this build may still use: the host's ``MemAvailable``, or less under a cgroup
    limit (a container, a CI runner, Read the Docs' builders)."""
    host = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                host = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    limits = [host] if host else []
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",  # cgroup v1
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            if limit.isdigit() and int(limit) < 2**60:
                limits.append(int(limit) - int(Path(usage_file).read_text().strip()))
        except (OSError, ValueError):
            continue
    return min(limits) / 2**30 if limits else float("inf")


def jobs() -> int:
    """Pages at once: ``CP_DOCS_JOBS``, else one more than the CPUs this process may use
    (a page waits part of the time: its kernel starting, its scripts starting, a cell's output
    on its way), at most one per :data:`GIB_PER_PAGE` of available memory, and at least one."""
    env = os.environ.get("CP_DOCS_JOBS")
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(
                f"CP_DOCS_JOBS={env!r}: give a whole number of pages to execute at once (1 or"
                " more), or unset it to let the build choose"
            )
        return int(env)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    by_memory = available_memory_gib() // GIB_PER_PAGE
    return int(max(1, min((cpus or 1) + 1, by_memory)))


@contextlib.contextmanager
def ipc_kernel():
    """A kernel manager's config that puts the kernel's channels on Unix sockets in a fresh
    folder, removed afterwards.

    Why: on TCP, jupyter_client picks five free ports and releases them for the kernel to bind;
    with pages side by side (their kernels, their ranks' coordinators, their connections)
    another process took one first ("ZMQError: Address already in use") and the kernel died.
    The folder is absolute and the kernel's own, since a kernel runs in its page's folder and
    picks socket names by what exists there. Windows has no Unix sockets for ZeroMQ: TCP there.

    Yields:
        A traitlets ``Config`` for ``nbclient.NotebookClient(config=...)``.
    """
    if os.name != "posix":
        yield Config()
        return
    with tempfile.TemporaryDirectory(prefix="cp-kernel-") as folder:
        yield Config(KernelManager={"transport": "ipc", "ip": os.path.join(folder, "k")})


def _stats_file(build_dir: Path, docname: str) -> Path:
    return build_dir / STATS_DIR / (docname.replace("/", "__") + ".jsonl")


def _execute(path: str, cwd: str, timeout, nb_json: str, stats: str) -> dict:
    """In a worker process: execute one notebook as myst-nb would (its kernel records itself
    in ``stats``; its channels on Unix sockets, :func:`ipc_kernel`)."""
    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution

    os.environ[page_stats.ENV] = stats
    nb = nbformat.reads(nb_json, as_version=4)
    with ipc_kernel() as config:
        result = single_nb_execution(
            nb, cwd=cwd, allow_errors=False, timeout=timeout, meta_override=True, config=config
        )
    error = None if result.err is None else f"{type(result.err).__name__}: {result.err}"
    return {"nb": nbformat.writes(nb), "seconds": result.time, "error": error}


def _executed_ahead(app) -> set:
    """The pages this build executed ahead of Sphinx's read."""
    if not hasattr(app, "_cp_executed_ahead"):
        app._cp_executed_ahead = set()
    return app._cp_executed_ahead


def _build_start(app) -> float:
    if not hasattr(app, "_cp_build_start"):
        app._cp_build_start = time.time()
    return app._cp_build_start


def _last_times(build_dir: Path) -> dict:
    try:
        rows = json.loads((build_dir / TIMES_FILE).read_text())["pages"]
        return {r["page"]: r["seconds"] for r in rows}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def expected_seconds(build_dir: Path) -> dict:
    """Each page's expected time: the last build's, else the committed table's."""
    try:
        costs = json.loads(COSTS.read_text())
    except (OSError, ValueError):
        costs = {}
    return {**costs, **_last_times(build_dir)}


def longest_first(docnames, build_dir: Path) -> list:
    """``docnames`` in the order to run them: longest expected first, unknown pages before all.

    Args:
        docnames: The pages to run.
        build_dir: The build folder whose ``page-times.json`` has the last build's times.

    Returns:
        The pages, reordered.
    """
    expected = expected_seconds(build_dir)
    return sorted(docnames, key=lambda d: -expected.get(d, float("inf")))


def execute_outdated(app, env, docnames) -> None:
    """Sphinx ``env-before-read-docs``: run the notebooks among ``docnames`` that myst-nb's cache
    lacks, :func:`jobs` at a time, and cache them for myst-nb."""
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    from myst_nb.core.read import create_nb_reader
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    _build_start(app)
    app._cp_read = sorted(docnames)
    env = app.env
    nb_config = env.mystnb_config
    if nb_config.execution_mode != "cache":
        return
    build_dir = Path(nb_config.execution_cache_path).parent
    stats_dir = build_dir / STATS_DIR
    stats_dir.mkdir(parents=True, exist_ok=True)
    cache = get_cache(nb_config.execution_cache_path)

    todo = []
    for docname in docnames:
        path = Path(env.doc2path(docname))
        text = path.read_text(encoding="utf-8")
        reader = create_nb_reader(str(path), env.myst_config, nb_config, text)
        if reader is None:
            continue  # a plain Markdown page
        nb = reader.read(text)
        overrides = dict(nb.metadata.get(nb_config.metadata_key, {}))
        if overrides.get("execution_mode", nb_config.execution_mode) != "cache":
            continue  # forced pages run inside Sphinx, as configured
        try:
            cache.match_cache_notebook(nb)
            continue  # already executed in an earlier build
        except KeyError:
            pass
        timeout = overrides.get("execution_timeout", nb_config.execution_timeout)
        todo.append((docname, path, nb, timeout))
    if not todo:
        return

    rank = {d: i for i, d in enumerate(longest_first([t[0] for t in todo], build_dir))}
    todo.sort(key=lambda t: rank[t[0]])
    workers = min(jobs(), len(todo))
    logger.info(f"executing {len(todo)} notebooks, {workers} at a time")
    start = time.perf_counter()
    # spawned, not forked: a worker inherits nothing of Sphinx's process or the cache's database
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=spawn) as pool:
        futures = {}
        for docname, path, nb, timeout in todo:
            stats = _stats_file(build_dir, docname)
            stats.unlink(missing_ok=True)
            future = pool.submit(
                _execute, str(path), str(path.parent), timeout, nbformat.writes(nb), str(stats)
            )
            futures[future] = (docname, path)
        for future in as_completed(futures):
            docname, path = futures[future]
            result = future.result()
            if result["error"] is not None:
                logger.info(
                    f"{docname}: failed when executed ahead of the read ({result['error']});"
                    " Sphinx executes it again and reports the error"
                )
                continue
            executed = nbformat.reads(result["nb"], as_version=4)
            cache.cache_notebook_bundle(
                CacheBundleIn(executed, str(path), data={"execution_seconds": result["seconds"]}),
                check_validity=False,
                overwrite=True,
            )
            _executed_ahead(app).add(docname)
            logger.info(f"{docname}: executed in {result['seconds']:.1f} s")
    logger.info(f"executed {len(todo)} notebooks in {time.perf_counter() - start:.1f} s")


def page_being_read(app, docname, source) -> None:
    """Sphinx ``source-read``: a page Sphinx itself executes (a forced page, or one that failed
    ahead of the read) records its processes in its own stats file too."""
    build_dir = Path(app.env.mystnb_config.execution_cache_path).parent
    stats = _stats_file(build_dir, docname)
    (build_dir / STATS_DIR).mkdir(parents=True, exist_ok=True)
    if FORCED.search(source[0][:2000]):
        stats.unlink(missing_ok=True)  # executed at every read: this build's figures only
    os.environ[page_stats.ENV] = str(stats)


def page_written(app, pagename, templatename, context, doctree) -> None:
    """Sphinx ``html-page-context``: note each page this build writes."""
    if not hasattr(app, "_cp_written"):
        app._cp_written = set()
    app._cp_written.add(pagename)


def summarize(rows: list, budget_programs: int = BUDGET_PROGRAMS) -> dict:
    """The build's table from its page rows (``page``, ``seconds``, and from :mod:`page_stats`
    ``cpu_s``, ``compiles``, ``cache_hits``...; ``executed`` on a page taken from an earlier
    build), with the budget verdict: ``within_budget`` is None unless every page ran in this
    build.

    Args:
        rows: One dict per executed page.
        budget_programs: The most XLA programs (compiles + cache hits) a clean build may use.

    Returns:
        The report: the rows longest first, totals, ``clean_build`` and ``within_budget``.
    """
    rows = sorted(rows, key=lambda r: -r["seconds"])
    clean = bool(rows) and not any("executed" in r for r in rows)
    programs = sum(r.get("compiles", 0) + r.get("cache_hits", 0) for r in rows)
    return {
        "pages": rows,
        "total_seconds": round(sum(r["seconds"] for r in rows), 1),
        "cpu_s": round(sum(r.get("cpu_s", 0.0) for r in rows), 1),
        "programs": programs,
        "peak_rss_mib": max((r.get("peak_rss_mib", 0) for r in rows), default=0),
        "jobs": jobs(),
        "clean_build": clean,
        "budget_programs": budget_programs,
        "within_budget": (programs <= budget_programs) if clean else None,
    }


def largest_compiles(rows: list, n: int = 10) -> list:
    """The ``n`` longest compiles of the build: where a cheaper build has to start.

    Args:
        rows: The page rows, each with :mod:`page_stats`' ``large_compiles``.
        n: How many.

    Returns:
        ``(seconds, program, page)`` tuples, longest first.

    Raises:
        ValueError: If ``n`` is not a positive int.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n={n!r} must be a positive int: how many compiles to list.")
    every = [(s, name, r["page"]) for r in rows for name, s in r.get("large_compiles", [])]
    return sorted(every, key=lambda c: -c[0])[:n]


def report(app, exception) -> None:
    """Sphinx ``build-finished``: print each executed page's time, CPU, compiles and peak memory,
    and write them to ``_build/page-times.json``."""
    if exception is not None or app.builder.format != "html":
        return
    build_dir = Path(app.env.mystnb_config.execution_cache_path).parent
    rows = []
    for docname, meta in sorted(getattr(app.env, "nb_metadata", {}).items()):
        data = meta.get("exec_data") or {}
        if not data:
            continue
        row = {"page": docname, "seconds": round(data.get("runtime") or 0.0, 1)}
        if docname not in _executed_ahead(app) and (data.get("mtime") or 0) < _build_start(app):
            row["executed"] = "in an earlier build (cached)"
        stats = _stats_file(build_dir, docname)
        row.update(page_stats.summarize(stats) if stats.exists() else {})
        rows.append(row)
    report_ = summarize(rows)
    report_["this_build"] = {
        "read": getattr(app, "_cp_read", []),
        "executed": sorted(r["page"] for r in rows if "executed" not in r),
        "written": sorted(getattr(app, "_cp_written", set())),
    }
    clean, cpu = report_["clean_build"], report_["cpu_s"]
    (build_dir / TIMES_FILE).write_text(json.dumps(report_, indent=2) + "\n")
    print(
        "page execution: s = the page's time; cpu s = its processes' CPU; compiles = XLA's,"
        " with their seconds; cached = programs the build's compile cache supplied; MiB = the"
        " largest process's peak memory"
    )
    print(
        f"  {'s':>6} {'cpu s':>6} {'procs':>5} {'compiles':>8} {'compile s':>9} {'cached':>6}"
        f" {'MiB':>6}  page"
    )
    for r in report_["pages"]:
        print(
            f"  {r['seconds']:6.1f} {r.get('cpu_s', 0):6.1f} {r.get('processes', 0):5d}"
            f" {r.get('compiles', 0):8d} {r.get('compile_s', 0):9.1f}"
            f" {r.get('cache_hits', 0):6d} {r.get('peak_rss_mib', 0):6d}  {r['page']}"
            + (" (executed in an earlier build)" if "executed" in r else "")
        )
    print(
        f"  {report_['total_seconds']:6.1f} s in all, {report_['jobs']} pages at a time;"
        f" the largest process peaked at {report_['peak_rss_mib']} MiB"
    )
    largest = largest_compiles(report_["pages"])
    if largest:
        print(f"the {len(largest)} longest compiles (s, program, page):")
        for seconds, program, page in largest:
            print(f"  {seconds:6.1f}  {program}  {page}")
    if clean:
        verdict = "within" if report_["within_budget"] else "OVER"
        print(
            f"budget: a clean build's pages used {cpu:.0f} CPU s and {report_['programs']} XLA"
            f" programs, {verdict} the {BUDGET_PROGRAMS}-program budget"
            " (devtools/docs_execute.py, BUDGET_PROGRAMS)"
        )


def refresh_costs(build_dir: Path) -> dict:
    """Write the last build's page times into :data:`COSTS`; return them."""
    costs = _last_times(build_dir)
    if not costs:
        raise SystemExit(f"no page times in {build_dir / TIMES_FILE}: run `make docs` first")
    ordered = dict(sorted(costs.items(), key=lambda kv: -kv[1]))
    COSTS.write_text(json.dumps(ordered, indent=2) + "\n")
    return ordered


if __name__ == "__main__":
    import sys

    build = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parents[1] / "_build"
    print(json.dumps(refresh_costs(build), indent=2))
