"""Every shell command that README.md and docs/*.md show is run by this test, from a fresh clone.

What is harvested (``harvest()``):

* fenced code blocks whose language is ``bash``, ``sh``, ``shell``, ``zsh`` or ``console``
  (also ``{code-block} bash``): one command per line, backslash continuations joined, ``#``
  comments (outside quotes) removed, comment-only lines (``#!/bin/bash``, ``#SBATCH``)
  skipped; in ``console`` blocks only the lines that start with ``$ ``;
* markdown table cells that are exactly one inline code span starting like a command
  (``python``, ``.venv/bin/python``, ``make``, ``pip``, ``srun``, ``mpirun``, ``VAR=value``...),
  e.g. README's table of tools (``\\|`` inside the span reads as ``|``).

Prose inline code (a tool named in a sentence) is not harvested.

Markers a page may put on the line right before a fence (MyST comments: not rendered):

* ``% shown-commands: output``: the block shows output, not commands; it is not harvested.
* ``% shown-commands: run``: every command of the block runs as typed in the clone (exit 0
  within 300 s, nothing but its exit status checked): for cheap CPU commands such as
  ``python -m tutorial_utils.te_on_cpu examples/x.py``.
* ``% shown-commands: gpu``: the block is for a GPU node or a scheduler: ``python -m``
  commands are parsed by their real CLI, ``make`` targets run as ``make -n``, anything else
  is only syntax-checked (``bash -n``).

A ``HANDLED`` entry (below) wins over a marker.

How each command runs: ``HANDLED`` maps the command text (whitespace collapsed) to one
handler. A harvested command with no entry FAILS ``test_every_shown_command_is_handled``,
naming the file, the line and the command; so does an entry no page shows any more. The
kinds of handler:

* ``Run``: run as typed in the clone, with small sizes where the entry says so (appended or
  replaced arguments, e.g. ``--preset tiny``, ``--quick``), outputs written under a temporary
  folder (``{tmp}``), then the output checked (e.g. the launcher's per-rank results, a
  ``cp=4`` PASS line of ``check``).
* ``Parse``: commands for a GPU node or a scheduler (SLURM ``srun``, ``mpirun``): the inner
  ``python -m tutorial_utils.cli.X ...`` arguments are parsed by X's real command line
  (its ``__main__`` runs up to ``parse_args()``, which then prints the namespace and stops),
  in the clone; a ``bash -c '...'`` wrapper is syntax-checked with ``bash -n``.
* ``MakeDry``: ``make <target>`` runs as ``make -n <target>`` in the clone and the recipe must
  name what the target promises. ``make docs`` and ``make test`` are NOT run for real: ``make
  test`` runs this test (it would recurse) and ``make docs`` builds the whole site, which
  tests/site/test_site.py already does; ``make gpu-*`` need a GPU node, ``make serve``/``make lab``
  never exit, ``make bench-cpu`` is the recipe's script run with small sizes.
* ``Shell``: ``export``/``source`` lines run in ``bash -c`` in the clone.
* ``PytestCollect``: a ``pytest`` command shown on a page is collected (``--collect-only``)
  in the clone, not run: the suite runs those tests itself.

The fresh clone: ``git clone`` of this repository's committed HEAD into a temporary folder,
with ``.venv`` a link to this checkout's venv (nothing is installed) and ``PYTHONPATH`` set to
the clone's ``src`` (so the clone's code runs, not this checkout's). The suite's own settings
(8 simulated devices, ``TUTORIAL_TE_BACKEND=reference``) are removed: commands run with the
default backend, as a user types them. Three run-wide settings stay, because they change how fast a
command runs, not what it computes: the run's shared compilation cache, XLA's lowest
backend optimisation level (``TUTORIAL_RUN_XLA_FLAGS``, added when the command imports
tutorial_utils) and the garbage collector's thresholds (``TUTORIAL_RUN_GC_THRESHOLDS``). After every
command the clone must be unchanged
(``git status`` clean): outputs go to the temporary folder only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from launch_demo_checks import assert_demo_passed

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
SHELL_LANGS = {"bash", "sh", "shell", "zsh", "console"}
SKIP_MARK = "% shown-commands: output"
RUN_MARK = "% shown-commands: run"
GPU_MARK = "% shown-commands: gpu"
_COMMAND_START = re.compile(
    r"^([A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(python3?|\.venv\S*/python3?|make|pip3?|bash|sh|srun|sbatch|"
    r"mpirun|git|jupyter|source|export|cd|\.venv/bin/\S+)(\s|$)"
)


# ============================================================================ harvesting


def canonical(command: str) -> str:
    """The key a command is handled under: ``.venv/bin/python`` reads as ``python`` (the clone's
    PATH starts with .venv/bin)."""
    return re.sub(r"^\.venv/bin/python3?(?=\s|$)", "python", " ".join(command.split()))


@dataclasses.dataclass(frozen=True)
class Shown:
    page: str
    line: int
    command: str  # whitespace collapsed
    mark: str = ""  # "run" or "gpu" from a marker before the block

    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def key(self) -> str:
        return canonical(self.command)


def _strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` outside quotes, at the start or after a
    blank)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _block_commands(lines: list[tuple[int, str]], console: bool) -> list[tuple[int, str]]:
    out, buf, start = [], "", None
    for lineno, raw in lines:
        text = raw.strip()
        if console:
            if buf == "" and not text.startswith("$ "):
                continue
            if buf == "":
                text = text[2:]
        if buf == "" and (not text or text.startswith("#")):
            continue
        text = _strip_comment(text)
        if buf == "":
            start = lineno
        if text.endswith("\\"):
            buf += text[:-1] + " "
            continue
        buf += text
        if buf.strip():
            out.append((start, " ".join(buf.split())))
        buf = ""
    if buf.strip():
        out.append((start, " ".join(buf.split())))
    return out


def _fence_lang(info: str) -> str:
    info = info.strip()
    m = re.match(r"\{(code-block|code|sourcecode)\}\s*(\S*)", info)
    if m:
        return m.group(2).lower()
    return info.split()[0].lower() if info else ""


def _table_cells(line: str) -> list[str]:
    body = line.strip().strip("|")
    cells, cur, i = [], "", 0
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body) and body[i + 1] == "|":
            cur += "|"
            i += 2
            continue
        if body[i] == "|":
            cells.append(cur.strip())
            cur = ""
        else:
            cur += body[i]
        i += 1
    cells.append(cur.strip())
    return cells


def harvest_page(page: str, text: str) -> list[Shown]:
    found: list[Shown] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,}|~{3,})(.*)$", lines[i])
        if m:
            fence, lang = m.group(2), _fence_lang(m.group(3))
            before = lines[i - 1].strip() if i > 0 else ""
            skip = before == SKIP_MARK
            mark = {RUN_MARK: "run", GPU_MARK: "gpu"}.get(before, "")
            j = i + 1
            body = []
            while j < len(lines) and not lines[j].strip().startswith(fence):
                body.append((j + 1, lines[j]))
                j += 1
            if lang in SHELL_LANGS and not skip:
                found += [
                    Shown(page, n, c, mark)
                    for n, c in _block_commands(body, console=lang == "console")
                ]
            i = j + 1
            continue
        if lines[i].lstrip().startswith("|"):
            for cell in _table_cells(lines[i]):
                cm = re.fullmatch(r"`([^`]+)`", cell)
                if cm and _COMMAND_START.match(cm.group(1).strip()):
                    found.append(Shown(page, i + 1, " ".join(cm.group(1).split())))
        i += 1
    return found


def harvest(root: Path = ROOT) -> list[Shown]:
    out: list[Shown] = []
    for page in PAGES:
        path = root / page
        if path.exists():
            out += harvest_page(page, path.read_text(encoding="utf-8"))
    return out


# ============================================================================ handlers


@dataclasses.dataclass
class Run:
    """Run in the clone; ``replace``/``append`` give small sizes and a temporary output folder
    (``{tmp}``)."""

    why: str
    append: Sequence[str] = ()
    replace: Sequence[tuple[str, str]] = ()
    files: dict[str, str] = dataclasses.field(
        default_factory=dict
    )  # written into {tmp}; the command runs there
    timeout: int = 300
    check: Callable | None = None  # check(proc, tmp) -> dict of figures for the report

    def argv(self, command: str, tmp: Path) -> str:
        for old, new in self.replace:
            assert old in command, f"replacement {old!r} no longer applies to {command!r}"
            command = command.replace(old, new)
        return " ".join([command, *self.append]).replace("{tmp}", str(tmp))


@dataclasses.dataclass
class Parse:
    """A GPU or scheduler command: the inner tool's arguments are parsed by its real CLI (and bash
    -c is syntax-checked)."""

    why: str
    expect: dict[str, object] = dataclasses.field(
        default_factory=dict
    )  # parsed attributes that must hold
    inner: Sequence[str] | None = (
        None  # [module, *argv] when the command nests it (e.g. inside $(...))
    )


@dataclasses.dataclass
class MakeDry:
    why: str
    must_contain: Sequence[str] = ()


@dataclasses.dataclass
class Shell:
    why: str


@dataclasses.dataclass
class PipExtras:
    """A GPU install (``pip install -e '.[extra]'``): every extra it names is defined in the clone's
    pyproject.toml."""

    why: str


@dataclasses.dataclass
class PytestCollect:
    why: str


def _check_plan(proc, tmp):
    assert (
        "ring" in proc.stdout and "allgather" in proc.stdout and "Recommendation:" in proc.stdout
    ), proc.stdout[-2000:]
    return {}


def _check_bench(proc, tmp):
    records = list(Path(tmp).glob("*.json"))
    assert len(records) == 1, (records, proc.stdout[-2000:])
    rec = json.loads(records[0].read_text())
    assert rec["schema"] == "cp-bench/1" and not rec["failures"], rec["failures"]
    done = {r["strategy"]: r for r in rec["results"]}
    assert {"single", "ring", "allgather"} <= set(done), sorted(done)
    assert all(r["mean_ms"] > 0 for r in done.values())
    assert done["ring"]["cp_size"] in (4, 8), done[
        "ring"
    ]  # real CP on 4 simulated devices, or 8 emulated ranks
    return {
        "record": records[0].name,
        "label": rec["label"],
        "ms": {k: round(v["mean_ms"], 1) for k, v in done.items()},
    }


def _check_check(proc, tmp):
    lines = proc.stdout.splitlines()
    assert "Devices: 4 x cpu" in lines[1] and "simulated host devices" in lines[1], lines[:2]
    assert "TransformerEngine 2.20.2" in lines[0], lines[0]  # the default backend: TE's code on CPU
    for needle in (
        "PASS te-cp-allgather: cp=4",
        "PASS te-cp-ring: cp=4",
        "PASS cp-allgather (cp=4, cpu)",
        "PASS cp-ring (cp=4, cpu)",
        "PASS cp-ulysses (cp=4, cpu)",
    ):
        assert any(l.startswith(needle) for l in lines), (needle, proc.stdout[-3000:])
    assert not any(l.startswith("FAIL") for l in lines), proc.stdout[-3000:]
    assert not any(re.match(r"PASS (te-)?cp-.*cp=1\b", l) for l in lines)
    report = json.loads((Path(tmp) / "check.json").read_text())
    assert report["environment"]["device_count"] == 4 and report["summary"]["FAIL"] == 0
    return {l.split(":")[0]: l.split(": ", 1)[1][:60] for l in lines if l.startswith("PASS")}


def _check_demo4(proc, tmp):
    return assert_demo_passed(
        proc.returncode, proc.stdout, proc.stderr, Path(tmp) / "demo", nprocs=4
    )


def _check_worker(proc, tmp):
    for rank in range(4):
        assert f"[rank {rank}] GATHERED [0, 1, 2, 3] 4 ['--lr', '1']" in proc.stdout, proc.stdout[
            -3000:
        ]
    assert "OK: all 4 ranks exited 0" in proc.stderr
    return {}


def _check_backend_line(proc, tmp):
    assert proc.stdout.startswith("TransformerEngine 2.20.2"), (
        proc.stdout
    )  # on CPU: TE's code, CPU stand-in kernel
    return {"printed": proc.stdout.strip()}


def _check_bench_cpu(proc, tmp):
    assert "blockwise" in proc.stdout and "dense" in proc.stdout, proc.stdout[-2000:]
    left = sorted(
        p.name for p in Path(tmp).glob("bench-ref-*")
    )  # its TMPDIR: the workers' outputs go there
    assert not left, f"the benchmark left its scratch folders behind: {left}"
    return {}


def _check_bench_kernel(proc, tmp):
    rec = json.loads((Path(tmp) / "cpu-kernel-compiled-vs-jax.json").read_text())
    assert [r["variant"] for r in rec["results"]] == [
        "jax-blockwise",
        "jax-bounds",
        "compiled",
    ], rec["results"]
    assert all(r["max_abs_err_vs_jax_blockwise"] < 1e-4 for r in rec["results"]), rec["results"]
    assert rec["config"]["matmul_2048_gflop_per_s"] > 0 and "| compiled |" in proc.stdout
    return {"compiled_ms": round(rec["results"][2]["median_ms"], 1)}


MY_WORKER = """\
import sys
from tutorial_utils.cli.launch import initialize

info = initialize()
import numpy as np
from jax.experimental import multihost_utils

got = multihost_utils.process_allgather(np.array([info["process_id"]]))
print("GATHERED", sorted(int(x) for x in np.ravel(got)), len(info["global_devices"]), sys.argv[1:])
"""

# the cpu preset (bf16: TE's code on CPU refuses the fp32 tiny preset), one window, one AllGather
# stripe, one iteration
_SMALL_BENCH = (
    "--iters",
    "1",
    "--warmup",
    "0",
    "--windows",
    "256",
    "--stripes",
    "16",
    "--out",
    "{tmp}",
    "--no-progress",
)
_GPU = "needs a GPU node (seed preset, real TE, 4 GPUs)"

#: Command as shown (whitespace collapsed) -> how the test runs it.
HANDLED: dict[str, object] = {
    # ---- README: quick start and GPU node
    "make docs": MakeDry(
        "builds the whole site; tests/site/test_site.py builds it already",
        ("sphinx", "_build/html"),
    ),
    "make test": MakeDry(
        "runs the suite, this test included: recursion", ("pytest", "setup_machine.sh")
    ),
    "make gpu-setup": MakeDry("needs a CUDA node", ("gpu_setup", "transformer-engine")),
    "make gpu-check": MakeDry(
        "needs a GPU node",
        ("tutorial_utils.cli.check --out results/checks/gpu-check.json --force",),
    ),
    "make gpu-bundle": MakeDry("downloads ~290 MB of CUDA wheels", ("gpu_setup bundle",)),
    "make gpu-run": MakeDry("needs a GPU node and a carried bundle", ("gpu_setup run",)),
    "make bench-cpu": Run(
        "the recipe's script (make -n checked separately) at 512 tokens",
        replace=[
            (
                "make bench-cpu",
                (
                    "TMPDIR={tmp} XLA_FLAGS=--xla_force_host_platform_device_count=4 "
                    "python benchmarks/bench_reference_cpu.py"
                ),
            )
        ],
        append=(
            "--seq",
            "512",
            "--fallback-seq",
            "512",
            "--window",
            "64",
            "--iters",
            "1",
            "--warmup",
            "0",
            "--results-dir",
            "{tmp}",
        ),
        check=_check_bench_cpu,
        timeout=300,
    ),
    "make bench-kernel": Run(
        "the recipe's script (make -n checked separately) at 512 tokens",
        replace=[
            (
                "make bench-kernel",
                (
                    "XLA_FLAGS=--xla_force_host_platform_device_count=4 "
                    "python benchmarks/bench_cpu_kernel.py"
                ),
            )
        ],
        append=(
            "--seq",
            "512",
            "--window",
            "64",
            "--iters",
            "1",
            "--warmup",
            "0",
            "--results-dir",
            "{tmp}",
        ),
        check=_check_bench_kernel,
        timeout=300,
    ),
    # ---- README: table of tools, run as typed on a CPU laptop
    "python -m tutorial_utils.cli.plan --preset seed --hardware H200": Run(
        "cheap: a cost model", check=_check_plan, timeout=120
    ),
    # ---- docs/performance.md: the advisor on a shape of your own
    "python -m tutorial_utils.cli.plan --batch 1 --seq-len 262144 --q-heads 32 --kv-heads 8"
    " --segments 1 --valid 262144 --window -1 -1 --cp 8 --hardware H200 --compact": Run(
        "cheap: a cost model", check=_check_plan, timeout=120
    ),
    "python -m tutorial_utils.cli.bench --preset cpu": Run(
        "1 window, 1 AllGather stripe, 1 iteration; 4 simulated devices as bench sets them up",
        append=_SMALL_BENCH,
        check=_check_bench,
        timeout=400,
    ),
    "python -m tutorial_utils.cli.check": Run(
        "--quick, CP checks only (the other --quick checks run in tests/cli/test_check.py);"
        " 4 simulated devices by default",
        append=("--quick", "--only", "cp-", "--out", "{tmp}/check.json"),
        check=_check_check,
        timeout=500,
    ),
    "python -m tutorial_utils.cli.launch -n 4 --demo": Run(
        "as typed (README and docs/multinode.md): 4 processes, TE's AllGather and Ring on"
        " TE-on-CPU",
        append=("--out", "{tmp}/demo", "--timeout", "560"),
        check=_check_demo4,
        timeout=590,
    ),
    "python -m tutorial_utils.cli.gpu_setup cudnn|bundle|install|run": Parse(
        "GPU node set-up; each of the four subcommands is parsed (with --dry-run where it has one)"
    ),
    # ---- docs/multinode.md
    "python -m tutorial_utils.cli.launch -n 4 -- my_worker.py --lr 1": Run(
        "my_worker.py: a 9-line worker that calls initialize() and all-gathers the ranks",
        files={"my_worker.py": MY_WORKER},
        check=_check_worker,
        timeout=240,
    ),
    "python -m tutorial_utils.cli.bench --preset seed --emulate-ranks 8 --link-gbps 50": Run(
        "cpu preset for seed (seed's sub-problems do not fit a CPU), 1 window, 1 stripe, 1"
        " iteration",
        replace=[("--preset seed", "--preset cpu")],
        append=_SMALL_BENCH,
        check=_check_bench,
        timeout=400,
    ),
    "source .venv/bin/activate": Shell("the clone's .venv is this checkout's"),
    "export CP_LAUNCH_INIT_TIMEOUT=300 CP_LAUNCH_HEARTBEAT_TIMEOUT=60": Shell(
        "sets variables only"
    ),
    "srun python -m tutorial_utils.cli.launch --worker-demo --preset cpu": Parse(
        "SLURM", expect={"worker_demo": True, "preset": "cpu"}
    ),
    "mpirun -np 8 -H node1:4,node2:4 -x COORDINATOR_ADDRESS=node1:12355 -x PATH -x VIRTUAL_ENV bash -c 'NUM_PROCESSES=$OMPI_COMM_WORLD_SIZE PROCESS_ID=$OMPI_COMM_WORLD_RANK CP_LAUNCH_LOCAL_DEVICE_IDS=$OMPI_COMM_WORLD_LOCAL_RANK exec python -m tutorial_utils.cli.launch --worker-demo --preset cpu'": Parse(  # noqa: E501 (the command as the page shows it)
        "mpirun on two nodes", expect={"worker_demo": True, "preset": "cpu"}
    ),
    "python -m pytest tests/cli/test_launch.py": PytestCollect(
        "the suite runs tests/cli/test_launch.py"
    ),
    'python -m pytest -m "not slow" tests/cli/test_launch.py': PytestCollect(
        "the suite runs tests/cli/test_launch.py"
    ),
    # ---- docs/installation.md (same make targets as README)
    # ---- docs/gpu.md and its appendix, docs/gpu_offline_install.md
    "pip install --no-deps -e .": Run(
        "pip's --dry-run: resolves and builds the metadata, installs nothing",
        append=("--dry-run",),
        check=lambda proc, tmp: (
            {} if "Would install" in proc.stdout else pytest.fail(proc.stdout[-2000:])
        ),
        timeout=300,
    ),
    'python -c "import tutorial_utils.te as te; print(te.backend_name())"': Run(
        "on CPU it prints TE-on-CPU's name (the page shows a GPU node's output)",
        check=_check_backend_line,
        timeout=120,
    ),
    "export CP_TUTORIAL_PRESET=seed": Shell("sets a variable only"),
    "export TUTORIAL_TE_BACKEND=te": Shell("sets a variable only"),
    "python -m tutorial_utils.cli.bench": Parse(_GPU),
    "python -m tutorial_utils.cli.bench --preset seed --emulate-ranks 4": Parse(
        "takes the link speed from the GPU's profile: a GPU node",
        expect={"emulate_ranks": 4, "preset": "seed"},
    ),
    "python --version": Run(
        "prints the interpreter's version",
        check=lambda proc, tmp: (
            {"printed": proc.stdout.strip()}
            if proc.stdout.startswith("Python 3")
            else pytest.fail(proc.stdout + proc.stderr)
        ),
        timeout=30,
    ),
    "pip install -e '.[gpu-cuda13]'": PipExtras("downloads CUDA 13 wheels for a GPU node"),
    "CPLUS_INCLUDE_PATH=$(python -m tutorial_utils.cli.gpu_setup build-includes) NVTE_FRAMEWORK=jax NVTE_NO_LOCAL_VERSION=1 pip install --no-build-isolation transformer-engine-jax==2.20.2": Parse(  # noqa: E501 (the command as the page shows it)
        "builds TE's extension against CUDA headers: a GPU node; the inner gpu_setup call is"
        " parsed, the line bash -n checked",
        inner=["tutorial_utils.cli.gpu_setup", "build-includes"],
    ),
    "export LD_LIBRARY_PATH=$(python -m tutorial_utils.cli.gpu_setup library-path)": Parse(
        "a GPU node with a system CUDA toolkit; the inner gpu_setup call is parsed, the line"
        " bash -n checked",
        inner=["tutorial_utils.cli.gpu_setup", "library-path"],
    ),
    "make gpu-bundle GPU_CUDA=12 GPU_PYTHON=3.11": MakeDry(
        "downloads CUDA wheels", ("gpu_setup bundle", "--cuda 12", "--python-version 3.11")
    ),
    # ---- docs/recipes.md
    "python -m tutorial_utils.te_on_cpu --devices 4 examples/thd_ring.py": Run(
        "as typed: the unmodified TE recipe on TE-on-CPU, 4 simulated devices",
        timeout=500,
        check=lambda proc, tmp: (
            {}
            if proc.stdout.startswith(
                "te_on_cpu: examples/thd_ring.py\nte_on_cpu: it runs TransformerEngine"
            )
            else pytest.fail(proc.stdout[-2000:])
        ),
    ),
    "python -m tutorial_utils.cli.check_layout examples/packed_batch.npz --cp 4 --strategy allgather --stripe 128 --window 256": Run(  # noqa: E501 (the command as the page shows it)
        "as typed: the shipped sample batch",
        timeout=400,
        check=lambda proc, tmp: {} if "OK" in proc.stdout else pytest.fail(proc.stdout[-2000:]),
    ),
}

_ALTERNATIVES = {  # a usage line with alternatives: each alternative, with what its parser needs
    "python -m tutorial_utils.cli.gpu_setup cudnn|bundle|install|run": [
        ["cudnn"],
        ["bundle", "{tmp}/b", "--dry-run"],
        ["install", "{tmp}/b", "--dry-run"],
        ["run", "--dry-run"],
    ],
}


def handler_for(key: str):
    """The ``HANDLED`` entry for ``key``, else the one its block's marker gives, else None."""
    if key in HANDLED:
        return HANDLED[key]
    marks = {s.mark for s in SHOWN if s.key == key} - {""}
    if "run" in marks:
        return Run("marked `% shown-commands: run` on the page")
    if "gpu" in marks:
        first = key.split()[0]
        if first == "make":
            return MakeDry("marked `% shown-commands: gpu` on the page")
        if re.search(r"(^|\s)python3? -m \S", key):
            return Parse("marked `% shown-commands: gpu` on the page")
        return Syntax("marked `% shown-commands: gpu` on the page")
    return None


@dataclasses.dataclass
class Syntax:
    """Only ``bash -n``: a non-Python command of a block marked for a GPU node."""

    why: str


# ============================================================================ the clone


SHOWN = harvest()
UNIQUE = sorted({s.key for s in SHOWN})
FIGURES: dict[str, dict] = {}


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    dest = tmp_path_factory.mktemp("fresh") / "cp-attention-tutorial"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(dest)], check=True, timeout=120
    )
    (dest / ".venv").symlink_to(ROOT / ".venv")
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "XLA_FLAGS",
            "TUTORIAL_TE_BACKEND",
            "JAX_PLATFORMS",
            "PYTHONPATH",
            "PYTEST_CURRENT_TEST",
            "PYTEST_XDIST_WORKER",
        )
    }
    env.update(
        PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        VIRTUAL_ENV=str(ROOT / ".venv"),
        PIP_NO_INPUT="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        # the clone's package, and the run's own settings (compile cache, flags) from devtools/
        PYTHONPATH=os.pathsep.join([str(dest / "src"), str(ROOT / "devtools")]),
    )
    return dest, env


def _sh(command: str, clone, cwd=None, timeout=300):
    dest, env = clone
    t0 = time.monotonic()
    proc = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd or dest,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, time.monotonic() - t0


def _inner_python(command: str) -> tuple[str, list[str], str | None]:
    """``(module, argv, bash_c_script)`` of the ``python -m tutorial_utils.cli.X ...`` inside a
    command."""
    words = shlex.split(command)
    script = None
    if "bash" in words and "-c" in words:
        script = words[words.index("-c") + 1]
        words = shlex.split(script)
    i = next(i for i, w in enumerate(words) if re.fullmatch(r"(\S*/)?python3?", w))
    assert words[i + 1] == "-m", command
    return words[i + 2], words[i + 3 :], script


# The tool's own entry point (``python -m X``) up to its argument parsing: the outermost
# parse_args() parses for real, prints the namespace and exits, so nothing else runs.
_PARSE_ONLY = """
import argparse, json, runpy, sys
real = argparse.ArgumentParser.parse_args
def parse_only(self, args=None, namespace=None):
    ns = real(self, args, namespace)
    print("PARSED " + json.dumps(vars(ns), default=str), flush=True)
    raise SystemExit(0)
argparse.ArgumentParser.parse_args = parse_only
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def _parse(command: str, handler: Parse, clone, tmp) -> dict:
    if handler.inner:
        (module, *argv), script = handler.inner, command
    else:
        module, argv, script = _inner_python(command)
    if script is not None:
        proc, _ = _sh(f"bash -n -c {shlex.quote(script)}", clone)
        assert proc.returncode == 0, f"bash -n: {proc.stderr}"
    runs = _ALTERNATIVES.get(command) or [argv]
    parsed = []
    for args in runs:
        args = [a.replace("{tmp}", str(tmp)) for a in args]
        proc, _ = _sh(
            f"python -c {shlex.quote(_PARSE_ONLY)} {shlex.quote(module)} "
            + " ".join(map(shlex.quote, args)),
            clone,
            timeout=120,
        )
        parsed_lines = [l for l in proc.stdout.splitlines() if l.startswith("PARSED ")]
        assert proc.returncode == 0 and parsed_lines, (
            f"{module} {args}: {proc.stdout[-1000:]}{proc.stderr[-2000:]}"
        )
        ns = json.loads(parsed_lines[-1][len("PARSED ") :])
        for key, want in handler.expect.items():
            assert ns[key] == want, (key, ns[key], want)
        parsed.append(ns)
    return {"parsed": len(parsed)}


def _make_dry(command: str, handler: MakeDry, clone) -> dict:
    target = command.split()[1]
    proc, _ = _sh(
        "make -n " + " ".join(map(shlex.quote, shlex.split(command)[1:])), clone, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    for needle in handler.must_contain:
        assert needle in proc.stdout, (
            f"`make -n {target}` does not mention {needle!r}:\n{proc.stdout}"
        )
    return {}


# ============================================================================ the tests


def test_harvest_reads_blocks_tables_and_markers():
    page = "\n".join(
        [
            "```bash",
            "make docs    # build",
            "  # only a comment",
            "python -m a.b --x 1 \\",
            "   --y 2   # two lines",
            "```",
            "| `.venv/bin/python -m a.c --p x\\|y` | what |",
            "| `not a command` | `make lab` |",
            "```python",
            "print(1)",
            "```",
            SKIP_MARK,
            "```bash",
            "# output",
            "Backend: x",
            "```",
            "```console",
            "$ make test",
            "output line",
            "```",
            "```{code-block} sh",
            "echo 'a # b'  # c",
            "```",
            GPU_MARK,
            "```bash",
            "nvidia-smi -L",
            "python -m a.d --g 1",
            "```",
            RUN_MARK,
            "```bash",
            "python x.py",
            "```",
        ]
    )
    got = [(s.line, s.command, s.mark) for s in harvest_page("p.md", page)]
    assert got == [
        (2, "make docs", ""),
        (4, "python -m a.b --x 1 --y 2", ""),
        (7, ".venv/bin/python -m a.c --p x|y", ""),
        (8, "make lab", ""),
        (18, "make test", ""),
        (22, "echo 'a # b'", ""),
        (26, "nvidia-smi -L", "gpu"),
        (27, "python -m a.d --g 1", "gpu"),
        (31, "python x.py", "run"),
    ]


def test_every_shown_command_is_handled():
    unhandled = [s for s in SHOWN if handler_for(s.key) is None]
    stale = sorted(set(HANDLED) - set(UNIQUE))
    msg = []
    if unhandled:
        msg.append(
            "commands shown on a page that no test runs (add each to HANDLED in"
            f" tests/site/test_shown_commands.py, or mark an output-only block with `{SKIP_MARK}`"
            " on the line before its fence):"
        )
        msg += [f"  {s.where()}: {s.command}" for s in unhandled]
    if stale:
        msg.append("HANDLED entries that no page shows any more (remove them):")
        msg += [f"  {c}" for c in stale]
    assert not msg, "\n".join(msg)
    assert len(SHOWN) >= 20  # README and docs show commands; an empty harvest would pass vacuously


def test_the_clone_runs_its_own_code(clone):
    dest, _ = clone
    # README's `.venv/bin/python` and the docs' `python` are one interpreter here (handled under one
    # key)
    proc, _ = _sh(
        ".venv/bin/python -c 'import tutorial_utils, os;"
        " print(os.path.realpath(tutorial_utils.__file__))'",
        clone,
    )
    assert proc.stdout.strip() == str(
        (dest / "src" / "tutorial_utils" / "__init__.py").resolve()
    ), proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "command", UNIQUE, ids=[c if len(c) <= 90 else c[:87] + "..." for c in UNIQUE]
)
def test_shown_command(command, clone, tmp_path):
    handler = handler_for(command)
    if handler is None:
        where = ", ".join(s.where() for s in SHOWN if s.key == command)
        pytest.fail(
            f"{where}: `{command}` is shown but no test runs it; add it to HANDLED in"
            f" {Path(__file__).name}"
        )
    t0 = time.monotonic()
    if isinstance(handler, Run):
        for name, text in handler.files.items():
            (tmp_path / name).write_text(text)
        line = handler.argv(command, tmp_path)
        proc, _ = _sh(line, clone, cwd=tmp_path if handler.files else None, timeout=handler.timeout)
        assert proc.returncode == 0, (
            f"`{line}` exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}"
        )
        figures = handler.check(proc, tmp_path) if handler.check else {}
        scripts = {
            "make bench-cpu": "benchmarks/bench_reference_cpu.py",
            "make bench-kernel": "benchmarks/bench_cpu_kernel.py",
        }
        if command in scripts:
            figures.update(_make_dry(command, MakeDry("", (scripts[command],)), clone))
        ran = line
    elif isinstance(handler, Parse):
        figures, ran = _parse(command, handler, clone, tmp_path), "parsed"
    elif isinstance(handler, MakeDry):
        figures, ran = _make_dry(command, handler, clone), f"make -n {command.split()[1]}"
    elif isinstance(handler, Shell):
        proc, _ = _sh(f"set -e; {command}", clone, timeout=60)
        assert proc.returncode == 0, proc.stderr
        figures, ran = {}, "bash -c"
    elif isinstance(handler, Syntax):
        proc, _ = _sh(f"bash -n -c {shlex.quote(command)}", clone, timeout=30)
        assert proc.returncode == 0, proc.stderr
        figures, ran = {}, "bash -n"
    elif isinstance(handler, PipExtras):
        import tomllib

        dest, _ = clone
        extras = set(
            tomllib.loads((dest / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        )
        named = {x for spec in re.findall(r"\.\[([^\]]+)\]", command) for x in spec.split(",")}
        assert named and named <= extras, (
            f"{command}: extras {sorted(named - extras)} not in pyproject.toml {sorted(extras)}"
        )
        figures, ran = {"extras": sorted(named)}, "extras checked"
    elif isinstance(handler, PytestCollect):
        proc, _ = _sh(
            command.replace("-m pytest", "-m pytest --collect-only -q -p no:cacheprovider", 1),
            clone,
            timeout=180,
        )
        assert proc.returncode == 0 and re.search(
            r"\d+(/\d+)? tests? (collected|selected)", proc.stdout
        ), proc.stdout[-2000:]
        figures, ran = {"collected": proc.stdout.strip().splitlines()[-1]}, "pytest --collect-only"
    else:  # pragma: no cover - a new handler kind
        pytest.fail(f"unknown handler {handler!r}")
    FIGURES[command] = {"how": ran, "seconds": round(time.monotonic() - t0, 1), **figures}
    print(f"SHOWN-COMMAND {json.dumps({'command': command, **FIGURES[command]}, default=str)}")


def test_the_clone_is_unchanged(clone):
    """Every command wrote into its temporary folder only (runs after the commands: pytest keeps
    file order)."""
    dest, _ = clone
    proc, _ = _sh("git status --porcelain --ignored=no", clone)
    changed = [l for l in proc.stdout.splitlines() if l[3:] not in (".venv",)]
    assert not changed, changed
