"""Install TransformerEngine for JAX on a GPU node, online or from carried files.

Why: TE's JAX extension is an sdist compiled against the JAX that is already installed, it
needs cuDNN >= 9.12 and the cudnn-frontend headers, and its CUDA core wheel is 276 MB. GPU
nodes often come with JAX and CUDA preinstalled and no package index. This module does the
three things that go wrong by hand, each as a step that can be checked on a CPU machine:

* ``python -m tutorial_utils.tools.gpu_setup cudnn``: find the cuDNN runtime and refuse one older
  than 9.12.0, naming the version found;
* ``python -m tutorial_utils.tools.gpu_setup bundle DIR --cuda 13``: download every file the offline
  install needs (on a machine with a package index) and split those above 60 MiB into
  pieces, with SHA-256 checksums in ``DIR/manifest.json``;
* ``python -m tutorial_utils.tools.gpu_setup install DIR [--dry-run]``: verify and reassemble the
  pieces, then install offline: TE's Python and core wheels, cudnn-frontend and the small
  pure-Python needs, then TE's JAX extension built with ``--no-build-isolation``,
  ``NVTE_FRAMEWORK=jax`` and ``NVTE_CUDA_ARCHS`` against the installed JAX.

Every command line is printed before it runs; ``--dry-run`` prints them and runs nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

__all__ = ["MIN_CUDNN", "TE_VERSION", "PIECE_BYTES", "cudnn_version", "check_cudnn", "cuda_major", "split_file",
           "join_pieces", "bundle_requirements", "bundle", "sdist_link", "install_commands", "install", "run_commands",
           "run", "main"]

TE_VERSION = "2.20.2"
MIN_CUDNN = (9, 12, 0)  # transformer_engine/common/__init__.py refuses older runtimes
PIECE_BYTES = 60 * 2**20  # below the 64 MiB a single transfer may carry
MANIFEST = "manifest.json"


# ----------------------------------------------------------------------------- cuDNN and CUDA


def _decode(v: int) -> Tuple[int, int, int]:
    major_mag = 1000 if v < 90000 else 10000
    major, rest = divmod(v, major_mag)
    return (major, *divmod(rest, 100))


def _cudnn_libraries() -> List[str]:
    found = []
    for base in sys.path:
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


def cuda_major(nvcc_output: Optional[str] = None) -> int:
    """The CUDA major version to build for: ``CUDA_MAJOR``, else ``nvcc --version``, else the JAX plugin."""
    env = os.environ.get("CUDA_MAJOR", "").strip()
    if env:
        if env not in ("12", "13"):
            raise SystemExit(f"CUDA_MAJOR={env!r}: use 12 or 13.")
        return int(env)
    if nvcc_output is None:
        try:
            nvcc_output = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            nvcc_output = ""
    match = re.search(r"release (\d+)\.", nvcc_output or "")
    if match and match.group(1) in ("12", "13"):
        return int(match.group(1))
    for major in (13, 12):
        for name in (f"jax_cuda{major}_plugin", f"jax_plugins.xla_cuda{major}"):
            try:
                import importlib.util

                if importlib.util.find_spec(name) is not None:
                    return major
            except ModuleNotFoundError:
                pass
    raise SystemExit("cannot tell the CUDA major version: no nvcc on the PATH and no jax CUDA plugin; set CUDA_MAJOR=12 "
                     "or CUDA_MAJOR=13.")


# ----------------------------------------------------------------------------- pieces and checksums


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def split_file(path: Path, piece_bytes: int = PIECE_BYTES) -> dict:
    """Cut ``path`` into ``path.partNNN`` files of at most ``piece_bytes`` and delete it; return its entry."""
    if piece_bytes < 1:
        raise ValueError(f"piece_bytes={piece_bytes} must be positive.")
    path = Path(path)
    entry = {"name": path.name, "bytes": path.stat().st_size, "sha256": _sha256(path), "pieces": []}
    with open(path, "rb") as f:
        for i, block in enumerate(iter(lambda: f.read(piece_bytes), b"")):
            part = path.with_name(f"{path.name}.part{i:03d}")
            part.write_bytes(block)
            entry["pieces"].append({"name": part.name, "bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()})
    path.unlink()
    return entry


def join_pieces(directory: Path) -> List[Path]:
    """Verify every piece and whole file listed in the manifest, reassembling split files.

    Raises ``SystemExit`` naming the first missing or corrupted file; never leaves a
    half-written file under its final name.
    """
    directory = Path(directory)
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise SystemExit(f"{manifest_path} not found: run `python -m tutorial_utils.tools.gpu_setup bundle {directory}` on a "
                         "machine with a package index and copy the folder here.")
    manifest = json.loads(manifest_path.read_text())
    files = []
    for entry in manifest["files"]:
        target = directory / entry["name"]
        if target.is_file() and target.stat().st_size == entry["bytes"] and _sha256(target) == entry["sha256"]:
            files.append(target)
            continue
        if not entry.get("pieces"):
            raise SystemExit(f"{target}: missing or its SHA-256 differs from the manifest; copy it again.")
        tmp = target.with_name(target.name + ".joining")
        with open(tmp, "wb") as out:
            for piece in entry["pieces"]:
                part = directory / piece["name"]
                if not part.is_file():
                    tmp.unlink()
                    raise SystemExit(f"{part}: piece missing ({len(entry['pieces'])} pieces make {entry['name']}); "
                                     "copy it and run again.")
                data = part.read_bytes()
                if hashlib.sha256(data).hexdigest() != piece["sha256"]:
                    tmp.unlink()
                    raise SystemExit(f"{part}: SHA-256 differs from the manifest (corrupted copy); copy it again.")
                out.write(data)
        if _sha256(tmp) != entry["sha256"]:
            tmp.unlink()
            raise SystemExit(f"{target}: reassembled file does not match the manifest's SHA-256.")
        tmp.replace(target)
        files.append(target)
    return files


# ----------------------------------------------------------------------------- what to carry, how to install


def bundle_requirements(cuda: int) -> List[Tuple[str, bool]]:
    """``(requirement, binary_for_the_target)`` pairs the offline install needs, beyond the node's JAX."""
    if cuda not in (12, 13):
        raise ValueError(f"cuda={cuda!r}: use 12 or 13.")
    return [
        (f"transformer-engine=={TE_VERSION}", False),  # TE's Python (pure-Python wheel)
        (f"transformer-engine-cu{cuda}=={TE_VERSION}", True),  # TE's CUDA core library (276 MB for cu13)
        (f"transformer-engine-jax=={TE_VERSION}", False),  # the JAX extension, an sdist compiled on the node
        ("nvidia-cudnn-frontend", True),  # headers the extension's build needs
        ("pydantic>=2", False), ("pydantic-core", True), ("annotated-types", False), ("typing-inspection", False),
    ]


SIMPLE_INDEX = "https://pypi.org/simple"


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


def bundle(directory: Path, cuda: int, python_version: str = "3.12", dry_run: bool = False) -> List[List[str]]:
    """Download the requirements for a Linux x86_64 node with ``python_version`` and split large files."""
    directory = Path(directory)
    commands = []
    for req, binary in bundle_requirements(cuda):
        if req.startswith("transformer-engine-jax"):
            commands.append(["fetch-sdist", "transformer-engine-jax", TE_VERSION])
            continue
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(directory), req]
        if binary:
            cmd += ["--only-binary=:all:", "--python-version", python_version, "--platform", "manylinux_2_28_x86_64",
                    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]
        commands.append(cmd)
    if dry_run:
        return commands
    directory.mkdir(parents=True, exist_ok=True)
    for cmd in commands:
        if cmd[0] == "fetch-sdist":
            _fetch_sdist(cmd[1], cmd[2], directory)
        else:
            _run(cmd)
    files = []
    for path in sorted(p for p in directory.iterdir() if p.is_file() and p.name != MANIFEST and ".part" not in p.name):
        if path.stat().st_size > PIECE_BYTES:
            files.append(split_file(path))
        else:
            files.append({"name": path.name, "bytes": path.stat().st_size, "sha256": _sha256(path), "pieces": []})
    (directory / MANIFEST).write_text(json.dumps({"te_version": TE_VERSION, "cuda": cuda, "files": files}, indent=2))
    return commands


def install_commands(files: Sequence[Path], *, cuda_archs: str = "90", editable: Path = Path(".")) -> List[List[str]]:
    """The offline install, in order: wheels (no index, no deps), TE's JAX extension, this package."""
    files = [Path(f) for f in files]
    sdists = [f for f in files if f.name.endswith((".tar.gz", ".zip")) and "jax" in f.name.lower()]
    wheels = [f for f in files if f.suffix == ".whl"]
    if len(sdists) != 1:
        raise SystemExit(f"expected exactly one transformer_engine_jax sdist in the bundle, found {[f.name for f in sdists]}.")
    pip = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps"]
    env = ["env", "NVTE_FRAMEWORK=jax", f"NVTE_CUDA_ARCHS={cuda_archs}", "MAX_JOBS=" + str(os.cpu_count() or 4)]
    return [
        pip + [str(w) for w in wheels],
        env + pip + ["--no-build-isolation", str(sdists[0])],
        pip + ["--no-build-isolation", "-e", str(editable)],
    ]


def _shell(cmd: Sequence[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)


def _run(cmd: List[str]) -> None:
    print("+", _shell(cmd), flush=True)
    subprocess.run(cmd, check=True)


def install(directory: Path, *, dry_run: bool = False, cuda_archs: str = "90") -> List[List[str]]:
    files = join_pieces(directory)
    commands = install_commands(files, cuda_archs=cuda_archs)
    for cmd in commands:
        if dry_run:
            print("+", _shell(cmd))
        else:
            _run(cmd)
    return commands


#: ``(name, seconds allowed)`` of the one-GPU run; 11 minutes in all, inside a 12-minute lease.
RUN_STEPS = (("install", 300), ("check", 120), ("bench-single", 90), ("bench-emulated", 150))


def run_commands(bundle_dir: Path, out: Path, python: str = sys.executable) -> List[Tuple[str, int, List[str]]]:
    """The exact command lines of ``make gpu-run``: install TE offline, check it, time the seed workload."""
    budget = dict(RUN_STEPS)
    mod = [python, "-m"]
    bench = mod + ["tutorial_utils.tools.bench", "--preset", "seed", "--windows", "8192", "--out", str(out), "--no-progress"]
    return [
        ("install", budget["install"], mod + ["tutorial_utils.tools.gpu_setup", "install", str(bundle_dir)]),
        ("check", budget["check"], mod + ["tutorial_utils.tools.check", "--out", str(out / "checks" / "gpu-check.json")]),
        ("bench-single", budget["bench-single"], bench + ["--strategies", "single", "--name", "gpu-seed-single"]),
        ("bench-emulated", budget["bench-emulated"],
         bench + ["--emulate-ranks", "4", "--strategies", "ring,allgather,ulysses", "--stripes", "128,256,512",
                  "--name", "gpu-seed-emulated-4"]),
    ]


def run(bundle_dir: Path, out: Path, *, dry_run: bool = False, python: str = sys.executable) -> dict:
    """Run every step with its time limit, go on after a failure, and write ``out/gpu-run.json``.

    A failed install leaves TE out: the check and the benchmarks then run the reference on the
    GPU, and their records say so (source ``gpu-reference``).
    """
    out = Path(out)
    steps = run_commands(bundle_dir, out, python)
    summary = {"steps": []}
    if dry_run:
        for name, limit, cmd in steps:
            print(f"+ [{name}, <= {limit} s]", _shell(cmd))
        return summary
    import time

    out.mkdir(parents=True, exist_ok=True)
    for name, limit, cmd in steps:
        print(f"+ [{name}, <= {limit} s]", _shell(cmd), flush=True)
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
            rc, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as err:
            rc, text = "timeout", (err.stdout or b"").decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        seconds = round(time.perf_counter() - start, 1)
        print(text[-4000:], flush=True)
        summary["steps"].append({"name": name, "rc": rc, "seconds": seconds, "limit_s": limit, "tail": text[-2000:]})
        (out / "gpu-run.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tutorial_utils.tools.gpu_setup", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("cudnn", help="print the cuDNN runtime found; exit 1 if missing or < 9.12.0")
    sub.add_parser("cuda", help="print the CUDA major version TE will be built for")
    b = sub.add_parser("bundle", help="download and split the files of an offline install")
    b.add_argument("dir", type=Path)
    b.add_argument("--cuda", type=int, choices=(12, 13), default=13)
    b.add_argument("--python-version", default="3.12")
    b.add_argument("--dry-run", action="store_true")
    i = sub.add_parser("install", help="verify, reassemble and install a bundle offline")
    i.add_argument("dir", type=Path)
    i.add_argument("--cuda-archs", default="90", help="NVTE_CUDA_ARCHS for the extension build (90 = Hopper)")
    i.add_argument("--dry-run", action="store_true")
    r = sub.add_parser("run", help="install from a bundle, check, and time the seed workload on one GPU")
    r.add_argument("--bundle", type=Path, default=Path("gpu-bundle"))
    r.add_argument("--out", type=Path, default=Path("results"))
    r.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "cudnn":
        print(check_cudnn())
    elif args.cmd == "cuda":
        print(cuda_major())
    elif args.cmd == "bundle":
        for cmd in bundle(args.dir, args.cuda, args.python_version, dry_run=args.dry_run):
            if args.dry_run:
                print("+", _shell(cmd))
    elif args.cmd == "install":
        install(args.dir, dry_run=args.dry_run, cuda_archs=args.cuda_archs)
    else:
        summary = run(args.bundle, args.out, dry_run=args.dry_run)
        return 0 if all(step["rc"] == 0 for step in summary["steps"]) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
