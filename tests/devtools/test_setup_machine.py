"""How ``make test`` runs its processes: the TCMalloc it preloads, and the garbage collector's
settings.

``--malloc`` (tests/setup_machine.sh) prints the library to preload, or nothing (no TCMalloc, or
TUTORIAL_FAST_MALLOC=0). A process started with it really runs on it (its memory map names the
library) and computes the same bits as one on glibc's malloc. Every process that imports
tutorial_utils under the run's ``TUTORIAL_RUN_GC_THRESHOLDS`` freezes what it imported and
collects less often (devtools/run_gc.py); without it, Python's defaults stay.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "setup_machine.sh"
PROGRAM = (
    "import jax, jax.numpy as jnp, numpy as np; "
    "x = jax.random.normal(jax.random.PRNGKey(0), (64, 64)); "
    "y = np.asarray(jax.nn.softmax(x @ x.T, axis=-1)); "
    "maps = open('/proc/self/maps').read(); "
    "print('tcmalloc' if 'libtcmalloc' in maps else 'glibc', y.tobytes().hex()[:4096])"
)


def _malloc(**env):
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--malloc"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_malloc_prints_a_library_or_nothing_and_can_be_turned_off():
    path = _malloc()
    assert path == "" or (Path(path).is_file() and Path(path).name == "libtcmalloc_minimal.so.4"), (
        path
    )
    assert _malloc(TUTORIAL_FAST_MALLOC="0") == ""


def test_a_preloaded_process_runs_on_tcmalloc_and_computes_the_same_bits():
    path = _malloc()
    if not path:
        pytest.skip(
            "no TCMalloc on this machine (tests/setup_machine.sh installs Debian's"
            " libtcmalloc-minimal4)"
        )
    runs = {}
    for name, preload in (("glibc", ""), ("tcmalloc", path)):
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        env["LD_PRELOAD"] = preload
        proc = subprocess.run(
            [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, env=env
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[name] = proc.stdout.split()
    assert runs["glibc"][0] == "glibc" and runs["tcmalloc"][0] == "tcmalloc"
    assert runs["glibc"][1] == runs["tcmalloc"][1]


def test_the_run_itself_is_on_what_make_test_preloaded():
    """Under ``make test`` this worker was started with the library; it must be mapped, not just
    named."""
    preload = os.environ.get("LD_PRELOAD", "")
    if "libtcmalloc" not in preload:
        pytest.skip("not started by make test with TCMalloc (LD_PRELOAD does not name it)")
    assert "libtcmalloc" in Path("/proc/self/maps").read_text()


def test_this_worker_collects_garbage_as_conftest_set_it():
    """tests/conftest.py freezes what collection imported and raises the GC thresholds (its
    docstring has the figures)."""
    import gc

    assert gc.get_threshold() == (20000, 20, 20)
    assert gc.get_freeze_count() > 10000  # the test modules, JAX, TE, numpy...


def test_a_run_subprocess_tunes_its_collector_at_import_and_a_readers_does_not(monkeypatch):
    import gc

    import run_gc

    code = "import gc, tutorial_utils; print(*gc.get_threshold(), gc.get_freeze_count())"
    env = {**os.environ, run_gc.ENV: "30000 30 30"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    *thresholds, frozen = map(int, proc.stdout.split())
    assert thresholds == [30000, 30, 30] and frozen > 10000  # JAX and numpy, frozen at import

    before = gc.get_threshold()
    monkeypatch.delenv(run_gc.ENV)
    assert (
        run_gc.tune_from_env() is False and gc.get_threshold() == before
    )  # unset: nothing changes
    for bad in ("20000 20", "a b c", "20000 0 20"):
        monkeypatch.setenv(run_gc.ENV, bad)
        with pytest.raises(
            ValueError,
            match=r"TUTORIAL_RUN_GC_THRESHOLDS=.* must be three positive integers.*unset",
        ):
            run_gc.tune_from_env()
