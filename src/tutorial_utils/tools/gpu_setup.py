"""Install TransformerEngine for JAX on a GPU node, online or from carried files, and run it.

Why: TE's JAX extension is an sdist compiled against the JAX that is already installed, it
needs cuDNN >= 9.12, cuDNN's and cudnn-frontend's headers, and its CUDA core wheel is 276 MB.
GPU nodes often come with JAX and CUDA preinstalled and no package index, and a lent machine
may take only 64 MiB per call, keep files only while it stays warm and run a command for at
most 600 s. Each thing that goes wrong by hand is a step here that can be checked on a CPU:

* ``cudnn`` / ``cuda``: the cuDNN runtime (refused below 9.12.0) and the CUDA major version TE
  is built for, taken from JAX's CUDA (what TE's own build uses), never from ``nvcc`` alone;
* ``bundle DIR --cuda 13``: download every file the offline install needs (pinned), repack the
  core wheel with xz and cut it into pieces that fit one call, with SHA-256 in ``manifest.json``;
* ``carry-plan``: the calls that carry the bundle to such a machine, with sizes and commands
  (``--dry-run`` plays them on this machine: pieces, sizes, checksums, reassembly, pip);
* ``run [--call K]``: the steps of one call (or all of them), each under its own time limit,
  its output streamed to ``OUT/gpu-run/run.log`` as it runs, the whole process group killed
  on a timeout, an import gate that stops the run loudly, and ``check``/``bench`` forced onto
  real TE (``TUTORIAL_TE_BACKEND=te``). Everything can be run again in the same tree.

Every command line is printed before it runs; ``--dry-run`` prints them and runs nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import hashlib
import json
import lzma
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..gpu import _nvidia_dirs, _site_dirs, nccl_library, preload_nccl

__all__ = ["MIN_CUDNN", "TE_VERSION", "CALL_BYTES", "CALL_SECONDS", "PINS", "cudnn_version", "check_cudnn",
           "cuda_major", "jax_cuda_majors", "cudnn_include_dir", "nccl_library", "preload_nccl", "library_env",
           "split_file", "join_pieces", "pack", "repack_wheel", "verify_wheel_record", "bundle_requirements", "bundle",
           "sdist_link", "working_tree_bytes", "carry_plan", "install_commands", "build_command", "build_extension",
           "import_gate", "call_steps", "run_commands", "run_step", "run", "main"]

TE_VERSION = "2.20.2"
MIN_CUDNN = (9, 12, 0)  # transformer_engine/common/__init__.py refuses older runtimes
MANIFEST = "manifest.json"
CALL_BYTES = 64 * 2**20  # what one call to the lent machine may carry, working tree included
CALL_SECONDS = 540  # each call's steps sum to at most this; one command may run 600 s
MARGIN_BYTES = 2 * 2**20  # room for the working tree to grow between bundling and carrying
BASE, CORE, BUILT = "base", "core", "built"  # folders of a bundle: small files, core pieces, built extension

#: Every file of the offline install, pinned: the versions this project's CPU environment runs
#: with, so that pydantic and pydantic-core (an exact pin of pydantic's) match by construction.
PINS = {
    "nvidia-cudnn-frontend": "1.32.0",  # headers for the extension's build (TE needs >= 1.25)
    "pydantic": "2.14.4",  # TE's Python needs it
    "pydantic-core": "2.50.5",  # pydantic 2.14.4 requires exactly this
    "annotated-types": "0.8.0",
    "typing-inspection": "0.4.5",
    "typing-extensions": "4.16.0",  # pydantic 2.14.4 requires >= 4.16.0
}


# ----------------------------------------------------------------------------- cuDNN, CUDA, NCCL


def _decode(v: int) -> Tuple[int, int, int]:
    major_mag = 1000 if v < 90000 else 10000
    major, rest = divmod(v, major_mag)
    return (major, *divmod(rest, 100))




def _cudnn_libraries() -> List[str]:
    found = []
    for base in _site_dirs():
        found += sorted(glob.glob(os.path.join(base, "nvidia", "cudnn", "lib", "libcudnn.so*")))
        found += sorted(glob.glob(os.path.join(base, "nvidia", "cu*", "lib", "libcudnn.so*")))
    return found + ["libcudnn.so.9", "libcudnn.so"]


def cudnn_version() -> Optional[Tuple[Tuple[int, int, int], str]]:
    """``((major, minor, patch), where)`` of the cuDNN runtime a process here would load, or ``None``."""
    for lib in _cudnn_libraries():
        try:
            handle = ctypes.CDLL(lib)
        except OSError:
            continue
        fn = handle.cudnnGetVersion
        fn.restype = ctypes.c_size_t
        return _decode(int(fn())), lib
    return None


_LOOK = object()


def check_cudnn(found=_LOOK, minimum: Tuple[int, int, int] = MIN_CUDNN) -> str:
    """A line naming the cuDNN found; ``SystemExit`` when it is missing or older than ``minimum``.

    ``found`` is what :func:`cudnn_version` returns (looked up when not given; ``None`` = none).
    """
    found = cudnn_version() if found is _LOOK else found
    need = ".".join(map(str, minimum))
    if found is None:
        raise SystemExit(f"cuDNN not found (looked for libcudnn in the nvidia-cudnn wheels and on the loader path); "
                         f"TransformerEngine {TE_VERSION} needs cuDNN >= {need}. Install nvidia-cudnn-cu12 or -cu13.")
    version, where = found
    text = ".".join(map(str, version))
    if tuple(version) < minimum:
        raise SystemExit(f"cuDNN {text} ({where}) < {need}: TransformerEngine {TE_VERSION} refuses to import on it. "
                         "Upgrade cuDNN (pip install -U nvidia-cudnn-cu12 or -cu13) before building TE.")
    return f"cuDNN {text} ({where}) >= {need}: ok"


def jax_cuda_majors() -> List[int]:
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


def _jax_runtime_major() -> Optional[int]:
    """The CUDA runtime JAX loaded, as TE's setup.py asks it (``jax._src.lib.cuda_versions``)."""
    try:
        from jax._src import lib

        return int(lib.cuda_versions.cuda_runtime_get_version()) // 1000
    except Exception:  # noqa: BLE001 - no CUDA JAX, or an internal API that moved
        return None


def _nvcc_output() -> str:
    try:
        return subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def cuda_major(nvcc_output: Optional[str] = None, jax_majors: Optional[Sequence[int]] = None) -> int:
    """The CUDA major version to build TE for: ``CUDA_MAJOR``, else JAX's CUDA, else ``nvcc``.

    Why JAX first: TE's extension picks its core wheel (``transformer_engine_cu12`` or ``_cu13``)
    from the CUDA runtime of the installed JAX. Trusting ``nvcc`` on a node whose JAX uses the
    other major would install the wrong core wheel next to the right one. When ``nvcc`` and
    JAX disagree this stops and says how to fix it, since the extension would be compiled
    against one toolkit's headers and run on the other's runtime.
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
            raise SystemExit(f"JAX CUDA plugins for CUDA {' and '.join(map(str, majors))} are both installed and JAX's "
                             "runtime could not be asked which one it loads; uninstall one (pip uninstall "
                             "jax-cuda12-plugin or jax-cuda13-plugin) or set CUDA_MAJOR=12|13.")
        majors = [runtime]
    text = _nvcc_output() if nvcc_output is None else nvcc_output
    match = re.search(r"release (\d+)\.", text or "")
    nvcc = int(match.group(1)) if match and match.group(1) in ("12", "13") else None
    if majors:
        if nvcc is not None and nvcc != majors[0]:
            raise SystemExit(f"nvcc is CUDA {nvcc} but JAX uses CUDA {majors[0]}: TE's extension would be compiled "
                             f"against CUDA {nvcc}'s headers and load transformer_engine_cu{majors[0]}. Put a CUDA "
                             f"{majors[0]} toolkit first on the PATH (and CUDA_HOME), or install jax[cuda{nvcc}], or "
                             "set CUDA_MAJOR to the one you mean.")
        return majors[0]
    if nvcc is not None:
        return nvcc
    raise SystemExit("cannot tell the CUDA major version: no JAX CUDA plugin and no nvcc on the PATH; set CUDA_MAJOR=12 "
                     "or CUDA_MAJOR=13.")




def cudnn_include_dir(sites: Optional[Sequence[str]] = None) -> Path:
    """The folder holding ``cudnn.h``: pip's cuDNN first, then the CUDA toolkit and the system.

    Why: TE's build adds the include folders of CUDA, NCCL, cudnn-frontend and XLA only, while
    ``cudnn_frontend.h`` and TE's ``cudnn_utils.h`` include ``cudnn.h``; pip's cuDNN keeps it in
    ``site-packages/nvidia/cudnn/include``. The build gets this folder through
    ``CPLUS_INCLUDE_PATH`` (read by the C++ compiler).
    """
    candidates = []
    for nv in _nvidia_dirs(sites):
        candidates += [nv / "cudnn" / "include", nv / "cu13" / "include", nv / "cu12" / "include"]
    if sites is None:
        cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
        candidates += [Path(cuda_home) / "include", Path("/usr/include"), Path("/usr/include/x86_64-linux-gnu")]
    for folder in candidates:
        if (folder / "cudnn.h").is_file():
            return folder
    raise SystemExit("cudnn.h not found (looked in site-packages/nvidia/cudnn/include, $CUDA_HOME/include and "
                     "/usr/include): TE's JAX extension includes it. Install cuDNN's headers, e.g. "
                     "`pip install nvidia-cudnn-cu13` (or -cu12), which puts them in site-packages/nvidia/cudnn/include.")






def library_env(env: Optional[Dict[str, str]] = None, sites: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """``env`` with pip's NCCL folder first on ``LD_LIBRARY_PATH``, so a child process loads TE."""
    env = dict(os.environ if env is None else env)
    lib = nccl_library(sites)
    if lib is not None:
        parts = [str(lib.parent)] + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


# ----------------------------------------------------------------------------- pieces and checksums


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _entry(path: Path, root: Path) -> dict:
    return {"name": path.relative_to(root).as_posix(), "bytes": path.stat().st_size, "sha256": _sha256(path),
            "pieces": []}


def split_file(path: Path, piece_bytes: int, first_piece_bytes: Optional[int] = None) -> List[dict]:
    """Cut ``path`` into ``path.partNNN`` files and delete it; return the pieces' entries (names relative
    to ``path``'s folder). The first piece may be smaller (``first_piece_bytes``), so that it fits
    beside the small files that travel with it."""
    if piece_bytes < 1 or (first_piece_bytes is not None and first_piece_bytes < 1):
        raise ValueError(f"piece_bytes={piece_bytes}, first_piece_bytes={first_piece_bytes}: both must be positive.")
    path = Path(path)
    pieces = []
    with open(path, "rb") as f:
        size = first_piece_bytes or piece_bytes
        while True:
            block = f.read(size)
            if not block:
                break
            part = path.with_name(f"{path.name}.part{len(pieces):03d}")
            part.write_bytes(block)
            pieces.append({"name": part.name, "bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()})
            size = piece_bytes
    path.unlink()
    return pieces


def _check_file(path: Path, entry: dict, what: str) -> None:
    if not path.is_file():
        raise SystemExit(f"{path}: {what} missing; copy it and run again.")
    if path.stat().st_size != entry["bytes"] or _sha256(path) != entry["sha256"]:
        raise SystemExit(f"{path}: SHA-256 differs from the manifest (corrupted copy); copy it again.")


def _manifest(directory: Path) -> dict:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise SystemExit(f"{path} not found: run `python -m tutorial_utils.tools.gpu_setup bundle {directory}` on a "
                         "machine with a package index and copy the folder here.")
    return json.loads(path.read_text())


def verify_pieces(directory: Path, upto_call: Optional[int] = None) -> List[str]:
    """Check every small file and every piece that calls ``1..upto_call`` carried (all when ``None``).

    Raises ``SystemExit`` naming the first missing or corrupted file. On a lent machine a
    missing earlier piece means it went back between calls: start again at call 1.
    """
    directory = Path(directory)
    manifest = _manifest(directory)
    checked = []
    for entry in manifest["files"]:
        target = directory / entry["name"]
        if entry.get("pieces"):
            if target.is_file() and _sha256(target) == entry["sha256"]:
                checked.append(entry["name"])  # already reassembled by an earlier run
                continue
            for piece in entry["pieces"]:
                if upto_call is not None and piece.get("call", 1) > upto_call:
                    continue
                _check_file(target.parent / piece["name"], piece, f"piece {piece['name']} (call {piece.get('call', '?')})")
                checked.append(piece["name"])
        else:
            _check_file(target, entry, "file")
            checked.append(entry["name"])
    return checked


def join_pieces(directory: Path) -> List[Path]:
    """Verify every piece and whole file listed in the manifest, reassembling split files.

    A split file whose pieces are xz-compressed (``"packing": "xz"``) is decompressed after
    joining; the result is checked against the manifest's SHA-256 and, for a wheel, every
    member against the wheel's own ``RECORD``. Raises ``SystemExit`` naming the first missing
    or corrupted file; never leaves a half-written file under its final name.
    """
    directory = Path(directory)
    manifest = _manifest(directory)
    files = []
    for entry in manifest["files"]:
        target = directory / entry["name"]
        if target.is_file() and target.stat().st_size == entry["bytes"] and _sha256(target) == entry["sha256"]:
            files.append(target)
            continue
        if not entry.get("pieces"):
            raise SystemExit(f"{target}: missing or its SHA-256 differs from the manifest; copy it again.")
        packed = target.with_name(target.name + ".xz.joining" if entry.get("packing") == "xz" else target.name + ".joining")
        try:
            with open(packed, "wb") as out:
                for piece in entry["pieces"]:
                    part = target.parent / piece["name"]
                    if not part.is_file():
                        raise SystemExit(f"{part}: piece missing ({len(entry['pieces'])} pieces make {entry['name']}); "
                                         "copy it and run again.")
                    data = part.read_bytes()
                    if hashlib.sha256(data).hexdigest() != piece["sha256"]:
                        raise SystemExit(f"{part}: SHA-256 differs from the manifest (corrupted copy); copy it again.")
                    out.write(data)
            tmp = packed
            if entry.get("packing") == "xz":
                tmp = target.with_name(target.name + ".joining")
                with lzma.open(packed, "rb") as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
                packed.unlink()
            if _sha256(tmp) != entry["sha256"]:
                raise SystemExit(f"{target}: reassembled file does not match the manifest's SHA-256.")
            if target.suffix == ".whl":
                verify_wheel_record(tmp)
            tmp.replace(target)
        finally:
            for leftover in (packed, target.with_name(target.name + ".joining")):
                if leftover.exists():
                    leftover.unlink()
        files.append(target)
    return files


def _record_hash(data: bytes) -> str:
    import base64

    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def verify_wheel_record(wheel: Path) -> int:
    """Check every member of ``wheel`` against the hashes in its ``RECORD``; return how many matched."""
    import csv
    import io

    with zipfile.ZipFile(wheel) as z:
        record_name = next((n for n in z.namelist() if n.endswith(".dist-info/RECORD")), None)
        if record_name is None:
            raise SystemExit(f"{wheel}: no .dist-info/RECORD, not a wheel.")
        rows = list(csv.reader(io.StringIO(z.read(record_name).decode())))
        count = 0
        for row in rows:
            if len(row) < 2 or not row[1]:
                continue
            if _record_hash(z.read(row[0])) != row[1]:
                raise SystemExit(f"{wheel}: {row[0]} differs from the wheel's RECORD.")
            count += 1
    return count


def repack_wheel(wheel: Path, dest: Path, preset: int = 9) -> dict:
    """Rewrite ``wheel`` uncompressed (same members, same order) at ``dest`` and xz-compress that.

    Why: the wheel's deflate leaves its 327 MB library at 260 MB; xz on the uncompressed
    members does far better, and the stored zip is still a wheel pip installs, with every
    member checked against the original wheel's ``RECORD``. Returns the manifest fields
    ``bytes``/``sha256`` of the stored wheel, and writes ``dest.xz``.
    """
    wheel, dest = Path(wheel), Path(dest)
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as out:
        for info in src.infolist():
            stored = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            stored.external_attr, stored.compress_type = info.external_attr, zipfile.ZIP_STORED
            with src.open(info) as f:
                out.writestr(stored, f.read())
    verify_wheel_record(dest)
    fields = {"bytes": dest.stat().st_size, "sha256": _sha256(dest), "pypi_sha256": _sha256(wheel), "packing": "xz"}
    xz = shutil.which("xz")
    if xz:  # the same .xz format as the lzma module, on all cores
        with open(dest.with_name(dest.name + ".xz"), "wb") as out:
            subprocess.run([xz, f"-{preset}", f"-T{os.cpu_count() or 1}", "-c", str(dest)], stdout=out, check=True)
    else:
        with open(dest, "rb") as src, lzma.open(dest.with_name(dest.name + ".xz"), "wb", preset=preset) as out:
            shutil.copyfileobj(src, out, 1 << 22)
    dest.unlink()
    return fields


# ----------------------------------------------------------------------------- what to carry


def bundle_requirements(cuda: int) -> List[Tuple[str, bool]]:
    """``(requirement, binary_for_the_target)`` pairs the offline install needs, beyond the node's JAX.

    Every requirement is pinned (``==``): the bundle is the same set each time it is made.
    """
    if cuda not in (12, 13):
        raise ValueError(f"cuda={cuda!r}: use 12 or 13.")
    return [
        (f"transformer-engine=={TE_VERSION}", False),  # TE's Python (pure-Python wheel)
        (f"transformer-engine-cu{cuda}=={TE_VERSION}", True),  # TE's CUDA core library (276 MB for cu13)
        (f"transformer-engine-jax=={TE_VERSION}", False),  # the JAX extension, an sdist compiled on the node
    ] + [(f"{name}=={version}", name in ("nvidia-cudnn-frontend", "pydantic-core")) for name, version in PINS.items()]


SIMPLE_INDEX = "https://pypi.org/simple"
#: The wheel platforms of a Linux x86_64 node with glibc >= 2.28; pip matches each tag exactly.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def _platform_args() -> List[str]:
    return [arg for tag in PLATFORMS for arg in ("--platform", tag)]


def sdist_link(index_html: str, project: str, version: str) -> Tuple[str, str]:
    """``(url, sha256)`` of ``project``'s ``version`` sdist in a PEP 503 simple-index page."""
    stem = re.escape(project.replace("-", "_"))
    match = re.search(rf'href="([^"]*/{stem}-{re.escape(version)}\.tar\.gz)#sha256=([0-9a-f]{{64}})"', index_html)
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


def working_tree_bytes(root: Path = Path(".")) -> Tuple[int, int]:
    """``(tracked, untracked)`` bytes of the files that travel with every call: what ``git ls-files``
    lists, and the untracked files git does not ignore."""
    def total(*args) -> int:
        out = subprocess.run(["git", "ls-files", "-z", *args], cwd=root, capture_output=True, text=True, check=True)
        return sum(os.path.getsize(Path(root) / f) for f in out.stdout.split("\0") if f and (Path(root) / f).is_file())

    return total(), total("--others", "--exclude-standard")


def _prepare_folder(directory: Path, clean: bool) -> None:
    if directory.exists() and any(directory.iterdir()):
        if not clean:
            raise SystemExit(f"{directory} is not empty: bundling into it would pick up stale files. Pass --clean to "
                             "empty it (only a folder holding a bundle's manifest.json), or choose an empty folder.")
        if not (directory / MANIFEST).is_file():
            raise SystemExit(f"{directory} holds no {MANIFEST}: --clean empties only a bundle's folder; choose another.")
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)


def bundle(directory: Path, cuda: int, python_version: str = "3.12", dry_run: bool = False, clean: bool = False,
           tree_bytes: Optional[int] = None, xz: bool = False) -> List[List[str]]:
    """Download the pinned requirements for a Linux x86_64 node with ``python_version`` and cut the
    core wheel into pieces sized so that each call carries at most :data:`CALL_BYTES` with the
    working tree (``tree_bytes``, measured when not given); see :func:`pack`."""
    directory = Path(directory)
    commands = []
    for req, binary in bundle_requirements(cuda):
        if req.startswith("transformer-engine-jax"):
            commands.append(["fetch-sdist", "transformer-engine-jax", TE_VERSION])
            continue
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(directory / BASE), req]
        if binary:
            cmd += ["--only-binary=:all:", "--python-version", python_version, *_platform_args()]
        commands.append(cmd)
    if dry_run:
        return commands
    _prepare_folder(directory, clean)
    (directory / BASE).mkdir()
    for cmd in commands:
        if cmd[0] == "fetch-sdist":
            _fetch_sdist(cmd[1], cmd[2], directory / BASE)
        else:
            _run(cmd)
    pack(directory, cuda, python_version, sum(working_tree_bytes()) if tree_bytes is None else tree_bytes, xz=xz)
    return commands


def pack(directory: Path, cuda: int, python_version: str, tree_bytes: int, call_bytes: int = CALL_BYTES,
         xz: bool = False, preset: int = 9) -> dict:
    """Turn the downloads in ``DIR/base/`` into a bundle: the core wheel moved to ``DIR/core/`` and
    cut so that call 1 carries the small files and the first piece, and each later call one
    piece, each with the working tree within ``call_bytes``; write the manifest.

    The wheel is carried as PyPI serves it (its SHA-256 is PyPI's). ``xz`` repacks it first
    (:func:`repack_wheel`); measured on TE 2.20.2's cu13 wheel this saves little, because 251 MB
    of its 327 MB library is the CUDA fat binary, which nvcc has already compressed (gzip and
    xz leave 8 MB slices of ``.nv_fatbin`` at 0.93-0.999 of their size), so the default keeps the
    original bytes.
    """
    directory = Path(directory)
    (directory / CORE).mkdir(exist_ok=True)
    stem = f"transformer_engine_cu{cuda}-"
    cores = sorted((directory / BASE).glob(stem + "*.whl"))
    if len(cores) != 1:
        raise SystemExit(f"expected one {stem}*.whl in {directory / BASE}, found {[c.name for c in cores]}.")
    core = directory / CORE / cores[0].name
    cores[0].replace(core)
    files = [_entry(path, directory) for path in sorted((directory / BASE).iterdir())]
    if xz:
        print(f"+ repack {core.name} uncompressed and xz it", flush=True)
        fields = repack_wheel(core, core.with_name(core.name + ".stored"), preset)
        core.unlink()  # the stored wheel, checked against the original's RECORD, replaces it
        carried = core.with_name(core.name + ".stored.xz").replace(core.with_name(core.name + ".xz"))
    else:
        verify_wheel_record(core)
        fields = {"bytes": core.stat().st_size, "sha256": _sha256(core), "packing": None}
        carried = core
    budget = call_bytes - tree_bytes - MARGIN_BYTES * call_bytes // CALL_BYTES
    first = budget - sum(f["bytes"] for f in files) - 16 * 1024  # the manifest travels with them
    if first < budget // 8:
        raise SystemExit(f"the small files and the working tree ({tree_bytes} bytes) leave too little room for a "
                         f"piece in a {call_bytes}-byte call.")
    pieces = split_file(carried, budget, first_piece_bytes=first)
    for call, piece in enumerate(pieces, start=1):
        piece["call"] = call  # piece k travels with call k; the last call also installs and runs
    files.append({"name": f"{CORE}/{core.name}", **fields, "pieces": pieces})
    manifest = {"schema": "gpu-bundle/2", "te_version": TE_VERSION, "cuda": cuda, "python_version": python_version,
                "call_bytes": call_bytes, "tree_bytes_when_cut": tree_bytes, "files": files}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


# ----------------------------------------------------------------------------- install and build


def _bundle_files(directory: Path) -> Tuple[List[Path], Path]:
    """``(wheels, sdist)`` of a bundle (the built extension wheel included when present)."""
    directory = Path(directory)
    manifest = _manifest(directory)
    names = [directory / e["name"] for e in manifest["files"]]
    sdists = [f for f in names if f.name.endswith(".tar.gz") and "jax" in f.name.lower()]
    if len(sdists) != 1:
        raise SystemExit(f"expected exactly one transformer_engine_jax sdist in the bundle, found {[f.name for f in sdists]}.")
    return [f for f in names if f.suffix == ".whl"], sdists[0]


def install_commands(wheels: Sequence[Path], built: Sequence[Path], python: str = sys.executable) -> List[List[str]]:
    """The offline install: every wheel of the bundle and the extension built from its sdist, with
    ``--no-index --no-deps``. This package is not installed: ``PYTHONPATH=src`` serves it."""
    wheels, built = [Path(w) for w in wheels], [Path(b) for b in built]
    if len(built) != 1 or not built[0].name.startswith("transformer_engine_jax-"):
        raise SystemExit(f"expected one built transformer_engine_jax wheel, found {[b.name for b in built]}: run the "
                         "build step (call 1 of the carry plan) first.")
    return [[python, "-m", "pip", "install", "--no-index", "--no-deps", "--no-cache-dir",
             *[str(w) for w in wheels + built]]]


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


def build_command(src: Path, dest: Path, jobs: int, python: str = sys.executable, cuda_archs: str = "90",
                  sites: Optional[Sequence[str]] = None) -> Tuple[List[str], Dict[str, str]]:
    """``(command, environment)`` that builds TE's JAX extension wheel from the unpacked sdist ``src``.

    The sdist's ``setup.py`` runs unchanged; pybind11's ``ParallelCompile`` (which TE's build
    already depends on) compiles its C++ files ``jobs`` at a time, since ``MAX_JOBS`` does not
    reach this build. The environment adds cuDNN's headers (``CPLUS_INCLUDE_PATH``), selects
    the JAX framework and Hopper (``NVTE_FRAMEWORK``, ``NVTE_CUDA_ARCHS``), and does not use
    build isolation: the extension is compiled against the JAX already installed.
    """
    env = dict(os.environ)
    include = str(cudnn_include_dir(sites))
    env["CPLUS_INCLUDE_PATH"] = os.pathsep.join(dict.fromkeys(
        [include] + [p for p in env.get("CPLUS_INCLUDE_PATH", "").split(os.pathsep) if p]))
    env.update(NVTE_FRAMEWORK="jax", NVTE_CUDA_ARCHS=cuda_archs, NVTE_BUILD_MAX_JOBS=str(jobs))
    return [python, "-c", _SETUP_PY, str(src), str(dest), str(jobs)], env


def build_extension(directory: Path, *, jobs: Optional[int] = None, python: str = sys.executable,
                    cuda_archs: str = "90", dry_run: bool = False) -> Path:
    """Build the extension wheel into ``DIR/built/`` from the bundle's sdist; skip it when a wheel built
    from the same sdist (same SHA-256) is already there, so the step can be run again."""
    directory = Path(directory)
    _wheels, sdist = _bundle_files(directory)
    built, stamp = directory / BUILT, directory / BUILT / "built.json"
    digest = _sha256(sdist) if sdist.is_file() else "?"
    if stamp.is_file():
        info = json.loads(stamp.read_text())
        wheel = built / info.get("wheel", "-")
        if info.get("sdist_sha256") == digest and wheel.is_file() and _sha256(wheel) == info.get("sha256"):
            print(f"+ {wheel.name} already built from this sdist: kept", flush=True)
            return wheel
    work = directory / "build"
    jobs = jobs or os.cpu_count() or 1
    cmd, env = build_command(work / sdist.name[: -len(".tar.gz")], built, jobs, python, cuda_archs)
    print("+", _shell(cmd[:2] + ["<setup.py bdist_wheel with ParallelCompile>"] + cmd[3:]), flush=True)
    if dry_run:
        return built
    for folder in (work, built):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(work)
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True)
    wheels = sorted(built.glob("transformer_engine_jax-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"the build left {[w.name for w in wheels]} in {built}, expected one wheel.")
    stamp.write_text(json.dumps({"wheel": wheels[0].name, "sha256": _sha256(wheels[0]), "sdist_sha256": digest,
                                 "jobs": jobs, "seconds": round(time.perf_counter() - start, 1)}, indent=2))
    return wheels[0]


def install(directory: Path, *, dry_run: bool = False, python: str = sys.executable) -> List[List[str]]:
    """Reassemble the pieces (checksums checked) and install the bundle offline."""
    directory = Path(directory)
    if not dry_run:
        join_pieces(directory)
    wheels, _sdist = _bundle_files(directory)
    built = sorted((directory / BUILT).glob("transformer_engine_jax-*.whl"))
    if dry_run and not built:
        built = [directory / BUILT / f"transformer_engine_jax-{TE_VERSION}-cp312-cp312-linux_x86_64.whl"]
    commands = install_commands(wheels, built, python)
    for cmd in commands:
        print("+", _shell(cmd), flush=True)
        if not dry_run:
            subprocess.run(cmd, check=True)
    return commands


def import_gate() -> str:
    """Load NCCL, start JAX on the GPU, import TE's JAX API and its extension, and select real TE in
    this package's facade. Returns a line naming what was loaded; raises ``SystemExit`` with the
    reason otherwise, so that a run never goes on to time the reference."""
    os.environ["TUTORIAL_TE_BACKEND"] = "te"
    nccl = preload_nccl()
    import jax

    devices = jax.devices()
    if not any(d.platform == "gpu" for d in devices):
        raise SystemExit(f"import gate: JAX sees no GPU ({devices}); install jax[cuda12] or jax[cuda13].")
    try:
        import transformer_engine.jax  # noqa: F401
        import transformer_engine_jax  # noqa: F401
    except Exception as err:  # noqa: BLE001 - TE raises many kinds when CUDA, cuDNN or NCCL are missing
        raise SystemExit(f"import gate: transformer_engine.jax failed to import: {err}") from err
    from tutorial_utils import te

    if te.backend_kind() != "te":
        raise SystemExit(f"import gate: the facade chose {te.backend_name()!r}, not real TE.")
    return f"import gate: ok: {te.backend_name()} on {devices[0].device_kind}, JAX {jax.__version__}, NCCL {nccl}"


def preflight(directory: Path) -> str:
    """What the node offers, checked against the bundle before anything is built."""
    manifest = _manifest(directory)
    lines = [f"python {sys.version.split()[0]}"]
    want = manifest.get("python_version")
    if want and sys.version_info[:2] != tuple(int(x) for x in want.split(".")):
        raise SystemExit(f"preflight: the bundle is for Python {want}, this is {sys.version.split()[0]}; make the bundle "
                         f"with --python-version {sys.version_info[0]}.{sys.version_info[1]}.")
    major = cuda_major()
    if major != manifest.get("cuda"):
        raise SystemExit(f"preflight: JAX here uses CUDA {major}, the bundle is for CUDA {manifest.get('cuda')}; make it "
                         f"with --cuda {major}.")
    lines += [f"CUDA {major} (JAX)", check_cudnn(), f"cudnn.h in {cudnn_include_dir()}", f"NCCL {nccl_library()}"]
    for module in ("pybind11", "wheel"):
        try:
            __import__(module)
        except ImportError:
            raise SystemExit(f"preflight: {module} is missing; TE's build needs it (pip install {module}).") from None
    return "; ".join(lines)


# ----------------------------------------------------------------------------- the run, call by call

#: ``(name, seconds allowed)`` of every step. The first call builds while the pieces arrive;
#: the last one installs, gates and runs. Each call's steps sum to at most CALL_SECONDS.
STEP_SECONDS = {"preflight": 30, "verify": 20, "build": 300, "install": 60, "gate": 45, "check": 150,
                "bench-single": 90, "bench-emulated": 120}
FIRST_STEPS = ("preflight", "verify", "build")
LAST_STEPS = ("verify", "install", "gate", "check", "bench-single", "bench-emulated")


def _calls(manifest: dict) -> int:
    """How many calls carry the bundle: one per piece, and at least two (build, then run)."""
    return max([p.get("call", 1) for e in manifest["files"] for p in e.get("pieces", [])] + [2])


def call_steps(call: Optional[int], calls: int) -> Tuple[str, ...]:
    """The steps of ``call`` (1-based) of ``calls``; all steps when ``call`` is ``None``.

    Call 1 builds the extension (it needs the small files only), the middle calls verify what
    has arrived, the last call carries the last piece, reassembles, installs, gates and runs.
    """
    if call is None:
        return tuple(dict.fromkeys(FIRST_STEPS + LAST_STEPS))
    if not 1 <= call <= calls:
        raise SystemExit(f"--call {call}: this bundle is carried in calls 1 to {calls}.")
    if call == 1:
        return FIRST_STEPS
    if call < calls:
        return ("verify",)
    return LAST_STEPS


def run_commands(bundle_dir: Path, out: Path, python: str = sys.executable, call: Optional[int] = None,
                 calls: int = 1) -> List[Tuple[str, int, List[str]]]:
    """``(name, seconds, command)`` of the steps of one call (or all): every command is re-runnable
    (``--force`` replaces the previous check report and records)."""
    me = [python, "-m", "tutorial_utils.tools.gpu_setup"]
    bench = [python, "-m", "tutorial_utils.tools.bench", "--preset", "seed", "--windows", "8192", "--out", str(out),
             "--no-progress", "--force"]
    verify = me + ["verify", str(bundle_dir)] + ([] if call is None or call >= calls else ["--call", str(call)])
    every = {
        "preflight": me + ["preflight", str(bundle_dir)],
        "verify": verify,
        "build": me + ["build-ext", str(bundle_dir)],
        "install": me + ["install", str(bundle_dir)],
        "gate": me + ["gate"],
        "check": [python, "-m", "tutorial_utils.tools.check", "--out", str(out / "checks" / "gpu-check.json"),
                  "--force"],
        "bench-single": bench + ["--strategies", "single", "--name", "gpu-seed-single"],
        "bench-emulated": bench + ["--emulate-ranks", "4", "--strategies", "ring,allgather,ulysses",
                                   "--stripes", "128,256,512", "--name", "gpu-seed-emulated-4"],
    }
    return [(name, STEP_SECONDS[name], every[name]) for name in call_steps(call, calls)]


def run_step(cmd: Sequence[str], limit: float, log, env: Optional[Dict[str, str]] = None) -> Tuple[object, float]:
    """Run ``cmd`` in its own process group, its output appended to the open file ``log`` as it comes.

    On timeout the whole group is killed (pip's and the compiler's children too), so nothing
    from this step goes on into the next. Returns ``(returncode or "timeout", seconds)``.
    """
    start = time.perf_counter()
    proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        rc = "timeout"
        for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=grace)
                time.sleep(0.2)  # let the group's other members take the signal too
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything of the group still alive
        except ProcessLookupError:
            pass
    return rc, round(time.perf_counter() - start, 1)


#: Steps whose failure makes the rest meaningless: the run stops there.
STOPPING = ("preflight", "verify", "build", "install", "gate")


def run(bundle_dir: Path, out: Path, *, call: Optional[int] = None, dry_run: bool = False,
        python: str = sys.executable, steps: Optional[List[Tuple[str, int, List[str]]]] = None) -> dict:
    """Run the steps of ``call`` (all when ``None``) with their time limits.

    Each step's output is streamed to ``out/gpu-run/run.log`` and the summary rewritten to
    ``out/gpu-run/run.json`` before and after each step, so a killed call still leaves both.
    (A subfolder: ``out`` is the records folder, whose ``*.json`` files must all be
    ``cp-bench/1`` records.) A failed preflight, verify, build, install or import gate stops
    the run; ``check`` and ``bench`` run with ``TUTORIAL_TE_BACKEND=te``, so they fail rather
    than fall back to the reference.
    """
    out, bundle_dir = Path(out), Path(bundle_dir)
    if steps is None:
        calls = _calls(_manifest(bundle_dir)) if (bundle_dir / MANIFEST).is_file() else 1
        steps = run_commands(bundle_dir, out, python, call, calls)
    summary = {"call": call, "limit_s": sum(limit for _, limit, _ in steps), "steps": []}
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
    env["PYTHONPATH"] = os.pathsep.join([src] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    stopped = None
    with open(folder / "run.log", "w") as log:
        for name, limit, cmd in steps:
            entry = {"name": name, "limit_s": limit, "command": _shell(cmd)}
            if stopped:
                summary["steps"].append({**entry, "rc": None, "note": f"not run: {stopped} failed"})
                continue
            summary["steps"].append({**entry, "rc": "running"})
            (folder / "run.json").write_text(json.dumps(summary, indent=2))
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
                print(f"!! {name} failed: the run stops here; see {folder / 'run.log'}", flush=True)
            (folder / "run.json").write_text(json.dumps(summary, indent=2))
    summary["ok"] = all(s["rc"] == 0 for s in summary["steps"])
    (folder / "run.json").write_text(json.dumps(summary, indent=2))
    with open(folder / "run.log") as f:
        print(f.read()[-6000:], flush=True)
    return summary


def carry_plan(bundle_dir: Path, tree_bytes: int, out: str = "$OUT/results") -> List[dict]:
    """The calls that carry ``bundle_dir`` to a machine taking :data:`CALL_BYTES` per call.

    Each call: ``carry`` (paths), ``bytes`` (working tree + carried files), ``seconds`` (its
    steps' limits) and ``command``. Call 1 carries the manifest and the small files and builds
    the extension; calls 2..N carry a piece each and verify everything carried so far; the
    call after the last piece reassembles, installs, gates and runs.
    """
    bundle_dir = Path(bundle_dir)
    manifest = _manifest(bundle_dir)
    calls = _calls(manifest)
    if bundle_dir.is_absolute():
        raise SystemExit(f"--bundle {bundle_dir}: give the bundle's path inside the repository (e.g. gpu-bundle); a "
                         "call carries paths of the checkout only.")
    plan = [{"call": k, "carry": [], "bytes": tree_bytes} for k in range(1, calls + 1)]
    plan[0]["carry"].append((bundle_dir / MANIFEST).as_posix())
    plan[0]["bytes"] += (bundle_dir / MANIFEST).stat().st_size
    base = [e for e in manifest["files"] if not e.get("pieces")]
    if base:
        plan[0]["carry"].append((bundle_dir / BASE).as_posix())
        plan[0]["bytes"] += sum(e["bytes"] for e in base)
    for entry in manifest["files"]:
        parent = (bundle_dir / entry["name"]).parent
        for piece in entry.get("pieces", []):
            plan[piece["call"] - 1]["carry"].append((parent / piece["name"]).as_posix())
            plan[piece["call"] - 1]["bytes"] += piece["bytes"]
    for item in plan:
        steps = run_commands(bundle_dir, Path(out), "python3", item["call"], calls)
        item["seconds"] = sum(limit for _, limit, _ in steps)
        item["steps"] = [name for name, _, _ in steps]
        item["command"] = (f"PYTHONPATH=src python3 -m tutorial_utils.tools.gpu_setup run --bundle {bundle_dir.as_posix()} "
                           f"--out {out} --call {item['call']}")
    return plan


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def print_plan(plan: List[dict], tree: Tuple[int, int]) -> List[str]:
    """Print the plan; return the problems found (a call over the size or time limit)."""
    problems = []
    print(f"working tree: {_mib(tree[0])} tracked (git ls-files) + {_mib(tree[1])} untracked, carried by every call; "
          f"limit {_mib(CALL_BYTES)} and {CALL_SECONDS} s per call. Issue the calls back to back: the machine keeps "
          "carried files only while it stays warm (about 30 s idle); each call checks what the earlier ones left.")
    for item in plan:
        print(f"\ncall {item['call']}/{len(plan)}: {_mib(item['bytes'])}, <= {item['seconds']} s ({', '.join(item['steps'])})")
        print("  carry: " + json.dumps(item["carry"]))
        print("  command: " + item["command"])
        if item["bytes"] > CALL_BYTES:
            problems.append(f"call {item['call']} carries {_mib(item['bytes'])} > {_mib(CALL_BYTES)}: bundle again "
                            "(`make gpu-bundle`) so the pieces are cut for today's working tree.")
        if item["seconds"] > CALL_SECONDS:
            problems.append(f"call {item['call']} may run {item['seconds']} s > {CALL_SECONDS} s.")
        if len(item["carry"]) > 8:
            problems.append(f"call {item['call']} names {len(item['carry'])} paths; a call carries at most 8.")
    total = sum(item["seconds"] for item in plan)
    print(f"\n{len(plan)} calls, their limits summing to {total} s of command time (ceilings: a lent machine's "
          "start and transfers count too, and the benchmarks run last); records come back under $OUT/results/: "
          "copy them into results/.")
    for p in problems:
        print("PROBLEM:", p)
    return problems


def rehearse(plan: List[dict], bundle_dir: Path, device: Path, python_version: str) -> None:
    """Play the plan on this machine: copy each call's carried paths into ``device`` (a stand-in
    for the lent machine's tree), verify there what the call's command verifies, and after the
    last piece reassemble, check every wheel and let pip resolve the offline install (dry run)."""
    if device.exists():
        shutil.rmtree(device)
    device.mkdir(parents=True)
    calls = len(plan)
    there = device / bundle_dir
    for item in plan:
        for path in item["carry"]:
            dst = device / path
            dst.parent.mkdir(parents=True, exist_ok=True)
            if Path(path).is_dir():
                shutil.copytree(path, dst)
            else:
                shutil.copy2(path, dst)
        k = item["call"]
        checked = verify_pieces(there, upto_call=k if k < calls else None)
        print(f"call {k}: carried {len(item['carry'])} paths ({_mib(item['bytes'])} with the tree); verified "
              f"{len(checked)} files: ok")
    files = join_pieces(there)
    print(f"reassembled and checked: {[f.name for f in files if f.suffix == '.whl' and 'cu1' in f.name]}")
    wheels, _sdist = _bundle_files(there)
    pip = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--no-index", "--target",
           str(device / "target"), "--python-version", python_version, *_platform_args(), "--only-binary=:all:"]
    _run(pip + ["--no-deps", *map(str, wheels)])  # the exact files the install step installs fit the node
    if list((there / BASE).glob("pydantic-*.whl")):  # the pins resolve among themselves, offline
        _run(pip + ["--find-links", str(there / BASE), f"pydantic=={PINS['pydantic']}"])


def _shell(cmd: Sequence[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)


def _run(cmd: List[str]) -> None:
    print("+", _shell(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tutorial_utils.tools.gpu_setup", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("cudnn", help="print the cuDNN runtime found; exit 1 if missing or < 9.12.0")
    sub.add_parser("cuda", help="print the CUDA major version TE will be built for (JAX's)")
    sub.add_parser("cudnn-include", help="print the folder holding cudnn.h (for CPLUS_INCLUDE_PATH)")
    b = sub.add_parser("bundle", help="download, repack and split the files of an offline install")
    b.add_argument("dir", type=Path)
    b.add_argument("--cuda", type=int, choices=(12, 13), default=13)
    b.add_argument("--python-version", default="3.12", choices=("3.11", "3.12"))
    b.add_argument("--clean", action="store_true", help="empty DIR first (only if it holds a bundle)")
    b.add_argument("--xz", action="store_true", help="repack the core wheel uncompressed and xz it (saves little: its fat binary is already compressed)")
    b.add_argument("--dry-run", action="store_true")
    c = sub.add_parser("carry-plan", help="print the calls that carry a bundle to a machine taking 64 MiB per call")
    c.add_argument("--bundle", type=Path, default=Path("gpu-bundle"))
    c.add_argument("--dry-run", action="store_true", help="play the calls here, into --device (no GPU steps)")
    c.add_argument("--device", type=Path, default=Path("/tmp/gpu-carry-rehearsal"))
    for name, helptext in (("verify", "check the pieces carried so far"), ("preflight", "check the node against the bundle"),
                           ("build-ext", "build TE's JAX extension wheel into DIR/built"),
                           ("install", "reassemble and install a bundle offline")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("dir", type=Path)
        if name == "verify":
            s.add_argument("--call", type=int, default=None)
        if name in ("install", "build-ext"):
            s.add_argument("--dry-run", action="store_true")
        if name == "build-ext":
            s.add_argument("--jobs", type=int, default=None)
            s.add_argument("--cuda-archs", default="90", help="NVTE_CUDA_ARCHS (90 = Hopper)")
    sub.add_parser("gate", help="import TE on the GPU through the facade; exit 1 with the reason otherwise")
    r = sub.add_parser("run", help="the steps of one call of the carry plan (all steps without --call)")
    r.add_argument("--bundle", type=Path, default=Path("gpu-bundle"))
    r.add_argument("--out", type=Path, default=Path("results"))
    r.add_argument("--call", type=int, default=None)
    r.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "cudnn":
        print(check_cudnn())
    elif args.cmd == "cuda":
        print(cuda_major())
    elif args.cmd == "cudnn-include":
        print(cudnn_include_dir())
    elif args.cmd == "bundle":
        for cmd in bundle(args.dir, args.cuda, args.python_version, dry_run=args.dry_run, clean=args.clean, xz=args.xz):
            if args.dry_run:
                print("+", _shell(cmd))
    elif args.cmd == "carry-plan":
        tree = working_tree_bytes()
        plan = carry_plan(args.bundle, sum(tree))
        problems = print_plan(plan, tree)
        if args.dry_run:
            rehearse(plan, args.bundle, args.device, _manifest(args.bundle).get("python_version", "3.12"))
        return 1 if problems else 0
    elif args.cmd == "verify":
        checked = verify_pieces(args.dir, args.call)
        print(f"verified {len(checked)} files against {args.dir / MANIFEST}")
    elif args.cmd == "preflight":
        print(preflight(args.dir))
    elif args.cmd == "build-ext":
        print(build_extension(args.dir, jobs=args.jobs, cuda_archs=args.cuda_archs, dry_run=args.dry_run))
    elif args.cmd == "install":
        install(args.dir, dry_run=args.dry_run)
    elif args.cmd == "gate":
        print(import_gate())
    else:
        summary = run(args.bundle, args.out, call=args.call, dry_run=args.dry_run)
        return 0 if args.dry_run or summary.get("ok") else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
