"""After a worker crash, ``--dist loadfile`` goes on with the unfinished files (pytest-xdist 3.8).

xdist's ``LoadScopeScheduling.remove_node`` puts the crashed worker's whole workload back on the
queue: the files it had finished come back as empty work units that never complete, and the run
waits at its end forever (pytest-xdist issues 784 and 1378); it also leaves the test the worker
died in pending, so the replacement runs it again until the restarts are spent (PR 1371). On
2026-12-03 one worker's segfault left CI waiting at 96 % until its 90-minute limit. This plugin
puts back only the unfinished files, with the crashed test marked done (xdist has reported it
failed already), so a crash fails its test and the run ends. ``tests/core/test_xdist_crash.py``
runs a crashing file both ways.
"""

from __future__ import annotations

try:
    from xdist.scheduler.loadscope import LoadScopeScheduling
except ImportError:  # no xdist: nothing to fix
    LoadScopeScheduling = None
#: xdist's own ``remove_node``, kept for the test that shows its fault
XDIST_REMOVE_NODE = LoadScopeScheduling and LoadScopeScheduling.remove_node


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
            unit[crashitem] = True
            break
    if crashitem is None:
        raise RuntimeError("Unable to identify crashitem on a workload with pending items")
    self.workqueue.update(
        {scope: unit for scope, unit in workload.items() if not all(unit.values())}
    )
    for other in self.assigned_work:
        self._reschedule(other)
    return crashitem


def pytest_configure(config):
    """Install the fix (it acts in the controller process of an xdist run)."""
    if LoadScopeScheduling is not None:
        LoadScopeScheduling.remove_node = _remove_node
