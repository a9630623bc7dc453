"""The package layout: what a reader copies stays apart from the tooling, and the installed
package holds none of the project's own development tooling.

* No import cycles between modules, counting imports inside functions too.
* The copied modules (top level and ``te/``) import nothing from ``cli``, ``pages`` or
  ``perfmodel``; only the facade's backend choice imports ``te_on_cpu`` (TE's code on CPU).
* ``tutorial_utils/__init__.py`` only re-exports, and importing the package loads no tooling.
* The built wheel holds the package and nothing of ``devtools/`` or ``tests/``.
"""

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "tutorial_utils"
TOOLING = ("cli", "pages", "perfmodel", "te_on_cpu")
ALLOWED_CORE_TO_TOOLS = {("te._backend", "te_on_cpu")}


def _module(path: Path) -> str:
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(current: str, is_pkg: bool, node: ast.ImportFrom) -> list:
    if node.level == 0:
        if not (node.module or "").startswith("tutorial_utils"):
            return []
        base = node.module[len("tutorial_utils") :].lstrip(".")
    else:
        parts = current.split(".") if current else []
        parts = parts if is_pkg else parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    out = []
    for alias in node.names:
        cand = f"{base}.{alias.name}".strip(".")
        out.append(
            cand
            if (PKG / cand.replace(".", "/")).with_suffix(".py").exists()
            or (PKG / cand.replace(".", "/")).is_dir()
            else base
        )
    return out


def _graph() -> dict:
    graph = {}
    for path in PKG.rglob("*.py"):
        mod = _module(path)
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                deps.update(_resolve(mod, path.name == "__init__.py", node))
            elif isinstance(node, ast.Import):
                deps.update(
                    a.name[len("tutorial_utils") :].lstrip(".")
                    for a in node.names
                    if a.name.startswith("tutorial_utils")
                )
        graph[mod] = {d for d in deps if d != mod and d in _all_modules()}
    return graph


def _all_modules() -> set:
    return {_module(p) for p in PKG.rglob("*.py")}


def _packages_of(mod: str) -> set:
    """A module's enclosing packages: importing ``te.attention`` runs ``te/__init__``."""
    parts = mod.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_no_import_cycles():
    graph = _graph()
    # an edge to a package's __init__ from inside that package is how Python loads it, not a cycle
    graph = {
        m: {d for d in deps if d not in _packages_of(m) and d != ""} for m, deps in graph.items()
    }
    seen, stack, cycles = set(), [], []

    def visit(node):
        if node in stack:
            cycles.append(stack[stack.index(node) :] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            visit(dep)
        stack.pop()

    for mod in sorted(graph):
        visit(mod)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_copied_modules_do_not_depend_on_the_tooling():
    graph = _graph()
    core = [m for m in graph if not m.startswith(TOOLING)]
    assert {
        "",
        "reference",
        "context_parallel",
        "reorder",
        "validation",
        "inputs",
        "te.attention",
    } <= set(core)
    bad = [
        (m, d)
        for m in core
        for d in graph[m]
        if d.startswith(TOOLING) and (m, d) not in ALLOWED_CORE_TO_TOOLS
    ]
    assert not bad, f"copied modules import the tutorial's tooling: {bad}"


def test_the_root_init_only_re_exports():
    tree = ast.parse((PKG / "__init__.py").read_text())
    body = tree.body[1:] if isinstance(tree.body[0], ast.Expr) else tree.body  # the docstring
    kinds = {type(node).__name__ for node in body}
    assert kinds <= {"ImportFrom", "Assign"}, kinds
    names = {t.id for node in body if isinstance(node, ast.Assign) for t in node.targets}
    assert names == {"__all__", "__version__"}
    imported = {
        a.asname or a.name for node in body if isinstance(node, ast.ImportFrom) for a in node.names
    }
    exported = next(
        node.value
        for node in body
        if isinstance(node, ast.Assign) and node.targets[0].id == "__all__"
    )
    assert imported == {ast.literal_eval(e) for e in exported.elts}


def test_importing_the_package_loads_no_tooling():
    """A reader's ``import tutorial_utils``: no compile cache, GC tuning, run hooks or tooling."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = (
        "import sys, tutorial_utils; print(' '.join(sorted(m for m in sys.modules if"
        " m.startswith(('tutorial_utils', 'compile_cache', 'run_gc', 'run_hooks', 'run_ledger',"
        " 'sitecustomize')))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT / "src",
    ).stdout.split()
    core = ["tutorial_utils", "tutorial_utils.reorder", "tutorial_utils.rules"]
    assert out == core + ["tutorial_utils.validation"], out


def test_the_wheel_holds_the_package_and_no_development_tooling(tmp_path):
    import shutil

    project = tmp_path / "project"  # a copy: setuptools writes build/ next to the sources
    shutil.copytree(
        ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
            str(project),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    modules = sorted(n for n in names if n.startswith("tutorial_utils/"))
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"tutorial_utils"}, top
    for forbidden in (
        "compile_cache",
        "run_gc",
        "run_ledger",
        "run_hooks",
        "venv_install",
        "sitecustomize",
        "gpu_carry",
        "te_build_check",
        "conftest",
    ):
        assert not [n for n in names if forbidden in n], forbidden
    assert (
        "tutorial_utils/te_on_cpu/cpu_attention_kernel.cc" in modules
    )  # the kernel's source travels
    assert {f"tutorial_utils/{d}/__init__.py" for d in TOOLING} <= set(modules)
