"""Test set-up: 8 simulated CPU devices, set before JAX is imported anywhere."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "devtools"))
import xla_flags  # noqa: E402

# The tests' arrays are tiny and XLA's compile is most of their time (see
# _build_test/test-times-py3.11.json): they compile with devtools/xla_flags.py's flags (XLA's
# lowest backend optimisation level, and the older CPU fusion emitter where XLA has it), which
# cut CPU compile time by a third to a half. The site build uses the same flags (conf.py); the
# benchmarks drop them and compile as a reader's run does.
_FAST_COMPILE = xla_flags.fast_compile_flags()
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count=8 {_FAST_COMPILE}"
).strip()
# ... and so do the run's subprocesses (commands, recipes, launcher ranks), which build their own
# XLA_FLAGS: devtools/sitecustomize.py adds it at their start (compile_cache.add_run_flags)
os.environ.setdefault("TUTORIAL_RUN_XLA_FLAGS", _FAST_COMPILE)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Every process of the run freezes what it has imported once JAX is in and collects garbage less
# often (devtools/run_gc.py says why); the workers do the same after collection, below.
os.environ.setdefault("TUTORIAL_RUN_GC_THRESHOLDS", "20000 20 20")
os.environ.setdefault("TUTORIAL_TE_BACKEND", "reference")

# per-test wall and JAX-compile times, written to _build_test/test-times-pyX.Y.json
# (tests/time_table.py); a worker crash fails its test without hanging the run
# (tests/xdist_crash.py)
pytest_plugins = ["time_table", "xdist_crash"]

# One XLA compilation cache for the whole run, shared by both workers, the site build's notebook
# kernels and every subprocess that imports JAX (devtools/compile_cache.py says why its
# key is safe for TE's context-parallel programs). The first process of the run creates it empty;
# the workers and subprocesses inherit the variable. TUTORIAL_TEST_COMPILE_CACHE=0 runs without it.
if (
    os.environ.get("TUTORIAL_TEST_COMPILE_CACHE", "1") != "0"
    and "TUTORIAL_COMPILE_CACHE_DIR" not in os.environ
):
    import shutil
    import sys
    from pathlib import Path

    _cache = (
        Path(__file__).resolve().parents[1]
        / "_build_cache"
        / f"xla-py{sys.version_info[0]}.{sys.version_info[1]}"
    )
    shutil.rmtree(_cache, ignore_errors=True)
    _cache.mkdir(parents=True, exist_ok=True)  # a process of a run being stopped may still write
    os.environ["TUTORIAL_COMPILE_CACHE_DIR"] = str(_cache)

# The run's settings reach every process of the run through devtools/sitecustomize.py, which
# Python loads at start-up from the path: devtools/ goes first on PYTHONPATH for the
# subprocesses, and this process applies them itself (it started before the path was set).
# tests/ comes next, here and in the subprocesses: the test folders (core/, te/, cli/ ...) and the
# scripts in tests/scripts/ import the modules kept here (helpers, cli_run, recipe_runs ...).
import sys as _sys  # noqa: E402
from pathlib import Path as _Path  # noqa: E402

_TESTS = str(_Path(__file__).resolve().parent)
_DEVTOOLS = str(_Path(__file__).resolve().parents[1] / "devtools")
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_DEVTOOLS, _TESTS]
    + [
        p
        for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if p and p not in (_DEVTOOLS, _TESTS)
    ]
)
for _path in (_TESTS, _DEVTOOLS):  # devtools/ ends up first
    if _path not in _sys.path:
        _sys.path.insert(0, _path)
import run_hooks  # noqa: E402

run_hooks.install()


def pytest_collection_finish(session):
    """Python's cyclic GC, tuned for a worker that holds every test module and JAX's caches.

    Freezing what collection imported moves it out of every later full collection, and larger
    thresholds collect less often: on tests/core/test_context_parallel.py + test_reference.py,
    GC went from 2.4 CPU s in 2,461 collections to 0.35 s in 310. Only collection timing
    changes; what is garbage still gets collected.
    """
    import run_gc

    run_gc.tune_from_env(collect_first=True)
