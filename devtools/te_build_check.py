"""TE 2.20.2's real build, cut to what fits a CI run: configure, every include, one compile.

A development tool. ``make gpu-rehearse`` builds the whole extension wheel (19 C++ files:
about 1.5 minutes on the node's 16 cores, bounded by ``attention.cpp``, about 5 on 2 cores);
this does the part that decides whether a build can work at all, in seconds, so that the test
suite can hold it:

* a folder laid out as the node's site-packages (:data:`NODE_PARTS`: CUDA 13.0's ``nvcc`` and
  headers, cuBLAS, cuDNN and NCCL at the versions the node's torch 2.11.0 pins, JAX's CUDA
  plugin), filled from PyPI with HTTP range requests: only the members needed, each checked
  against its wheel's ``RECORD``;
* TE's sdist unpacked, and its own ``setup.py`` run (``build_ext``) with that folder on the
  Python path; every C++ file preprocessed (each ``#include`` found) and one compiled;
  linking is skipped;
* the version TE's ``te_version()`` gives in that environment.

The bundle's build wheels (cudnn-frontend, nvtx, pybind11) come from the same pins as
``gpu_setup``'s, so that leaving one out reproduces the failure the GPU run would hit.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import time
import urllib.request
import zlib
from collections.abc import Sequence
from pathlib import Path

from tutorial_utils.cli import gpu_setup as G

INDEX = "https://pypi.org/simple"
CACHE = Path("_build_cache") / "te-build"
#: The compiled translation unit: the smallest that includes ``extensions.h``, and so cuDNN's,
#: cuBLAS's, NVTX's and XLA's headers.
COMPILED = "cudnn.cpp"


def _pins() -> dict[str, str]:
    return {r.name: r.version for r in G.bundle_requirements(13)}


#: ``(project, version, members)``: what the node's site-packages holds that TE's build reads,
#: at the node image's versions (``devtools/gpu_node.py``'s ``NODE_IMAGE``: CUDA 13.0 as torch
#: 2.11.0's ``cuda-toolkit==13.0.2`` pins it, cuBLAS 13.1, cuDNN 9.19, NCCL 2.28.9). ``None``
#: takes the whole wheel; a tuple takes the members under those prefixes (and the
#: ``.dist-info``, so that ``importlib.metadata`` finds the project, as TE's build asks it).
NODE_PARTS: tuple[tuple[str, str, tuple[str, ...] | None], ...] = (
    ("nvidia-cuda-nvcc", "13.0.88", ("nvidia/cu13/bin/nvcc",)),
    ("nvidia-cuda-runtime", "13.0.96", None),
    ("nvidia-cuda-crt", "13.0.88", None),
    ("nvidia-cuda-cccl", "13.0.85", None),
    ("nvidia-cuda-nvrtc", "13.0.88", ("nvidia/cu13/include/",)),
    ("nvidia-cublas", "13.1.0.3", ("nvidia/cu13/include/",)),
    ("nvidia-cudnn-cu13", "9.19.0.56", ("nvidia/cudnn/include/",)),
    ("nvidia-nccl-cu13", "2.28.9", ("nvidia/nccl/include/",)),
)
#: What the GPU run installs into its build environment (``use="build"`` in ``gpu_setup``).
BUILD_PARTS = tuple(r.name for r in G.bundle_requirements(13) if r.use == "build")


# ----------------------------------------------------------------------------- wheels, by range


def _get(url: str, start: int | None = None, end: int | None = None) -> bytes:
    headers = {} if start is None else {"Range": f"bytes={start}-{'' if end is None else end}"}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=120) as r:
        return r.read()


def _tag_ok(name: str) -> bool:
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    parts = name[:-4].split("-")
    pytag, abi, plat = parts[-3], parts[-2], parts[-1]
    return (
        (pytag.startswith("py3") or py in pytag.split("."))
        and abi in ("none", "abi3", py)
        and (plat == "any" or "x86_64" in plat)
    )


def wheel_url(project: str, version: str) -> str:
    """The URL of ``project``'s ``version`` wheel for this Python on Linux x86_64, from PyPI's
    simple index."""
    page = _get(f"{INDEX}/{project}/").decode()
    stem = re.escape(project.replace("-", "_"))
    for url, name in re.findall(
        r'href="([^"#]*/(' + stem + r"-" + re.escape(version) + r'-[^"#/]+\.whl))', page, flags=re.I
    ):
        if _tag_ok(name):
            return url
    raise SystemExit(f"no {project} {version} wheel for this Python on Linux x86_64 in {INDEX}.")


def _central_directory(url: str) -> tuple[int, list[dict]]:
    size = int(
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=60).headers[
            "Content-Length"
        ]
    )
    tail = _get(url, max(0, size - 65536), size - 1)
    eocd = tail.rfind(b"PK\x05\x06")
    if eocd < 0:
        raise SystemExit(f"{url}: no end of central directory, not a zip.")
    cd_size, cd_offset = struct.unpack("<II", tail[eocd + 12 : eocd + 20])
    cd = _get(url, cd_offset, cd_offset + cd_size - 1)
    entries, i = [], 0
    while i + 46 <= len(cd) and cd[i : i + 4] == b"PK\x01\x02":
        (method,) = struct.unpack("<H", cd[i + 10 : i + 12])
        csize, usize = struct.unpack("<II", cd[i + 20 : i + 28])
        nlen, xlen, clen = struct.unpack("<HHH", cd[i + 28 : i + 34])
        (offset,) = struct.unpack("<I", cd[i + 42 : i + 46])
        name = cd[i + 46 : i + 46 + nlen].decode()
        mode = struct.unpack("<I", cd[i + 38 : i + 42])[0] >> 16
        entries.append(
            {
                "name": name,
                "method": method,
                "csize": csize,
                "usize": usize,
                "offset": offset,
                "mode": mode,
            }
        )
        i += 46 + nlen + xlen + clen
    return size, entries


def _spans(entries: list[dict], size: int, gap: int = 1 << 20) -> list[tuple[int, int, list[dict]]]:
    """Group members whose bytes lie close together, so that one request fetches several."""
    ordered = sorted(entries, key=lambda e: e["offset"])
    spans: list[tuple[int, int, list[dict]]] = []
    for e in ordered:
        end = min(size - 1, e["offset"] + 30 + len(e["name"].encode()) + 1024 + e["csize"])
        if spans and e["offset"] - spans[-1][1] < gap:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end), spans[-1][2] + [e])
        else:
            spans.append((e["offset"], end, [e]))
    return spans


def _member(blob: bytes, start: int, entry: dict) -> bytes:
    i = entry["offset"] - start
    if blob[i : i + 4] != b"PK\x03\x04":
        raise SystemExit(f"{entry['name']}: no local header where the central directory says.")
    nlen, xlen = struct.unpack("<HH", blob[i + 26 : i + 30])
    data = blob[i + 30 + nlen + xlen : i + 30 + nlen + xlen + entry["csize"]]
    if entry["method"] == 8:
        data = zlib.decompress(data, -15)
    elif entry["method"] != 0:
        raise SystemExit(f"{entry['name']}: compression method {entry['method']} not handled.")
    return data


def fetch_members(project: str, version: str, prefixes: Sequence[str] | None, dest: Path) -> int:
    """Extract from ``project``'s wheel the members under ``prefixes`` (all when ``None``) and its
    ``.dist-info`` into ``dest``, each checked against the wheel's ``RECORD``; returns bytes
    fetched.
    """
    url = wheel_url(project, version)
    size, entries = _central_directory(url)
    info = next(
        e["name"].split("/")[0]
        for e in entries
        if e["name"].count("/") == 1 and e["name"].endswith(".dist-info/RECORD")
    )
    wanted = [
        e
        for e in entries
        if not e["name"].endswith("/")
        and (prefixes is None or e["name"].startswith(tuple(prefixes) + (info + "/",)))
    ]
    fetched, blobs = 0, {}
    for start, end, members in _spans(wanted, size):
        blob = _get(url, start, end)
        fetched += len(blob)
        for e in members:
            blobs[e["name"]] = (_member(blob, start, e), e["mode"])
    record = {
        row[0]: row[1]
        for row in csv.reader(io.StringIO(blobs[f"{info}/RECORD"][0].decode()))
        if len(row) > 1
    }
    for name, (data, mode) in blobs.items():
        if record.get(name) and record[name] != G.record_hash(data):
            raise SystemExit(f"{project} {version}: {name} differs from the wheel's RECORD.")
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if mode & 0o111:
            path.chmod(0o755)
    if prefixes is not None and not [n for n in blobs if not n.startswith(info)]:
        raise SystemExit(f"{project} {version}: nothing under {list(prefixes)}.")
    return fetched


def prepare(cache: Path = CACHE) -> dict:
    """Fill ``cache`` once: ``node/`` (what ``jax[cuda13]`` installs, as TE's build reads it),
    ``build/<project>/`` (each build wheel alone, so that a test can leave one out), and TE's sdist.

    Returns the stamp: what was fetched, the bytes and the seconds.
    """
    import jaxlib

    tag = f"py{sys.version_info[0]}{sys.version_info[1]}-jaxlib{jaxlib.__version__}"
    root = Path(cache) / tag
    stamp = root / "prepared.json"
    parts = list(NODE_PARTS) + [("jax-cuda13-plugin", jaxlib.__version__, None)]
    if stamp.is_file():
        info = json.loads(stamp.read_text())
        if [list(p[:2]) for p in parts] == info["node"]:
            return info
        shutil.rmtree(root / "node", ignore_errors=True)  # other versions: fetch them again
    start, fetched, pins = time.perf_counter(), 0, _pins()
    node = root / "node"
    for project, version, prefixes in parts:
        fetched += fetch_members(project, version, prefixes, node)
    for project in BUILD_PARTS:
        fetched += fetch_members(project, pins[project], None, root / "build" / project)
    sdist = root / f"transformer_engine_jax-{G.TE_VERSION}.tar.gz"
    url, digest = G.sdist_link(
        _get(f"{INDEX}/transformer-engine-jax/").decode(), "transformer-engine-jax", G.TE_VERSION
    )
    data = _get(url)
    if hashlib.sha256(data).hexdigest() != digest:
        raise SystemExit(f"{url}: SHA-256 differs from the index's.")
    sdist.write_bytes(data)
    fetched += len(data)
    info = {
        "node": [p[:2] for p in parts],
        "build": {p: pins[p] for p in BUILD_PARTS},
        "sdist": sdist.name,
        "bytes_fetched": fetched,
        "seconds": round(time.perf_counter() - start, 1),
        "root": str(root),
    }
    stamp.write_text(json.dumps(info, indent=2))
    return info


# ----------------------------------------------------------------------------- the build, cut short

#: Hooks put around the GPU run's own build script (``gpu_install._SETUP_PY``, which runs TE's
#: ``setup.py bdist_wheel`` under ``ParallelCompile``): every C++ file but one is only
#: preprocessed, the link is skipped, and what happened is written to a report.
_HOOKS = """\
import json, os, sys, threading
src, dest, jobs, compiled, report, version_only, setup_py = sys.argv[1:8]
sys.path.insert(0, src)
from build_tools.te_version import te_version
done = {"version": te_version(), "preprocessed": [], "compiled": [], "include_dirs": [],
"peak_parallel": 0}
if version_only == "1":
    json.dump(done, open(report, "w"))
    sys.exit(0)
import setuptools
from distutils import unixccompiler
real, live, lock = unixccompiler.UnixCCompiler._compile, [0], threading.Lock()
def one(self, obj, src_file, ext, cc_args, extra_postargs, pp_opts):
    with lock:
        live[0] += 1
        done["peak_parallel"] = max(done["peak_parallel"], live[0])
    try:
        name = os.path.basename(src_file)
        if name == compiled:
            done["compiled"].append(name)
            return real(self, obj, src_file, ext, cc_args, extra_postargs, pp_opts)
        done["preprocessed"].append(name)
        return real(self, obj, src_file, ext, ["-E" if a == "-c" else a for a in cc_args],
        extra_postargs, pp_opts)
    finally:
        with lock:
            live[0] -= 1
unixccompiler.UnixCCompiler._compile = one
class Linked(Exception):
    pass
def link(self, *args, **kwargs):
    raise Linked()
unixccompiler.UnixCCompiler.link = link
from setuptools.command import build_ext as _be
orig = _be.build_ext.build_extension
def build_extension(self, ext):
    done["include_dirs"] = [str(d) for d in ext.include_dirs]
    return orig(self, ext)
_be.build_ext.build_extension = build_extension
sys.argv = [sys.argv[0], src, dest, jobs]
try:
    exec(compile(open(setup_py).read(), "gpu_install._SETUP_PY", "exec"), {"__name__": "__main__"})
except Linked:
    done["stopped_before_link"] = True
json.dump(done, open(report, "w"))
"""


def configure_and_compile(
    root: Path,
    work: Path,
    leave_out: Sequence[str] = (),
    local_version: bool = False,
    compiled: str = COMPILED,
    jobs: int = 2,
    version_only: bool = False,
    timeout: float = 300,
) -> dict:
    """Run the GPU run's build step on TE's unpacked sdist in ``work``, cut short by :data:`_HOOKS`.

    The environment is :func:`gpu_setup.build_command`'s (``CPLUS_INCLUDE_PATH``, ``NVTE_*``,
    ``NVTE_NO_LOCAL_VERSION=1``), with the node's folder and the build wheels (less
    ``leave_out``) on the Python path as the build step puts its build environment there;
    ``local_version`` unsets ``NVTE_NO_LOCAL_VERSION``, as the old plan did.

    Returns ``{"rc", "seconds", "output", "report"}``; ``report`` (when the runner got that far)
    has TE's version, the include folders, the files preprocessed and compiled, and how many
    compiled at once. With ``version_only``, it stops after the version.
    """
    root, work = Path(root).resolve(), Path(work).resolve()
    src = work / f"transformer_engine_jax-{G.TE_VERSION}"
    shutil.rmtree(src, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    with tarfile.open(root / f"transformer_engine_jax-{G.TE_VERSION}.tar.gz") as tar:
        tar.extractall(work)
    sites = [str(root / "node")] + [
        str(root / "build" / p) for p in BUILD_PARTS if p not in leave_out
    ]
    base = {
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "JAX_PLATFORMS": "cpu",
    }
    cmd, env = G.build_command(src, work / "dist", jobs, sites=sites, env=base)
    env["PYTHONPATH"] = os.pathsep.join(
        sites + [p for p in sys.path if p.endswith("site-packages")]
    )
    if local_version:
        env.pop("NVTE_NO_LOCAL_VERSION")
    setup_py, report = work / "setup_runner.py", work / "report.json"
    setup_py.write_text(cmd[2])
    report.unlink(missing_ok=True)
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _HOOKS,
            str(src),
            str(work / "dist"),
            str(jobs),
            compiled,
            str(report),
            "1" if version_only else "0",
            str(setup_py),
        ],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return {
        "rc": proc.returncode,
        "seconds": round(time.perf_counter() - start, 1),
        "output": proc.stdout + proc.stderr,
        "sources": sorted(p.name for p in src.glob("csrc/**/*.cpp")),
        "env": {k: env[k] for k in sorted(env) if k != "PATH"},
        "report": json.loads(report.read_text()) if report.is_file() else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python devtools/te_build_check.py", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--cache", type=Path, default=CACHE)
    p.add_argument("--leave-out", action="append", default=[], choices=BUILD_PARTS)
    p.add_argument("--local-version", action="store_true", help="leave NVTE_NO_LOCAL_VERSION unset")
    args = p.parse_args(argv)
    info = prepare(args.cache)
    print(
        f"prepared: {info['bytes_fetched'] / 2**20:.1f} MiB fetched in {info['seconds']} s ->"
        f" {info['root']}"
    )
    result = configure_and_compile(
        Path(info["root"]), Path(info["root"]) / "work", args.leave_out, args.local_version
    )
    print(result["output"][-3000:])
    print(json.dumps({k: v for k, v in result.items() if k != "output"}, indent=2))
    ok = result["rc"] == 0 and result["report"] and result["report"].get("stopped_before_link")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
