"""A worker crash under ``--dist loadfile``: its test runs once more in a fresh worker, and the run
ends (pytest-xdist 3.8).

xdist's ``LoadScopeScheduling.remove_node`` puts the crashed worker's whole workload back on the
queue: the files it had finished come back as empty work units that never complete, and the run
waits at its end forever (pytest-xdist issues 784 and 1378), and a replacement worker given a
one-test unit waits for a second test (issue 1327). On 2026-12-03 one worker's segfault,
inside XLA's serialisation of a compiled program for the run's compilation cache, left CI waiting
at 96 % until its 90-minute limit. This plugin puts back only the unfinished files and tells a
worker that takes the last unit that no more work follows. The test the
worker died in runs once more, in the replacement worker: a crash in native code outside the
test's subject (the cache write) then costs a rerun, reported as ``RERUN`` and listed at the end
of the run; a second crash of the same test fails it. ``tests/core/test_xdist_crash.py`` runs
both cases in a real two-worker run.
"""

from __future__ import annotations

from collections import Counter

import pytest

try:
    from xdist.scheduler.loadscope import LoadScopeScheduling
except ImportError:  # no xdist: nothing to fix
    LoadScopeScheduling = None
#: xdist's own ``remove_node`` (kept for the test that shows its fault) and ``_reschedule``
#: (which the fix calls first)
XDIST_REMOVE_NODE = LoadScopeScheduling and LoadScopeScheduling.remove_node
XDIST_RESCHEDULE = LoadScopeScheduling and LoadScopeScheduling._reschedule
#: how many times each test has taken its worker down in this run (the controller's count)
CRASHES: Counter = Counter()


def _remove_node(self, node):
    """``LoadScopeScheduling.remove_node`` requeueing only unfinished work (see the module)."""
    workload = self.assigned_work.pop(node)
    if not self._pending_of(workload):
        return None
    crashitem = None
    for unit in workload.values():
        pending = [nodeid for nodeid, done in unit.items() if not done]
        if pending:
            crashitem = pending[0]
            CRASHES[crashitem] += 1
            unit[crashitem] = CRASHES[crashitem] > 1  # the first crash: run it once more
            break
    if crashitem is None:
        raise RuntimeError("Unable to identify crashitem on a workload with pending items")
    self.workqueue.update(
        {scope: unit for scope, unit in workload.items() if not all(unit.values())}
    )
    for other in self.assigned_work:
        self._reschedule(other)
    return crashitem


def _reschedule(self, node):
    """``LoadScopeScheduling._reschedule``, then units until the node holds two tests, and "no
    more work" once the queue is empty.

    A worker runs a test only once it knows the next one (or that none follows). A replacement
    worker given one unit one test long waited for either, and no test of its finished to ask
    for more (pytest-xdist issue 1327); xdist's first distribution gives each worker two units
    and ends with this shutdown for the same reason.
    """
    if node not in self.registered_collections:
        return  # a replacement still collecting: scheduled once its collection arrives
    try:
        XDIST_RESCHEDULE(self, node)
        while (
            self.workqueue
            and not node.shutting_down
            and self._pending_of(self.assigned_work[node]) < 2
        ):
            self._assign_work_unit(node)
    except OSError:
        # the node died after its last report: its "node down" follows, and remove_node puts
        # back what was just sent to it
        return
    if not self.workqueue and not node.shutting_down:
        node.shutdown()


def pytest_configure(config):
    """Install the fix (it acts in the controller process of an xdist run)."""
    if LoadScopeScheduling is not None:
        LoadScopeScheduling.remove_node = _remove_node
        LoadScopeScheduling._reschedule = _reschedule


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent under -p no:xdist
def pytest_handlecrashitem(crashitem, report, sched):
    """A first crash is reported as a rerun; the test's next run gives its verdict."""
    if CRASHES[crashitem] == 1:
        report.outcome = "rerun"
        report.longrepr = f"{report.longrepr}; running it again in a fresh worker"


def pytest_report_teststatus(report, config):
    """``RERUN`` (``R``) for a test whose worker crashed once."""
    if report.outcome == "rerun":
        return "rerun", "R", ("RERUN", {"yellow": True})
    return None


def pytest_terminal_summary(terminalreporter):
    """Name every test that took its worker down, and how often."""
    if CRASHES:
        terminalreporter.write_sep("=", "worker crashes", yellow=True)
        for nodeid, n in CRASHES.items():
            verdict = "failed" if n > 1 else "ran again in a fresh worker"
            terminalreporter.write_line(f"{nodeid}: crashed its worker {n}x; {verdict}")
