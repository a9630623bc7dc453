"""Where a whole test run's CPU goes, across every Python process it starts.

Why: the per-test time table (tests/time_table.py) sees the pytest workers only, while a run
of ``make test`` starts well over a hundred processes (notebook kernels, recipes, launcher
ranks, the commands the pages show) and each compiles its own XLA programs. To cut CI time
one must know which processes spend the CPU, how much of it is XLA compiling, and whether the
shared compilation cache is hit or missed. ``make test-ledger`` answers that:

1. ``install`` writes one ``.pth`` line into the venv's site-packages. Python runs it at
   every interpreter start; it loads ``_ledger_hook.py`` (standard library only) when
   ``TUTORIAL_RUN_LEDGER`` names a file and does nothing otherwise.
2. The hooked run appends to that file: per process its CPU (user + system) and wall time,
   argv and pytest test; per compile request the persistent-cache read (hit or miss), the
   backend compile and the cache write, with their seconds.
3. ``report`` sums it up; ``uninstall`` removes the line.

Usage::

    python devtools/run_ledger.py install [--site-dir DIR] TUTORIAL_RUN_LEDGER=ledger.jsonl make
    test python devtools/run_ledger.py report ledger.jsonl [--json] python devtools/run_ledger.py
    uninstall [--site-dir DIR]

It measures the tutorial's own runs; nothing a reader copies uses it.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

ENV = "TUTORIAL_RUN_LEDGER"
PTH_NAME = "zz_tutorial_run_ledger.pth"
HOOK = Path(__file__).with_name("_ledger_hook.py")


def _site_dir(site_dir: str | None) -> Path:
    path = Path(site_dir) if site_dir else Path(sysconfig.get_paths()["purelib"])
    if not path.is_dir():
        raise ValueError(
            f"--site-dir={str(path)!r} is not a folder; give the site-packages folder of the venv "
            "whose processes should be recorded (e.g. .venv/lib/python3.11/site-packages)."
        )
    return path


def install(site_dir: str | None = None) -> Path:
    """Write the ``.pth`` line into ``site_dir`` (default: this interpreter's site-packages); return
    its path."""
    pth = _site_dir(site_dir) / PTH_NAME
    line = f"import os; os.environ.get({ENV!r}) and __import__('runpy').run_path({str(HOOK)!r})\n"
    pth.write_text(line, encoding="utf-8")
    return pth


def uninstall(site_dir: str | None = None) -> bool:
    """Remove the ``.pth`` line; return whether there was one."""
    pth = _site_dir(site_dir) / PTH_NAME
    existed = pth.exists()
    pth.unlink(missing_ok=True)
    return existed


def _kind(proc: dict) -> str:
    argv = proc.get("argv") or []
    text = " ".join(argv)
    if argv == ["-c"]:  # pytest-xdist workers run as `python -c`, for the whole session
        return "pytest worker" if proc["wall"] > 60 else "python -c"
    if "ipykernel_launcher" in text:
        return "notebook kernel"
    if "sphinx" in text:
        return "sphinx"
    if "pytest" in text:
        return "pytest (main or a collect)"
    script = next((a for a in argv if a.endswith(".py")), argv[0] if argv else "?")
    return Path(script).name


def read(path: str | Path) -> list:
    p = Path(path)
    if not p.is_file():
        raise ValueError(
            f"ledger={str(p)!r} does not exist; run the suite with {ENV}={p} after "
            "`python devtools/run_ledger.py install`."
        )
    rows = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"ledger={str(p)!r} line {n} is not JSON ({exc.msg}); was it written by another"
                    " tool?"
                ) from exc
    return rows


def summarize(rows: list) -> dict:
    """Totals per process kind, compile and cache figures, the largest processes and repeated
    misses."""
    procs = {r["pid"]: r for r in rows if r.get("k") == "proc"}
    compile_s = collections.Counter()
    for r in rows:
        if r.get("k") == "compile":
            compile_s[r["pid"]] += r["s"]
    by_kind = collections.defaultdict(lambda: {"processes": 0, "cpu_s": 0.0, "compile_s": 0.0})
    for pid, p in procs.items():
        k = by_kind[_kind(p)]
        k["processes"] += 1
        k["cpu_s"] += p["cpu"]
        k["compile_s"] += compile_s[pid]
    reads = [r for r in rows if r.get("k") == "read"]
    misses = collections.Counter(r["key"] for r in reads if not r["hit"] and r.get("key"))
    top = sorted(procs.values(), key=lambda p: -p["cpu"])[:10]
    return {
        "processes": len(procs),
        "cpu_s": round(sum(p["cpu"] for p in procs.values()), 1),
        "compile_s": round(sum(compile_s.values()), 1),
        "compiles": sum(1 for r in rows if r.get("k") == "compile"),
        "cache_hits": sum(1 for r in reads if r["hit"]),
        "cache_misses": sum(1 for r in reads if not r["hit"]),
        "cache_write_s": round(sum(r["s"] for r in rows if r.get("k") == "write"), 1),
        "keys_missed_more_than_once": sum(1 for n in misses.values() if n > 1),
        "hook_missing": sorted({r["name"] for r in rows if r.get("k") == "hook-missing"}),
        "by_kind": {
            k: {kk: round(vv, 1) if isinstance(vv, float) else vv for kk, vv in v.items()}
            for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]["cpu_s"])
        },
        "top_processes": [
            {
                "cpu_s": round(p["cpu"], 1),
                "wall_s": round(p["wall"], 1),
                "compile_s": round(compile_s[p["pid"]], 1),
                "argv": " ".join(p["argv"])[-100:],
                "test": p["test"][:100],
            }
            for p in top
        ],
    }


def format_summary(s: dict) -> str:
    lines = [
        (
            f"{s['processes']} processes, {s['cpu_s']:.1f} core-s of CPU, of which XLA backend"
            f" compile {s['compile_s']:.1f} s ({s['compiles']} compiles)"
        ),
        (
            f"persistent cache: {s['cache_hits']} hits, {s['cache_misses']} misses, writes"
            f" {s['cache_write_s']:.1f} s; keys missed more than once:"
            f" {s['keys_missed_more_than_once']}"
        ),
    ]
    if s["hook_missing"]:
        lines.append(f"not recorded (this JAX lacks them): {', '.join(s['hook_missing'])}")
    lines.append(f"{'core-s':>8} {'compile':>8} {'procs':>5}  kind")
    lines += [
        f"{v['cpu_s']:8.1f} {v['compile_s']:8.1f} {v['processes']:5d}  {k}"
        for k, v in s["by_kind"].items()
    ]
    lines.append(f"{'core-s':>8} {'compile':>8} {'wall':>6}  largest processes")
    lines += [
        f"{p['cpu_s']:8.1f} {p['compile_s']:8.1f} {p['wall_s']:6.1f}  {p['argv']}  [{p['test']}]"
        for p in s["top_processes"]
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python devtools/run_ledger.py",
        description="Record every Python process of a test run (CPU, XLA compiles, cache hits).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("install", "uninstall"):
        s = sub.add_parser(name)
        s.add_argument(
            "--site-dir", default=None, help="site-packages folder (default: this interpreter's)"
        )
    r = sub.add_parser("report")
    r.add_argument("ledger", help=f"the file {ENV} named")
    r.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = p.parse_args(argv)
    try:
        if args.command == "install":
            print(
                f"run_ledger: installed {install(args.site_dir)}; set {ENV}=<file> to record a run"
            )
        elif args.command == "uninstall":
            print(
                "run_ledger: removed"
                if uninstall(args.site_dir)
                else "run_ledger: was not installed"
            )
        else:
            summary = summarize(read(args.ledger))
            print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    except ValueError as exc:
        print(f"run_ledger: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
