"""Chapters 4, 5a, 5b and the TE CP rules page on 1, 2 and 8 simulated devices (the site is
built with 4), with TE's code.

The CP size follows the devices (``workload_for_devices``), every reorder uses it, and each
page says what it did: a single device runs without CP and says so, two devices have no room
for a (dp, cp) mesh, eight give a 2 x 4 one (and Ulysses cannot split 4 KV heads over 8).
Every chapter asserts its own results against the single-device run, so an execution that
finishes is also a correct one.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tutorial_utils.perfmodel.workload import fit_cp_to_devices, get_workload

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "scripts"


@pytest.mark.parametrize("devices, cp", [(1, 1), (2, 2), (3, 2), (4, 4), (6, 4), (8, 8)])
def test_cp_size_follows_the_devices(devices, cp, monkeypatch):
    monkeypatch.delenv("CP_TUTORIAL_CP", raising=False)
    assert fit_cp_to_devices(get_workload("cpu"), devices).cp_size == cp


def test_cp_override_is_checked(monkeypatch):
    monkeypatch.setenv("CP_TUTORIAL_CP", "2")
    assert fit_cp_to_devices(get_workload("seed"), 8).cp_size == 2
    monkeypatch.setenv("CP_TUTORIAL_CP", "8")
    with pytest.raises(ValueError, match=r"CP_TUTORIAL_CP=8 but only 4 device\(s\) are visible"):
        fit_cp_to_devices(get_workload("cpu"), 4)
    monkeypatch.setenv("CP_TUTORIAL_CP", "eight")
    with pytest.raises(ValueError, match=r"CP_TUTORIAL_CP='eight' must be a positive integer"):
        fit_cp_to_devices(get_workload("cpu"), 4)
    monkeypatch.setenv("CP_TUTORIAL_CP", "3")
    with pytest.raises(ValueError, match=r"CP_TUTORIAL_CP=3 does not divide preset 'cpu'"):
        fit_cp_to_devices(get_workload("cpu"), 4)


def _run(devices: int, chapter: str, tmp_path) -> str:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TUTORIAL_TE_BACKEND", "XLA_FLAGS", "CP_TUTORIAL_CP")
    }
    env["CP_TUTORIAL_RECORDS_DIR"] = str(tmp_path)
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "notebook_runner.py"), str(devices), chapter],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return "\n".join(json.loads(proc.stdout.strip().splitlines()[-1])["outputs"])


# In CI: one device (no CP) for chapter 4, eight for chapters 5a and 5b (Ulysses skipped) and
# the rules page (2 x 4 for dp x cp); the site build covers four. CP_DEVICE_COUNTS=all runs
# them at 1, 2 and 8.
_CHAPTERS = ("04_striped_load_balancing", "05a_cp_algorithms", "05b_te_cp_runs", "docs/te_cp_rules")
_ALL = [(c, n) for c in _CHAPTERS for n in (1, 2, 8)]
_CI = [
    ("04_striped_load_balancing", 1),
    ("05a_cp_algorithms", 8),
    ("05b_te_cp_runs", 8),
    ("docs/te_cp_rules", 8),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "chapter, devices", _ALL if os.environ.get("CP_DEVICE_COUNTS") == "all" else _CI
)
def test_chapter_runs_and_says_what_it_did(chapter, devices, tmp_path):
    text = _run(devices, chapter, tmp_path)
    assert f"Devices: {devices} x cpu" in text and f"| cp: {devices} |" in text
    assert "TransformerEngine 2.20.2 (its JAX code; CPU reference kernel in place of cuDNN)" in text
    if devices == 1:
        assert "Only one device, so CP size 1" in text
    if chapter == "docs/te_cp_rules":
        mesh = {1: "dp=1, cp=1", 2: "dp=1, cp=2", 8: "dp=2, cp=4"}[devices]
        assert f"(strategy ({mesh})" in text or f"strategy ({mesh})" in text
        if devices < 4:
            assert "too few for data and context parallelism together" in text
    if chapter.startswith("05b") and devices == 8:
        assert "ulysses   skipped: 4 KV heads cannot be split over cp=8 devices" in text


def test_facade_refuses_data_reordered_for_another_cp_size():
    """Eager call with concrete ids/positions: a cp=2 reorder (or none) on a cp=4 mesh raises,
    naming it."""
    env = {k: v for k, v in os.environ.items() if k not in ("TUTORIAL_TE_BACKEND", "XLA_FLAGS")}
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "reorder_mismatch_script.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "cp4 ok (2, 64, 2, 8)"
    assert lines[1].startswith(
        "cp 2 -> sequence_descriptor: the segment ids/positions look reordered for "
        "cp_size=2, but the mesh's CP axis has 4 devices"
    )
    assert lines[2].startswith(
        "cp 1 -> sequence_descriptor: the segment ids/positions are not reordered"
    )
