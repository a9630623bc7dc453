"""Build and install TransformerEngine's JAX extension on a GPU node, online or offline.

TE's JAX extension is an sdist compiled on the node against the JAX already there, with
headers from five packages, and TE's import then loads cuDNN, NVRTC, cuRAND and NCCL in an
order of its own. Each thing that goes wrong by hand is a subcommand here that can be
checked on a CPU: ``cuda``, ``cudnn``, ``cudnn-include``, ``bundle`` (the files of an offline
install), ``preflight``, ``build-ext``, ``install``, ``gate`` and ``run`` (all of them, each
step under a time limit, with a log).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

from tutorial_utils.gpu import _nvidia_dirs, _site_dirs, nccl_library, preload_nccl

__all__ = [
    "TE_VERSION",
    "MIN_CUDNN",
    "Requirement",
    "bundle_requirements",
    "cuda_major",
    "jax_cuda_majors",
    "te_nvcc",
    "te_library",
    "cudnn_version",
    "check_cudnn",
    "cudnn_include_dir",
    "nvtx_include_dir",
    "build_includes",
    "nccl_library",
    "preload_nccl",
    "library_env",
    "verify_wheel_record",
    "wheel_version",
    "bundle",
    "verify_bundle",
    "verify_bundle_entry",
    "preflight",
    "build_command",
    "build_extension",
    "install_commands",
    "install",
    "import_gate",
    "STEP_SECONDS",
    "run_commands",
    "run_step",
    "run",
    "main",
]

TE_VERSION = "2.20.2"
MIN_CUDNN = (9, 12, 0)  # transformer_engine/common/__init__.py refuses older runtimes
MANIFEST = "manifest.json"
BASE, CORE, EXTRA, BUILT, BUILD_ENV = "base", "core", "extra", "built", "build-env"


# ----------------------------------------------------------------------------- what an install need


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One pinned file of an offline install.

    ``use`` says when it is installed: ``te`` (TE's own three packages, always), ``build``
    (into the bundle's build environment, before the extension is compiled), ``runtime``
    (into the node's Python, unless that distribution is already there) or ``library``
    (a CUDA library TE loads at import, installed only when TE's loader would not find
    ``library`` on the node).
    """

    name: str
    version: str
    binary: bool  # a platform wheel: downloaded for the node's Python and platform
    use: str
    library: str | None = None

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"


#: The pins of an offline install beyond the node's JAX and Flax, per CUDA major. The pure
#: Python ones are the versions this project's CPU environment runs with, so that pydantic
#: and pydantic-core (an exact pin of pydantic's) match by construction.
_SHARED = [
    # the build: TE's setup.py imports setuptools and pybind11, and writes a wheel
    ("setuptools", "84.2.1", False, "build"),
    ("wheel", "0.48.0", False, "build"),
    ("pybind11", "3.1.0", False, "build"),
    (
        "nvidia-cudnn-frontend",
        "1.32.0",
        True,
        "build",
    ),  # build_tools/utils.py: cudnn_frontend_include_path()
    # TE's Python at run time
    ("packaging", "26.4", False, "runtime"),  # transformer_engine/jax imports it
    ("pydantic", "2.14.4", False, "runtime"),
    ("pydantic-core", "2.50.5", True, "runtime"),  # pydantic 2.14.4 requires exactly this
    ("annotated-types", "0.8.0", False, "runtime"),
    ("typing-inspection", "0.4.5", False, "runtime"),
    ("typing-extensions", "4.16.0", False, "runtime"),  # pydantic 2.14.4 requires >= 4.16.0
]
_BY_CUDA = {
    # common/common.h includes <nvtx3/nvToolsExt.h>; no wheel of jax[cudaNN] ships it
    13: [
        ("nvidia-nvtx", "13.5.25", True, "build"),
        ("nvidia-curand", "10.4.5.25", True, "library"),
    ],
    12: [
        ("nvidia-nvtx-cu12", "12.9.79", True, "build"),
        ("nvidia-curand-cu12", "10.3.9.90", True, "library"),
    ],
}


def bundle_requirements(cuda: int) -> list[Requirement]:
    """Every file an offline install for CUDA ``cuda`` needs, beyond the node's JAX and Flax.

    Args:
        cuda: the CUDA major of the node's JAX, 12 or 13.

    Returns:
        Pinned requirements: TE's Python wheel, its CUDA core wheel and the extension's sdist
        (``use="te"``), then the build, runtime and library wheels.

    Raises:
        ValueError: ``cuda`` is not 12 or 13.
    """
    if cuda not in (12, 13):
        raise ValueError(f"cuda={cuda!r}: use 12 or 13 (the CUDA major of the node's JAX).")
    te = [
        Requirement("transformer-engine", TE_VERSION, False, "te"),
        Requirement(
            f"transformer-engine-cu{cuda}", TE_VERSION, True, "te"
        ),  # the 276 MB core library
        Requirement("transformer-engine-jax", TE_VERSION, False, "te"),
    ]  # the extension: an sdist
    rest = [
        Requirement(n, v, b, use, library="curand" if use == "library" else None)
        for n, v, b, use in _SHARED + _BY_CUDA[cuda]
    ]
    return te + rest


# ----------------------------------------------------------------------------- CUDA, as TE finds it


def jax_cuda_majors() -> list[int]:
    """CUDA majors of the JAX CUDA plugins installed here (looked up without importing JAX)."""
    import importlib.util

    majors = []
    for major in (12, 13):
        for name in (f"jax_cuda{major}_plugin", f"jax_plugins.xla_cuda{major}"):
            try:
                if importlib.util.find_spec(name) is not None:
                    majors.append(major)
                    break
            except (ModuleNotFoundError, ValueError):
                pass
    return majors


def _jax_runtime_major() -> int | None:
    """The CUDA runtime JAX loaded, as TE's setup.py asks it (``jax._src.lib.cuda_versions``)."""
    try:
        from jax._src import lib

        return int(lib.cuda_versions.cuda_runtime_get_version()) // 1000
    except Exception:  # noqa: BLE001 - no CUDA JAX, or an internal API that moved
        return None


def te_nvcc(env: dict[str, str] | None = None, path: Sequence[str] | None = None) -> Path | None:
    """The ``nvcc`` TE's build picks, in TE's order (``build_tools/utils.py: nvcc_path``).

    ``$CUDA_HOME/bin/nvcc``, then pip's (``nvidia/bin`` or ``nvidia/cuNN/bin`` on the Python
    path, newest CUDA first), then ``nvidia-cuda-nvcc``'s files, then the ``PATH``, then
    ``/usr/local/cuda``. Why it matters: TE takes its CUDA include folder from this ``nvcc``,
    so pip's wins over a system toolkit unless ``CUDA_HOME`` is set.
    """
    env = os.environ if env is None else env
    candidates = []
    if env.get("CUDA_HOME"):
        candidates.append(Path(env["CUDA_HOME"]) / "bin" / "nvcc")
    for entry in sys.path if path is None else path:
        nv = Path(entry or ".") / "nvidia"
        if nv.is_dir():
            versions = sorted(
                (d for d in nv.iterdir() if d.is_dir() and re.fullmatch(r"cu\d+", d.name)),
                key=lambda d: int(d.name[2:]),
                reverse=True,
            )
            candidates += [root / "bin" / "nvcc" for root in [nv, *versions]]
    try:
        from importlib.metadata import distribution

        dist = distribution("nvidia-cuda-nvcc")
        candidates += [
            Path(dist.locate_file(f))
            for f in dist.files or []
            if f.name == "nvcc" and f.parent.name == "bin"
        ]
    except Exception:  # noqa: BLE001 - not installed
        pass
    which = shutil.which("nvcc", path=env.get("PATH"))
    candidates += ([Path(which)] if which else []) + [Path("/usr/local/cuda/bin/nvcc")]
    return next((c.resolve() for c in candidates if c.is_file()), None)


def _release(nvcc: Path | None) -> int | None:
    if nvcc is None:
        return None
    try:
        out = subprocess.run(
            [str(nvcc), "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release (\d+)\.", out)
    return int(match.group(1)) if match else None


def cuda_major(nvcc_output: str | None = None, jax_majors: Sequence[int] | None = None) -> int:
    """The CUDA major version to build TE for: ``CUDA_MAJOR``, else JAX's CUDA, else ``nvcc``.

    Why JAX first: TE's extension picks its core wheel (``transformer_engine_cu12`` or
    ``_cu13``) from the CUDA runtime of the installed JAX, and compiles against the headers of
    the ``nvcc`` it finds (:func:`te_nvcc`); when the two disagree this stops and says how to
    fix it.

    Args:
        nvcc_output: what ``nvcc --version`` printed (looked up the way TE does when ``None``).
        jax_majors: the CUDA majors of the JAX plugins (looked up when ``None``).

    Raises:
        SystemExit: ``CUDA_MAJOR`` is not 12 or 13, JAX and ``nvcc`` disagree, or neither is found.
    """
    env = os.environ.get("CUDA_MAJOR", "").strip()
    if env:
        if env not in ("12", "13"):
            raise SystemExit(f"CUDA_MAJOR={env!r}: use 12 or 13.")
        return int(env)
    majors = sorted(set(jax_cuda_majors() if jax_majors is None else jax_majors))
    if len(majors) > 1:
        runtime = _jax_runtime_major()
        if runtime not in majors:
            raise SystemExit(
                f"JAX CUDA plugins for CUDA {' and '.join(map(str, majors))} are both installed and"
                " JAX's runtime could not be asked which one it loads; uninstall one (pip"
                " uninstall jax-cuda12-plugin or jax-cuda13-plugin) or set CUDA_MAJOR=12|13."
            )
        majors = [runtime]
    if nvcc_output is None:
        nvcc = _release(te_nvcc())
    else:
        match = re.search(r"release (\d+)\.", nvcc_output)
        nvcc = int(match.group(1)) if match else None
    nvcc = nvcc if nvcc in (12, 13) else None
    if majors:
        if nvcc is not None and nvcc != majors[0]:
            raise SystemExit(
                f"nvcc is CUDA {nvcc} but JAX uses CUDA {majors[0]}: TE's extension would be"
                f" compiled against CUDA {nvcc}'s headers and load"
                f" transformer_engine_cu{majors[0]}. Set CUDA_HOME to a CUDA {majors[0]} toolkit"
                f" (TE takes CUDA_HOME's nvcc first), or install jax[cuda{nvcc}], or set CUDA_MAJOR"
                " to the one you mean."
            )
        return majors[0]
    if nvcc is not None:
        return nvcc
    raise SystemExit(
        "cannot tell the CUDA major version: no JAX CUDA plugin and no nvcc where TE looks; set "
        "CUDA_MAJOR=12 or CUDA_MAJOR=13."
    )


def _system_roots(name: str, env: dict[str, str]) -> list[str]:
    keys = (f"{name.upper()}_HOME", f"{name.upper()}_PATH", "CUDA_HOME", "CUDA_PATH")
    return [env[k] for k in keys if env.get(k)] + ["/usr/local/cuda"]


def te_library(
    name: str, env: dict[str, str] | None = None, purelib: str | None = None
) -> tuple[str, Path] | None:
    """Where TE's import would load ``lib<name>`` from: ``(how, path)``, or ``None``.

    TE's own order (``transformer_engine/common/__init__.py``): the system first (``<NAME>_HOME``,
    ``<NAME>_PATH``, ``CUDA_HOME``, ``CUDA_PATH``, ``/usr/local/cuda``, searched recursively, no
    stubs, the highest file name first; then ``lib<name>.so`` on the loader path), then pip's
    wheels in this Python's ``purelib`` only (``nvidia/cu13/<name>/lib``, ``nvidia/cu13/lib``,
    ``nvidia/<name>/lib``, ``nvidia/cuda_<name>/lib``). A library installed elsewhere on
    ``sys.path`` is not found by TE.

    Args:
        name: the library's name without ``lib`` and ``.so``: ``cudnn``, ``nvrtc``, ``curand``.
        env: the environment TE would see (``os.environ`` when ``None``).
        purelib: the site-packages TE searches (this Python's when ``None``).
    """
    env = dict(os.environ if env is None else env)
    for root in _system_roots(name, env):
        libs = [p for p in glob.glob(f"{root}/**/lib{name}.so*", recursive=True) if "stub" not in p]
        if libs:
            return "system", Path(sorted(libs, key=os.path.basename, reverse=True)[0])
    for folder in [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]:
        if (Path(folder) / f"lib{name}.so").exists():
            return "loader path", Path(folder) / f"lib{name}.so"
    nv = Path(purelib or sysconfig.get_path("purelib")) / "nvidia"
    for pattern in (
        f"cu13/{name}/lib/lib*.so.*[0-9]",
        f"cu13/lib/lib{name}*.so.*[0-9]",
        f"{name}/lib/lib*.so.*[0-9]",
        f"cuda_{name}/lib/lib*.so.*[0-9]",
    ):
        found = sorted(nv.glob(pattern))
        if found:
            main = [p for p in found if p.name.startswith(f"lib{name}.so")]
            return "pip", (main or found)[0]
    return None


def _decode(v: int) -> tuple[int, int, int]:
    major_mag = 1000 if v < 90000 else 10000
    major, rest = divmod(v, major_mag)
    return (major, *divmod(rest, 100))


def cudnn_version(found: tuple[str, Path] | None = None) -> tuple[tuple[int, int, int], str] | None:
    """``((major, minor, patch), path)`` of the cuDNN TE would load (:func:`te_library`), or
    ``None``."""
    found = te_library("cudnn") if found is None else found
    if found is None:
        return None
    lib = found[1]
    if not lib.name.startswith("libcudnn.so"):
        lib = next(iter(sorted(lib.parent.glob("libcudnn.so*"), reverse=True)), lib)
    try:
        fn = ctypes.CDLL(str(lib)).cudnnGetVersion
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_size_t
    return _decode(int(fn())), str(lib)


class _LookUp:
    """The default of :func:`check_cudnn`'s ``found``: look the runtime up."""

    def __repr__(self) -> str:
        return "<looked up>"


_LOOK = _LookUp()


def check_cudnn(found=_LOOK, minimum: tuple[int, int, int] = MIN_CUDNN) -> str:
    """A line naming the cuDNN TE would load; ``SystemExit`` when it is missing or older than
    ``minimum``.

    Args:
        found: what :func:`cudnn_version` returns (looked up when not given; ``None`` = none).
        minimum: the oldest runtime accepted (TE 2.20.2's).
    """
    found = cudnn_version() if found is _LOOK else found
    need = ".".join(map(str, minimum))
    if found is None:
        raise SystemExit(
            "cuDNN not found where TE looks (CUDA_HOME, /usr/local/cuda, the loader path, then "
            f"site-packages/nvidia); TransformerEngine {TE_VERSION} needs cuDNN >= {need}. Install "
            "nvidia-cudnn-cu12 or -cu13."
        )
    version, where = found
    text = ".".join(map(str, version))
    if tuple(version) < minimum:
        raise SystemExit(
            f"cuDNN {text} ({where}) < {need}: TransformerEngine {TE_VERSION} refuses to import on"
            " it. Upgrade cuDNN (pip install -U nvidia-cudnn-cu12 or -cu13), or point CUDNN_HOME"
            " at a newer one: TE loads a system cuDNN before pip's."
        )
    return f"cuDNN {text} ({where}) >= {need}: ok"


def cudnn_include_dir(sites: Sequence[str] | None = None) -> Path:
    """The folder holding ``cudnn.h``: pip's cuDNN first, then the CUDA toolkit and the system.

    Why: TE's build adds the include folders of CUDA, NCCL, cudnn-frontend and XLA only, while
    its ``extensions.h`` includes ``cudnn.h``; pip's cuDNN keeps it in
    ``site-packages/nvidia/cudnn/include``. The build gets it through ``CPLUS_INCLUDE_PATH``.
    """
    candidates = []
    for nv in _nvidia_dirs(sites):
        candidates += [nv / "cudnn" / "include", nv / "cu13" / "include", nv / "cu12" / "include"]
    if sites is None:
        cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
        candidates += [
            Path(cuda_home) / "include",
            Path("/usr/include"),
            Path("/usr/include/x86_64-linux-gnu"),
        ]
    for folder in candidates:
        if (folder / "cudnn.h").is_file():
            return folder
    raise SystemExit(
        "cudnn.h not found (looked in site-packages/nvidia/cudnn/include, $CUDA_HOME/include and"
        " /usr/include): TE's JAX extension includes it. Install cuDNN's headers, e.g. `pip install"
        " nvidia-cudnn-cu13` (or -cu12), which puts them in site-packages/nvidia/cudnn/include."
    )


def nvtx_include_dir(roots: Sequence[Path]) -> Path | None:
    """The ``include`` folder that holds ``nvtx3/nvToolsExt.h`` under any of ``roots``, or ``None``.

    Why: TE's ``common/nvtx.h`` includes ``<nvtx3/nvToolsExt.h>``, TE adds only the include
    folder of the ``nvcc`` it picks, and pip's CUDA (what ``jax[cudaNN]`` installs) has no
    ``nvtx3``: ``nvidia-nvtx`` supplies it, through ``CPLUS_INCLUDE_PATH``.
    """
    for root in roots:
        for header in sorted(Path(root).glob("**/include/nvtx3/nvToolsExt.h")):
            return header.parent.parent
    return None


def build_includes(build_env: Path | None = None, sites: Sequence[str] | None = None) -> str:
    """``CPLUS_INCLUDE_PATH`` for TE's build: the folders of ``cudnn.h`` and of the ``nvtx3``
    headers.

    Args:
        build_env: a folder of build wheels installed with ``pip --target``, searched first.
        sites: the site-packages folders to search (this Python's when ``None``).
    """
    roots = ([Path(build_env)] if build_env else []) + [Path(s) for s in (sites or _site_dirs())]
    nvtx = nvtx_include_dir(roots)
    return os.pathsep.join([str(cudnn_include_dir(sites))] + ([str(nvtx)] if nvtx else []))


def library_env(
    env: dict[str, str] | None = None, sites: Sequence[str] | None = None
) -> dict[str, str]:
    """``env`` with pip's NCCL folder first on ``LD_LIBRARY_PATH``, so a child process loads TE."""
    env = dict(os.environ if env is None else env)
    lib = nccl_library(sites)
    if lib is not None:
        parts = [str(lib.parent)] + [
            p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p
        ]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


# ----------------------------------------------------------------------------- files and checksums


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _record_hash(data: bytes) -> str:
    import base64

    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def verify_wheel_record(wheel: Path) -> int:
    """Check every member of ``wheel`` against the hashes in its ``RECORD``; return how many
    matched."""
    import csv
    import io

    with zipfile.ZipFile(wheel) as z:
        record_name = next((n for n in z.namelist() if n.endswith(".dist-info/RECORD")), None)
        if record_name is None:
            raise SystemExit(f"{wheel}: no .dist-info/RECORD, not a wheel.")
        count = 0
        for row in csv.reader(io.StringIO(z.read(record_name).decode())):
            if len(row) < 2 or not row[1]:
                continue
            if _record_hash(z.read(row[0])) != row[1]:
                raise SystemExit(f"{wheel}: {row[0]} differs from the wheel's RECORD.")
            count += 1
    return count


def wheel_version(wheel: Path) -> str:
    """The ``Version:`` in a wheel's ``METADATA``."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        match = re.search(r"^Version: (\S+)$", z.read(meta).decode(errors="replace"), flags=re.M)
    return match.group(1) if match else "?"


def _manifest(directory: Path) -> dict:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise SystemExit(
            f"{path} not found: run `python -m tutorial_utils.cli.gpu_setup bundle {directory}` on"
            " a machine with a package index and copy the folder here."
        )
    return json.loads(path.read_text())


def verify_bundle_entry(directory: Path, entry: dict) -> None:
    """Check one file of the bundle against its manifest entry; ``SystemExit`` names it if missing
    or corrupted."""
    path = Path(directory) / entry["name"]
    if not path.is_file():
        raise SystemExit(f"{path}: missing; copy the bundle again.")
    if path.stat().st_size != entry["bytes"] or _sha256(path) != entry["sha256"]:
        raise SystemExit(
            f"{path}: SHA-256 differs from the manifest (corrupted copy); copy it again."
        )


def verify_bundle(directory: Path) -> list[str]:
    """Check every file of the bundle against its manifest; return their names.

    Raises ``SystemExit`` naming the first missing or corrupted file.
    """
    entries = _manifest(directory)["files"]
    for entry in entries:
        verify_bundle_entry(directory, entry)
    return [e["name"] for e in entries]


def _entries(directory: Path, use: str | None = None) -> list[dict]:
    return [e for e in _manifest(directory)["files"] if use is None or e.get("use") == use]


# ----------------------------------------------------------------------------- the bundle

SIMPLE_INDEX = "https://pypi.org/simple"
#: The wheel platforms of a Linux x86_64 node with glibc >= 2.28; pip matches each tag exactly.
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)


def _platform_args() -> list[str]:
    return [arg for tag in PLATFORMS for arg in ("--platform", tag)]


def sdist_link(index_html: str, project: str, version: str) -> tuple[str, str]:
    """``(url, sha256)`` of ``project``'s ``version`` sdist in a PEP 503 simple-index page."""
    stem = re.escape(project.replace("-", "_"))
    match = re.search(
        rf'href="([^"]*/{stem}-{re.escape(version)}\.tar\.gz)#sha256=([0-9a-f]{{64}})"', index_html
    )
    if not match:
        raise SystemExit(f"no {project} {version} sdist in the index page; check the version.")
    return match.group(1), match.group(2)


def _fetch_sdist(project: str, version: str, directory: Path) -> Path:
    """Download an sdist as a file (``pip download`` would try to build it, which needs CUDA)."""
    import urllib.request

    with urllib.request.urlopen(f"{SIMPLE_INDEX}/{project}/", timeout=120) as r:
        url, digest = sdist_link(r.read().decode(), project, version)
    target = directory / url.rsplit("/", 1)[1]
    print(f"+ fetch {url}", flush=True)
    with urllib.request.urlopen(url, timeout=600) as r:
        target.write_bytes(r.read())
    if _sha256(target) != digest:
        target.unlink()
        raise SystemExit(f"{target.name}: SHA-256 differs from the index's; download again.")
    return target


def _folder(req: Requirement) -> str:
    if req.name.startswith("transformer-engine-cu"):
        return CORE
    return EXTRA if req.use == "library" else BASE


def _prepare_folder(directory: Path, clean: bool) -> None:
    if directory.exists() and any(directory.iterdir()):
        if not clean:
            raise SystemExit(
                f"{directory} is not empty: bundling into it would pick up stale files. Pass"
                " --clean to empty it (only a folder holding a bundle's manifest.json), or choose"
                " an empty folder."
            )
        if not (directory / MANIFEST).is_file():
            raise SystemExit(
                f"{directory} holds no {MANIFEST}: --clean empties only a bundle's folder; choose"
                " another."
            )
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)


def bundle(
    directory: Path,
    cuda: int,
    python_version: str = "3.12",
    dry_run: bool = False,
    clean: bool = False,
) -> list[list[str]]:
    """Download every file of an offline install for a Linux x86_64 node and write the manifest.

    Args:
        directory: an empty folder (or one holding an earlier bundle, with ``clean``).
        cuda: the CUDA major of the node's JAX.
        python_version: the node's Python, ``3.11`` or ``3.12`` (platform wheels are chosen for it).
        dry_run: return the download commands without running them.
        clean: empty ``directory`` first (refused unless it holds a bundle's manifest).

    Returns:
        The download commands, in order.
    """
    directory = Path(directory)
    reqs = bundle_requirements(cuda)
    commands = []
    for req in reqs:
        if req.name == "transformer-engine-jax":
            commands.append(["fetch-sdist", req.name, req.version])
            continue
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--dest",
            str(directory / _folder(req)),
            req.spec,
        ]
        if req.binary:
            cmd += ["--only-binary=:all:", "--python-version", python_version, *_platform_args()]
        commands.append(cmd)
    if dry_run:
        return commands
    _prepare_folder(directory, clean)
    for cmd in commands:
        if cmd[0] == "fetch-sdist":
            (directory / BASE).mkdir(exist_ok=True)
            _fetch_sdist(cmd[1], cmd[2], directory / BASE)
        else:
            _run(cmd)
    write_manifest(directory, cuda, python_version, reqs)
    return commands


def _requirement_of(path: Path, reqs: Sequence[Requirement]) -> Requirement:
    project = path.name.lower().split("-")[
        0
    ]  # a wheel's or sdist's file name starts with "<project>-"
    for req in reqs:
        if project == req.name.replace("-", "_"):
            return req
    raise SystemExit(f"{path}: not a file of the bundle's requirements.")


def write_manifest(
    directory: Path, cuda: int, python_version: str, reqs: Sequence[Requirement] | None = None
) -> dict:
    """Write ``manifest.json``: every file's name, size, SHA-256, use, and (for wheels) checked
    RECORD."""
    directory = Path(directory)
    reqs = bundle_requirements(cuda) if reqs is None else reqs
    files = []
    for path in sorted(
        p for sub in (BASE, CORE, EXTRA) for p in (directory / sub).glob("*") if p.is_file()
    ):
        req = _requirement_of(path, reqs)
        if path.suffix == ".whl" and req.use in (
            "te",
            "library",
        ):  # the large ones, carried in pieces
            verify_wheel_record(path)
        files.append(
            {
                "name": path.relative_to(directory).as_posix(),
                "bytes": path.stat().st_size,
                "sha256": _sha256(path),
                "use": req.use,
                "library": req.library,
            }
        )
    manifest = {
        "schema": "gpu-bundle/3",
        "te_version": TE_VERSION,
        "cuda": cuda,
        "python_version": python_version,
        "files": files,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


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
    return any(Path(e["name"]).name.lower().startswith(prefix) for e in _entries(directory))


def preflight(directory: Path) -> list[str]:
    """Check the node against the bundle before anything is built: every tool, header and library
    TE's build and TE's import look for, in TE's own search order.

    Returns one line per check. Raises ``SystemExit`` listing every problem found (not only the
    first), each with its fix.
    """
    directory = Path(directory)
    manifest = _manifest(directory)
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
        carried = [e for e in _entries(directory, "library") if e.get("library") == name]
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
    import importlib.util

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
    wheels = [directory / e["name"] for e in _entries(directory, "build")]
    stamp = target / ".installed.json"
    want = sorted(w.name for w in wheels)
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        return target
    shutil.rmtree(target, ignore_errors=True)
    _run(
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
        directory / e["name"] for e in _entries(directory, "te") if e["name"].endswith(".tar.gz")
    ]
    if len(sdists) != 1:
        raise SystemExit(
            "expected one transformer_engine_jax sdist in the bundle, found"
            f" {[s.name for s in sdists]}."
        )
    sdist = sdists[0]
    built, stamp = directory / BUILT, directory / BUILT / "built.json"
    digest = _sha256(sdist) if sdist.is_file() else "?"
    wheel = None
    if stamp.is_file():
        info = json.loads(stamp.read_text())
        kept = built / info.get("wheel", "-")
        if (
            info.get("sdist_sha256") == digest
            and kept.is_file()
            and _sha256(kept) == info.get("sha256")
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
                _shell(cmd[:2] + ["<setup.py bdist_wheel with ParallelCompile>"] + cmd[3:]),
                flush=True,
            )
            return built
        build_env = _install_build_env(directory, python)
        cmd, env = build_command(src, built, jobs, python, cuda_archs, build_env=build_env)
        print(
            "+",
            _shell(cmd[:2] + ["<setup.py bdist_wheel with ParallelCompile>"] + cmd[3:]),
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
                    "sha256": _sha256(wheel),
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


def _installed(project: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(project)
    except PackageNotFoundError:
        return None


def install_commands(directory: Path, python: str | None = None) -> list[list[str]]:
    """The offline install, ``--no-index --no-deps``: TE's three packages (the core wheel, the
    Python
    wheel and the built extension) always; a runtime wheel only when its project is not installed
    yet; a library wheel only when TE's loader would not find that library (:func:`te_library`).
    This package is not installed: ``PYTHONPATH=src`` serves it."""
    python = sys.executable if python is None else python  # this Python, at call time
    directory = Path(directory)
    built = sorted((directory / BUILT).glob("transformer_engine_jax-*.whl"))
    if len(built) != 1:
        raise SystemExit(
            f"expected one built transformer_engine_jax wheel in {directory / BUILT}, found "
            f"{[b.name for b in built]}: run the build step first."
        )
    wheels = [
        directory / e["name"] for e in _entries(directory, "te") if e["name"].endswith(".whl")
    ] + built
    for entry in _entries(directory, "runtime"):
        project = Path(entry["name"]).name.split("-")[0].replace("_", "-")
        if _installed(project) is None:
            wheels.append(directory / entry["name"])
        else:
            print(f"+ {project} {_installed(project)} already installed: kept", flush=True)
    for entry in _entries(directory, "library"):
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
        print("+", _shell(cmd), flush=True)
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
        import transformer_engine.jax  # noqa: F401
        import transformer_engine_jax
    except Exception as err:  # noqa: BLE001 - TE raises many kinds when CUDA, cuDNN or NCCL are missing
        raise SystemExit(
            f"import gate: transformer_engine.jax failed to import: {type(err).__name__}: {err}"
        ) from err
    versions = {
        p: _installed(p)
        for p in (
            "transformer-engine",
            f"transformer-engine-cu{cuda_major()}",
            "transformer-engine-jax",
        )
    }
    if set(versions.values()) != {TE_VERSION}:
        raise SystemExit(f"import gate: TE's packages are not all {TE_VERSION}: {versions}")
    cudnn = ".".join(map(str, _decode(int(transformer_engine_jax.get_cudnn_version()))))
    line = (
        f"TE {TE_VERSION} imported (extension, core and Python agree), cuDNN {cudnn}, NCCL {nccl}"
    )
    import jax

    devices = jax.devices()
    if not any(d.platform == "gpu" for d in devices):
        raise SystemExit(
            f"import gate: {line}; but JAX sees no GPU ({devices}): check the driver (nvidia-smi)."
        )
    from tutorial_utils import te

    if te.backend_kind() != "te":
        raise SystemExit(f"import gate: the facade chose {te.backend_name()!r}, not real TE.")
    return (
        f"import gate: ok: {line}; {te.backend_name()} on {devices[0].device_kind}, JAX"
        f" {jax.__version__}"
    )


# ----------------------------------------------------------------------------- the run

#: ``(name, seconds allowed)`` of every step, in the order a run takes them: the benchmarks,
#: which are the point of the run, before the check.
STEP_SECONDS = {
    "preflight": 20,
    "verify": 5,
    "build": 150,
    "install": 45,
    "gate": 30,
    "bench-single": 75,
    "bench-emulated": 120,
    "check": 60,
}
#: Steps whose failure makes the rest meaningless: the run stops there.
STOPPING = ("preflight", "verify", "build", "install", "gate")


def run_commands(
    bundle_dir: Path, out: Path, python: str | None = None, steps: Sequence[str] | None = None
) -> list[tuple[str, int, list[str]]]:
    """``(name, seconds, command)`` of ``steps`` (all of :data:`STEP_SECONDS` when ``None``).

    Every command can run again in the same tree: the build is kept, and ``--force``
    replaces the previous check report and records.
    """
    python = sys.executable if python is None else python  # this Python, at call time
    bundle_dir, out = Path(bundle_dir), Path(out)
    me = [python, "-m", "tutorial_utils.cli.gpu_setup"]
    bench = [
        python,
        "-m",
        "tutorial_utils.cli.bench",
        "--preset",
        "seed",
        "--windows",
        "8192",
        "--out",
        str(out),
        "--no-progress",
        "--force",
    ]
    every = {
        "preflight": me + ["preflight", str(bundle_dir)],
        "verify": me + ["verify", str(bundle_dir)],
        "build": me + ["build-ext", str(bundle_dir), "--out", str(out)],
        "install": me + ["install", str(bundle_dir)],
        "gate": me + ["gate"],
        "bench-single": bench + ["--strategies", "single", "--name", "gpu-seed-single"],
        "bench-emulated": (
            bench
            + [
                "--emulate-ranks",
                "4",
                "--strategies",
                "single,ring,allgather",
                "--stripes",
                "512",
                "--name",
                "gpu-seed-emulated-4",
            ]
        ),
        "check": [
            python,
            "-m",
            "tutorial_utils.cli.check",
            "--quick",
            "--out",
            str(out / "checks" / "gpu-check.json"),
            "--force",
        ],
    }
    names = list(STEP_SECONDS) if steps is None else list(steps)
    unknown = [n for n in names if n not in every]
    if unknown:
        raise ValueError(f"steps={unknown}: choose from {list(every)}.")
    return [(name, STEP_SECONDS[name], every[name]) for name in names]


def run_step(
    cmd: Sequence[str], limit: float, log, env: dict[str, str] | None = None
) -> tuple[object, float]:
    """Run ``cmd`` in its own process group, its output appended to the open file ``log`` as it
    comes.

    On timeout the whole group is killed (pip's and the compiler's children too), so nothing
    from this step goes on into the next. Returns ``(returncode or "timeout", seconds)``.
    """
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        rc = "timeout"
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=5)
                time.sleep(0.2)  # let the group's other members take the signal too
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything of the group still alive
        except ProcessLookupError:
            pass
    return rc, round(time.perf_counter() - start, 1)


def run(
    bundle_dir: Path,
    out: Path,
    *,
    dry_run: bool = False,
    python: str | None = None,
    steps: list[tuple[str, int, list[str]]] | None = None,
    log_name: str = "run",
) -> dict:
    """Run ``steps`` (every step of :func:`run_commands` when ``None``), each under its limit.

    Each step's output is streamed to ``out/gpu-run/<log_name>.log`` and the summary rewritten to
    ``out/gpu-run/<log_name>.json`` before and after each step, so a killed run still leaves both
    (a subfolder: every ``*.json`` directly in ``out`` must be a ``cp-bench/1`` record). A failed
    preflight, verify, build, install or import gate stops the run; the benchmarks and the check
    run with ``TUTORIAL_TE_BACKEND=te``, so they fail rather than fall back to the reference.
    """
    python = sys.executable if python is None else python  # this Python, at call time
    out, bundle_dir = Path(out), Path(bundle_dir)
    steps = run_commands(bundle_dir, out, python) if steps is None else steps
    summary = {"limit_s": sum(limit for _, limit, _ in steps), "steps": []}
    if dry_run:
        for name, limit, cmd in steps:
            print(f"+ [{name}, <= {limit} s]", _shell(cmd))
        return summary
    folder = out / "gpu-run"
    folder.mkdir(parents=True, exist_ok=True)
    env = library_env()
    env["TUTORIAL_TE_BACKEND"] = "te"
    env["PYTHONUNBUFFERED"] = "1"
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(
        [src] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    stopped = None
    with open(folder / f"{log_name}.log", "w") as log:
        for name, limit, cmd in steps:
            entry = {"name": name, "limit_s": limit, "command": _shell(cmd)}
            if stopped:
                summary["steps"].append({**entry, "rc": None, "note": f"not run: {stopped} failed"})
                continue
            summary["steps"].append({**entry, "rc": "running"})
            (folder / f"{log_name}.json").write_text(json.dumps(summary, indent=2))
            line = f"+ [{name}, <= {limit} s] {_shell(cmd)}"
            print(line, flush=True)
            log.write(line + "\n")
            log.flush()
            rc, seconds = run_step(cmd, limit, log, env)
            log.write(f"= [{name}] rc={rc} in {seconds} s\n")
            log.flush()
            print(f"= [{name}] rc={rc} in {seconds} s", flush=True)
            summary["steps"][-1].update(rc=rc, seconds=seconds)
            if rc != 0 and name in STOPPING:
                stopped = name
                print(
                    f"!! {name} failed: the run stops here; see {folder / (log_name + '.log')}",
                    flush=True,
                )
            (folder / f"{log_name}.json").write_text(json.dumps(summary, indent=2))
    summary["ok"] = all(s["rc"] == 0 for s in summary["steps"])
    (folder / f"{log_name}.json").write_text(json.dumps(summary, indent=2))
    with open(folder / f"{log_name}.log") as f:
        print(f.read()[-6000:], flush=True)
    return summary


def _shell(cmd: Sequence[str]) -> str:
    return " ".join(shlex.quote(str(c)) for c in cmd)


def _run(cmd: list[str]) -> None:
    print("+", _shell(cmd), flush=True)
    subprocess.run(cmd, check=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tutorial_utils.cli.gpu_setup", description=__doc__.split("\n\n")[0]
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser(
        "cudnn", help="print the cuDNN runtime TE would load; exit 1 if missing or < 9.12.0"
    )
    sub.add_parser("cuda", help="print the CUDA major version TE will be built for (JAX's)")
    sub.add_parser("cudnn-include", help="print the folder holding cudnn.h")
    sub.add_parser(
        "build-includes",
        help="print CPLUS_INCLUDE_PATH for TE's build: cudnn.h's and nvtx3's folders",
    )
    br = sub.add_parser(
        "build-requirements", help="print the pinned packages TE's build needs (for pip install)"
    )
    br.add_argument("--cuda", type=int, choices=(12, 13), required=True)
    b = sub.add_parser("bundle", help="download every file of an offline install into DIR")
    b.add_argument("dir", type=Path)
    b.add_argument("--cuda", type=int, choices=(12, 13), default=13)
    b.add_argument("--python-version", default="3.12", choices=("3.11", "3.12"))
    b.add_argument(
        "--clean", action="store_true", help="empty DIR first (only if it holds a bundle)"
    )
    b.add_argument("--dry-run", action="store_true")
    for name, helptext in (
        ("verify", "check every file of a bundle against its manifest"),
        ("preflight", "check the node against the bundle, in TE's own search order"),
        ("build-ext", "build TE's JAX extension wheel into DIR/built"),
        ("install", "install a bundle offline"),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("dir", type=Path)
        if name in ("install", "build-ext"):
            s.add_argument("--dry-run", action="store_true")
        if name == "build-ext":
            s.add_argument(
                "--jobs",
                type=int,
                default=None,
                help="C++ files compiled at once (default: every core)",
            )
            s.add_argument("--cuda-archs", default="90", help="NVTE_CUDA_ARCHS (90 = Hopper)")
            s.add_argument(
                "--out",
                type=Path,
                default=None,
                help="also copy the wheel and its stamp to OUT/gpu-run/",
            )
    sub.add_parser(
        "gate",
        help="import TE and its extension, then require a GPU; exit 1 with the reason otherwise",
    )
    r = sub.add_parser(
        "run", help="every step: preflight, verify, build, install, gate, benchmarks, check"
    )
    r.add_argument("--bundle", type=Path, default=Path("gpu-bundle"))
    r.add_argument("--out", type=Path, default=Path("results"))
    r.add_argument("--dry-run", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "cudnn":
        print(check_cudnn())
    elif args.cmd == "cuda":
        print(cuda_major())
    elif args.cmd == "cudnn-include":
        print(cudnn_include_dir())
    elif args.cmd == "build-includes":
        print(build_includes())
    elif args.cmd == "build-requirements":
        print(" ".join(r.spec for r in bundle_requirements(args.cuda) if r.use == "build"))
    elif args.cmd == "bundle":
        for cmd in bundle(
            args.dir, args.cuda, args.python_version, dry_run=args.dry_run, clean=args.clean
        ):
            if args.dry_run:
                print("+", _shell(cmd))
    elif args.cmd == "verify":
        print(f"verified {len(verify_bundle(args.dir))} files against {args.dir / MANIFEST}")
    elif args.cmd == "preflight":
        print("\n".join(preflight(args.dir)))
    elif args.cmd == "build-ext":
        print(
            build_extension(
                args.dir,
                jobs=args.jobs,
                cuda_archs=args.cuda_archs,
                out=args.out,
                dry_run=args.dry_run,
            )
        )
    elif args.cmd == "install":
        install(args.dir, dry_run=args.dry_run)
    elif args.cmd == "gate":
        print(import_gate())
    else:
        summary = run(args.bundle, args.out, dry_run=args.dry_run)
        return 0 if args.dry_run or summary.get("ok") else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
