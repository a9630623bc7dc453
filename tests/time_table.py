"""A pytest plugin that writes where the suite's time goes, so CI time can be cut where it is spent.

Why: `make test` must stay within CI's budget, and guessing which test is slow (or whether a
test is slow because XLA compiles, or because it computes) wastes the effort. This plugin
records, for every test, its wall time (setup + call + teardown) and the part of it that JAX
spent tracing, lowering and compiling in the test's own process (from `jax.monitoring`'s
compile-duration events). Time spent in a subprocess (a notebook, a script, a launcher rank)
counts as wall time only.

It also orders the test files for the workers, longest first (:func:`heaviest_files_first`).

On the controlling process it writes `_build_test/test-times-pyX.Y.json` (per test and per file,
plus the session's wall time and each worker's busy time and when its last test ended, which
shows an idle tail) and prints the ten slowest tests with their compile share.
Works with and without pytest-xdist: workers attach their compile time to each report.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

# jax.monitoring's events for one jit compile: trace, lower to MLIR, backend compile
_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_BACKEND_COMPILE = _COMPILE_EVENTS[2]
_CACHE_HIT = "/jax/compilation_cache/cache_hits"
# running totals in this process, and what the last report already accounted for
_compiled = {
    "seconds": 0.0,
    "backend_s": 0.0,
    "compiles": 0.0,
    "cache_hits": 0.0,
    "listening": False,
}
_reported = {"seconds": 0.0, "backend_s": 0.0, "compiles": 0.0, "cache_hits": 0.0}


def _listen_for_compiles() -> None:
    """Register the compile listener once, on first use, after conftest has set up JAX's env."""
    if _compiled["listening"]:
        return
    import jax.monitoring  # noqa: PLC0415 - imported lazily so conftest's XLA_FLAGS apply first

    def on_duration(event: str, duration: float, **_kwargs) -> None:
        if event in _COMPILE_EVENTS:
            _compiled["seconds"] += duration
        if event == _BACKEND_COMPILE:
            _compiled["backend_s"] += duration
            _compiled["compiles"] += 1

    def on_event(event: str, **_kwargs) -> None:
        if event == _CACHE_HIT:
            _compiled["cache_hits"] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    _compiled["listening"] = True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _listen_for_compiles()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    # phases run one after another in a process, so the compile time since the last report
    # is this phase's
    for key, name in (
        ("seconds", "compile_s"),
        ("backend_s", "backend_compile_s"),
        ("compiles", "compiles"),
        ("cache_hits", "cache_hits"),
    ):
        report.user_properties.append((name, _compiled[key] - _reported[key]))
        _reported[key] = _compiled[key]


_MEASURES = ("compile_s", "backend_compile_s", "compiles", "cache_hits")


class _TimeTable:
    def __init__(self, config):
        self.config = config
        self.started = time.monotonic()
        self.started_epoch = time.time()  # the clock of the reports' start/stop stamps
        self.tests: dict[str, dict] = defaultdict(
            lambda: {"wall_s": 0.0, **dict.fromkeys(_MEASURES, 0.0), "outcome": "passed"}
        )
        # per worker: time in tests and when its last test ended (an idle tail is lost wall time)
        self.workers: dict[str, dict] = defaultdict(
            lambda: {"busy_s": 0.0, "tests": 0, "last_stop_s": 0.0}
        )

    def pytest_runtest_logreport(self, report):
        row = self.tests[report.nodeid]
        row["wall_s"] += report.duration
        node = getattr(report, "node", None)  # set by pytest-xdist on the controller
        worker = self.workers[getattr(getattr(node, "gateway", None), "id", None) or "main"]
        worker["busy_s"] += report.duration
        worker["tests"] += report.when == "call" or (
            report.when == "setup" and report.outcome != "passed"
        )
        worker["last_stop_s"] = max(
            worker["last_stop_s"], getattr(report, "stop", 0.0) - self.started_epoch
        )
        for k, v in report.user_properties:
            if k in _MEASURES:
                row[k] += v
        # a failure in any phase wins; otherwise a skip (in setup or call) does
        if report.outcome == "failed" or (
            report.outcome == "skipped" and row["outcome"] == "passed"
        ):
            row["outcome"] = report.outcome

    def table(self) -> dict:
        files: dict[str, dict] = defaultdict(
            lambda: {"wall_s": 0.0, **dict.fromkeys(_MEASURES, 0.0), "tests": 0}
        )
        for nodeid, row in self.tests.items():
            f = files[nodeid.split("::", 1)[0]]
            for k in ("wall_s", *_MEASURES):
                f[k] += row[k]
            f["tests"] += 1
        rnd = lambda d: {k: round(v, 3) if isinstance(v, float) else v for k, v in d.items()}  # noqa: E731
        return {
            "schema": "test-times/1",
            "session_wall_s": round(time.monotonic() - self.started, 1),
            "workers": (
                os.environ.get("PYTEST_XDIST_WORKER_COUNT")
                or getattr(self.config.option, "numprocesses", None)
                or 1
            ),
            # the allocator the run's processes were given (make test preloads TCMalloc when it can)
            "ld_preload": os.environ.get("LD_PRELOAD", ""),
            "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS", ""),
            "note": (
                "wall_s = setup + call + teardown; compile_s = JAX trace + lower + backend compile"
                " in the test's own process, backend_compile_s its XLA part, compiles the number of"
                " XLA programs it compiled (many small ones: eager op-by-op dispatch); cache_hits ="
                " persistent compilation cache hits"
            ),
            "workers_busy": {k: rnd(v) for k, v in sorted(self.workers.items())},
            "files": {k: rnd(v) for k, v in sorted(files.items(), key=lambda kv: -kv[1]["wall_s"])},
            "tests": {
                k: rnd(v) for k, v in sorted(self.tests.items(), key=lambda kv: -kv[1]["wall_s"])
            },
        }

    def pytest_terminal_summary(self, terminalreporter):
        if not self.tests:
            return
        table = self.table()
        # one table per Python, so CI's two legs (3.11 and 3.12) do not overwrite each other's
        out = (
            Path(self.config.rootpath)
            / "_build_test"
            / f"test-times-py{sys.version_info[0]}.{sys.version_info[1]}.json"
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(table, indent=1) + "\n")
        tr = terminalreporter
        tr.section("ten slowest tests (wall s, of which JAX compile s)")
        for nodeid, row in list(table["tests"].items())[:10]:
            tr.write_line(f"{row['wall_s']:8.1f} {row['compile_s']:8.1f}  {nodeid}")
        total = sum(r["wall_s"] for r in table["tests"].values())
        compile_total = sum(r["compile_s"] for r in table["tests"].values())
        hits = sum(r["cache_hits"] for r in table["tests"].values())
        tr.write_line(
            f"total test time {total:.1f} s (JAX compile {compile_total:.1f} s,"
            f" {hits:.0f} compilation cache hits) over {len(table['tests'])} tests; session wall"
            f" {table['session_wall_s']:.1f} s; table: {out.relative_to(self.config.rootpath)}"
        )
        tr.write_line(
            "workers: "
            + "; ".join(
                f"{k} {w['busy_s']:.0f} s in {w['tests']} tests, last ended at "
                f"{w['last_stop_s']:.0f} s"
                for k, w in table["workers_busy"].items()
            )
        )


# ------------------------------------------------------------------ the order files are handed out

#: Wall seconds per test file in ``make test`` (2-core machine, from
#: _build_test/test-times-py3.11.json; files under 10 s are left out), keyed by the file's path
#: as test ids spell it (from the repository root). Only the order in which the workers are
#: handed files depends on it: a stale or missing entry can make the run's end less even, never
#: change a result.
FILE_SECONDS = {
    "tests/site/test_site.py": 473,
    "tests/te_on_cpu/test_te_on_cpu.py": 245,
    "tests/site/test_shown_commands.py": 196,
    "tests/site/test_device_counts.py": 141,
    "tests/core/test_context_parallel.py": 120,
    "tests/cli/test_check.py": 112,
    "tests/core/test_reference.py": 89,
    "tests/core/test_model.py": 60,
    "tests/examples/test_examples.py": 59,
    "tests/cli/test_bench_cli.py": 53,
    "tests/cli/test_launch.py": 49,
    "tests/cli/test_check_layout.py": 46,
    "tests/examples/test_seed_tutorial.py": 42,
    "tests/te/test_placement.py": 38,
    "tests/core/test_nan_semantics.py": 25,
    "tests/cli/test_plan.py": 24,
    "tests/core/test_bad_input.py": 21,
    "tests/te/test_facade.py": 18,
    "tests/te_on_cpu/test_cpu_kernel.py": 17,
    "tests/perfmodel/test_comm.py": 15,
    "tests/devtools/test_te_build.py": 21,
    "tests/te_on_cpu/test_dpa_sweep.py": 12,
    "tests/pages/test_cp_runs.py": 14,
    "tests/cli/test_support_matrix.py": 10,
    "tests/cli/test_gpu_setup.py": 8,
}


def heaviest_files_first(nodeids: list[str]) -> list[str]:
    """``nodeids`` with whole files reordered by :data:`FILE_SECONDS`, longest first (ties: as
    collected).

    Why: ``--dist loadfile`` hands each worker one file at a time, in collection order. The
    longest first (the site build alone is a quarter of the run) and the shortest last keeps the
    workers busy to the end: ordered by pytest-xdist's default (the number of tests per file),
    a 4-test, 42 s file came last and one worker idled 51 s of a 1,006 s session.
    """
    order = {}
    for nodeid in nodeids:
        order.setdefault(nodeid.split("::", 1)[0], len(order))
    rank = {f: (-FILE_SECONDS.get(f, 0), i) for f, i in order.items()}
    return sorted(nodeids, key=lambda n: rank[n.split("::", 1)[0]])


def pytest_collection_modifyitems(session, config, items):
    by_id = {item.nodeid: item for item in items}
    items[:] = [by_id[n] for n in heaviest_files_first([item.nodeid for item in items])]


def pytest_configure(config):
    # only the controlling process (no xdist, or xdist's master) writes the table
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_TimeTable(config), "time_table_report")
        # xdist would re-sort the files by their number of tests; keep the order above instead
        if hasattr(config.option, "loadscopereorder"):
            config.option.loadscopereorder = False
