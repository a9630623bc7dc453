"""The package layout: what a reader copies stays apart from the tutorial's tooling.

* No import cycles between modules, counting imports inside functions too.
* The copied modules (top level and ``te/``) import nothing from ``tools/``, except the
  facade's backend choice, which must know whether it runs on CPU (TE's code with a CPU kernel).
"""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "tutorial_utils"
ALLOWED_CORE_TO_TOOLS = {("te._backend", "tools.te_on_cpu")}


def _module(path: Path) -> str:
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(current: str, is_pkg: bool, node: ast.ImportFrom) -> list:
    if node.level == 0:
        if not (node.module or "").startswith("tutorial_utils"):
            return []
        base = node.module[len("tutorial_utils"):].lstrip(".")
    else:
        parts = current.split(".") if current else []
        parts = parts if is_pkg else parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    out = []
    for alias in node.names:
        cand = f"{base}.{alias.name}".strip(".")
        out.append(cand if (PKG / cand.replace(".", "/")).with_suffix(".py").exists()
                   or (PKG / cand.replace(".", "/")).is_dir() else base)
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
                deps.update(a.name[len("tutorial_utils"):].lstrip(".") for a in node.names
                            if a.name.startswith("tutorial_utils"))
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
    graph = {m: {d for d in deps if d not in _packages_of(m) and d != ""} for m, deps in graph.items()}
    seen, stack, cycles = set(), [], []

    def visit(node):
        if node in stack:
            cycles.append(stack[stack.index(node):] + [node])
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
    core = [m for m in graph if m != "" and not m.startswith("tools")]
    assert {"reference", "context_parallel", "reorder", "validation", "inputs", "te.attention"} <= set(core)
    bad = [(m, d) for m in core for d in graph[m] if d.startswith("tools") and (m, d) not in ALLOWED_CORE_TO_TOOLS]
    assert not bad, f"copied modules import the tutorial's tooling: {bad}"
