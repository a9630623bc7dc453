"""The offline install on a GPU node: preflight, TE's extension build, the install, the import gate.

Each is a subcommand of ``python -m tutorial_utils.cli.gpu_setup`` and a step of its ``run``.
Nothing here imports JAX or TE at the top: TE is installed by these very steps, and a JAX that
does not import is one of the problems the preflight reports. Two imports are inside functions
for that reason: the preflight asks JAX for its FFI headers, and the import gate imports TE
(through :mod:`tutorial_utils.cli._gpu_gate`) only after it has chosen real TE and loaded
pip's NCCL, reporting a failed import as its own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

from tutorial_utils.cli.gpu_bundle import (
    BUILD_ENV,
    BUILT,
    TE_VERSION,
    file_sha256,
    manifest_entries,
    read_manifest,
    run_echoed,
    shell_line,
    wheel_version,
)
from tutorial_utils.cli.gpu_cuda import (
    build_includes,
    check_core_libraries,
    check_cudnn,
    cuda_major,
    cudnn_include_dir,
    installed_version,
    nvtx_include_dir,
    te_library,
    te_loads_pip_runtime,
    te_nvcc,
)
from tutorial_utils.gpu import nccl_library, preload_nccl

__all__ = [
    "preflight",
    "build_command",
    "build_extension",
    "version_satisfies",
    "install_commands",
    "install",
    "import_gate",
]


# ----------------------------------------------------------------------------- preflight


_RUN_MODULES = (
    "numpy",
    "flax",
    "jax",
)  # what TE's JAX code and the run's steps import beyond the bundle


def _externally_managed() -> bool:
    in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    return not in_venv and (Path(sysconfig.get_path("stdlib")) / "EXTERNALLY-MANAGED").is_file()


def _compiler() -> str | None:
    cxx = os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "g++"
    return shutil.which(shlex.split(cxx)[0]) if cxx else None


def _bundle_has(directory: Path, prefix: str) -> bool:
    return any(Path(e["name"]).name.lower().startswith(prefix) for e in manifest_entries(directory))


def preflight(directory: Path) -> list[str]:
    """Check the node against the bundle before anything is built: every tool, header and library
    TE's build and TE's import look for, in TE's own search order.

    Returns one line per check. Raises ``SystemExit`` listing every problem found (not only the
    first), each with its fix.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    lines, problems = [f"python {sys.version.split()[0]} ({sys.executable})"], []

    def need(ok: bool, line: str, problem: str) -> None:
        (lines if ok else problems).append(line if ok else problem)

    want = manifest.get("python_version")
    need(
        not want or sys.version_info[:2] == tuple(int(x) for x in want.split(".")),
        f"bundle for Python {want}: ok",
        f"the bundle is for Python {want}, this is {sys.version.split()[0]}: make it with"
        f" --python-version {sys.version_info[0]}.{sys.version_info[1]}.",
    )
    need(
        not _externally_managed(),
        "pip may install into this Python (no PEP 668 marker, or a venv)",
        f"{sys.executable} is an externally managed Python (PEP 668): create a venv that keeps its"
        " packages, `python3 -m venv --system-site-packages .venv`, and run with"
        " .venv/bin/python.",
    )
    include = Path(sysconfig.get_paths()["include"])
    need(
        (include / "Python.h").is_file(),
        f"Python.h in {include}",
        f"Python.h is missing from {include}: install the Python headers (e.g. apt install"
        " python3-dev).",
    )
    cxx = _compiler()
    need(cxx is not None, f"C++ compiler {cxx}", "no C++ compiler (g++ or $CXX): install g++.")
    try:
        major = cuda_major()
        need(
            major == manifest.get("cuda"),
            f"CUDA {major} (JAX's)",
            f"JAX here uses CUDA {major}, the bundle is for CUDA {manifest.get('cuda')}: make it"
            f" with --cuda {major}.",
        )
    except SystemExit as err:
        problems.append(str(err))
    nvcc = te_nvcc()
    cuda_include = nvcc.parent.parent / "include" if nvcc else None
    need(
        cuda_include is not None and (cuda_include / "cuda_runtime.h").is_file(),
        f"nvcc TE picks: {nvcc} (headers in {cuda_include})",
        f"no nvcc with CUDA headers where TE looks (found {nvcc}): install"
        f" jax[cuda{manifest.get('cuda')}] (pip's nvcc) or set CUDA_HOME to a toolkit.",
    )
    for label, fn in (("cudnn.h", cudnn_include_dir), ("cuDNN runtime", check_cudnn)):
        try:
            lines.append(f"{label}: {fn()}")
        except SystemExit as err:
            problems.append(str(err))
    nccl = nccl_library()
    need(
        nccl is not None and (nccl.parent.parent / "include" / "nccl.h").is_file(),
        f"NCCL {nccl}",
        "pip's NCCL (libnccl.so.2 and nccl.h in site-packages/nvidia/nccl) is missing: install"
        " nvidia-nccl-cu12 or -cu13 (jax[cudaNN] brings it).",
    )
    node_nvtx = nvtx_include_dir([cuda_include]) if cuda_include else None
    need(
        node_nvtx is not None or _bundle_has(directory, "nvidia_nvtx"),
        f"nvtx3 headers: {node_nvtx or 'from the bundle (nvidia-nvtx)'}",
        "no nvtx3/nvToolsExt.h on the node or in the bundle: make the bundle again (it carries"
        " nvidia-nvtx).",
    )
    need(
        _bundle_has(directory, "nvidia_cudnn_frontend"),
        "cudnn-frontend: from the bundle",
        "the bundle has no nvidia-cudnn-frontend wheel; TE's build needs it: make the bundle"
        " again.",
    )
    try:
        from jax import ffi

        header = Path(ffi.include_dir()) / "xla" / "ffi" / "api" / "ffi.h"
        need(
            header.is_file(),
            f"XLA FFI headers in {header.parent}",
            f"{header} is missing: reinstall jaxlib.",
        )
    except ImportError as err:
        problems.append(f"JAX does not import ({err}): install jax[cuda{manifest.get('cuda')}].")
    for name in ("nvrtc", "curand"):  # loaded like cuDNN: the system first, then pip's
        found = te_library(name)
        carried = [e for e in manifest_entries(directory, "library") if e.get("library") == name]
        if found:
            lines.append(f"lib{name}: {found[1]} ({found[0]})")
        elif carried:
            lines.append(
                f"lib{name}: NOT on the node; the install step installs"
                f" {Path(carried[0]['name']).name} (carried in {Path(carried[0]['name']).parent}/)"
            )
        else:
            problems.append(
                f"lib{name} is not where TE's import looks for it (CUDA_HOME, /usr/local/cuda, the"
                f" loader path, site-packages/nvidia): install it (pip's nvidia-{name} wheel for"
                f" CUDA {manifest.get('cuda')})."
            )
    pip_branch = te_loads_pip_runtime()
    lines.append(
        "TE's loader branch: "
        + (
            "no system NVRTC/cuRAND, so TE preloads cuBLAS, cudart and cuDNN from pip"
            if pip_branch
            else "NVRTC or cuRAND from a system toolkit, so TE does not preload cuBLAS or cudart:"
            " its core library finds them on the loader path"
        )
    )
    try:
        lines += check_core_libraries(int(manifest.get("cuda") or 13))
    except SystemExit as err:
        problems.append(str(err))
    for module in _RUN_MODULES:
        need(
            importlib.util.find_spec(module) is not None,
            f"import {module}: ok",
            f"Python module {module!r} is missing: TE's JAX code or the run imports it;"
            " install it.",
        )
    if problems:
        raise SystemExit("preflight failed:\n" + "\n".join(f"  - {p}" for p in problems))
    return lines


# ----------------------------------------------------------------------------- build


_SETUP_PY = """\
import os, runpy, sys
src, dest, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
import setuptools  # before pybind11, so distutils is setuptools' own
from pybind11.setup_helpers import ParallelCompile
ParallelCompile("NVTE_BUILD_MAX_JOBS", default=jobs).install()
os.chdir(src)
sys.path.insert(0, src)
sys.argv = ["setup.py", "bdist_wheel", "--dist-dir", dest]
runpy.run_path("setup.py", run_name="__main__")
"""


def build_command(
    src: Path,
    dest: Path,
    jobs: int,
    python: str | None = None,
    cuda_archs: str = "90",
    sites: Sequence[str] | None = None,
    build_env: Path | None = None,
    env: dict[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """``(command, environment)`` that builds TE's JAX extension wheel from the unpacked sdist
    ``src``.

    The sdist's ``setup.py`` runs unchanged, inside pybind11's ``ParallelCompile`` (``jobs`` C++
    files at once). The environment puts ``build_env`` (the bundle's build wheels: setuptools,
    wheel, pybind11, cudnn-frontend, nvtx) first on ``PYTHONPATH``, and ``cudnn.h`` and the
    ``nvtx3`` headers on ``CPLUS_INCLUDE_PATH``; it selects JAX and Hopper
    (``NVTE_FRAMEWORK``, ``NVTE_CUDA_ARCHS``) and sets ``NVTE_NO_LOCAL_VERSION=1``: built in
    a git checkout, TE would otherwise version the wheel ``2.20.2+<commit>``, and its import
    asserts that all its packages share one version.
    """
    python = sys.executable if python is None else python  # this Python, at call time
    env = dict(os.environ if env is None else env)
    env["CPLUS_INCLUDE_PATH"] = os.pathsep.join(
        dict.fromkeys(
            build_includes(build_env, sites).split(os.pathsep)
            + [p for p in env.get("CPLUS_INCLUDE_PATH", "").split(os.pathsep) if p]
        )
    )
    if build_env is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(build_env)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
    env.update(
        NVTE_FRAMEWORK="jax",
        NVTE_CUDA_ARCHS=cuda_archs,
        NVTE_BUILD_MAX_JOBS=str(jobs),
        NVTE_NO_LOCAL_VERSION="1",
    )
    return [python, "-c", _SETUP_PY, str(src), str(dest), str(jobs)], env


def _install_build_env(directory: Path, python: str) -> Path:
    """Install the bundle's build wheels into ``DIR/build-env`` (``pip --target``), once.

    Why a folder of its own: the node's Python keeps its own setuptools and pybind11; the build
    sees the pinned ones through ``PYTHONPATH`` only.
    """
    target = directory / BUILD_ENV
    wheels = [directory / e["name"] for e in manifest_entries(directory, "build")]
    stamp = target / ".installed.json"
    want = sorted(w.name for w in wheels)
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        return target
    shutil.rmtree(target, ignore_errors=True)
    run_echoed(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--target",
            str(target),
            *map(str, wheels),
        ]
    )
    stamp.write_text(json.dumps(want))
    return target


def build_extension(
    directory: Path,
    *,
    jobs: int | None = None,
    python: str | None = None,
    cuda_archs: str = "90",
    out: Path | None = None,
    dry_run: bool = False,
) -> Path:
    """Build the extension wheel into ``DIR/built/`` from the bundle's sdist.

    The bundle's build wheels are installed into ``DIR/build-env`` first. A wheel already built
    from the same sdist (same SHA-256, with its ``built.json``) is kept, so the step can be run
    again and a wheel brought back from an earlier run is not built twice. The wheel's version
    must be exactly TE's; with ``out``, the wheel and its stamp are copied to ``out/gpu-run/``.

    Raises:
        SystemExit: the build failed, or left no wheel, or a wheel of another version.
    """
    python = sys.executable if python is None else python  # this Python, at call time
    directory = Path(directory).resolve()  # the build runs in the unpacked sdist's folder
    sdists = [
        directory / e["name"]
        for e in manifest_entries(directory, "te")
        if e["name"].endswith(".tar.gz")
    ]
    if len(sdists) != 1:
        raise SystemExit(
            "expected one transformer_engine_jax sdist in the bundle, found"
            f" {[s.name for s in sdists]}."
        )
    sdist = sdists[0]
    built, stamp = directory / BUILT, directory / BUILT / "built.json"
    digest = file_sha256(sdist) if sdist.is_file() else "?"
    wheel = None
    if stamp.is_file():
        info = json.loads(stamp.read_text())
        kept = built / info.get("wheel", "-")
        if (
            info.get("sdist_sha256") == digest
            and kept.is_file()
            and file_sha256(kept) == info.get("sha256")
        ):
            print(f"+ {kept.name} already built from this sdist: kept", flush=True)
            wheel = kept
    if wheel is None:
        work = directory / "build"
        jobs = jobs or os.cpu_count() or 1
        src = work / sdist.name[: -len(".tar.gz")]
        if dry_run:
            cmd, _ = build_command(
                src, built, jobs, python, cuda_archs, build_env=directory / BUILD_ENV
            )
            print(
                "+",
                shell_line(cmd[:2] + ["<setup.py bdist_wheel with ParallelCompile>"] + cmd[3:]),
                flush=True,
            )
            return built
        build_env = _install_build_env(directory, python)
        cmd, env = build_command(src, built, jobs, python, cuda_archs, build_env=build_env)
        print(
            "+",
            shell_line(cmd[:2] + ["<setup.py bdist_wheel with ParallelCompile>"] + cmd[3:]),
            flush=True,
        )
        for folder in (work, built):
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(work)
        start = time.perf_counter()
        subprocess.run(cmd, env=env, check=True)
        wheels = sorted(built.glob("transformer_engine_jax-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(
                f"the build left {[w.name for w in wheels]} in {built}, expected one wheel."
            )
        wheel = wheels[0]
        version = wheel_version(wheel)
        if version != TE_VERSION:
            raise SystemExit(
                f"the built wheel {wheel.name} has version {version}, not {TE_VERSION}: TE's import"
                " would refuse it (its packages must share one version). Build with"
                " NVTE_NO_LOCAL_VERSION=1."
            )
        stamp.write_text(
            json.dumps(
                {
                    "wheel": wheel.name,
                    "version": version,
                    "sha256": file_sha256(wheel),
                    "sdist_sha256": digest,
                    "jobs": jobs,
                    "seconds": round(time.perf_counter() - start, 1),
                },
                indent=2,
            )
        )
    if out is not None:
        dest = Path(out) / "gpu-run"
        dest.mkdir(parents=True, exist_ok=True)
        for path in (wheel, stamp):
            shutil.copy2(path, dest / path.name)
        print(
            f"+ {wheel.name} and built.json copied to {dest}: carry them in {built}/ to skip the"
            " build next time",
            flush=True,
        )
    return wheel


# ----------------------------------------------------------------------------- install and gate


_RELEASE = re.compile(r"\d+(?:\.\d+)*")


def _release(text: str) -> tuple[int, ...]:
    """The release numbers of a version (``4.16.0rc1`` -> ``(4, 16, 0)``)."""
    match = _RELEASE.match(text.strip().lstrip("vV"))
    return tuple(int(x) for x in match.group(0).split(".")) if match else (0,)


def _padded(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    n = max(len(a), len(b))
    return a + (0,) * (n - len(a)), b + (0,) * (n - len(b))


def version_satisfies(version: str, specifier: str) -> bool:
    """Whether ``version`` meets every clause of ``specifier`` (``>=4.16.0``, ``==2.50.5,<3``).

    Release numbers only (PEP 440's ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``~=`` and
    ``==X.*``); pre- and post-release tags are ignored. Why not ``packaging``: the install may
    be what brings it to the node.

    Args:
        version: an installed version.
        specifier: the clauses, comma-separated (empty: any version).
    """
    have = _release(version)
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        op, want = re.match(r"(~=|===|==|!=|<=|>=|<|>)?\s*(.*)", clause).groups()
        op = op or "=="
        a, b = _padded(have, _release(want.removesuffix(".*")))
        if want.endswith(".*") or op == "~=":  # a prefix match (``~=`` also at least the version)
            prefix = _release(want[:-2]) if want.endswith(".*") else _release(want)[:-1]
            same = have[: len(prefix)] == prefix and (op != "~=" or a >= b)
            if same != (op != "!="):
                return False
            continue
        ok = {
            "==": a == b,
            "===": a == b,
            "!=": a != b,
            "<": a < b,
            "<=": a <= b,
            ">": a > b,
            ">=": a >= b,
        }[op]
        if not ok:
            return False
    return True


def _project(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requires(wheel: Path) -> list[tuple[str, str, str]]:
    """``(project, specifier, requirer)`` of a wheel's ``Requires-Dist`` lines, extras left out
    (other markers are not evaluated: such a requirement counts)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode(errors="replace")
    found = []
    for line in re.findall(r"^Requires-Dist: (.+)$", text, flags=re.M):
        requirement, _, marker = line.partition(";")
        if "extra" in marker:
            continue
        match = re.match(
            r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*\(?([^)]*)\)?", requirement
        )
        if match:
            found.append((_project(match.group(1)), match.group(2).strip(), wheel.name))
    return found


def install_commands(directory: Path, python: str | None = None) -> list[list[str]]:
    """The offline install, ``--no-index --no-deps``: TE's three packages (the core wheel, the
    Python wheel and the built extension) always; a runtime wheel when its project is not
    installed, or is installed at a version that a wheel being installed does not accept (then
    the bundle's version replaces it); a library wheel only when TE's loader would not find that
    library (:func:`te_library`). This package is not installed: ``PYTHONPATH=src`` serves it.

    Raises:
        SystemExit: no built extension wheel, or a requirement that neither the installed
            version nor the bundle's meets.
    """
    python = sys.executable if python is None else python  # this Python, at call time
    directory = Path(directory)
    built = sorted((directory / BUILT).glob("transformer_engine_jax-*.whl"))
    if len(built) != 1:
        raise SystemExit(
            f"expected one built transformer_engine_jax wheel in {directory / BUILT}, found "
            f"{[b.name for b in built]}: run the build step first."
        )
    wheels = [
        directory / e["name"]
        for e in manifest_entries(directory, "te")
        if e["name"].endswith(".whl")
    ] + built
    runtime = {
        _project(Path(e["name"]).name.split("-")[0]): directory / e["name"]
        for e in manifest_entries(directory, "runtime")
    }
    chosen: dict[str, str] = {}  # project -> why its wheel is installed
    while True:  # a wheel chosen may require more of the others
        needs = [r for w in wheels + [runtime[p] for p in chosen] for r in _requires(w)]
        new = {}
        for project in runtime:
            have = installed_version(project)
            if project in chosen:
                continue
            if have is None:
                new[project] = "not installed"
                continue
            unmet = [
                f"{by} needs {spec}"
                for p, spec, by in needs
                if p == project and not version_satisfies(have, spec)
            ]
            if unmet:
                new[project] = f"{have} installed, but {'; '.join(unmet)}"
        if not new:
            break
        chosen.update(new)
    for project, wheel in runtime.items():
        have = installed_version(project)
        if project not in chosen:
            print(f"+ {project} {have} already installed and accepted: kept", flush=True)
            continue
        if have is not None:
            print(f"+ {project} {chosen[project]}: installing {wheel.name}", flush=True)
        mine = wheel_version(wheel)
        unmet = [
            f"{by} needs {project}{spec}"
            for p, spec, by in needs
            if p == project and not version_satisfies(mine, spec)
        ]
        if unmet:
            raise SystemExit(
                f"the bundle's {wheel.name} does not meet {'; '.join(unmet)}: make the bundle"
                " again with matching pins."
            )
        wheels.append(wheel)
    for entry in manifest_entries(directory, "library"):
        if te_library(entry["library"]) is None:
            wheels.append(directory / entry["name"])
    return [
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-deps",
            "--no-cache-dir",
            *map(str, wheels),
        ]
    ]


def install(
    directory: Path, *, dry_run: bool = False, python: str | None = None
) -> list[list[str]]:
    """Install the bundle offline (:func:`install_commands`); with ``dry_run``, only print the
    commands."""
    python = sys.executable if python is None else python  # this Python, at call time
    commands = install_commands(directory, python)
    for cmd in commands:
        print("+", shell_line(cmd), flush=True)
        if not dry_run:
            subprocess.run(cmd, check=True)
    return commands


def import_gate() -> str:
    """Load NCCL, import TE's JAX API and its extension, check their version and cuDNN, then require
    a GPU in JAX and real TE in this package's facade.

    TE is imported before JAX is asked for devices, so that a machine without a driver fails
    at TE's own loading (``libcuda.so.1``), the first thing a driver is needed for. Returns a
    line naming what was loaded; raises ``SystemExit`` with the reason otherwise, so that a run
    never goes on to time the reference.
    """
    os.environ["TUTORIAL_TE_BACKEND"] = "te"
    nccl = preload_nccl()
    try:
        from tutorial_utils.cli import _gpu_gate
    except Exception as err:  # noqa: BLE001 - TE raises many kinds when CUDA, cuDNN or NCCL are missing
        raise SystemExit(
            f"import gate: transformer_engine.jax failed to import: {type(err).__name__}: {err}"
        ) from err
    return _gpu_gate.check_loaded_te(nccl)
