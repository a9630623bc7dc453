"""CUDA, cuDNN and the libraries TE loads, found on the node the way TE's build and import find
them.

TE's build takes its CUDA headers from the ``nvcc`` it picks (:func:`te_nvcc`), and TE's import
loads cuDNN, NVRTC and cuRAND in an order of its own (:func:`te_library`): a system copy before
pip's. Which of TE's two loader branches a node takes decides whether TE preloads cuBLAS and
cudart itself (:func:`te_loads_pip_runtime`); :func:`library_env` makes both branches work and
:func:`check_core_libraries` proves it before TE is imported. Everything here is looked up
without importing TE, which is not installed yet, or JAX, which may lack its CUDA plugin; the
one exception, :func:`cuda_major` asking JAX's runtime which CUDA it loads when two JAX CUDA
plugins are installed, imports JAX inside a function for that reason.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path

from tutorial_utils.cli.gpu_bundle import MIN_CUDNN, TE_VERSION
from tutorial_utils.gpu import _nvidia_dirs, _site_dirs, default_cudnn_home, nccl_library

__all__ = [
    "jax_cuda_majors",
    "te_nvcc",
    "cuda_major",
    "te_library",
    "decode_cudnn_version",
    "cudnn_version",
    "check_cudnn",
    "cudnn_include_dir",
    "nvtx_include_dir",
    "build_includes",
    "CORE_LIBRARIES",
    "pip_library_dirs",
    "library_env",
    "te_loads_pip_runtime",
    "loaded_path",
    "check_core_libraries",
    "installed_version",
]

#: What ``libtransformer_engine.so`` needs at load (``DT_NEEDED``; it has no RUNPATH) beyond
#: NCCL: cuBLAS, cuBLASLt and the CUDA runtime, each by its soname ``lib<name>.so.<major>``.
CORE_LIBRARIES = ("cublas", "cublasLt", "cudart")


def jax_cuda_majors() -> list[int]:
    """CUDA majors of the JAX CUDA plugins installed here (looked up without importing JAX)."""
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
    stubs, the highest file name first; then ``lib<name>.so`` on ``LD_LIBRARY_PATH`` or in
    ``ldconfig``'s cache), then pip's
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
    if (cached := ldconfig_library(name)) is not None:
        return "loader path", cached
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


@functools.lru_cache(maxsize=1)
def _ldconfig_listing() -> str:
    """``ldconfig -p``'s output, read once per process ("" where it cannot run)."""
    tool = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        return subprocess.run(
            [tool, "-p"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def ldconfig_library(name: str, listing: str | None = None) -> Path | None:
    """``lib<name>.so`` (unversioned, as TE asks for it) in the loader's cache, or ``None``.

    Args:
        name: the library's name without ``lib`` and ``.so``.
        listing: ``ldconfig -p``'s output (run when ``None``).
    """
    for line in (_ldconfig_listing() if listing is None else listing).splitlines():
        soname, _, path = line.strip().partition(" => ")
        if soname.split(" ")[0] == f"lib{name}.so" and path:
            return Path(path.strip())
    return None


def decode_cudnn_version(v: int) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of the number ``cudnnGetVersion`` returns.

    Args:
        v: the number, with the major in its thousands before cuDNN 9 and in its ten
            thousands from cuDNN 9 on; then the minor times 100 and the patch.
    """
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
    return decode_cudnn_version(int(fn())), str(lib)


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


def pip_library_dirs(sites: Sequence[str] | None = None) -> list[Path]:
    """The folders of pip's CUDA libraries: ``nvidia/<name>/lib`` and ``nvidia/cuNN/lib``.

    Args:
        sites: the site-packages folders to search (this Python's and ``sys.path`` when
            ``None``).
    """
    found = []
    for nv in _nvidia_dirs(sites):
        for lib in sorted(nv.glob("*/lib")):
            if lib.is_dir() and any(lib.glob("lib*.so*")):
                found.append(lib)
    return found


def library_env(
    env: dict[str, str] | None = None, sites: Sequence[str] | None = None
) -> dict[str, str]:
    """``env`` with pip's NCCL folder first on ``LD_LIBRARY_PATH`` and pip's other CUDA library
    folders after the entries already there, so that a child process loads TE on either of
    TE's loader branches.

    Why both: ``libtransformer_engine.so`` needs NCCL, cuBLAS, cuBLASLt and cudart and has no
    RUNPATH. TE preloads cuBLAS and cudart from pip only when it finds neither NVRTC nor cuRAND
    in a system toolkit (:func:`te_loads_pip_runtime`); on a node with a system ``nvcc`` and
    NVRTC (``CUDA_HOME``, ``/usr/local/cuda``) it does not, and the core library then fails
    with ``libcublas.so.13: cannot open shared object file``. The folders already on the path
    stay first, so a system copy still wins, as in TE's own order. ``CUDNN_HOME``, unless set,
    names pip's cuDNN (:func:`~tutorial_utils.gpu.default_cudnn_home`): TE takes a system cuDNN
    before pip's, and an H200 image's 9.14.0 made TE disable every windowed kernel.

    Args:
        env: the environment to extend (``os.environ`` when ``None``; not modified).
        sites: the site-packages folders to search (this Python's when ``None``).
    """
    env = dict(os.environ if env is None else env)
    default_cudnn_home(env, sites)
    nccl = nccl_library(sites)
    first = [str(nccl.parent)] if nccl is not None else []
    there = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    parts = first + there + [str(d) for d in pip_library_dirs(sites)]
    if parts:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


def te_loads_pip_runtime(env: dict[str, str] | None = None, purelib: str | None = None) -> bool:
    """Whether TE's import preloads cuBLAS, cudart and cuDNN from pip itself (its
    ``load_libs_for_no_ctk``): only when neither NVRTC nor cuRAND comes from a system toolkit
    or the loader path (:func:`te_library`).

    Args:
        env: the environment TE would see (``os.environ`` when ``None``).
        purelib: the site-packages TE searches (this Python's when ``None``).
    """
    found = [te_library(name, env=env, purelib=purelib) for name in ("nvrtc", "curand")]
    return not any(f is not None and f[0] != "pip" for f in found)


def loaded_path(soname: str) -> str | None:
    """The file this process has loaded for ``soname`` (read from ``/proc/self/maps``), or
    ``None``.

    Args:
        soname: a library's soname, such as ``libcublas.so.13``.
    """
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    stem = soname.split(".so")[0] + ".so"
    paths = {line.split()[-1] for line in maps.splitlines() if "/" in line}
    return next(
        (p for p in sorted(paths) if os.path.basename(p).startswith(stem + ".")),
        next((p for p in sorted(paths) if os.path.basename(p) == stem), None),
    )


def check_core_libraries(major: int, purelib: str | None = None) -> list[str]:
    """Load cuBLAS, cuBLASLt and cudart (:data:`CORE_LIBRARIES`) by soname, as the dynamic linker
    will for ``libtransformer_engine.so``; one line each.

    A library the loader path lacks is still fine on TE's pip branch when pip has it (TE then
    preloads it by its full path).

    Args:
        major: the CUDA major (the sonames end in ``.so.<major>``).
        purelib: the site-packages TE searches (this Python's when ``None``).

    Raises:
        SystemExit: naming each library that TE's core library would not find, and the fix.
    """
    lines, missing = [], []
    pip_branch = te_loads_pip_runtime(purelib=purelib)
    nv = Path(purelib or sysconfig.get_path("purelib")) / "nvidia"
    for name in CORE_LIBRARIES:
        soname = f"lib{name}.so.{major}"
        try:
            ctypes.CDLL(soname)
            lines.append(f"{soname}: {loaded_path(soname) or 'loaded'}")
            continue
        except OSError as err:
            reason = str(err)
        pip = sorted(nv.glob(f"cu{major}/lib/{soname}*")) + sorted(nv.glob(f"*/lib/{soname}*"))
        if pip_branch and pip:
            lines.append(f"{soname}: {pip[0]} (TE preloads it from pip: no system NVRTC/cuRAND)")
        else:
            missing.append(f"{soname} ({reason})")
    if missing:
        fix = (
            "install pip's nvidia-cublas and nvidia-cuda-runtime (jax[cudaNN] brings them)"
            if pip_branch
            else "TE finds NVRTC or cuRAND in a system toolkit here, so it does not preload cuBLAS"
            " or cudart from pip: put pip's library folders on the loader path, `export"
            " LD_LIBRARY_PATH=$(python -m tutorial_utils.cli.gpu_setup library-path)` (`gpu_setup"
            " run` does this for its steps)"
        )
        raise SystemExit(f"TE's core library would not load: {'; '.join(missing)}. Fix: {fix}.")
    return lines


def installed_version(project: str) -> str | None:
    """The installed version of the distribution ``project``, or ``None`` when it is not installed.

    Args:
        project: a distribution name, such as ``transformer-engine-jax``.
    """
    try:
        return version(project)
    except PackageNotFoundError:
        return None
