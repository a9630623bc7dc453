"""The carry plan for a lent GPU machine (``devtools/gpu_carry.py``), on small real wheels:
cutting and joining, checksums, which calls a node needs, and the time plan at real sizes.
The plan played with TE's real build is ``make gpu-rehearse``."""

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from gpu_wheels import make_wheel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "devtools"))

import gpu_carry as C  # noqa: E402
import gpu_rehearsal as R  # noqa: E402

from tutorial_utils.cli import gpu_setup as G  # noqa: E402

KIB = 1024
CORE = "transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl"
CURAND = "nvidia_curand-10.4.5.25-py3-none-manylinux_2_27_x86_64.whl"


def _bundle(d: Path) -> Path:
    """A bundle as ``gpu_setup bundle`` leaves it, with small real wheels."""
    for folder, name, project, size in (
        ("core", CORE, "transformer_engine_cu13", 900 * KIB),
        ("extra", CURAND, "nvidia_curand", 300 * KIB),
        ("base", "transformer_engine-2.20.2-py3-none-any.whl", "transformer_engine", 1 * KIB),
    ):
        (d / folder).mkdir(parents=True, exist_ok=True)
        make_wheel(
            d / folder / name, project, name.split("-")[1], {f"{project}/lib.so": hashes(size)}
        )
    G.write_manifest(d, 13, "3.12")
    return d


def hashes(n: int) -> bytes:
    """``n`` bytes that do not compress."""
    out, block = bytearray(), b"seed"
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:n])


@pytest.fixture
def cut_bundle(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = _bundle(tmp_path / "gpu-bundle")
    C.cut(d, tree_bytes=20 * KIB, call_bytes=512 * KIB)
    return d


def test_cutting_carries_the_core_first_and_a_library_last_and_joining_restores_the_bytes(
    cut_bundle,
):
    d = cut_bundle
    manifest = G.read_manifest(d)
    carry = C._carry(d)
    assert (
        not (d / "core" / CORE).exists() and not (d / "extra" / CURAND).exists()
    )  # only pieces travel
    calls = [p["call"] for p in carry["pieces"]]
    assert calls == sorted(calls) and carry["pieces"][-1]["library"] == "curand"
    assert all(p["library"] is None for p in carry["pieces"] if p["file"] == f"core/{CORE}")
    joined = C.join_pieces(d, libraries=["curand"])
    assert [p.name for p in joined] == [CORE, CURAND]
    for entry in manifest["files"]:
        assert G.file_sha256(d / entry["name"]) == entry["sha256"]
    assert C.join_pieces(d, libraries=["curand"]) == joined and not list(d.rglob("*.joining"))


def test_a_node_with_the_library_needs_fewer_calls(cut_bundle):
    carry = C._carry(cut_bundle)
    with_lib = C.carry_plan(Path("gpu-bundle"), 20 * KIB)
    without = C.carry_plan(Path("gpu-bundle"), 20 * KIB, libraries=["curand"])
    assert len(with_lib) == C.last_call(carry, []) < len(without) == C.last_call(carry, ["curand"])
    for plan in (with_lib, without):
        assert plan[0]["steps"] == ["verify", "preflight", "build"]
        assert plan[-1]["steps"] == [
            "verify",
            "install",
            "gate",
            "bench-single",
            "bench-emulated",
            "check",
        ]
        assert all(item["steps"] == ["verify"] for item in plan[1:-1])
        assert plan[0]["carry"][:3] == [
            "gpu-bundle/manifest.json",
            "gpu-bundle/carry.json",
            "gpu-bundle/base",
        ]
        assert all(len(item["carry"]) <= C.MAX_PATHS for item in plan)
    with pytest.raises(SystemExit, match=r"inside the repository"):
        C.carry_plan(cut_bundle.resolve(), 0)


def test_a_corrupted_or_missing_piece_is_named_and_nothing_half_written_remains(cut_bundle):
    d = cut_bundle
    part = d / "core" / (CORE + ".part001")
    data = bytearray(part.read_bytes())
    data[10] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(SystemExit, match=r"part001: SHA-256 differs from carry.json"):
        C.verify_pieces(d, upto_call=2)
    C.verify_pieces(d, upto_call=1)  # call 1's pieces are intact
    with pytest.raises(SystemExit, match=r"does not match the manifest's SHA-256"):
        C.join_pieces(d, libraries=[])
    assert not list(d.rglob("*.joining")) and not (d / "core" / CORE).exists()
    part.unlink()
    with pytest.raises(
        SystemExit, match=r"part001: piece missing \(call 2\): the machine went back"
    ):
        C.verify_pieces(d, upto_call=2)


def test_the_time_plan_with_its_30_second_gaps_and_a_retry_fits_15_minutes_at_the_real_sizes(
    tmp_path, monkeypatch, capsys
):
    """The real bundle's sizes (TE 2.20.2's core wheel and cuRAND's for CUDA 13), a 1.7 MiB
    tree; every step at its limit, every gap at the 30 s the machine waits."""
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "gpu-bundle"
    d.mkdir()
    sizes = {
        f"core/{CORE}": (276_522_776, None),
        f"extra/{CURAND}": (77_113_015, "curand"),
        "base/small.whl": (18_000_000, None),
    }
    manifest = {
        "files": [
            {
                "name": n,
                "bytes": b,
                "sha256": "0" * 64,
                "use": "library" if lib else "te",
                "library": lib,
            }
            for n, (b, lib) in sizes.items()
        ]
    }
    (d / G.MANIFEST).write_text(json.dumps(manifest))
    tree = int(1.7 * 2**20)
    calls = C.assign_pieces(
        18_000_000,
        [
            (f"core/{CORE}", sizes[f"core/{CORE}"][0]),
            (f"extra/{CURAND}", sizes[f"extra/{CURAND}"][0]),
        ],
        tree,
    )
    pieces = [
        {
            "file": n,
            "name": f"{n}.part{k}",
            "bytes": ln,
            "sha256": "0",
            "call": call,
            "library": sizes[n][1],
        }
        for call, items in enumerate(calls, 1)
        for k, (n, _, ln) in enumerate(items)
    ]
    (d / C.CARRY).write_text(json.dumps({"pieces": pieces}))
    for libraries in ([], ["curand"]):
        plan = C.carry_plan(Path("gpu-bundle"), tree, libraries=libraries)
        assert all(item["bytes"] <= C.CALL_BYTES for item in plan)
        assert all(item["seconds"] <= 540 for item in plan)  # one command may run 600 s
        retry = C.retry_seconds(plan)
        assert retry["step"] == "build"  # the longest step, restarted by call 2
        # killed at its limit, it is found and restarted by call 4: the last call then waits
        assert 0 < retry["after_timeout_s"] <= G.STEP_SECONDS["build"]
        total = C.plan_seconds(plan) + retry["extra_s"]
        milestones = C.milestones(plan)
        if not libraries:  # the node's image has cuRAND: everything, and a retry, in 15 minutes
            assert total <= C.BUDGET_S == 15 * 60, total
        else:  # a node without it needs a sixth call: the records still come within the budget
            assert milestones["bench-emulated"] <= C.BUDGET_S < total
        assert milestones["bench-single"] < milestones["check"] <= total
        assert C.print_plan(plan, (tree, 0), str(libraries), must_fit=not libraries) == []
        # the build (detached in call 1) is done before the last call needs it
        assert plan[-1]["build_wait_s"] == 0 and plan[0]["seconds"] <= 60
        gaps = C.GAP_S * (len(plan) - 1)
        assert C.plan_seconds(plan) == pytest.approx(
            C.START_S + gaps + sum(i["seconds"] + i["transfer_s"] for i in plan)
        )
    out = capsys.readouterr().out
    assert "4 gaps x 30 s = 120 s" in out and "build (started detached)" in out
    plan = C.carry_plan(Path("gpu-bundle"), tree, libraries=["curand"])
    assert [len(p) for p in (C.carry_plan(Path("gpu-bundle"), tree), plan)] == [5, 6]
    # a working tree grown past what the cut allowed for is caught before the machine is used
    assert any(
        "cut the bundle again" in q
        for q in C.print_plan(
            C.carry_plan(Path("gpu-bundle"), tree + 4 * 2**20), (tree + 4 * 2**20, 0), "grown"
        )
    )


def test_steps_outside_call_range_are_refused():
    assert C.call_steps(1, 5) == ("preflight", "build")
    assert C.call_steps(5, 5) == C.LAST_STEPS
    with pytest.raises(SystemExit, match=r"--call 6: this node's run is carried in calls 1 to 5"):
        C.call_steps(6, 5)


def test_the_rehearsal_fails_unless_the_gate_stops_only_at_the_driver(tmp_path):
    """The verdict reads the gate's line: any other failure than ``libcuda.so.1`` is a problem."""
    work = tmp_path
    log = work / "out" / "call2" / "results" / "gpu-run" / "call2.log"
    log.parent.mkdir(parents=True)
    report = {
        "calls": [
            {"call": 1, "run": [{"name": "preflight", "rc": 0}]},
            {"call": 2, "run": [{"name": "install", "rc": 0}, {"name": "gate", "rc": 1}]},
        ],
        "build": {"status": {"rc": 0}, **R.projected_build_seconds([])},
    }
    plan = [{"call": 1}, {"call": 2}]
    log.write_text(
        "+ [gate, <= 60 s] python -m tutorial_utils.cli.gpu_setup gate\nimport gate:"
        " transformer_engine.jax failed to import: OSError: libcublas.so.13: cannot open shared"
        " object file: No such file or directory\n"
    )
    verdict = R._verdict(report, plan, work, work, Path(sys.executable), {})
    assert not verdict["ok"] and "another reason than the missing driver" in verdict["problems"][0]
    assert "libcublas.so.13" in verdict["gate_without_driver"]
    shutil.rmtree(work / "out")


def test_the_build_is_judged_by_its_projected_time_on_the_nodes_cores_not_by_this_machines():
    """CPU seconds per compile, not wall time: a busy 2-core machine gives the same verdict."""
    assert R.scaled_build_limit(2) == G.STEP_SECONDS["build"] * 8  # 16 / 2 cores
    assert R.scaled_build_limit(32) == G.STEP_SECONDS["build"]  # never below the node's
    compiles = [{"src": f"/b/csrc/extensions/f{i}.cpp", "cpu_s": 20.0} for i in range(18)]
    compiles += [
        {"src": "/b/csrc/extensions/attention.cpp", "cpu_s": 79.0},
        {"src": "/tmp/flagcheck.cpp", "cpu_s": 0.1},  # pybind11's probe: not a file of TE's
        {"src": None, "cpu_s": 3.0},  # the link
    ]
    p = R.projected_build_seconds(compiles)
    assert p["files"] == 19 and p["longest"] == {"src": "attention.cpp", "cpu_s": 79.0}
    assert p["projected_s"] == 79.0 + R.BUILD_SERIAL_S  # the longest file bounds it: ~1.5 min
    report = {"calls": [], "build": {"status": {"rc": 0}, **p}}
    assert not any(
        "projected" in q for q in R._verdict(report, [], Path("/x"), None, None, {})["problems"]
    )
    slow = R.projected_build_seconds([{**c, "cpu_s": c["cpu_s"] * 3} for c in compiles])
    report["build"] = {"status": {"rc": 0}, **slow}
    problems = R._verdict(report, [], Path("/x"), None, None, {})["problems"]
    assert any("projected time on 16 cores" in q for q in problems)


def test_a_wheel_brought_back_travels_in_call_1_after_cutting_again(cut_bundle):
    d = cut_bundle
    before = C.carry_plan(Path("gpu-bundle"), 20 * KIB)
    built = d / G.BUILT
    built.mkdir()
    wheel = make_wheel(
        built / "transformer_engine_jax-2.20.2-cp312-cp312-linux_x86_64.whl",
        "transformer_engine_jax",
        "2.20.2",
        {"transformer_engine_jax.so": hashes(40 * KIB)},
    )
    (built / "built.json").write_text(json.dumps({"wheel": wheel.name}))
    carry = C.cut(d, tree_bytes=20 * KIB, call_bytes=512 * KIB)  # puts the pieces together first
    assert not list(d.rglob("*.joining")) and carry["pieces"]
    for entry in G.read_manifest(d)["files"]:
        if entry["name"] not in {p["file"] for p in carry["pieces"]}:
            assert G.file_sha256(d / entry["name"]) == entry["sha256"]
    plan = C.carry_plan(Path("gpu-bundle"), 20 * KIB)
    assert plan[0]["carry"][-1 - len([p for p in carry["pieces"] if p["call"] == 1])] == (
        "gpu-bundle/built"
    )
    assert plan[0]["built"] == wheel.name and plan[-1]["build_wait_s"] == 0
    assert all(item["bytes"] <= 512 * KIB for item in plan)
    assert plan[0]["bytes"] - before[0]["bytes"] < 60 * KIB  # the wheel took a piece's room
    joined = C.join_pieces(d, libraries=["curand"])
    for path in joined:  # cut twice, the files are still the manifest's
        entry = next(e for e in G.read_manifest(d)["files"] if e["name"].endswith(path.name))
        assert G.file_sha256(path) == entry["sha256"]


def test_the_detached_build_outlives_its_call_and_is_waited_for(cut_bundle):
    """Call 1 returns at once; the build's process runs in its own session and leaves its state."""
    d = cut_bundle
    assert C.build_status(d) == {"rc": None}
    info = C.start_build(d, sys.executable, limit=120)
    assert info["attempt"] == 1 and (d / C.DETACHED / "started.json").is_file()
    status = C.wait_build(d, limit=120)  # this bundle has no sdist: the build step fails
    assert status["rc"] == 1 and status["pid"] == info["pid"], status
    assert (
        "expected one transformer_engine_jax sdist"
        in (d / C.DETACHED / "gpu-run" / "build.log").read_text()
    )
    assert C._build_line(status).startswith("build: rc=1 after")


def test_call_1_starts_no_build_when_the_preflight_fails_and_replies_briefly(
    cut_bundle, tmp_path, capsys
):
    """On this CPU machine the preflight fails (no cuDNN, a bundle for Python 3.12): call 1 says
    so in a few lines, keeps the whole log under OUT, and leaves no build running."""
    summary = C.run_call(cut_bundle, tmp_path / "out", 1)
    assert summary["ok"] is False and summary["steps"][0]["name"] == "preflight"
    assert C.build_status(cut_bundle) == {"rc": None}
    assert "preflight failed" in (tmp_path / "out" / "gpu-run" / "call1.log").read_text()
    reply = capsys.readouterr().out
    assert len(reply) <= C.REPLY_TAIL + 1000 and "!! preflight failed" in reply
