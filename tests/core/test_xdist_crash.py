"""A worker that crashes under ``--dist loadfile`` fails its test, and the run goes on and ends."""

import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import xdist_crash
from xdist.scheduler.loadscope import LoadScopeScheduling

TESTS = Path(__file__).resolve().parents[1]


def _scheduler(remove_node):
    """A LoadScope scheduler holding one crashed worker's workload: a finished file and the file
    it died in (its first test done, the second running, the third not started)."""
    sched = LoadScopeScheduling.__new__(LoadScopeScheduling)
    sched.workqueue = OrderedDict()
    sched.assigned_work = {
        "dead": {
            "a.py": {"a.py::t": True},
            "b.py": {"b.py::t1": True, "b.py::t2": False, "b.py::t3": False},
        }
    }
    return sched, remove_node.__get__(sched)


def test_xdists_own_remove_node_requeues_finished_files_and_the_crashed_test():
    sched, remove = _scheduler(xdist_crash.XDIST_REMOVE_NODE)
    assert remove("dead") == "b.py::t2"
    assert list(sched.workqueue) == ["a.py", "b.py"]  # a.py: an empty unit that never completes
    assert sched.workqueue["b.py"]["b.py::t2"] is False  # the crashed test runs again


def test_the_fix_requeues_only_unfinished_work():
    sched, remove = _scheduler(xdist_crash._remove_node)
    assert remove("dead") == "b.py::t2"
    assert list(sched.workqueue) == ["b.py"]
    assert sched.workqueue["b.py"] == {"b.py::t1": True, "b.py::t2": True, "b.py::t3": False}


def test_a_crashing_test_fails_and_the_run_ends(tmp_path):
    for i in range(1, 6):
        (tmp_path / f"test_f{i}.py").write_text("def test_x():\n    pass\n")
    (tmp_path / "test_f3.py").write_text(
        "import os\n\ndef test_crash():\n    os._exit(1)\n\ndef test_after():\n    pass\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile"]
        + ["-p", "no:cacheprovider", "-p", "xdist_crash", "-p", "no:time_table"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=600,  # a guard against the hang this fixes, not a speed limit
    )
    assert run.returncode == 1, run.stdout[-2000:]
    assert "1 failed, 5 passed" in run.stdout, run.stdout[-2000:]
    assert "crashed while running 'test_f3.py::test_crash'" in run.stdout
