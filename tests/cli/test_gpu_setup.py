"""The GPU install and run (``tutorial_utils.cli.gpu_setup``), tested on CPU with small real
wheels and files laid out as pip lays them out: pins, TE's own search orders for ``nvcc`` and
libraries, the build's environment, preflight, the offline install, the run's limits, logs,
process-group kill and import gate, and the GPU page. TE's real ``setup.py`` is
``tests/devtools/test_te_build.py``; the carry plan for a lent machine is
``tests/devtools/test_gpu_carry.py``."""

import _ctypes
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from gpu_wheels import make_wheel

from tutorial_utils import gpu
from tutorial_utils.cli import gpu_bundle, gpu_cuda, gpu_install
from tutorial_utils.cli import gpu_setup as G
from tutorial_utils.cli.bench import build_parser as bench_parser
from tutorial_utils.cli.check import build_parser as check_parser
from tutorial_utils.perfmodel import records

ROOT = Path(__file__).resolve().parents[2]
CORE = "transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl"


def _exe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n")
    path.chmod(0o755)
    return path


def _bundle(d: Path, built: bool = True) -> Path:
    """A bundle with every requirement for CUDA 13 as a small real wheel (and the sdist)."""
    for req in G.bundle_requirements(13):
        folder = d / gpu_bundle._folder(req)
        folder.mkdir(parents=True, exist_ok=True)
        stem = req.name.replace("-", "_")
        if req.name == "transformer-engine-jax":
            (folder / f"{stem}-{req.version}.tar.gz").write_bytes(b"sdist")
        else:
            make_wheel(
                folder / f"{stem}-{req.version}-py3-none-any.whl",
                stem,
                req.version,
                {f"{stem}/x.py": b"1"},
            )
    G.write_manifest(d, 13, "3.12")
    if built:
        (d / G.BUILT).mkdir()
        make_wheel(
            d / G.BUILT / "transformer_engine_jax-2.20.2-cp312-cp312-linux_x86_64.whl",
            "transformer_engine_jax",
            "2.20.2",
            {"transformer_engine_jax.so": b"ext"},
        )
    return d


def test_the_bundle_is_pinned_and_carries_what_tes_build_and_import_need():
    reqs = G.bundle_requirements(13)
    assert all(re.fullmatch(r"[0-9.]+", r.version) for r in reqs), reqs
    uses = {r.name: r.use for r in reqs}
    assert uses["nvidia-cudnn-frontend"] == uses["nvidia-nvtx"] == uses["setuptools"] == "build"
    assert uses["packaging"] == "runtime" and uses["nvidia-curand"] == "library"
    assert {"nvidia-nvtx-cu12", "nvidia-curand-cu12"} <= {r.name for r in G.bundle_requirements(12)}
    from importlib.metadata import requires, version

    pins = {r.name: r.version for r in reqs}
    if version("pydantic") == pins["pydantic"]:  # the pins agree with what pydantic itself requires
        needs = requires("pydantic")
        assert f"pydantic-core=={pins['pydantic-core']}" in needs
    with pytest.raises(ValueError, match=r"cuda=11"):
        G.bundle_requirements(11)


def test_the_bundle_never_mixes_in_stale_files(tmp_path):
    (tmp_path / "old.whl").write_text("stale")
    with pytest.raises(
        SystemExit, match=r"is not empty: bundling into it would pick up stale files"
    ):
        G.bundle(tmp_path, 13)
    with pytest.raises(
        SystemExit, match=r"holds no manifest.json: --clean empties only a bundle's folder"
    ):
        G.bundle(tmp_path, 13, clean=True)
    (tmp_path / G.MANIFEST).write_text("{}")
    gpu_bundle._prepare_folder(tmp_path, clean=True)
    assert list(tmp_path.iterdir()) == []


def test_bundling_again_keeps_a_wheel_brought_back(tmp_path):
    """``--clean`` empties the bundle but keeps ``built/``: the build step uses the wheel only
    if its ``built.json`` names the same sdist."""
    d = tmp_path / "gpu-bundle"
    (d / G.BUILT).mkdir(parents=True)
    (d / G.BUILT / "built.json").write_text("{}")
    (d / G.MANIFEST).write_text("{}")
    (d / "base").mkdir()
    (d / "base" / "old.whl").write_text("stale")
    gpu_bundle._prepare_folder(d, clean=True)
    assert sorted(p.relative_to(d).as_posix() for p in d.rglob("*")) == [
        "built",
        "built/built.json",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["gpu-bundle"]


def test_bundle_dry_run_lists_every_file_for_the_target():
    text = [" ".join(c) for c in G.bundle(Path("b"), 13, "3.12", dry_run=True)]
    assert any(
        "transformer-engine-cu13==2.20.2" in t
        and "--only-binary=:all:" in t
        and "--python-version 3.12" in t
        for t in text
    )
    assert "fetch-sdist transformer-engine-jax 2.20.2" in text
    for name in (
        "nvidia-cudnn-frontend==",
        "nvidia-nvtx==",
        "nvidia-curand==",
        "setuptools==",
        "packaging==",
    ):
        assert any(name in t for t in text), name
    assert any(
        "transformer-engine-cu12==2.20.2" in " ".join(c)
        for c in G.bundle(Path("b"), 12, dry_run=True)
    )


def test_a_wheel_whose_member_differs_from_its_record_is_refused(tmp_path):
    w = make_wheel(tmp_path / "a-1-py3-none-any.whl", "a", "1", {"a/x.py": b"1"})
    assert G.verify_wheel_record(w) == 3 and G.wheel_version(w) == "1"
    with zipfile.ZipFile(w) as z:
        items = [(i, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(w, "w") as z:
        for info, data in items:
            z.writestr(info, b"2" if info.filename == "a/x.py" else data)
    with pytest.raises(SystemExit, match=r"a/x.py differs from the wheel's RECORD"):
        G.verify_wheel_record(w)


def test_te_takes_cuda_home_s_nvcc_then_pips_then_the_path(tmp_path):
    """TE's ``nvcc_path`` order: pip's nvcc wins over the PATH's unless CUDA_HOME is set."""
    home = _exe(tmp_path / "toolkit" / "bin" / "nvcc")
    pip = _exe(tmp_path / "site" / "nvidia" / "cu13" / "bin" / "nvcc")
    on_path = _exe(tmp_path / "usr" / "bin" / "nvcc")
    sites = [str(tmp_path / "site")]
    assert (
        G.te_nvcc({"CUDA_HOME": str(tmp_path / "toolkit"), "PATH": str(on_path.parent)}, sites)
        == home
    )
    assert G.te_nvcc({"PATH": str(on_path.parent)}, sites) == pip
    assert G.te_nvcc({"PATH": str(on_path.parent)}, [str(tmp_path / "none")]) == on_path


def test_te_loads_a_system_library_before_pips(tmp_path):
    """TE's loader order: ``<NAME>_HOME``/``CUDA_HOME`` searched recursively (no stubs), then the
    loader path, then pip's wheels in this Python's purelib."""
    name = "tutorialprobe"  # a library no machine has, so /usr/local/cuda never answers
    system = tmp_path / "cuda" / "lib64" / f"lib{name}.so.10"
    stub = tmp_path / "cuda" / "lib64" / "stubs" / f"lib{name}.so.99"
    pip = tmp_path / "site" / "nvidia" / "cu13" / "lib" / f"lib{name}.so.10"
    for path in (system, stub, pip):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    purelib = str(tmp_path / "site")
    assert G.te_library(name, {"CUDA_HOME": str(tmp_path / "cuda")}, purelib) == ("system", system)
    assert G.te_library(name, {f"{name.upper()}_HOME": str(tmp_path / "cuda")}, purelib) == (
        "system",
        system,
    )
    assert G.te_library(name, {}, purelib) == ("pip", pip)
    assert G.te_library(name, {}, str(tmp_path / "elsewhere")) is None


def test_cudnn_check_names_the_version_it_found():
    assert (
        G.check_cudnn(((9, 12, 1), "libcudnn.so.9")) == "cuDNN 9.12.1 (libcudnn.so.9) >= 9.12.0: ok"
    )
    with pytest.raises(
        SystemExit,
        match=r"cuDNN 9\.10\.0 \(/x/libcudnn\.so\.9\) < 9\.12\.0: TransformerEngine 2\.20\.2 "
        r"refuses to import on it",
    ):
        G.check_cudnn(((9, 10, 0), "/x/libcudnn.so.9"))
    with pytest.raises(SystemExit, match=r"cuDNN not found"):
        G.check_cudnn(found=None)


def test_cuda_major_follows_jax_and_refuses_a_mixed_node(monkeypatch):
    """TE picks its core wheel from JAX's CUDA, so JAX decides, and nvcc must agree."""
    monkeypatch.delenv("CUDA_MAJOR", raising=False)
    assert G.cuda_major("release 13.0, V13.0.48", jax_majors=[13]) == 13
    assert G.cuda_major("", jax_majors=[12]) == 12
    assert G.cuda_major("Cuda compilation tools, release 12.8, V12.8.93", jax_majors=[]) == 12
    with pytest.raises(SystemExit, match=r"nvcc is CUDA 12 but JAX uses CUDA 13.*Set CUDA_HOME"):
        G.cuda_major("release 12.8", jax_majors=[13])
    monkeypatch.setenv("CUDA_MAJOR", "12")
    assert G.cuda_major("release 13.0", jax_majors=[13]) == 12
    monkeypatch.setenv("CUDA_MAJOR", "11")
    with pytest.raises(SystemExit, match=r"CUDA_MAJOR='11': use 12 or 13"):
        G.cuda_major()


def test_the_build_gets_cudnn_and_nvtx_headers_its_own_wheels_and_a_plain_version(tmp_path):
    site, build_env = tmp_path / "site", tmp_path / "build-env"
    for header in (
        site / "nvidia" / "cudnn" / "include" / "cudnn.h",
        build_env / "nvidia" / "cu13" / "include" / "nvtx3" / "nvToolsExt.h",
    ):
        header.parent.mkdir(parents=True)
        header.write_text("")
    cmd, env = G.build_command(
        tmp_path / "src",
        tmp_path / "out",
        3,
        sites=[str(site)],
        build_env=build_env,
        env={"CPLUS_INCLUDE_PATH": "/opt/other", "PYTHONPATH": "/x"},
    )
    assert (
        env["CPLUS_INCLUDE_PATH"]
        == f"{site}/nvidia/cudnn/include:{build_env}/nvidia/cu13/include:/opt/other"
    )
    assert env["PYTHONPATH"] == f"{build_env}:/x"  # the pinned setuptools, pybind11, frontend first
    assert (env["NVTE_FRAMEWORK"], env["NVTE_CUDA_ARCHS"], env["NVTE_BUILD_MAX_JOBS"]) == (
        "jax",
        "90",
        "3",
    )
    assert env["NVTE_NO_LOCAL_VERSION"] == "1"  # in a git checkout TE would append "+<commit>"
    assert "ParallelCompile" in cmd[2] and cmd[-1] == "3"
    assert (
        G.build_includes(sites=[str(site)]) == f"{site}/nvidia/cudnn/include"
    )  # no nvtx3 found: none added
    with pytest.raises(SystemExit, match=r"cudnn.h not found .*pip install nvidia-cudnn-cu13"):
        G.cudnn_include_dir([str(tmp_path / "empty")])


def test_a_wheel_built_from_the_same_sdist_is_kept_and_brought_back(tmp_path, monkeypatch):
    """A machine lost after the build never builds twice: the wheel goes out with the results."""

    def never(*args, **kwargs):
        raise AssertionError("the kept wheel was built again")

    monkeypatch.setattr(gpu_install, "build_command", never)  # the build is never prepared
    monkeypatch.setattr(subprocess, "run", never)  # nor pip nor the compiler run
    d = _bundle(tmp_path / "gpu-bundle")
    wheel = next((d / G.BUILT).glob("*.whl"))
    sdist = next((d / G.BASE).glob("*.tar.gz"))
    (d / G.BUILT / "built.json").write_text(
        json.dumps(
            {
                "wheel": wheel.name,
                "sha256": G.file_sha256(wheel),
                "sdist_sha256": G.file_sha256(sdist),
            }
        )
    )
    out = tmp_path / "out"
    assert G.build_extension(d, out=out) == wheel.resolve()
    assert not (d / "build").exists() and not (d / G.BUILD_ENV).exists()  # nothing unpacked
    assert (out / "gpu-run" / wheel.name).read_bytes() == wheel.read_bytes()
    assert (out / "gpu-run" / "built.json").is_file()


def test_preflight_lists_every_problem_at_once(tmp_path):
    """On this CPU machine (no CUDA JAX, no cuDNN, no NCCL), with a bundle that lacks the frontend
    and nvtx wheels, preflight names each problem, not only the first."""
    d = _bundle(tmp_path / "gpu-bundle", built=False)
    for entry in G.read_manifest(d)["files"]:
        if Path(entry["name"]).name.startswith(("nvidia_cudnn_frontend", "nvidia_nvtx")):
            (d / entry["name"]).unlink()
    G.write_manifest(d, 13, f"{sys.version_info[0]}.{sys.version_info[1]}")
    with pytest.raises(SystemExit) as err:
        G.preflight(d)
    problems = [line for line in str(err.value).splitlines() if line.startswith("  - ")]
    text = "\n".join(problems)
    assert len(problems) >= 4, text
    for needle in ("cudnn-frontend", "nvtx3", "cuDNN not found", "NCCL"):
        assert needle in text, needle


def test_the_install_takes_tes_three_always_and_the_rest_only_when_missing(tmp_path, monkeypatch):
    d = _bundle(tmp_path / "gpu-bundle")
    monkeypatch.setattr(
        gpu_install, "installed_version", lambda project: "26.4" if project == "packaging" else None
    )
    monkeypatch.setattr(gpu_install, "te_library", lambda name, **kw: None)
    (cmd,) = G.install_commands(d, "python3")
    names = [Path(c).name.split("-")[0] for c in cmd[7:]]
    assert cmd[:7] == [
        "python3",
        "-m",
        "pip",
        "install",
        "--no-index",
        "--no-deps",
        "--no-cache-dir",
    ]
    assert names[:3] == ["transformer_engine", "transformer_engine_cu13", "transformer_engine_jax"]
    assert {"pydantic", "pydantic_core", "nvidia_curand"} <= set(names)
    assert (
        "packaging" not in names
        and "setuptools" not in names
        and "nvidia_cudnn_frontend" not in names
    )
    monkeypatch.setattr(
        gpu_install, "te_library", lambda name, **kw: ("pip", Path("/x/libcurand.so.10"))
    )
    assert "nvidia_curand" not in " ".join(G.install_commands(d, "python3")[0])
    shutil.rmtree(d / G.BUILT)
    with pytest.raises(SystemExit, match=r"run the build step first"):
        G.install_commands(d, "python3")


def _with_requirements(d: Path, project: str, requires: list[str]) -> None:
    """Give the bundle's ``project`` wheel these ``Requires-Dist`` lines (as pydantic's has)."""
    (wheel,) = [p for p in d.rglob("*.whl") if p.name.split("-")[0] == project]
    make_wheel(wheel, project, wheel.name.split("-")[1], {f"{project}/x.py": b"1"}, requires)
    G.write_manifest(d, 13, "3.12")


def test_an_installed_package_older_than_a_requirement_is_replaced_from_the_bundle(
    tmp_path, monkeypatch, capsys
):
    """pydantic 2.14.4 needs typing-extensions >= 4.16.0: an older one installed is upgraded."""
    d = _bundle(tmp_path / "gpu-bundle")
    _with_requirements(
        d, "pydantic", ["annotated-types>=0.6.0", "typing-extensions>=4.16.0", "x; extra == 'e'"]
    )
    installed = {"typing-extensions": "4.12.2", "annotated-types": "0.8.0", "packaging": "26.4"}
    monkeypatch.setattr(gpu_install, "installed_version", lambda project: installed.get(project))
    monkeypatch.setattr(gpu_install, "te_library", lambda name, **kw: ("pip", Path("/x")))
    (cmd,) = G.install_commands(d, "python3")
    names = [Path(c).name.split("-")[0] for c in cmd[7:]]
    assert "pydantic" in names and "typing_extensions" in names  # missing, and too old
    assert "annotated_types" not in names and "packaging" not in names  # accepted: kept
    out = capsys.readouterr().out
    assert "+ typing-extensions 4.12.2 installed, but pydantic-2.14.4" in out
    assert "needs >=4.16.0: installing typing_extensions-4.16.0" in out
    assert "+ annotated-types 0.8.0 already installed and accepted: kept" in out
    installed["typing-extensions"] = "4.16.1"  # new enough: kept
    (cmd,) = G.install_commands(d, "python3")
    assert "typing_extensions" not in " ".join(cmd)
    _with_requirements(d, "pydantic", ["typing-extensions>=5"])  # nothing in the bundle meets it
    with pytest.raises(SystemExit, match=r"typing_extensions-4.16.0.* does not meet .*>=5"):
        G.install_commands(d, "python3")


def test_version_specifiers_are_read_as_pip_reads_release_numbers():
    for version, spec, want in (
        ("4.15.0", ">=4.16.0", False),
        ("4.16", ">=4.16.0", True),
        ("2.50.5", "==2.50.5", True),
        ("2.50.6", "==2.50.5", False),
        ("1.4.2", "~=1.4", True),
        ("2.0", "~=1.4", False),
        ("13.0.88.1", "==13.0.88.*", True),
        ("2.5", ">=2,<3", True),
        ("3.0", ">=2,<3", False),
        ("1.0.2", "!=1.0.*", False),
        ("0.1", "", True),
    ):
        assert G.version_satisfies(version, spec) is want, (version, spec)


def test_the_run_puts_pips_cuda_folders_after_the_path_and_nccl_first(tmp_path):
    """TE's system branch does not preload cuBLAS or cudart; the run's steps find them anyway."""
    site = tmp_path / "site"
    for lib in ("nccl/lib/libnccl.so.2", "cu13/lib/libcublas.so.13", "cudnn/lib/libcudnn.so.9"):
        (site / "nvidia" / lib).parent.mkdir(parents=True, exist_ok=True)
        (site / "nvidia" / lib).write_bytes(b"")
    (site / "nvidia" / "cu13" / "include").mkdir()  # not a library folder
    env = G.library_env({"LD_LIBRARY_PATH": "/opt/system/lib"}, sites=[str(site)])
    assert env["LD_LIBRARY_PATH"].split(":") == [
        f"{site}/nvidia/nccl/lib",
        "/opt/system/lib",  # a library already on the path still wins, as in TE's order
        f"{site}/nvidia/cu13/lib",
        f"{site}/nvidia/cudnn/lib",
    ]
    assert G.library_env({}, sites=[str(tmp_path / "none")]) == {}


def test_te_gets_pips_cudnn_not_an_older_system_one(tmp_path, monkeypatch):
    """The H200 image has cuDNN 9.14.0 in ``ldconfig``'s cache and 9.19.0 from pip (JAX's): TE
    takes ``libcudnn.so`` from the cache unless ``CUDNN_HOME`` names pip's."""
    listing = (
        "12 libs found in cache\n"
        "\tlibcudnn.so.9 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudnn.so.9\n"
        "\tlibcudnn.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudnn.so\n"
    )
    assert gpu_cuda.ldconfig_library("cudnn", listing) == Path(
        "/usr/lib/x86_64-linux-gnu/libcudnn.so"
    )
    assert gpu_cuda.ldconfig_library("cublas", listing) is None
    site = tmp_path / "site"
    (site / "nvidia" / "cudnn" / "lib").mkdir(parents=True)
    (site / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9").write_bytes(b"")
    home = str(site / "nvidia" / "cudnn")
    assert G.library_env({}, sites=[str(site)])["CUDNN_HOME"] == home
    assert G.library_env({"CUDNN_HOME": "/mine"}, sites=[str(site)])["CUDNN_HOME"] == "/mine"
    assert "CUDNN_HOME" not in G.library_env({}, sites=[str(tmp_path / "none")])
    monkeypatch.delenv("CUDNN_HOME", raising=False)
    assert gpu.preload_te_libraries(sites=[str(site)]) == []
    assert os.environ["CUDNN_HOME"] == home


def test_the_loader_branch_follows_a_system_nvrtc_or_curand(tmp_path):
    site = tmp_path / "site"
    (site / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13").write_bytes(b"")
    toolkit = tmp_path / "cuda" / "lib64"
    toolkit.mkdir(parents=True)
    (toolkit / "libcurand.so.10").write_bytes(b"")
    env = {"CUDA_HOME": str(tmp_path / "cuda")}
    assert G.te_loads_pip_runtime(env, str(site)) is False  # cuRAND from the toolkit
    if not list(Path("/usr/local/cuda").glob("**/lib*nvrtc.so*")) and not list(
        Path("/usr/local/cuda").glob("**/libcurand.so*")
    ):
        assert G.te_loads_pip_runtime({}, str(site)) is True  # pip's only


def test_the_run_orders_its_steps_and_every_command_is_accepted_by_the_real_clis(tmp_path):
    steps = G.run_commands(Path("gpu-bundle"), tmp_path, "python3")
    assert [name for name, _, _ in steps] == [
        "preflight",
        "verify",
        "build",
        "install",
        "gate",
        "bench-single",
        "bench-emulated",
        "check",
    ]
    for name, _, cmd in steps:
        module, args = cmd[2], cmd[3:]
        if module == "tutorial_utils.cli.gpu_setup":
            G.build_parser().parse_args(args)
            continue
        parsed = (
            check_parser() if module == "tutorial_utils.cli.check" else bench_parser()
        ).parse_args(args)
        assert parsed.force is True  # a second run replaces its report and records
        if name.startswith("bench"):
            assert parsed.preset == "seed" and parsed.out == str(tmp_path)
        else:
            assert parsed.quick is True
    emulated = dict((n, c) for n, _, c in steps)["bench-emulated"]
    assert "single,ring,allgather" in emulated  # the speed-up panel needs the single row
    assert dict((n, c) for n, _, c in steps)["build"][-2:] == [
        "--out",
        str(tmp_path),
    ]  # the wheel comes back
    with pytest.raises(ValueError, match=r"steps=\['nope'\]"):
        G.run_commands(Path("gpu-bundle"), tmp_path, steps=["nope"])


#: Seconds only a hang reaches: the limit of the steps below that should finish, and the most a
#: test waits for a process to exit, so that a slow, busy machine never fails a test.
HANG_GUARD_S = 120


def _fake_steps(*pairs):
    return [(name, limit, [sys.executable, "-c", code]) for name, limit, code in pairs]


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie waiting for its parent)."""
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" in status.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_a_killed_step_keeps_its_output_and_the_run_log_is_not_a_record(tmp_path):
    """Output streamed to OUT/gpu-run/<log>.log as it comes; the summary outside the records."""
    steps = [
        ("check", 2, ["sh", "-c", "echo 'started the check'; sleep 60"]),  # prints at once
        *_fake_steps(
            (
                "bench-single",
                HANG_GUARD_S,
                "import os; print('backend', os.environ['TUTORIAL_TE_BACKEND'])",
            )
        ),
    ]
    summary = G.run(Path("gpu-bundle"), tmp_path, steps=steps, log_name="call5")
    assert [s["rc"] for s in summary["steps"]] == ["timeout", 0] and summary["ok"] is False
    log = (tmp_path / "gpu-run" / "call5.log").read_text()
    assert "started the check" in log and "= [check] rc=timeout" in log
    assert "backend te" in log  # check and bench run with TUTORIAL_TE_BACKEND=te
    assert (
        json.loads((tmp_path / "gpu-run" / "call5.json").read_text())["steps"][0]["rc"] == "timeout"
    )
    assert records.read_records(tmp_path) == ([], [])  # nothing in the records folder breaks it
    assert G.run(Path("gpu-bundle"), tmp_path, steps=steps[1:])["ok"] is True  # again, same tree


def test_a_timeout_kills_the_whole_process_group(tmp_path):
    """pip's and g++'s children must not go on into the next step."""
    pid_file = tmp_path / "child.pid"
    step = ["sh", "-c", f"sleep 60 & echo $! > {shlex.quote(str(pid_file))}; wait"]
    with open(tmp_path / "log", "w") as log:
        rc, _ = G.run_step(step, 2, log)
    assert rc == "timeout"
    child = int(pid_file.read_text())
    guard = time.monotonic() + HANG_GUARD_S  # a guard only: the kill has already been sent
    while not _gone(child) and time.monotonic() < guard:
        time.sleep(0.1)
    assert _gone(child), f"the step's child {child} outlived the step's timeout"


def test_a_failed_import_gate_stops_the_run_loudly(tmp_path):
    steps = _fake_steps(
        (
            "gate",
            HANG_GUARD_S,
            "raise SystemExit('import gate: transformer_engine.jax failed to import: x')",
        ),
        ("bench-single", HANG_GUARD_S, "print('RAN-' + 'BENCH')"),
        ("check", HANG_GUARD_S, "print('RAN-' + 'CHECK')"),
    )
    summary = G.run(Path("gpu-bundle"), tmp_path, steps=steps)
    assert summary["ok"] is False and [s["rc"] for s in summary["steps"]] == [1, None, None]
    assert summary["steps"][1]["note"] == "not run: gate failed"
    assert "RAN-" not in (tmp_path / "gpu-run" / "run.log").read_text()


def test_the_import_gate_refuses_a_machine_without_a_gpu():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-m", "tutorial_utils.cli.gpu_setup", "gate"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith("import gate: ")


def test_nccl_is_loaded_from_pip_before_te(tmp_path):
    """libtransformer_engine.so has no RPATH; pip's libnccl.so.2 is loaded first."""
    lib = tmp_path / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    lib.parent.mkdir(parents=True)
    shutil.copy(_ctypes.__file__, lib)  # any real shared library stands in for NCCL
    assert G.nccl_library([str(tmp_path)]) == lib
    assert G.preload_nccl([str(tmp_path)]) == str(lib)
    assert str(lib) in Path("/proc/self/maps").read_text()
    env = G.library_env({"LD_LIBRARY_PATH": "/usr/lib/x"}, sites=[str(tmp_path)])
    assert env["LD_LIBRARY_PATH"] == f"{lib.parent}:/usr/lib/x"
    assert G.preload_nccl([str(tmp_path / "none")]) is None


def test_make_gpu_targets():
    def make_n(target, *extra):
        proc = subprocess.run(
            ["make", "--no-print-directory", "-n", target, *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert (
        make_n("gpu-run", "GPU_OUT=/tmp/out").strip()
        == "PYTHONPATH=src python3 -m tutorial_utils.cli.gpu_setup run --bundle gpu-bundle --out"
        " /tmp/out"
    )
    assert make_n("gpu-check").strip().endswith("--force")  # a second run replaces the report
    setup = make_n("gpu-setup")
    for needle in (
        "build-requirements --cuda",
        "build-includes",
        "NVTE_NO_LOCAL_VERSION=1",
        "--no-build-isolation",
    ):
        assert needle in setup, needle
    assert "cmake" not in setup and "ninja" not in setup
    assert "devtools/gpu_carry.py rehearse" in make_n("gpu-rehearse")
    dry = subprocess.run(
        [
            sys.executable,
            "-m",
            "tutorial_utils.cli.gpu_setup",
            "run",
            "--out",
            "/tmp/out",
            "--dry-run",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert dry.returncode == 0, dry.stderr
    assert [line.split(",")[0] for line in dry.stdout.splitlines()] == [
        "+ [preflight",
        "+ [verify",
        "+ [build",
        "+ [install",
        "+ [gate",
        "+ [bench-single",
        "+ [bench-emulated",
        "+ [check",
    ]


def test_sdist_link_reads_the_simple_index():
    page = (
        '<a href="https://files.example/x/transformer_engine_jax-2.20.1.tar.gz#sha256='
        + "a" * 64
        + '">old</a><a href="https://files.example/y/transformer_engine_jax-2.20.2.tar.gz#sha256='
        + "b" * 64
        + '">new</a>'
    )
    assert G.sdist_link(page, "transformer-engine-jax", "2.20.2") == (
        "https://files.example/y/transformer_engine_jax-2.20.2.tar.gz",
        "b" * 64,
    )
    with pytest.raises(SystemExit, match=r"no transformer-engine-jax 2.20.9 sdist"):
        G.sdist_link(page, "transformer-engine-jax", "2.20.9")


def test_gpu_extras_pin_one_cuda_each_and_leave_te_jax_to_the_no_isolation_build():
    """Finding 11: no jax[cuda12]-only extra, and no transformer-engine[jax] built in isolation."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert "gpu" not in extras
    for major in (12, 13):
        deps = " ".join(extras[f"gpu-cuda{major}"])
        assert f"jax[cuda{major}]" in deps and f"transformer-engine-cu{major}==2.20.2" in deps
        assert "transformer-engine[jax]" not in deps and f"cuda{25 - major}" not in deps


def _te_dir() -> Path:
    """The installed TE's sources, found without importing it (its import refuses a CPU machine)."""
    import importlib.util

    return Path(
        next(iter(importlib.util.find_spec("transformer_engine").submodule_search_locations))
    )


def _gpu_pages() -> str:
    """The GPU pages' text: docs/gpu.md and its appendix, docs/gpu_offline_install.md."""
    return "\n".join(
        (ROOT / "docs" / name).read_text() for name in ("gpu.md", "gpu_offline_install.md")
    )


def test_gpu_page_names_only_environment_variables_that_te_or_this_project_reads():
    """Finding 11: every variable the GPU pages name occurs in the installed TE or in this
    project."""
    text = _gpu_pages()
    names = set(re.findall(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]\b", text))
    assert "NVTE_CUDA_INCLUDE_PATH" not in names  # read by nothing
    assert {"TUTORIAL_TE_BACKEND", "CPLUS_INCLUDE_PATH", "NVTE_FRAMEWORK"} <= names
    corpus = "".join(p.read_text(errors="replace") for p in _te_dir().rglob("*.py"))
    corpus += (
        "".join(p.read_text() for p in (ROOT / "src").rglob("*.py"))
        + (ROOT / "Makefile").read_text()
    )
    missing = sorted(n for n in names if n not in corpus)
    assert not missing, f"the GPU pages name variables nothing reads: {missing}"


def test_gpu_page_covers_both_cudas_both_pythons_and_cudnn_headers():
    text = _gpu_pages()
    for needle in (
        "CUDA 12",
        "CUDA 13",
        "Python 3.11",
        "Python 3.12",
        "cudnn.h",
        "nvtx3/",
        "nvidia-cudnn-frontend",
        "setuptools",
        "libcurand",
        "NVTE_NO_LOCAL_VERSION=1",
        "--python-version 3.11",
        "--cuda 12",
        "pip's `nvcc` wins over a system\ntoolkit unless `CUDA_HOME` is set",
    ):
        assert needle in text, needle
    for gone in ("cmake", "ninja", "64 MiB", "carry plan", "carry-plan", "gpu-carry"):
        assert gone not in text, (
            gone
        )  # nothing uses the first two; the rest is contributors' (devtools/README.md)


def test_gpu_page_states_the_step_limits_the_code_uses():
    text = (ROOT / "docs" / "gpu_offline_install.md").read_text()
    stated = {
        name: int(sec)
        for name, sec in re.findall(r"^\| `([a-z-]+)` \| (\d+) s \|", text, flags=re.M)
    }
    assert stated == G.STEP_SECONDS


def test_the_facade_loads_tes_libraries_before_importing_real_te(monkeypatch):
    """``tutorial_utils.te`` loads NCCL and TE's CUDA runtime first, then imports TE."""
    import importlib

    from tutorial_utils.te import _backend

    order = []
    monkeypatch.setattr(_backend, "preload_te_libraries", lambda *a, **k: order.append("nccl"))
    monkeypatch.setattr(importlib, "import_module", lambda name: order.append(name) or name)
    assert _backend._import_real_te() == "transformer_engine.jax"
    assert order == ["nccl", "transformer_engine.jax"]


def test_preload_te_libraries_loads_pips_cuda_runtime_when_the_loader_path_lacks_it(tmp_path):
    """TE's system-toolkit loader branch preloads nothing from pip: the preload does it, and
    takes the loader path's copy first. Stand-in libraries built with the system compiler."""
    import ctypes
    import shutil as _shutil
    import subprocess as _sp

    from tutorial_utils import gpu as GPU

    cc = _shutil.which("cc") or _shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build stand-in libraries")
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    src = tmp_path / "empty.c"
    src.write_text("int tutorial_stand_in(void) { return 0; }\n")
    names = ["libnccl.so.2", "libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13"]
    for name in names:
        _sp.run(
            [cc, "-shared", "-fPIC", f"-Wl,-soname,{name}", "-o", str(lib / name), str(src)],
            check=True,
        )

    def on_loader_path(name):
        try:
            ctypes.CDLL(name)
        except OSError:
            return False
        return True

    # NCCL always from pip; the others from pip unless this machine's loader path has them
    want = [str(lib / names[0])] + [str(lib / n) for n in names[1:] if not on_loader_path(n)]
    loaded = GPU.preload_te_libraries([str(tmp_path)])
    assert loaded == want, loaded
    assert GPU.preload_te_libraries([str(tmp_path / "none")]) == []
