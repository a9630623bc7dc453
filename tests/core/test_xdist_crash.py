"""A worker that crashes under ``--dist loadfile``: its test runs once more, and the run ends."""

import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import xdist_crash
from xdist.scheduler.loadscope import LoadScopeScheduling

TESTS = Path(__file__).resolve().parents[1]


def _scheduler():
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
    return sched


def test_xdists_own_remove_node_requeues_finished_files():
    sched = _scheduler()
    assert xdist_crash.XDIST_REMOVE_NODE(sched, "dead") == "b.py::t2"
    assert list(sched.workqueue) == ["a.py", "b.py"]  # a.py: an empty unit that never completes


def test_the_fix_requeues_unfinished_work_and_the_crashed_test_once(monkeypatch):
    monkeypatch.setattr(xdist_crash, "CRASHES", xdist_crash.Counter())
    sched = _scheduler()
    assert xdist_crash._remove_node(sched, "dead") == "b.py::t2"
    assert list(sched.workqueue) == ["b.py"]
    assert sched.workqueue["b.py"] == {"b.py::t1": True, "b.py::t2": False, "b.py::t3": False}
    sched = _scheduler()  # the same test takes its second worker down: done, failed
    assert xdist_crash._remove_node(sched, "dead") == "b.py::t2"
    assert sched.workqueue["b.py"] == {"b.py::t1": True, "b.py::t2": True, "b.py::t3": False}


CRASH_ONCE = """import os
from pathlib import Path

def test_crash():
    flag = Path(__file__).with_suffix(".crashed")
    if not flag.exists():
        flag.write_text("1")
        os._exit(1)

def test_after():
    pass
"""
CRASH_ALWAYS = "import os\n\ndef test_crash():\n    os._exit(1)\n\ndef test_after():\n    pass\n"


@pytest.mark.parametrize(
    ("body", "rc", "counts", "summary"),
    [
        (CRASH_ONCE, 0, "6 passed, 1 rerun", "crashed its worker 1x; ran again in a fresh worker"),
        (CRASH_ALWAYS, 1, "1 failed, 5 passed, 1 rerun", "crashed its worker 2x; failed"),
    ],
    ids=["crashes-once", "crashes-always"],
)
def test_a_crashing_test_in_a_real_two_worker_run(tmp_path, body, rc, counts, summary):
    for i in range(1, 6):
        (tmp_path / f"test_f{i}.py").write_text("def test_x():\n    pass\n")
    (tmp_path / "test_f3.py").write_text(body)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile"]
        + ["-p", "no:cacheprovider", "-p", "xdist_crash"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=600,  # a guard against the hang this fixes, not a speed limit
    )
    assert run.returncode == rc, run.stdout[-2000:]
    assert counts in run.stdout, run.stdout[-2000:]
    assert f"test_f3.py::test_crash: {summary}" in run.stdout, run.stdout[-2000:]


def test_the_plugin_loads_without_xdist(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_x():\n    pass\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "xdist_crash"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout[-2000:]
