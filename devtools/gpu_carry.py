"""Carry an offline TE bundle to a lent GPU machine that takes limited uploads, and rehearse it.

A development tool, not part of the installed package: the machines this project borrows
for its GPU records take at most 64 MiB per call (the working tree included), keep files only
while warm, and give about 15 minutes in all. So the bundle that
``python -m tutorial_utils.cli.gpu_setup bundle`` makes is cut into pieces, one call's worth
each, and the run's steps are spread over the calls:

* ``cut``: cut the bundle's large wheels into pieces that fit the calls (``carry.json``);
* ``plan``: print each call (paths, bytes, steps, limits) and the time plan;
* ``call K``: what call K runs on the machine (verify, then build, or install and run);
* ``rehearse``: play every call here, on a CPU, with TE's real sdist and its real ``setup.py``,
  in a fresh Python that looks like the machine.

Run from the repository root, with ``PYTHONPATH=src``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tutorial_utils.cli import gpu_setup as G

CARRY = "carry.json"
CALL_BYTES = 64 * 2**20  # what one call may carry, working tree included
MARGIN_BYTES = 2 * 2**20  # room for the working tree to grow between cutting and carrying
MAX_PATHS = 8  # paths one call may name
#: The time plan. The start and the transfer rate are assumptions, not measurements: no call
#: to such a machine has been timed yet. Every call's transfer counts: a fixed cost plus its bytes.
START_S = 180
TRANSFER_FIXED_S = 10
TRANSFER_BYTES_PER_S = 8 * 2**20
BUDGET_S = 15 * 60  # the session's machine time, start included
PLAN_BUDGET_S = START_S + 11 * 60  # what the plan must fit: 11 minutes after a 3-minute start
FIRST_STEPS = ("preflight", "build")
LAST_STEPS = ("install", "gate", "bench-single", "bench-emulated", "check")


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def working_tree_bytes(root: Path = Path(".")) -> tuple[int, int]:
    """``(tracked, untracked)`` bytes of what travels with every call: ``git ls-files``, and the
    untracked files git does not ignore."""

    def total(*args) -> int:
        out = subprocess.run(
            ["git", "ls-files", "-z", *args], cwd=root, capture_output=True, text=True, check=True
        )
        return sum(
            os.path.getsize(Path(root) / f)
            for f in out.stdout.split("\0")
            if f and (Path(root) / f).is_file()
        )

    return total(), total("--others", "--exclude-standard")


# ----------------------------------------------------------------------------- cutting


def assign_pieces(
    small_bytes: int,
    large: Sequence[tuple[str, int]],
    tree_bytes: int,
    call_bytes: int = CALL_BYTES,
) -> list[list[tuple[str, int, int]]]:
    """Fill calls with the bytes of the ``large`` files, in order, after the small files.

    Call 1 carries the small files (``small_bytes``) and the first piece; each later call one
    call's worth. A call may hold the end of one file and the start of the next.

    Args:
        small_bytes: the manifest and every small file, all carried by call 1.
        large: ``(name, bytes)`` of the files to cut, in carrying order (a library the node may
            already have goes last, so that its calls can be left out).
        tree_bytes: the working tree, carried by every call.
        call_bytes: the most one call may carry.

    Returns:
        For each call, its pieces as ``(name, offset, length)``.
    """
    budget = call_bytes - tree_bytes - MARGIN_BYTES * call_bytes // CALL_BYTES
    first = budget - small_bytes - 32 * 1024  # carry.json travels too
    if first < budget // 8:
        raise SystemExit(
            f"the small files ({small_bytes} bytes) and the working tree ({tree_bytes} bytes) leave"
            f" too little room in a {call_bytes}-byte call."
        )
    calls: list[list[tuple[str, int, int]]] = [[]]
    room = first
    for name, size in large:
        offset = 0
        while offset < size:
            if room == 0:
                calls.append([])
                room = budget
            take = min(room, size - offset)
            calls[-1].append((name, offset, take))
            offset += take
            room -= take
    return calls


def cut(directory: Path, tree_bytes: int, call_bytes: int = CALL_BYTES) -> dict:
    """Cut the bundle's core wheel and library wheels into ``.partNNN`` pieces, one call's worth,
    and write ``carry.json``; the whole files are removed (the last call puts them together)."""
    directory = Path(directory)
    manifest = G.read_manifest(directory)
    large = [e for e in manifest["files"] if e["name"].startswith((G.CORE + "/", G.EXTRA + "/"))]
    large.sort(
        key=lambda e: e["use"] == "library"
    )  # the core wheel first, a library the node may have last
    small = (
        sum(e["bytes"] for e in manifest["files"] if e not in large)
        + (directory / G.MANIFEST).stat().st_size
    )
    calls = assign_pieces(small, [(e["name"], e["bytes"]) for e in large], tree_bytes, call_bytes)
    pieces, counters = [], {}
    for call, items in enumerate(calls, start=1):
        for name, offset, length in items:
            whole = directory / name
            k = counters.get(name, 0)
            counters[name] = k + 1
            part = whole.with_name(f"{whole.name}.part{k:03d}")
            with open(whole, "rb") as f:
                f.seek(offset)
                data = f.read(length)
            part.write_bytes(data)
            pieces.append(
                {
                    "file": name,
                    "name": part.relative_to(directory).as_posix(),
                    "bytes": length,
                    "sha256": _sha256_bytes(data),
                    "call": call,
                    "library": next(e["library"] for e in large if e["name"] == name),
                }
            )
    for entry in large:
        (directory / entry["name"]).unlink()
    carry = {
        "schema": "gpu-carry/1",
        "call_bytes": call_bytes,
        "tree_bytes_when_cut": tree_bytes,
        "pieces": pieces,
    }
    (directory / CARRY).write_text(json.dumps(carry, indent=2))
    return carry


def _carry(directory: Path) -> dict:
    path = Path(directory) / CARRY
    if not path.is_file():
        raise SystemExit(
            f"{path} not found: cut the bundle first (python devtools/gpu_carry.py cut"
            f" {directory})."
        )
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------- the plan


def _needed_libraries(
    carry: dict, env: dict[str, str] | None = None, purelib: Path | None = None
) -> list[str]:
    """The carried libraries that TE's loader would not find on this machine (or in ``purelib``)."""
    names = sorted({p["library"] for p in carry["pieces"] if p["library"]})
    return [name for name in names if G.te_library(name, env=env, purelib=purelib) is None]


def last_call(carry: dict, libraries: Sequence[str]) -> int:
    """The call that installs and runs: after the core wheel's last piece, or after the last piece
    of a library the node lacks."""
    return max(p["call"] for p in carry["pieces"] if not p["library"] or p["library"] in libraries)


def call_steps(call: int, last: int) -> tuple[str, ...]:
    """The run's steps in call ``call`` (1-based) when call ``last`` installs and runs."""
    if not 1 <= call <= last:
        raise SystemExit(f"--call {call}: this node's run is carried in calls 1 to {last}.")
    steps = FIRST_STEPS if call == 1 else ()
    return steps + (LAST_STEPS if call == last else ())


def call_seconds(steps: Sequence[str]) -> int:
    """The limits of ``steps`` plus the verification every call starts with."""
    return G.STEP_SECONDS["verify"] + sum(G.STEP_SECONDS[s] for s in steps)


def transfer_seconds(nbytes: int) -> float:
    return TRANSFER_FIXED_S + nbytes / TRANSFER_BYTES_PER_S


def carry_plan(
    bundle_dir: Path, tree_bytes: int, out: str = "$OUT/results", libraries: Sequence[str] = ()
) -> list[dict]:
    """The calls that carry ``bundle_dir`` when the node lacks ``libraries`` (of those carried).

    Each call: ``carry`` (paths), ``bytes`` (the working tree and the carried files), ``steps``,
    ``seconds`` (their limits), ``transfer_s`` (assumed) and ``command``.
    """
    bundle_dir = Path(bundle_dir)
    if bundle_dir.is_absolute():
        raise SystemExit(
            f"--bundle {bundle_dir}: give the bundle's path inside the repository (e.g."
            " gpu-bundle); a call carries paths of the checkout only."
        )
    manifest, carry = G.read_manifest(bundle_dir), _carry(bundle_dir)
    last = last_call(carry, libraries)
    plan = [{"call": k, "carry": [], "bytes": tree_bytes} for k in range(1, last + 1)]
    cut_files = {p["file"] for p in carry["pieces"]}
    plan[0]["carry"] += [
        (bundle_dir / G.MANIFEST).as_posix(),
        (bundle_dir / CARRY).as_posix(),
        (bundle_dir / G.BASE).as_posix(),
    ]
    plan[0]["bytes"] += (
        sum(e["bytes"] for e in manifest["files"] if e["name"] not in cut_files)
        + (bundle_dir / G.MANIFEST).stat().st_size
        + (bundle_dir / CARRY).stat().st_size
    )
    for piece in carry["pieces"]:
        if piece["call"] <= last:
            plan[piece["call"] - 1]["carry"].append((bundle_dir / piece["name"]).as_posix())
            plan[piece["call"] - 1]["bytes"] += piece["bytes"]
    for item in plan:
        item["steps"] = ["verify", *call_steps(item["call"], last)]
        item["seconds"] = call_seconds(item["steps"][1:])
        item["transfer_s"] = round(transfer_seconds(item["bytes"]), 1)
        item["command"] = (
            f"PYTHONPATH=src python3 devtools/gpu_carry.py call {item['call']} --bundle "
            f"{bundle_dir.as_posix()} --out {out}"
        )
    return plan


def plan_seconds(plan: Sequence[dict]) -> float:
    """The machine time a plan may take: the start, every call's limits and every transfer."""
    return START_S + sum(item["seconds"] + item["transfer_s"] for item in plan)


def print_plan(plan: list[dict], tree: tuple[int, int], variant: str) -> list[str]:
    """Print one variant of the plan; return the problems found (a call over a limit)."""
    mib = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
    problems = []
    print(f"\n== {variant}: {len(plan)} calls")
    for item in plan:
        print(
            f"call {item['call']}/{len(plan)}: {mib(item['bytes'])}, <= {item['seconds']} s +"
            f" ~{item['transfer_s']} s transfer ({', '.join(item['steps'])})"
        )
        print("  carry: " + json.dumps(item["carry"]))
        print("  command: " + item["command"])
        if item["bytes"] > CALL_BYTES:
            problems.append(
                f"call {item['call']} carries {mib(item['bytes'])} > {mib(CALL_BYTES)}: cut the"
                " bundle again for today's working tree."
            )
        if item["seconds"] > 600:
            problems.append(f"call {item['call']} may run {item['seconds']} s > 600 s.")
        if len(item["carry"]) > MAX_PATHS:
            problems.append(
                f"call {item['call']} names {len(item['carry'])} paths; a call carries at most"
                f" {MAX_PATHS}."
            )
    total = plan_seconds(plan)
    print(
        f"time plan: {START_S} s start + {sum(i['seconds'] for i in plan)} s of step limits + "
        f"{sum(i['transfer_s'] for i in plan):.0f} s of transfers = {total:.0f} s "
        f"(plan budget {PLAN_BUDGET_S} s; machine time {BUDGET_S} s)"
    )
    if total > PLAN_BUDGET_S:
        problems.append(
            f"{variant}: the plan may take {total:.0f} s > its budget of {PLAN_BUDGET_S} s "
            f"({START_S} s start + 11 minutes; the machine gives {BUDGET_S} s in all)."
        )
    return problems


# ----------------------------------------------------------------------------- one call, on the mac


def verify_pieces(directory: Path, upto_call: int) -> list[str]:
    """Check the whole small files and every piece of calls ``1..upto_call`` that is still needed
    (a file already put together is checked whole instead)."""
    directory = Path(directory)
    manifest, carry = G.read_manifest(directory), _carry(directory)
    whole = {e["name"]: e for e in manifest["files"]}
    cut_files = {p["file"] for p in carry["pieces"]}
    checked = []
    for entry in manifest["files"]:
        if entry["name"] not in cut_files:
            G.verify_bundle_entry(directory, entry)
            checked.append(entry["name"])
    for piece in carry["pieces"]:
        target = directory / piece["file"]
        if target.is_file() and G.file_sha256(target) == whole[piece["file"]]["sha256"]:
            continue
        if piece["call"] > upto_call:
            continue
        path = directory / piece["name"]
        if not path.is_file():
            raise SystemExit(
                f"{path}: piece missing (call {piece['call']}): the machine went back since; start "
                "again at call 1."
            )
        if _sha256_bytes(path.read_bytes()) != piece["sha256"]:
            raise SystemExit(
                f"{path}: SHA-256 differs from {CARRY} (corrupted copy); carry it again."
            )
        checked.append(piece["name"])
    return checked


def join_pieces(directory: Path, libraries: Sequence[str]) -> list[Path]:
    """Put the cut files together (the core wheel, and the libraries in ``libraries``), each checked
    against the manifest's SHA-256 and, as a wheel, against its own ``RECORD``."""
    directory = Path(directory)
    manifest, carry = G.read_manifest(directory), _carry(directory)
    joined = []
    for entry in manifest["files"]:
        parts = [p for p in carry["pieces"] if p["file"] == entry["name"]]
        if not parts or (parts[0]["library"] and parts[0]["library"] not in libraries):
            continue
        target = directory / entry["name"]
        if not (target.is_file() and G.file_sha256(target) == entry["sha256"]):
            tmp = target.with_name(target.name + ".joining")
            try:
                with open(tmp, "wb") as out:
                    for part in parts:
                        out.write((directory / part["name"]).read_bytes())
                if G.file_sha256(tmp) != entry["sha256"]:
                    raise SystemExit(
                        f"{target}: put together, it does not match the manifest's SHA-256."
                    )
                G.verify_wheel_record(tmp)
                tmp.replace(target)
            finally:
                tmp.unlink(missing_ok=True)
        joined.append(target)
    return joined


def run_call(bundle_dir: Path, out: Path, call: int, python: str = sys.executable) -> dict:
    """Call ``call`` on the machine: verify what has arrived, then run this call's steps.

    Whether a carried library is needed is decided here, by TE's own search order, so the same
    commands serve a node that has it (one call fewer) and one that does not.
    """
    bundle_dir, out = Path(bundle_dir), Path(out)
    carry = _carry(bundle_dir)
    libraries = _needed_libraries(carry)
    last = last_call(carry, libraries)
    steps = call_steps(call, last)
    checked = verify_pieces(bundle_dir, call)
    print(
        f"call {call}/{last}: verified {len(checked)} files and pieces; libraries carried for this"
        f" node: {libraries or 'none'}; steps: {', '.join(steps) or 'none'}",
        flush=True,
    )
    if call == last:
        joined = join_pieces(bundle_dir, libraries)
        print(f"put together and checked: {[p.name for p in joined]}", flush=True)
    elif (
        "library" in json.dumps([p for p in carry["pieces"] if p["call"] == call + 1]) and libraries
    ):
        print(
            f"lib{'/lib'.join(libraries)} is not on this node: carry call {call + 1} next.",
            flush=True,
        )
    if not steps:
        return {"call": call, "ok": True, "steps": []}
    commands = G.run_commands(bundle_dir, out, python, steps)
    summary = G.run(bundle_dir, out, python=python, steps=commands, log_name=f"call{call}")
    return {"call": call, **summary}


# ----------------------------------------------------------------------------- the rehearsal

#: What the rehearsal's node has before the plan runs: the lent machine's Python, JAX with CUDA
#: 13 from the registry (pip's CUDA, cuDNN, NCCL and nvcc come with it) and Flax, which TE's JAX
#: code imports. No cudnn-frontend, no nvtx headers, no cuRAND, no system CUDA.
NODE_PACKAGES = ("jax[cuda13]==0.11.2", "flax==0.12.8")
NODE_PYTHON = "3.12"


def _node_python(version: str) -> str:
    """``python<version>``: pyenv's first (as the Makefile's PYTHON312), then the PATH's, if it
    runs."""
    candidates = sorted(Path.home().glob(f".pyenv/versions/{version}*/bin/python{version}")) + [
        shutil.which(f"python{version}")
    ]
    for found in filter(None, candidates):
        if subprocess.run([str(found), "-c", "pass"], capture_output=True).returncode == 0:
            return str(found)
    raise SystemExit(
        f"no working python{version} found: install it (pyenv install {version}) or pass --python."
    )


def make_node(work: Path, python: str, packages: Sequence[str]) -> Path:
    """A fresh venv that looks like the machine: ``packages`` from the registry and nothing else."""
    node = work / "node"
    shutil.rmtree(node, ignore_errors=True)
    subprocess.run([python, "-m", "venv", str(node)], check=True)
    uv = shutil.which("uv") or (Path(sys.executable).parent / "uv")
    if Path(uv).is_file():
        cmd = [str(uv), "pip", "install", "--python", str(node / "bin" / "python"), *packages]
    else:
        cmd = [str(node / "bin" / "python"), "-m", "pip", "install", "--quiet", *packages]
    G.run_echoed(cmd)
    return node / "bin" / "python"


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
    packages: Sequence[str] = NODE_PACKAGES,
    root: Path = Path("."),
) -> dict:
    """Play the plan here: every call's files copied into a fresh device tree, every call's command
    run with a fresh node Python, TE's real sdist built by its real ``setup.py``, the wheels
    installed, and the import gate run as far as a machine without a driver allows.

    Passes when every step before the gate succeeds and the gate fails only for want of a
    driver: at ``libcuda.so.1`` without one, and at "JAX sees no GPU" with a stand-in
    driver (:func:`driver_stub`) that lets TE's import go through.
    """
    work, root = Path(work).resolve(), Path(root).resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    node_python = make_node(work, python, packages)
    env = {
        "PATH": f"{node_python.parent}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
    }  # no CUDA_HOME, no LD_LIBRARY_PATH, no system nvcc
    device = _device_tree(work, root)
    facts = _node_facts(node_python, {**env, "PYTHONPATH": str(root / "src")})
    print(f"node: {json.dumps(facts)}", flush=True)
    report = {"node": facts, "packages": list(packages), "calls": [], "ok": False}
    lacks = _needed_libraries(
        _carry(root / bundle_dir), env=env, purelib=_purelib(node_python, env)
    )
    plan = carry_plan(Path(bundle_dir), sum(working_tree_bytes(root)), libraries=lacks)
    report["lacks"] = lacks
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
        )
        start = time.perf_counter()
        proc = subprocess.run(
            cmd.split(),
            cwd=device,
            env={**env, "PYTHONPATH": "src"},
            capture_output=True,
            text=True,
            timeout=item["seconds"] + 60,
        )
        (work / f"call{item['call']}.log").write_text(proc.stdout + proc.stderr)
        summary = {
            "call": item["call"],
            "rc": proc.returncode,
            "seconds": round(time.perf_counter() - start, 1),
            "limit_s": item["seconds"],
            "bytes": item["bytes"],
            "steps": item["steps"],
        }
        results = sorted(out.glob("results/gpu-run/call*.json"))
        if results:
            summary["run"] = json.loads(results[0].read_text())["steps"]
        report["calls"].append(summary)
        print(
            f"call {item['call']}/{len(plan)}: rc={proc.returncode} in {summary['seconds']} s "
            f"(limit {item['seconds']} s)",
            flush=True,
        )
        if proc.returncode != 0:
            break
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
    """Every step before the gate passed, and the gate failed only for want of a driver."""
    last = report["calls"][-1] if report["calls"] else {}
    steps = {s["name"]: s for c in report["calls"] for s in c.get("run", [])}
    problems = [
        f"{name}: rc={s['rc']}"
        for name, s in steps.items()
        if name != "gate" and s.get("rc") not in (0, None)
    ]
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
    stub, nccl = driver_stub(work, purelib), G.nccl_library([str(purelib)])
    proc = subprocess.run(
        [str(python), "-m", "tutorial_utils.cli.gpu_setup", "gate"],
        cwd=device,
        timeout=300,
        env={
            **env,
            "PYTHONPATH": "src",
            "LD_LIBRARY_PATH": f"{stub}:{nccl.parent if nccl else ''}",
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


# ----------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python devtools/gpu_carry.py", description=__doc__.split("\n\n")[0]
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cut", help="cut the bundle's large wheels into one call's worth each")
    c.add_argument("bundle", type=Path)
    pl = sub.add_parser("plan", help="print the calls and the time plan")
    pl.add_argument("--bundle", type=Path, default=Path("gpu-bundle"))
    pl.add_argument("--json", action="store_true")
    k = sub.add_parser("call", help="run call K on the machine")
    k.add_argument("call", type=int)
    k.add_argument("--bundle", type=Path, default=Path("gpu-bundle"))
    k.add_argument("--out", type=Path, default=Path("results"))
    r = sub.add_parser(
        "rehearse", help="play every call here with TE's real build, in a fresh node Python"
    )
    r.add_argument("--bundle", type=Path, default=Path("gpu-bundle"))
    r.add_argument("--work", type=Path, default=Path("/tmp/gpu-rehearsal"))
    r.add_argument(
        "--python", default=None, help=f"the node's Python (default: python{NODE_PYTHON})"
    )
    args = p.parse_args(argv)
    if args.cmd == "cut":
        carry = cut(args.bundle, sum(working_tree_bytes()))
        print(f"{len(carry['pieces'])} pieces in {max(p['call'] for p in carry['pieces'])} calls")
    elif args.cmd == "plan":
        tree = working_tree_bytes()
        libraries = sorted({p["library"] for p in _carry(args.bundle)["pieces"] if p["library"]})
        variants = {
            "the node has every library TE loads": carry_plan(args.bundle, sum(tree)),
            f"the node lacks {', '.join(libraries)}": carry_plan(
                args.bundle, sum(tree), libraries=libraries
            ),
        }
        if args.json:
            print(
                json.dumps(
                    {k: {"calls": v, "seconds": plan_seconds(v)} for k, v in variants.items()},
                    indent=2,
                )
            )
            return 0
        print(
            f"working tree: {sum(tree) / 2**20:.1f} MiB, carried by every call; at most"
            f" {CALL_BYTES // 2**20} MiB and {MAX_PATHS} paths per call. Issue the calls back to"
            " back: the machine keeps carried files only while warm. Call 1's preflight says which"
            " libraries this node lacks. Transfers are assumed at"
            f" {TRANSFER_BYTES_PER_S // 2**20} MiB/s + {TRANSFER_FIXED_S} s per call, the start at"
            f" {START_S} s."
        )
        problems = [q for name, plan in variants.items() for q in print_plan(plan, tree, name)]
        for q in problems:
            print("PROBLEM:", q)
        return 1 if problems else 0
    elif args.cmd == "call":
        return 0 if run_call(args.bundle, args.out, args.call).get("ok") else 1
    else:
        report = rehearse(args.bundle, args.work, args.python or _node_python(NODE_PYTHON))
        print(json.dumps({k: v for k, v in report.items() if k != "calls"}, indent=2))
        return 0 if report["ok"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
