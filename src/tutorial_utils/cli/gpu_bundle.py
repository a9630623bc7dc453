"""The offline bundle: what an install needs, its download, its manifest and its checksums.

``python -m tutorial_utils.cli.gpu_setup bundle DIR`` downloads every pinned file of an offline
install (:func:`bundle_requirements`) on a machine with a package index and writes
``DIR/manifest.json`` (each file's size, SHA-256 and use); the node checks each file against it
before anything is built or installed. Standard library only: the bundle is made and checked
on machines without TE.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "TE_VERSION",
    "MIN_CUDNN",
    "MANIFEST",
    "BASE",
    "CORE",
    "EXTRA",
    "BUILT",
    "BUILD_ENV",
    "Requirement",
    "bundle_requirements",
    "file_sha256",
    "record_hash",
    "verify_wheel_record",
    "wheel_version",
    "read_manifest",
    "manifest_entries",
    "verify_bundle_entry",
    "verify_bundle",
    "sdist_link",
    "bundle",
    "write_manifest",
    "shell_line",
    "run_echoed",
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


# ----------------------------------------------------------------------------- files and checksums


def file_sha256(path: Path) -> str:
    """The SHA-256 of the file at ``path``, as hex.

    Args:
        path: the file, read in 1 MiB blocks.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def record_hash(data: bytes) -> str:
    """``data``'s hash as a wheel's ``RECORD`` writes it: ``sha256=<urlsafe base64, unpadded>``.

    Args:
        data: a member's bytes.
    """
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def verify_wheel_record(wheel: Path) -> int:
    """Check every member of ``wheel`` against the hashes in its ``RECORD``; return how many
    matched."""
    with zipfile.ZipFile(wheel) as z:
        record_name = next((n for n in z.namelist() if n.endswith(".dist-info/RECORD")), None)
        if record_name is None:
            raise SystemExit(f"{wheel}: no .dist-info/RECORD, not a wheel.")
        count = 0
        for row in csv.reader(io.StringIO(z.read(record_name).decode())):
            if len(row) < 2 or not row[1]:
                continue
            if record_hash(z.read(row[0])) != row[1]:
                raise SystemExit(f"{wheel}: {row[0]} differs from the wheel's RECORD.")
            count += 1
    return count


def wheel_version(wheel: Path) -> str:
    """The ``Version:`` in a wheel's ``METADATA``."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        match = re.search(r"^Version: (\S+)$", z.read(meta).decode(errors="replace"), flags=re.M)
    return match.group(1) if match else "?"


def read_manifest(directory: Path) -> dict:
    """The bundle's ``manifest.json``; ``SystemExit`` saying how to make it when it is missing.

    Args:
        directory: the bundle's folder.
    """
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
    if path.stat().st_size != entry["bytes"] or file_sha256(path) != entry["sha256"]:
        raise SystemExit(
            f"{path}: SHA-256 differs from the manifest (corrupted copy); copy it again."
        )


def verify_bundle(directory: Path) -> list[str]:
    """Check every file of the bundle against its manifest; return their names.

    Raises ``SystemExit`` naming the first missing or corrupted file.
    """
    entries = read_manifest(directory)["files"]
    for entry in entries:
        verify_bundle_entry(directory, entry)
    return [e["name"] for e in entries]


def manifest_entries(directory: Path, use: str | None = None) -> list[dict]:
    """The manifest's file entries, only those of ``use`` when given.

    Args:
        directory: the bundle's folder.
        use: ``te``, ``build``, ``runtime`` or ``library`` (every entry when ``None``).
    """
    return [e for e in read_manifest(directory)["files"] if use is None or e.get("use") == use]


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
    with urllib.request.urlopen(f"{SIMPLE_INDEX}/{project}/", timeout=120) as r:
        url, digest = sdist_link(r.read().decode(), project, version)
    target = directory / url.rsplit("/", 1)[1]
    print(f"+ fetch {url}", flush=True)
    with urllib.request.urlopen(url, timeout=600) as r:
        target.write_bytes(r.read())
    if file_sha256(target) != digest:
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
        kept = directory.parent / f".{directory.name}-{BUILT}"
        shutil.rmtree(kept, ignore_errors=True)
        if (directory / BUILT).is_dir():  # a wheel brought back: the build keeps it only if it
            (directory / BUILT).rename(kept)  # was built from the same sdist (built.json)
        shutil.rmtree(directory)
        directory.mkdir(parents=True)
        if kept.is_dir():
            kept.rename(directory / BUILT)
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
            run_echoed(cmd)
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
                "sha256": file_sha256(path),
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


# ----------------------------------------------------------------------------- commands, as shown


def shell_line(cmd: Sequence[str]) -> str:
    """``cmd`` as one shell line, each argument quoted where it needs it.

    Args:
        cmd: the command and its arguments.
    """
    return " ".join(shlex.quote(str(c)) for c in cmd)


def run_echoed(cmd: list[str]) -> None:
    """Print ``cmd`` after ``+`` (as ``set -x`` does), then run it.

    Args:
        cmd: the command and its arguments.

    Raises:
        subprocess.CalledProcessError: the command failed.
    """
    print("+", shell_line(cmd), flush=True)
    subprocess.run(cmd, check=True)
