"""Rehearse the carry plan here, with TE's real build, on a node laid out as the lent one.

A development tool (``python devtools/gpu_carry.py rehearse``, ``make gpu-rehearse``). The node is
:func:`gpu_node.make_node`'s: the image's JAX, Flax and torch from the registry (pip's CUDA 13.0
libraries at torch's pins), and a CUDA 13.0 toolkit at ``CUDA_HOME`` with NVRTC and cuRAND, so
that TE's loader takes the node's branch. Every call's files are copied into a fresh device tree
and every call's command runs there with the node's Python: TE's sdist built by its own
``setup.py`` (detached, as on the machine), the wheels installed, and the import gate run as far
as a machine without a driver allows.

The verdict does not depend on how busy this machine is: the build runs under its limit scaled
by this machine's cores (:func:`scaled_build_limit`), and what is asserted is the build's
projected time on the node's 16 cores (:func:`projected_build_seconds`), from the CPU seconds of
each compile, timed through a wrapper around the same compiler (:func:`timed_compiler`).
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import gpu_carry as C
import gpu_node as N

from tutorial_utils.cli import gpu_setup as G

__all__ = [
    "NODE_CORES",
    "scaled_build_limit",
    "timed_compiler",
    "projected_build_seconds",
    "driver_stub",
    "rehearse",
]

#: The lent node's cores, which the build's limit is sized for.
NODE_CORES = 16
#: Seconds of a build that no compile overlaps: TE's ``setup.py``, pybind11's flag probes, the
#: link and the wheel.
BUILD_SERIAL_S = 15


def scaled_build_limit(cores: int | None = None) -> int:
    """The build step's limit for a machine of ``cores`` (this one's when ``None``): the node's
    limit times ``NODE_CORES / cores``, so that a small, busy machine does not time out a build
    the node would finish."""
    cores = cores or os.cpu_count() or 1
    return math.ceil(G.STEP_SECONDS["build"] * max(1.0, NODE_CORES / cores))


#: The compiler wrapper: runs the real compiler and appends its source file and CPU seconds.
_WRAPPER = """\
#!{python}
import json, os, resource, subprocess, sys
rc = subprocess.call([{real!r}, *sys.argv[1:]])
use = resource.getrusage(resource.RUSAGE_CHILDREN)
src = next((a for a in sys.argv[1:] if a.endswith((".cpp", ".cc", ".cu", ".c"))), None)
with open({log!r}, "a") as f:
    f.write(json.dumps({{"src": src, "cpu_s": use.ru_utime + use.ru_stime}}) + "\\n")
sys.exit(rc)
"""


def timed_compiler(work: Path) -> tuple[dict[str, str], Path]:
    """``({"CC": ..., "CXX": ...}, log)``: wrappers around ``gcc`` and ``g++`` that log each
    compile's source and CPU seconds (setuptools compiles C++ with ``CXX``, C with ``CC``).

    Args:
        work: the folder for the wrappers and the log.
    """
    work.mkdir(parents=True, exist_ok=True)
    log = work / "compiles.jsonl"
    log.unlink(missing_ok=True)
    env = {}
    for var, real in (("CC", "gcc"), ("CXX", "g++")):
        wrapper = work / f"{real}-timed"
        wrapper.write_text(
            _WRAPPER.format(python=sys.executable, real=shutil.which(real) or real, log=str(log))
        )
        wrapper.chmod(0o755)
        env[var] = str(wrapper)
    return env, log


def projected_build_seconds(compiles: Sequence[dict], cores: int = NODE_CORES) -> dict:
    """The build's time on ``cores`` cores from its compiles' CPU seconds.

    ``max(longest compile, all compiles / cores) + BUILD_SERIAL_S``: the files compile in
    parallel, so the longest one (``attention.cpp``) bounds the build from below.

    Args:
        compiles: ``{"src", "cpu_s"}`` per compile (the wrapper's log).
        cores: the node's cores.
    """
    sources = [c for c in compiles if c.get("src") and not c["src"].endswith("flagcheck.cpp")]
    total = sum(c["cpu_s"] for c in sources)
    longest = max(sources, key=lambda c: c["cpu_s"], default={"src": None, "cpu_s": 0.0})
    return {
        "files": len(sources),
        "cpu_s": round(total, 1),
        "longest": {
            "src": longest["src"] and Path(longest["src"]).name,
            "cpu_s": round(longest["cpu_s"], 1),
        },
        "projected_s": round(max(longest["cpu_s"], total / cores) + BUILD_SERIAL_S, 1),
        "cores": cores,
    }


def _node_facts(python: Path, env: dict[str, str]) -> dict:
    code = (
        "import json, sysconfig, sys; sys.path.insert(0, 'src');"
        "from tutorial_utils.cli import gpu_setup as G;"
        "from importlib.metadata import version;"
        "pure = sysconfig.get_path('purelib');"
        "print(json.dumps({'python': sys.version.split()[0], 'jax': version('jax'),"
        "'nvcc': str(G.te_nvcc()), 'frontend': G.installed_version('nvidia-cudnn-frontend'),"
        "'nvtx': str(G.nvtx_include_dir([G.te_nvcc().parent.parent])) if G.te_nvcc() else None,"
        "'curand': str(G.te_library('curand')), 'cudnn': str(G.cudnn_version())}))"
    )
    proc = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _device_tree(work: Path, root: Path) -> Path:
    """A copy of the working tree as the machine gets it: a git checkout (so that TE's
    ``te_version`` would append a commit), with no bundle."""
    device = work / "device"
    shutil.rmtree(device, ignore_errors=True)
    device.mkdir(parents=True)
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, files):
        src = root / name
        if src.is_file():
            (device / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, device / name)
    git = ["git", "-c", "user.name=rehearsal", "-c", "user.email=rehearsal@localhost"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "device tree"]):
        subprocess.run(git + args, cwd=device, check=True)
    return device


def driver_stub(work: Path, purelib: Path) -> Path:
    """A stand-in ``libcuda.so.1`` whose every function returns CUDA_ERROR_NO_DEVICE (100).

    Why: without a driver, TE's import stops at the first library that links the driver
    (cuDNN's runtime-compiled engines). With this stand-in it goes on through everything that
    does not need a GPU (cuRAND, NVRTC, the core library, the extension, the version checks),
    so those are rehearsed too. Its symbols are the driver functions that the installed
    libraries need, read with ``nm``.
    """
    needed = set()
    for lib in list(purelib.glob("nvidia/**/*.so*")) + list(
        purelib.glob("transformer_engine*/**/*.so*")
    ):
        if not lib.is_file():
            continue
        dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
        if "libcuda.so.1" not in dyn:
            continue
        syms = subprocess.run(
            ["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True
        ).stdout
        needed |= {m for m in re.findall(r"\bU (cu[A-Z]\w*)", syms)}
    folder = work / "driver-stub"
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "stub.c"
    source.write_text(
        "".join(f"int {s}(void) {{ return 100; }}\n" for s in sorted(needed))
        or "int cuInit(void){return 100;}\n"
    )
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            str(folder / "libcuda.so.1"),
            str(source),
        ],
        check=True,
    )
    return folder


def rehearse(
    bundle_dir: Path,
    work: Path,
    python: str,
    packages: Sequence[str] = N.NODE_PACKAGES,
    root: Path = Path("."),
) -> dict:
    """Play the plan here: every call's files copied into a fresh device tree, every call's command
    run with the node's Python, TE's real sdist built by its real ``setup.py``, the wheels
    installed, and the import gate run as far as a machine without a driver allows.

    Passes when every step before the gate succeeds, the build's projected time on the node's
    cores is within its limit, and the gate fails only for want of a driver: at
    ``libcuda.so.1`` without one, and at "JAX sees no GPU" with a stand-in driver
    (:func:`driver_stub`) that lets TE's import go through.
    """
    work, root = Path(work).resolve(), Path(root).resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    node_python, cuda_home = N.make_node(work, python, packages)
    compilers, compiles = timed_compiler(work / "cc")
    env = {
        "PATH": f"{node_python.parent}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "CUDA_HOME": str(cuda_home),  # the node's system toolkit: nvcc 13.0, NVRTC, cuRAND
        **compilers,
    }  # no LD_LIBRARY_PATH, no system nvcc on the PATH
    device = _device_tree(work, root)
    facts = _node_facts(node_python, {**env, "PYTHONPATH": str(root / "src")})
    print(f"node: {json.dumps(facts)}", flush=True)
    report = {"node": facts, "packages": list(packages), "calls": [], "ok": False}
    purelib = N.purelib_of(node_python, env)
    lacks = C._needed_libraries(C._carry(root / bundle_dir), env=env, purelib=purelib)
    plan = C.carry_plan(Path(bundle_dir), sum(C.working_tree_bytes(root)), libraries=lacks)
    report["lacks"] = lacks
    limit = scaled_build_limit()
    report["build_limit_s"] = limit
    for item in plan:
        for path in item["carry"]:
            src, dst = root / path, device / path
            dst.parent.mkdir(parents=True, exist_ok=True)
            (
                shutil.copytree(src, dst, dirs_exist_ok=True)
                if src.is_dir()
                else shutil.copy2(src, dst)
            )
        out = work / "out" / f"call{item['call']}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        cmd = (
            item["command"]
            .replace("PYTHONPATH=src python3", str(node_python))
            .replace("$OUT", str(out))
        ).split() + ["--build-limit", str(limit)]
        start = time.perf_counter()
        proc = subprocess.run(
            cmd,
            cwd=device,
            env={**env, "PYTHONPATH": "src"},
            capture_output=True,
            text=True,
            timeout=item["seconds"] + limit + 120,
        )
        (work / f"call{item['call']}.log").write_text(proc.stdout + proc.stderr)
        summary = {
            "call": item["call"],
            "rc": proc.returncode,
            "seconds": round(time.perf_counter() - start, 1),
            "limit_s": item["seconds"],
            "bytes": item["bytes"],
            "steps": item["steps"],
            "output_lines": len((proc.stdout + proc.stderr).splitlines()),
        }
        results = sorted(out.glob("results/gpu-run/call*.json"))
        if results:
            summary["run"] = json.loads(results[0].read_text())["steps"]
        report["calls"].append(summary)
        print(
            f"call {item['call']}/{len(plan)}: rc={proc.returncode} in {summary['seconds']} s",
            flush=True,
        )
        if proc.returncode != 0:
            break
    detached = C.build_status(device / bundle_dir)
    report["build"] = {
        "status": detached,
        **projected_build_seconds(
            [json.loads(x) for x in compiles.read_text().splitlines()] if compiles.is_file() else []
        ),
    }
    report.update(_verdict(report, plan, work, device, node_python, env))
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["cpu_s"] = round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 1)
    (work / "rehearsal.json").write_text(json.dumps(report, indent=2))
    return report


def _purelib(python: Path, env: dict[str, str]) -> Path:
    code = "import sysconfig; print(sysconfig.get_path('purelib'))"
    return Path(
        subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, env=env, check=True
        ).stdout.strip()
    )


def _first_line(text: str, needle: str) -> str:
    return next((line for line in text.splitlines() if needle in line), text[-400:])


def _verdict(
    report: dict, plan: list[dict], work: Path, device: Path, python: Path, env: dict[str, str]
) -> dict:
    """Every step before the gate passed, the build's projected time on the node fits its limit,
    and the gate failed only for want of a driver."""
    last = report["calls"][-1] if report["calls"] else {}
    steps = {s["name"]: s for c in report["calls"] for s in c.get("run", [])}
    problems = [
        f"{name}: rc={s['rc']}"
        for name, s in steps.items()
        if name != "gate" and s.get("rc") not in (0, None)
    ]
    build = report.get("build", {})
    if build.get("status", {}).get("rc", 0) not in (0, None):
        problems.append(f"the detached build failed: {build['status']}")
    if build.get("files") and build["projected_s"] > G.STEP_SECONDS["build"]:
        problems.append(
            f"the build's projected time on {build['cores']} cores, {build['projected_s']} s"
            f" (longest compile {build['longest']}), exceeds its limit of"
            f" {G.STEP_SECONDS['build']} s"
        )
    if last.get("call") != len(plan):
        problems.append(
            f"stopped at call {last.get('call')} of {len(plan)} (see"
            f" {work}/call{last.get('call')}.log)"
        )
    result = {
        "problems": problems,
        "ok": False,
        "steps_ok": [n for n, s in steps.items() if s.get("rc") == 0],
    }
    if "gate" not in steps:
        problems.append("the import gate never ran")
        return result
    log = work / "out" / f"call{last['call']}" / "results" / "gpu-run" / f"call{last['call']}.log"
    text = log.read_text()
    result["gate_without_driver"] = _first_line(text[text.find("+ [gate") :], "import gate")
    if "libcuda.so.1" not in result["gate_without_driver"]:
        problems.append(
            "the gate failed for another reason than the missing driver:"
            f" {result['gate_without_driver']}"
        )
        return result
    purelib = _purelib(python, env)
    stub = driver_stub(work, purelib)
    run_env = G.library_env(env, sites=[str(purelib)])  # the run's path: NCCL, cuBLAS, cudart
    proc = subprocess.run(
        [str(python), "-m", "tutorial_utils.cli.gpu_setup", "gate"],
        cwd=device,
        timeout=300,
        env={
            **run_env,
            "PYTHONPATH": "src",
            "LD_LIBRARY_PATH": f"{stub}:{run_env.get('LD_LIBRARY_PATH', '')}",
        },
        capture_output=True,
        text=True,
    )
    result["gate_with_stub_driver"] = _first_line(proc.stderr + proc.stdout, "import gate")
    if (
        "JAX sees no GPU" not in result["gate_with_stub_driver"]
        or f"TE {G.TE_VERSION} imported" not in result["gate_with_stub_driver"]
    ):
        problems.append(
            "with a stand-in driver, TE's import did not go through:"
            f" {result['gate_with_stub_driver']}"
        )
    wheels = sorted((device / "gpu-bundle" / G.BUILT).glob("*.whl"))
    result["wheel"] = (
        {
            "name": wheels[0].name,
            "version": G.wheel_version(wheels[0]),
            "bytes": wheels[0].stat().st_size,
        }
        if wheels
        else None
    )
    result["ok"] = not problems
    return result
