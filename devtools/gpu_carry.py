"""Carry an offline TE bundle to a lent GPU machine that takes limited uploads, and rehearse it.

A development tool, not part of the installed package: the machines this project borrows
for its GPU records take at most 64 MiB per call (the working tree included), keep files only
while warm, which is 30 s after a call's reply, and give 15 minutes in all, idle time included.
So the bundle that ``python -m tutorial_utils.cli.gpu_setup bundle`` makes is cut into pieces,
one call's worth each, and the run's steps are spread over the calls:

* ``cut``: cut the bundle's large wheels into pieces that fit the calls (``carry.json``); run it
  again after putting a wheel brought back into ``gpu-bundle/built/``: call 1 then carries it;
* ``plan``: print each call (paths, bytes, steps, limits) and the time plan, the 30-second gaps
  between calls counted;
* ``call K``: what call K runs on the machine. Call 1 verifies, runs the preflight and starts
  TE's build detached (it goes on between calls; its log stays on the machine), so that every
  reply is a few lines and the next call can follow within the 30 seconds. The middle calls
  verify their pieces and say how the build is doing (restarting it once if it failed); the
  last call puts the core wheel together, waits for the build, and runs the rest;
* ``rehearse``: play every call here, on a CPU, with TE's real sdist and its real ``setup.py``,
  in a fresh Python laid out as the node (:mod:`gpu_rehearsal`);
* ``rehearse-loader``: TE's loader on the node's layout, offline, before and after pip's CUDA
  folders joined the run's library path (:mod:`gpu_node`).

Run from the repository root, with ``PYTHONPATH=src``. ``gpu_rehearsal`` imports this module,
so :func:`main` imports it when asked to rehearse.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import gpu_node

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
#: The most the session may take between a call's reply and the next call: the machine keeps
#: the carried files only that long, and the wait counts against the budget.
GAP_S = 30
#: Starting the detached build and printing its line.
DETACH_S = 5
BUDGET_S = 15 * 60  # the session's machine time: the start, the calls, the gaps, the retry
FIRST_STEPS = ("preflight", "build")
LAST_STEPS = ("install", "gate", "bench-single", "bench-emulated", "check")
#: The detached build's files, inside the bundle: they stay on the machine between calls.
DETACHED = "detached"
#: Characters of a call's log that its reply shows (the whole log comes back under $OUT).
REPLY_TAIL = 1200


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
    and write ``carry.json``; the whole files are removed (the last call puts them together).

    A bundle already cut is put together first (each file checked) and cut anew, so that a
    wheel brought back into ``built/`` since (carried by call 1) is counted in call 1's bytes.
    """
    directory = Path(directory)
    manifest = G.read_manifest(directory)
    if (directory / CARRY).is_file():
        old = _carry(directory)
        join_pieces(directory, sorted({p["library"] for p in old["pieces"] if p["library"]}))
        for piece in old["pieces"]:
            (directory / piece["name"]).unlink(missing_ok=True)
        (directory / CARRY).unlink()
    large = [e for e in manifest["files"] if e["name"].startswith((G.CORE + "/", G.EXTRA + "/"))]
    large.sort(
        key=lambda e: e["use"] == "library"
    )  # the core wheel first, a library the node may have last
    small = (
        sum(e["bytes"] for e in manifest["files"] if e not in large)
        + (directory / G.MANIFEST).stat().st_size
        + sum(f.stat().st_size for f in _built_files(directory))
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
    """The run's steps in call ``call`` (1-based) when call ``last`` installs and runs; call 1's
    ``build`` is started detached."""
    if not 1 <= call <= last:
        raise SystemExit(f"--call {call}: this node's run is carried in calls 1 to {last}.")
    steps = FIRST_STEPS if call == 1 else ()
    return steps + (LAST_STEPS if call == last else ())


def call_seconds(steps: Sequence[str], build_wait: float = 0) -> float:
    """The most a call with ``steps`` may run: the verification every call starts with, each
    step's limit (the build only its start: it runs detached), and ``build_wait``, the part of
    the build's limit the last call may still wait for."""
    sync = [s for s in steps if s != "build"]
    return (
        G.STEP_SECONDS["verify"]
        + sum(G.STEP_SECONDS[s] for s in sync)
        + (DETACH_S if "build" in steps else 0)
        + build_wait
    )


def transfer_seconds(nbytes: int) -> float:
    """The assumed transfer time of a call carrying ``nbytes``."""
    return TRANSFER_FIXED_S + nbytes / TRANSFER_BYTES_PER_S


def _built_files(bundle_dir: Path) -> list[Path]:
    built = Path(bundle_dir) / G.BUILT
    wheels = sorted(built.glob("transformer_engine_jax-*.whl"))
    return wheels + [built / "built.json"] if wheels and (built / "built.json").is_file() else []


def carry_plan(
    bundle_dir: Path, tree_bytes: int, out: str = "$OUT/results", libraries: Sequence[str] = ()
) -> list[dict]:
    """The calls that carry ``bundle_dir`` when the node lacks ``libraries`` (of those carried).

    Each call: ``carry`` (paths), ``bytes`` (the working tree and the carried files), ``steps``,
    ``seconds`` (their limits; the last call's include the wait for the detached build),
    ``transfer_s`` (assumed) and ``command``. A wheel brought back into ``built/`` (with its
    ``built.json``) travels in call 1, and the build step then keeps it.
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
    built = _built_files(bundle_dir)
    if built:
        plan[0]["carry"].append((bundle_dir / G.BUILT).as_posix())
        plan[0]["bytes"] += sum(f.stat().st_size for f in built)
        plan[0]["built"] = built[0].name
    for piece in carry["pieces"]:
        if piece["call"] <= last:
            plan[piece["call"] - 1]["carry"].append((bundle_dir / piece["name"]).as_posix())
            plan[piece["call"] - 1]["bytes"] += piece["bytes"]
    for item in plan:
        item["steps"] = ["verify", *call_steps(item["call"], last)]
        item["transfer_s"] = round(transfer_seconds(item["bytes"]), 1)
        item["command"] = (
            f"PYTHONPATH=src python3 devtools/gpu_carry.py call {item['call']} --bundle "
            f"{bundle_dir.as_posix()} --out {out}"
        )
    # the build starts at the end of call 1's preflight and runs through the gaps and the
    # middle calls; the last call waits for what may be left of its limit
    between = sum(GAP_S + i["transfer_s"] + call_seconds(i["steps"][1:]) for i in plan[1:-1])
    between += GAP_S + plan[-1]["transfer_s"] + G.STEP_SECONDS["verify"] if last > 1 else 0
    wait = 0 if built else max(0.0, G.STEP_SECONDS["build"] - between)
    for item in plan:
        item["seconds"] = round(call_seconds(item["steps"][1:], wait if item is plan[-1] else 0), 1)
    plan[-1]["build_wait_s"] = round(wait, 1)
    return plan


def plan_seconds(plan: Sequence[dict]) -> float:
    """The machine time a plan may take: the start, every call's limits and transfer, and a
    30-second gap before every call after the first."""
    return START_S + sum(i["seconds"] + i["transfer_s"] for i in plan) + GAP_S * (len(plan) - 1)


def milestones(plan: Sequence[dict]) -> dict[str, float]:
    """When each of the last call's steps has ended at the latest, in machine seconds from the
    request (start, transfers, gaps and every earlier limit counted)."""
    t = START_S + sum(i["seconds"] + i["transfer_s"] for i in plan[:-1]) + GAP_S * (len(plan) - 1)
    t += plan[-1]["transfer_s"] + G.STEP_SECONDS["verify"] + plan[-1].get("build_wait_s", 0)
    done = {}
    for step in plan[-1]["steps"][1:]:
        if step in LAST_STEPS:
            t += G.STEP_SECONDS[step]
            done[step] = round(t, 1)
    return done


def retry_seconds(plan: Sequence[dict]) -> dict:
    """What retrying the longest step once adds to the plan.

    The longest is the build, started detached at the end of call 1; the first later call that
    finds it failed restarts it, and only what the restart makes the last call wait counts.
    ``extra_s`` is for a failure found by call 2 (a crash); ``after_timeout_s`` for a build
    killed at its limit, found by the first call after that.
    """
    longest = max(G.STEP_SECONDS, key=G.STEP_SECONDS.get)
    if longest != "build" or len(plan) < 3:
        extra = G.STEP_SECONDS[longest] + GAP_S + TRANSFER_FIXED_S  # one more call
        return {"step": longest, "extra_s": extra, "after_timeout_s": extra}
    limit, t, polls = G.STEP_SECONDS["build"], 0.0, []
    for item in plan[1:-1]:  # seconds after call 1's reply at which each middle call polls
        t += GAP_S + item["transfer_s"] + G.STEP_SECONDS["verify"]
        polls.append(t)
        t += item["seconds"] - G.STEP_SECONDS["verify"]
    needed = t + GAP_S + plan[-1]["transfer_s"] + G.STEP_SECONDS["verify"]
    base_wait = plan[-1].get("build_wait_s", 0)

    def extra(failed_at: float) -> float:
        restart = next((p for p in polls if p >= failed_at), needed)  # the last call restarts last
        return round(max(0.0, restart + limit - needed - base_wait), 1)

    return {"step": "build", "extra_s": extra(0.0), "after_timeout_s": extra(limit)}


def print_plan(
    plan: list[dict], tree: tuple[int, int], variant: str, must_fit: bool = True
) -> list[str]:
    """Print one variant of the plan; return the problems found (a call over a limit, and when
    ``must_fit``, a plan over the budget with one retry of the longest step; otherwise the
    results that would come after the budget are named)."""
    mib = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
    problems = []
    print(f"\n== {variant}: {len(plan)} calls")
    for item in plan:
        steps = ", ".join("build (started detached)" if s == "build" else s for s in item["steps"])
        extra = (
            f", waits <= {item['build_wait_s']} s for the build" if item.get("build_wait_s") else ""
        )
        print(
            f"call {item['call']}/{len(plan)}: {mib(item['bytes'])}, <= {item['seconds']} s +"
            f" ~{item['transfer_s']} s transfer ({steps}{extra})"
            + (f"; carries the built {item['built']}" if item.get("built") else "")
        )
        print("  carry: " + json.dumps(item["carry"]))
        print("  command: " + item["command"])
        if item["bytes"] > CALL_BYTES:
            problems.append(
                f"call {item['call']} carries {mib(item['bytes'])} > {mib(CALL_BYTES)}: cut the"
                " bundle again for today's working tree."
            )
        if item["seconds"] > 540:
            problems.append(f"call {item['call']} may run {item['seconds']} s > 540 s of 600 s.")
        if len(item["carry"]) > MAX_PATHS:
            problems.append(
                f"call {item['call']} names {len(item['carry'])} paths; a call carries at most"
                f" {MAX_PATHS}."
            )
    total, retry = plan_seconds(plan), retry_seconds(plan)
    gaps = GAP_S * (len(plan) - 1)
    print(
        f"time plan: {START_S} s start + {sum(i['seconds'] for i in plan):.0f} s of call limits +"
        f" {sum(i['transfer_s'] for i in plan):.0f} s of transfers + {len(plan) - 1} gaps x"
        f" {GAP_S} s = {gaps} s -> {total:.0f} s; one retry of the longest step"
        f" ({retry['step']}) adds {retry['extra_s']:.0f} s -> {total + retry['extra_s']:.0f} s"
        f" of {BUDGET_S} s (after a timeout at its limit: +{retry['after_timeout_s']:.0f} s)"
    )
    print(
        "results in hand by (worst case): "
        + ", ".join(f"{step} {t:.0f} s" for step, t in milestones(plan).items())
    )
    if total + retry["extra_s"] > BUDGET_S:
        late = [step for step, t in milestones(plan).items() if t > BUDGET_S]
        text = (
            f"{variant}: the plan with one retry of {retry['step']} may take"
            f" {total + retry['extra_s']:.0f} s > {BUDGET_S} s"
        )
        if must_fit:
            problems.append(text + ".")
        else:
            print(f"note: {text}; at every limit, {', '.join(late) or 'nothing'} would end late")
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


def build_status(bundle_dir: Path) -> dict:
    """The detached build's state: ``rc`` (``None`` not started, ``"running"``, ``"lost"`` when
    its process is gone without a result, else its exit code), ``seconds`` and ``pid``."""
    folder = Path(bundle_dir) / DETACHED
    started = folder / "started.json"
    if not started.is_file():
        return {"rc": None}
    info = json.loads(started.read_text())
    result = folder / "gpu-run" / "build.json"
    steps = json.loads(result.read_text())["steps"] if result.is_file() else []
    if steps and steps[-1].get("rc") not in ("running", None):
        return {**info, "rc": steps[-1]["rc"], "seconds": steps[-1].get("seconds")}
    try:
        os.kill(info["pid"], 0)
    except ProcessLookupError:
        return {**info, "rc": "lost"}
    return {**info, "rc": "running", "seconds": round(time.time() - info["started"], 1)}


def start_build(bundle_dir: Path, python: str, limit: int, attempt: int = 1) -> dict:
    """Start the build step in its own process session, so that it outlives the call: its
    output goes to ``DETACHED/gpu-run/build.log``, its summary to ``.../build.json``, the
    runner's own lines to ``DETACHED/runner.log``."""
    folder = Path(bundle_dir) / DETACHED
    shutil.rmtree(folder / "gpu-run", ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [python, str(Path(__file__).resolve()), "build-detached", "--bundle", str(bundle_dir)]
    with open(folder / "runner.log", "a") as log:
        proc = subprocess.Popen(
            cmd + ["--limit", str(limit)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": "src"},
        )
    info = {"pid": proc.pid, "started": time.time(), "limit_s": limit, "attempt": attempt}
    (folder / "started.json").write_text(json.dumps(info))
    return info


def wait_build(bundle_dir: Path, limit: int) -> dict:
    """Wait for the detached build (at most its limit from its start, plus its kill), then its
    state."""
    while True:
        status = build_status(bundle_dir)
        if status["rc"] != "running" or time.time() > status["started"] + limit + 30:
            return status
        time.sleep(2)


def _build_line(status: dict) -> str:
    rc = status["rc"]
    if rc is None:
        return "build: not started"
    if rc == "running":
        return f"build: running for {status['seconds']} s (attempt {status.get('attempt', 1)})"
    return f"build: rc={rc} after {status.get('seconds')} s (attempt {status.get('attempt', 1)})"


def run_call(
    bundle_dir: Path,
    out: Path,
    call: int,
    python: str = sys.executable,
    build_limit: int | None = None,
) -> dict:
    """Call ``call`` on the machine: verify what has arrived, then this call's part of the run.

    Whether a carried library is needed is decided here, by TE's own search order, so the same
    commands serve a node that has it (one call fewer) and one that does not. The reply stays
    short (the logs come back under ``out/gpu-run/``), so that the next call can follow within
    the machine's 30 seconds.
    """
    bundle_dir, out = Path(bundle_dir), Path(out)
    limit = build_limit or G.STEP_SECONDS["build"]
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
    summary: dict = {"call": call, "ok": True, "steps": []}
    if call == 1:
        commands = G.run_commands(bundle_dir, out, python, ["preflight"])
        summary = G.run(
            bundle_dir, out, python=python, steps=commands, log_name="call1", tail=REPLY_TAIL
        )
        if not summary.get("ok"):
            return {"call": call, **summary}
        print(f"build: started detached, pid {start_build(bundle_dir, python, limit)['pid']}")
    elif call < last:
        status = build_status(bundle_dir)
        print(_build_line(status), flush=True)
        if status["rc"] not in ("running", 0, None) and status.get("attempt", 1) == 1:
            print(f"build: restarted, pid {start_build(bundle_dir, python, limit, 2)['pid']}")
        if libraries and any(p["library"] for p in carry["pieces"] if p["call"] == call + 1):
            print(f"lib{'/lib'.join(libraries)} is not on this node: carry call {call + 1} next.")
    if call != last:
        return {"call": call, **summary}
    joined = join_pieces(bundle_dir, libraries)
    print(f"put together and checked: {[p.name for p in joined]}", flush=True)
    status = wait_build(bundle_dir, limit)
    print(_build_line(status), flush=True)
    if status["rc"] not in (0, "running", None) and status.get("attempt", 1) == 1:
        print(f"build: restarted, pid {start_build(bundle_dir, python, limit, 2)['pid']}")
        status = wait_build(bundle_dir, limit)
        print(_build_line(status), flush=True)
    dest = out / "gpu-run"
    dest.mkdir(parents=True, exist_ok=True)
    log = bundle_dir / DETACHED / "gpu-run" / "build.log"
    if log.is_file():
        shutil.copy2(log, dest / "build.log")
    if status["rc"] != 0:
        if status["rc"] == "running":
            os.killpg(status["pid"], signal.SIGKILL)
        print(log.read_text()[-REPLY_TAIL:] if log.is_file() else "", flush=True)
        return {"call": call, "ok": False, "steps": [{"name": "build", "rc": status["rc"]}]}
    for path in _built_files(bundle_dir):
        shutil.copy2(path, dest / path.name)
    commands = G.run_commands(bundle_dir, out, python, LAST_STEPS)
    summary = G.run(
        bundle_dir, out, python=python, steps=commands, log_name=f"call{call}", tail=REPLY_TAIL
    )
    return {"call": call, **summary}


def build_detached(bundle_dir: Path, limit: int, python: str = sys.executable) -> int:
    """The detached process: the build step under ``limit``, its summary in ``DETACHED``."""
    (name, _, cmd), *_ = G.run_commands(bundle_dir, Path(bundle_dir) / DETACHED, python, ["build"])
    summary = G.run(
        bundle_dir,
        Path(bundle_dir) / DETACHED,
        python=python,
        steps=[(name, limit, cmd)],
        log_name="build",
        tail=0,
    )
    return 0 if summary.get("ok") else 1


# ----------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``cut``, ``plan``, ``call K``, ``rehearse``, ``rehearse-loader``."""
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
    k.add_argument(
        "--build-limit", type=int, default=None, help="the build's limit (default: the run's)"
    )
    d = sub.add_parser("build-detached", help="(started by call 1) the build, in its own session")
    d.add_argument("--bundle", type=Path, default=Path("gpu-bundle"))
    d.add_argument("--limit", type=int, default=G.STEP_SECONDS["build"])
    r = sub.add_parser(
        "rehearse", help="play every call here with TE's real build, in a fresh node Python"
    )
    r.add_argument("--bundle", type=Path, default=Path("gpu-bundle"))
    r.add_argument("--work", type=Path, default=Path("/tmp/gpu-rehearsal"))
    r.add_argument(
        "--python", default=None, help=f"the node's Python (default: python{gpu_node.NODE_PYTHON})"
    )
    lo = sub.add_parser(
        "rehearse-loader", help="TE's loader on the node's layout, offline, in seconds"
    )
    lo.add_argument("--work", type=Path, default=Path("/tmp/gpu-loader-rehearsal"))
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
            f" {CALL_BYTES // 2**20} MiB and {MAX_PATHS} paths per call. The machine keeps carried"
            f" files only {GAP_S} s after a call's reply: issue the next call within {GAP_S} s"
            " (each reply is a few lines; the logs come back under $OUT). Call 1 starts the build"
            " detached; the middle calls say how it is doing; the last call waits for it. Call"
            " 1's preflight says which libraries this node lacks. Transfers are assumed at"
            f" {TRANSFER_BYTES_PER_S // 2**20} MiB/s + {TRANSFER_FIXED_S} s per call, the start at"
            f" {START_S} s. A wheel brought back: put it and built.json in gpu-bundle/built/ and"
            " run `cut` again; call 1 then carries it."
        )
        # the node's image has cuRAND (KINDS.md): that plan must fit; the other is a fallback
        problems = [
            q
            for k, (name, plan) in enumerate(variants.items())
            for q in print_plan(plan, tree, name, must_fit=k == 0)
        ]
        for q in problems:
            print("PROBLEM:", q)
        return 1 if problems else 0
    elif args.cmd == "call":
        return (
            0
            if run_call(args.bundle, args.out, args.call, build_limit=args.build_limit).get("ok")
            else 1
        )
    elif args.cmd == "build-detached":
        return build_detached(args.bundle, args.limit)
    elif args.cmd == "rehearse-loader":
        report = gpu_node.rehearse_loader(args.work)
        for name, case in report["cases"].items():
            print(f"{name}: preflight: {case['preflight'][:160]}")
            print(f"{name}: TE: {json.dumps(case['probe'])}")
            print(f"{name}: {case['gate']}")
        print(json.dumps({"problems": report["problems"], "ok": report["ok"]}, indent=2))
        return 0 if report["ok"] else 1
    else:
        import gpu_rehearsal  # imports this module

        report = gpu_rehearsal.rehearse(
            args.bundle, args.work, args.python or gpu_node.node_python()
        )
        print(json.dumps({k: v for k, v in report.items() if k != "calls"}, indent=2))
        return 0 if report["ok"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
