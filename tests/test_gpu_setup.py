"""Everything before the GPU machine, tested on CPU with small fake wheels and pieces (nothing is
downloaded): packing, pieces and checksums, the carry plan for a machine that takes 64 MiB per
call, the build's environment and parallel compile, the run's limits, logs, process-group kill
and import gate, cuDNN/CUDA/NCCL detection, and the docs' environment variables."""

import _ctypes
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from tutorial_utils.tools import gpu_setup as G
from tutorial_utils.tools import records
from tutorial_utils.tools.bench import build_parser as bench_parser
from tutorial_utils.tools.check import build_parser as check_parser

ROOT = Path(__file__).resolve().parents[1]
CORE = "transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl"
KIB = 1024


def _wheel(path: Path, name: str, version: str, members: dict) -> Path:
    """A real (small) wheel: METADATA, WHEEL and a RECORD with each member's hash."""
    info = f"{name}-{version}.dist-info"
    members = {**members, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
               f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rows = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
            for n, d in members.items()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in members.items():
            z.writestr(n, d)
        z.writestr(f"{info}/RECORD", "\n".join(rows + [f"{info}/RECORD,,"]) + "\n")
    return path


def _library_bytes(n: int) -> bytes:
    """Bytes that compress about as a fat binary does: repeated blocks with some noise."""
    block = hashlib.sha256(b"kernel").digest() * 64
    noise = os.urandom(n * 3 // 8)
    return (block * (n // len(block) + 1))[: n - len(noise)] + noise


def _sdist(path: Path, setup_py: str) -> Path:
    src = path.parent / "sdist-src" / "transformer_engine_jax-2.20.2"
    src.mkdir(parents=True)
    (src / "setup.py").write_text(setup_py)
    with tarfile.open(path, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    shutil.rmtree(src.parent)
    return path


FAKE_SETUP = """
import sys, time, threading, distutils.ccompiler as cc
assert sys.argv[:3] == ["setup.py", "bdist_wheel", "--dist-dir"], sys.argv
live, peak, lock = [0], [0], threading.Lock()
def one(obj, src, ext, cc_args, extra_postargs, pp_opts):
    with lock:
        live[0] += 1; peak[0] = max(peak[0], live[0])
    time.sleep(0.3)
    with lock:
        live[0] -= 1
comp = cc.new_compiler()
comp._compile = one
comp.compile([f"f{i}.cpp" for i in range(6)], output_dir="objs")
import pathlib
dest = pathlib.Path(sys.argv[3]); dest.mkdir(parents=True, exist_ok=True)
(dest / "transformer_engine_jax-2.20.2-cp311-cp311-linux_x86_64.whl").write_text(f"peak={peak[0]}")
print("compiled with", peak[0], "at once", flush=True)
"""


def _downloads(d: Path) -> bytes:
    """What ``bundle`` downloads into ``d/base``, faked small; returns the core wheel's bytes."""
    (d / "base").mkdir(parents=True)
    _wheel(d / "base" / CORE, "transformer_engine_cu13", "2.20.2",
           {"transformer_engine/wheel_lib/libtransformer_engine.so": _library_bytes(1400 * KIB)})
    _wheel(d / "base" / "transformer_engine-2.20.2-py3-none-any.whl", "transformer_engine", "2.20.2",
           {"transformer_engine/__init__.py": b"x = 1\n"})
    _sdist(d / "base" / "transformer_engine_jax-2.20.2.tar.gz", FAKE_SETUP)
    return (d / "base" / CORE).read_bytes()


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    """A bundle as ``bundle`` leaves it, from fake downloads, cut for 256 KiB calls."""
    d = tmp_path_factory.mktemp("repo") / "gpu-bundle"
    _downloads(d)
    G.pack(d, 13, "3.11", tree_bytes=20 * KIB, call_bytes=256 * KIB)
    return d


def test_pack_cuts_the_core_wheel_as_pypi_serves_it_and_join_restores_the_same_bytes(tmp_path):
    d = tmp_path / "gpu-bundle"
    original = _downloads(d)
    manifest = G.pack(d, 13, "3.11", tree_bytes=20 * KIB, call_bytes=256 * KIB)
    core = next(e for e in manifest["files"] if e["pieces"])
    assert core["sha256"] == hashlib.sha256(original).hexdigest() and core["packing"] is None
    assert sum(p["bytes"] for p in core["pieces"]) == len(original) and len(core["pieces"]) >= 3
    assert [p["call"] for p in core["pieces"]] == list(range(1, len(core["pieces"]) + 1))
    assert not (d / "core" / CORE).exists() and not (d / "base" / CORE).exists()  # only pieces travel
    G.join_pieces(d)
    assert (d / "core" / CORE).read_bytes() == original


def _copy(bundle_dir, tmp_path) -> Path:
    d = tmp_path / "gpu-bundle"
    shutil.copytree(bundle_dir, d)
    return d


def test_pack_can_shrink_the_core_wheel_with_xz_and_join_restores_it(tmp_path):
    d = tmp_path / "gpu-bundle"
    _downloads(d)
    manifest = G.pack(d, 13, "3.11", tree_bytes=20 * KIB, call_bytes=256 * KIB, xz=True, preset=1)
    core = next(e for e in manifest["files"] if e["pieces"])
    assert core["name"] == f"core/{CORE}" and core["packing"] == "xz"
    assert sum(p["bytes"] for p in core["pieces"]) < 0.5 * core["bytes"]  # xz on the stored members
    assert [p["call"] for p in core["pieces"]] == list(range(1, len(core["pieces"]) + 1))
    assert not (d / "core" / CORE).exists() and not (d / "base" / CORE).exists()  # only pieces travel
    files = G.join_pieces(d)
    wheel = d / "core" / CORE
    assert wheel in files and G.verify_wheel_record(wheel) == 3  # every member matches the original RECORD
    with zipfile.ZipFile(wheel) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
        assert len(z.read("transformer_engine/wheel_lib/libtransformer_engine.so")) == 1400 * KIB
    assert G.join_pieces(d) == files and not list(d.rglob("*.joining"))  # a second run keeps the files


def test_a_corrupted_or_missing_piece_is_named_and_nothing_half_written_remains(bundle_dir, tmp_path):
    d = _copy(bundle_dir, tmp_path)
    part = d / "core" / (CORE + ".part001")
    data = bytearray(part.read_bytes())
    data[10] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(SystemExit, match=r"part001: SHA-256 differs from the manifest"):
        G.join_pieces(d)
    with pytest.raises(SystemExit, match=r"part001: SHA-256 differs"):
        G.verify_pieces(d, upto_call=2)
    G.verify_pieces(d, upto_call=1)  # call 1's files are intact
    part.unlink()
    with pytest.raises(SystemExit, match=r"part001: piece missing \(\d+ pieces make"):
        G.join_pieces(d)
    assert not list(d.rglob("*.joining")) and not (d / "core" / CORE).exists()
    with pytest.raises(SystemExit, match=r"manifest.json not found: run `python -m tutorial_utils.tools.gpu_setup bundle"):
        G.join_pieces(tmp_path / "elsewhere")


def test_a_wheel_whose_member_differs_from_its_record_is_refused(tmp_path):
    w = _wheel(tmp_path / "a-1-py3-none-any.whl", "a", "1", {"a/x.py": b"1"})
    with zipfile.ZipFile(w) as z:
        items = [(i, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(w, "w") as z:
        for info, data in items:
            z.writestr(info, b"2" if info.filename == "a/x.py" else data)
    with pytest.raises(SystemExit, match=r"a/x.py differs from the wheel's RECORD"):
        G.verify_wheel_record(w)


def test_carry_plan_fits_every_call(bundle_dir, monkeypatch):
    """Finding 1 and item 2: each call within 64 MiB (here 256 KiB) with the tree, 540 s, 8 paths."""
    monkeypatch.chdir(bundle_dir.parent)
    plan = G.carry_plan(Path("gpu-bundle"), tree_bytes=20 * KIB)
    manifest = json.loads((bundle_dir / G.MANIFEST).read_text())
    pieces = next(e for e in manifest["files"] if e["pieces"])["pieces"]
    assert len(plan) == len(pieces) >= 3
    assert plan[0]["carry"][:2] == ["gpu-bundle/manifest.json", "gpu-bundle/base"]
    assert plan[0]["steps"] == ["preflight", "verify", "build"]  # the build needs no core wheel
    assert all(item["steps"] == ["verify"] for item in plan[1:-1])
    assert plan[-1]["steps"] == ["verify", "install", "gate", "check", "bench-single", "bench-emulated"]
    for item, piece in zip(plan, pieces):
        assert f"gpu-bundle/core/{piece['name']}" in item["carry"]
        assert item["bytes"] <= 256 * KIB and item["seconds"] <= G.CALL_SECONDS and len(item["carry"]) <= 8
        assert item["command"].endswith(f"--out $OUT/results --call {item['call']}")
    assert G.print_plan(plan, (20 * KIB, 0)) == []  # the real 64 MiB limit holds a fortiori
    small = G.carry_plan(Path("gpu-bundle"), tree_bytes=200 * KIB)
    assert any(item["bytes"] > 256 * KIB for item in small)  # a grown tree is caught...
    with pytest.raises(SystemExit, match=r"inside the repository"):
        G.carry_plan(bundle_dir, 0)


def test_carry_plan_rehearsal_plays_every_call_and_lets_pip_resolve_offline(bundle_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(bundle_dir.parent)
    plan = G.carry_plan(Path("gpu-bundle"), tree_bytes=20 * KIB)
    device = tmp_path / "device"
    G.rehearse(plan, Path("gpu-bundle"), device, "3.11")
    assert G.verify_wheel_record(device / "gpu-bundle" / "core" / CORE) == 3
    # a call that finds an earlier call's piece gone (the machine went back) says so
    (device / "gpu-bundle" / "core" / CORE).unlink()
    (device / "gpu-bundle" / "core" / (CORE + ".part000")).unlink()
    with pytest.raises(SystemExit, match=r"part000 \(call 1\) missing"):
        G.verify_pieces(device / "gpu-bundle", upto_call=2)


def test_every_call_and_every_run_stays_under_540_seconds():
    """Finding 2: the steps of each call sum to at most 540 s (one command may run 600 s)."""
    for calls in (2, 3, 5):
        for call in range(1, calls + 1):
            steps = G.run_commands(Path("gpu-bundle"), Path("r"), "python3", call, calls)
            assert sum(limit for _, limit, _ in steps) <= G.CALL_SECONDS <= 540
    with pytest.raises(SystemExit, match=r"--call 4: this bundle is carried in calls 1 to 3"):
        G.call_steps(4, 3)


def _fake_steps(*pairs):
    return [(name, limit, [sys.executable, "-c", code]) for name, limit, code in pairs]


def test_a_killed_step_keeps_its_output_and_the_run_log_is_not_a_record(tmp_path):
    """Findings 2 and 6: output streamed to OUT/gpu-run/run.log as it comes; run.json outside the records."""
    steps = _fake_steps(("check", 1.5, "import time; print('started the check', flush=True); time.sleep(30)"),
                        ("bench-single", 5, "import os; print('backend', os.environ['TUTORIAL_TE_BACKEND'])"))
    start = time.perf_counter()
    summary = G.run(Path("gpu-bundle"), tmp_path, steps=steps)
    assert time.perf_counter() - start < 15
    assert [s["rc"] for s in summary["steps"]] == ["timeout", 0] and summary["ok"] is False
    log = (tmp_path / "gpu-run" / "run.log").read_text()
    assert "started the check" in log and "= [check] rc=timeout" in log
    assert "backend te" in log  # finding 5: check and bench run with TUTORIAL_TE_BACKEND=te
    assert json.loads((tmp_path / "gpu-run" / "run.json").read_text())["steps"][0]["rc"] == "timeout"
    assert records.read_records(tmp_path) == ([], [])  # nothing in the records folder breaks it
    summary = G.run(Path("gpu-bundle"), tmp_path, steps=steps[1:])  # finding 7: again, same tree
    assert summary["ok"] is True


def test_a_timeout_kills_the_whole_process_group(tmp_path):
    """Finding 4: pip's and g++'s children must not go on into the next step."""
    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    with open(tmp_path / "log", "w") as log:
        rc, seconds = G.run_step([sys.executable, "-c", code], 2, log)
    assert rc == "timeout" and seconds < 20
    child = int(pid_file.read_text())
    time.sleep(0.5)
    status = Path(f"/proc/{child}/status")
    assert not status.exists() or "zombie" in status.read_text()


def test_a_failed_import_gate_stops_the_run_loudly(tmp_path):
    """Finding 5: no check or benchmark after a failed install or import."""
    steps = _fake_steps(("gate", 5, "raise SystemExit('import gate: transformer_engine.jax failed to import: x')"),
                        ("check", 5, "print('RAN-' + 'CHECK')"), ("bench-single", 5, "print('RAN-' + 'BENCH')"))
    summary = G.run(Path("gpu-bundle"), tmp_path, steps=steps)
    assert summary["ok"] is False and [s["rc"] for s in summary["steps"]] == [1, None, None]
    assert summary["steps"][1]["note"] == "not run: gate failed"
    assert "RAN-" not in (tmp_path / "gpu-run" / "run.log").read_text()


def test_the_import_gate_refuses_a_machine_without_a_gpu():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "tutorial_utils.tools.gpu_setup", "gate"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 1 and "import gate: JAX sees no GPU" in proc.stderr


def test_run_commands_are_accepted_by_the_real_clis_and_can_be_run_twice(tmp_path):
    """Finding 7 (--force) and 8 (no final `pip install -e .`)."""
    steps = G.run_commands(Path("gpu-bundle"), tmp_path, "python3", call=3, calls=3)
    assert [name for name, _, _ in steps] == ["verify", "install", "gate", "check", "bench-single", "bench-emulated"]
    for name, _, cmd in steps:
        module, args = cmd[2], cmd[3:]
        if module == "tutorial_utils.tools.gpu_setup":
            continue
        parsed = (check_parser() if module == "tutorial_utils.tools.check" else bench_parser()).parse_args(args)
        assert parsed.force is True  # a second run replaces its report and records
        if name.startswith("bench"):
            assert parsed.preset == "seed" and parsed.out == str(tmp_path)
    assert "--emulate-ranks" in steps[-1][2] and "128,256,512" in steps[-1][2]
    wheels = [tmp_path / "base" / "a.whl", tmp_path / "core" / CORE]
    (cmd,) = G.install_commands(wheels, [tmp_path / "built" / "transformer_engine_jax-2.20.2-cp312-cp312-x.whl"])
    assert cmd[3:7] == ["install", "--no-index", "--no-deps", "--no-cache-dir"] and "-e" not in cmd
    with pytest.raises(SystemExit, match=r"run the build step \(call 1 of the carry plan\) first"):
        G.install_commands(wheels, [])


def test_build_adds_cudnn_headers_and_compiles_in_parallel(bundle_dir, tmp_path, monkeypatch):
    """Findings 3 and 4: cudnn.h on the include path; the sdist's setup.py compiled with ParallelCompile."""
    pytest.importorskip("pybind11")
    site = tmp_path / "site"
    (site / "nvidia" / "cudnn" / "include").mkdir(parents=True)
    (site / "nvidia" / "cudnn" / "include" / "cudnn.h").write_text("")
    monkeypatch.setenv("CPLUS_INCLUDE_PATH", "/opt/other")
    cmd, env = G.build_command(tmp_path / "src", tmp_path / "out", 3, sites=[str(site)])
    assert env["CPLUS_INCLUDE_PATH"] == f"{site}/nvidia/cudnn/include:/opt/other"
    assert (env["NVTE_FRAMEWORK"], env["NVTE_CUDA_ARCHS"], env["NVTE_BUILD_MAX_JOBS"]) == ("jax", "90", "3")
    assert "ParallelCompile" in cmd[2] and "--no-build-isolation" not in cmd  # setup.py runs in this Python
    with pytest.raises(SystemExit, match=r"cudnn.h not found .*pip install nvidia-cudnn-cu13"):
        G.cudnn_include_dir([str(tmp_path / "empty")])
    # the real build step on the fake sdist: parallel, stamped, and kept on a second run
    d = _copy(bundle_dir, tmp_path)
    monkeypatch.setattr(G, "cudnn_include_dir", lambda sites=None: site / "nvidia" / "cudnn" / "include")
    wheel = G.build_extension(d, jobs=3)
    assert wheel.read_text() == "peak=3"  # six 0.3 s compiles ran three at a time
    stamp = json.loads((d / "built" / "built.json").read_text())
    assert stamp["jobs"] == 3 and stamp["sdist_sha256"] == G._sha256(d / "base" / "transformer_engine_jax-2.20.2.tar.gz")
    start = time.perf_counter()
    assert G.build_extension(d, jobs=3) == wheel and time.perf_counter() - start < 1  # re-run: kept


def test_nccl_is_loaded_from_pip_before_te(tmp_path):
    """Finding 10: libtransformer_engine.so has no RPATH; pip's libnccl.so.2 is loaded first."""
    lib = tmp_path / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    lib.parent.mkdir(parents=True)
    shutil.copy(_ctypes.__file__, lib)  # any real shared library stands in for NCCL
    assert G.nccl_library([str(tmp_path)]) == lib
    assert G.preload_nccl([str(tmp_path)]) == str(lib)
    assert str(lib) in Path("/proc/self/maps").read_text()
    env = G.library_env({"LD_LIBRARY_PATH": "/usr/lib/x"}, sites=[str(tmp_path)])
    assert env["LD_LIBRARY_PATH"] == f"{lib.parent}:/usr/lib/x"
    assert G.preload_nccl([str(tmp_path / "none")]) is None


def test_cudnn_check_names_the_version_it_found():
    assert G.check_cudnn(((9, 12, 1), "libcudnn.so.9")) == "cuDNN 9.12.1 (libcudnn.so.9) >= 9.12.0: ok"
    with pytest.raises(SystemExit, match=r"cuDNN 9\.10\.0 \(/x/libcudnn\.so\.9\) < 9\.12\.0: TransformerEngine 2\.20\.2 "
                                         r"refuses to import on it"):
        G.check_cudnn(((9, 10, 0), "/x/libcudnn.so.9"))
    with pytest.raises(SystemExit, match=r"cuDNN not found"):
        G.check_cudnn(found=None)


def test_cuda_major_follows_jax_and_refuses_a_mixed_node(monkeypatch):
    """Finding 11: TE picks its core wheel from JAX's CUDA, so JAX decides, and nvcc must agree."""
    monkeypatch.delenv("CUDA_MAJOR", raising=False)
    assert G.cuda_major("release 13.0, V13.0.48", jax_majors=[13]) == 13
    assert G.cuda_major("", jax_majors=[12]) == 12
    assert G.cuda_major("Cuda compilation tools, release 12.8, V12.8.93", jax_majors=[]) == 12
    with pytest.raises(SystemExit, match=r"nvcc is CUDA 12 but JAX uses CUDA 13"):
        G.cuda_major("release 12.8", jax_majors=[13])
    monkeypatch.setenv("CUDA_MAJOR", "12")
    assert G.cuda_major("release 13.0", jax_majors=[13]) == 12
    monkeypatch.setenv("CUDA_MAJOR", "11")
    with pytest.raises(SystemExit, match=r"CUDA_MAJOR='11': use 12 or 13"):
        G.cuda_major()


def test_the_bundle_is_pinned_and_never_mixes_in_stale_files(tmp_path):
    """Finding 9."""
    reqs = [r for r, _ in G.bundle_requirements(13)]
    assert all(re.fullmatch(r"[a-z0-9-]+==[0-9.]+", r) for r in reqs), reqs
    assert {"pydantic", "pydantic-core", "typing-extensions"} <= {r.split("==")[0] for r in reqs}
    from importlib.metadata import requires, version

    if version("pydantic") == G.PINS["pydantic"]:  # the pins agree with what pydantic itself requires
        needs = requires("pydantic")
        assert f"pydantic-core=={G.PINS['pydantic-core']}" in needs
        floor = next(r for r in needs if r.startswith("typing-extensions>="))
        assert tuple(map(int, G.PINS["typing-extensions"].split("."))) >= tuple(map(int, floor.split(">=")[1].split(".")))
    (tmp_path / "old.whl").write_text("stale")
    with pytest.raises(SystemExit, match=r"is not empty: bundling into it would pick up stale files"):
        G.bundle(tmp_path, 13)
    with pytest.raises(SystemExit, match=r"holds no manifest.json: --clean empties only a bundle's folder"):
        G.bundle(tmp_path, 13, clean=True)
    (tmp_path / G.MANIFEST).write_text("{}")
    G._prepare_folder(tmp_path, clean=True)
    assert list(tmp_path.iterdir()) == []


def test_bundle_dry_run_lists_every_file_for_the_target():
    text = [" ".join(c) for c in G.bundle(Path("b"), 13, "3.12", dry_run=True)]
    assert any("transformer-engine-cu13==2.20.2" in t and "--only-binary=:all:" in t and "--python-version 3.12" in t
               for t in text)
    assert "fetch-sdist transformer-engine-jax 2.20.2" in text
    assert any("nvidia-cudnn-frontend==" in t and "--only-binary=:all:" in t for t in text)
    assert any("transformer-engine-cu12==2.20.2" in " ".join(c) for c in G.bundle(Path("b"), 12, dry_run=True))
    with pytest.raises(ValueError, match=r"cuda=11"):
        G.bundle_requirements(11)


def test_sdist_link_reads_the_simple_index():
    page = ('<a href="https://files.example/x/transformer_engine_jax-2.20.1.tar.gz#sha256=' + "a" * 64 + '">old</a>'
            '<a href="https://files.example/y/transformer_engine_jax-2.20.2.tar.gz#sha256=' + "b" * 64 + '">new</a>')
    assert G.sdist_link(page, "transformer-engine-jax", "2.20.2") == (
        "https://files.example/y/transformer_engine_jax-2.20.2.tar.gz", "b" * 64)
    with pytest.raises(SystemExit, match=r"no transformer-engine-jax 2.20.9 sdist"):
        G.sdist_link(page, "transformer-engine-jax", "2.20.9")


def test_make_gpu_targets():
    def make_n(target, *extra):
        proc = subprocess.run(["make", "--no-print-directory", "-n", target, *extra], cwd=ROOT, capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert make_n("gpu-run", "GPU_OUT=/tmp/out").strip() == (
        "PYTHONPATH=src python3 -m tutorial_utils.tools.gpu_setup run --bundle gpu-bundle --out /tmp/out")
    assert "carry-plan --bundle gpu-bundle" in make_n("gpu-carry-plan")
    setup = make_n("gpu-setup")
    assert "CPLUS_INCLUDE_PATH=" in setup and "cudnn-include" in setup  # finding 3 on the online route too
    dry = subprocess.run([sys.executable, "-m", "tutorial_utils.tools.gpu_setup", "run", "--out", "/tmp/out",
                          "--dry-run"], cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert [line.split(",")[0] for line in dry.stdout.splitlines()] == [
        "+ [preflight", "+ [verify", "+ [build", "+ [install", "+ [gate", "+ [check", "+ [bench-single",
        "+ [bench-emulated"]


def test_gpu_extras_pin_one_cuda_each_and_leave_te_jax_to_the_no_isolation_build():
    """Finding 11: no jax[cuda12]-only extra, and no transformer-engine[jax] built in isolation."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "gpu" not in extras
    for major in (12, 13):
        deps = " ".join(extras[f"gpu-cuda{major}"])
        assert f"jax[cuda{major}]" in deps and f"transformer-engine-cu{major}==2.20.2" in deps
        assert "transformer-engine[jax]" not in deps and f"cuda{25 - major}" not in deps


def _te_dir() -> Path:
    """The installed TE's sources, found without importing it (its import refuses a CPU machine)."""
    import importlib.util

    return Path(next(iter(importlib.util.find_spec("transformer_engine").submodule_search_locations)))


def test_gpu_page_names_only_environment_variables_that_te_or_this_project_reads():
    """Finding 11: every variable docs/gpu.md names occurs in the installed TE or in this project."""
    text = (ROOT / "docs" / "gpu.md").read_text()
    names = set(re.findall(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]\b", text))
    assert "NVTE_CUDA_INCLUDE_PATH" not in names  # read by nothing
    assert {"TUTORIAL_TE_BACKEND", "CPLUS_INCLUDE_PATH", "NVTE_FRAMEWORK"} <= names
    corpus = "".join(p.read_text(errors="replace") for p in _te_dir().rglob("*.py"))
    corpus += "".join(p.read_text() for p in (ROOT / "src").rglob("*.py")) + (ROOT / "Makefile").read_text()
    missing = sorted(n for n in names if n not in corpus)
    assert not missing, f"docs/gpu.md names variables nothing reads: {missing}"


def test_gpu_page_covers_both_cudas_both_pythons_and_cudnn_headers():
    text = (ROOT / "docs" / "gpu.md").read_text()
    for needle in ("CUDA 12", "CUDA 13", "Python 3.11", "Python 3.12", "cudnn.h", "nvidia/cudnn/include",
                   "carry-plan", "--python-version 3.11", "--cuda 12"):
        assert needle in text, needle
    assert "never run" not in text or "make gpu-run" in text


def test_gpu_page_states_the_step_limits_the_code_uses():
    text = (ROOT / "docs" / "gpu.md").read_text()
    stated = {name: int(sec) for name, sec in re.findall(r"^\| `([a-z-]+)` \| (\d+) s \|", text, flags=re.M)}
    assert stated == G.STEP_SECONDS


def test_the_facade_loads_pips_nccl_before_importing_real_te(monkeypatch):
    """Finding 10 at the facade: ``tutorial_utils.te`` loads NCCL first, then imports TE."""
    import importlib

    from tutorial_utils.te import _backend

    order = []
    monkeypatch.setattr(_backend, "preload_nccl", lambda *a, **k: order.append("nccl"))
    monkeypatch.setattr(importlib, "import_module", lambda name: order.append(name) or name)
    assert _backend._import_real_te() == "transformer_engine.jax"
    assert order == ["nccl", "transformer_engine.jax"]
