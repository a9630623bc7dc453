"""What a reader copies: each copy set's files, derived from the imports, never listed by hand.

A copy set is named by the modules a reader wants (``validation``, ``te``...); its files are
those modules and everything they import inside ``tutorial_utils``, imports inside functions
included (:func:`closure`). The API page shows the sets (``conf.py`` expands its
``<!-- copy-sets -->`` marker with :func:`markdown_table`), and ``tests/core/test_copy_sets.py``
copies each into a package with another name and runs it there.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "tutorial_utils"

# what the reader wants -> the modules that give it (the files follow from the imports)
COPY_SETS = {
    "Reorder a packed batch for load balancing, and validate it": ["reorder", "validation"],
    "Pack documents into THD rows": ["inputs"],
    "The reference kernels and CP strategies (an oracle)": ["reference", "context_parallel"],
    "The `te` facade (TE's API with its checks; TE's code on CPU)": ["te"],
    "Check CP gradients against one device": ["gradient_check"],
    "The small language model and its data pipeline": ["model", "text_data"],
}


def module_name(path: Path) -> str:
    """``te/attention.py`` -> ``te.attention``; a package's ``__init__.py`` -> the package.

    Args:
        path: A ``.py`` file under :data:`PKG`.

    Returns:
        The dotted name inside the package (``""`` for the package itself).
    """
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_path(name: str) -> Path:
    """The file of a module named as :func:`module_name` names it.

    Args:
        name: A dotted name inside the package.

    Returns:
        Its ``.py`` file, or its package's ``__init__.py``.
    """
    base = PKG.joinpath(*name.split(".")) if name else PKG
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _exists(name: str) -> bool:
    return module_path(name).is_file()


def imports_of(name: str) -> set:
    """The package's modules that ``name`` imports, at its top or inside functions.

    Args:
        name: A dotted name inside the package.

    Returns:
        Dotted names of the modules (and packages) it imports.
    """
    path = module_path(name)
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(
                a.name[len("tutorial_utils") :].lstrip(".")
                for a in node.names
                if a.name.split(".")[0] == "tutorial_utils"
            )
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if (node.module or "").split(".")[0] != "tutorial_utils":
                    continue
                base = node.module[len("tutorial_utils") :].lstrip(".")
            else:
                parts = name.split(".") if name else []
                parts = parts if is_pkg else parts[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.add(base)
            for alias in node.names:
                candidate = f"{base}.{alias.name}".strip(".")
                if _exists(candidate):
                    found.add(candidate)
    return {m for m in found if m != name and _exists(m)}


def _with_packages(name: str) -> set:
    """A module and its enclosing packages: importing ``te.attention`` runs ``te/__init__``."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def closure(entries) -> list:
    """Every module a copy of ``entries`` needs, sorted.

    Args:
        entries: Dotted module names the reader wants.

    Returns:
        The dotted names, the entries included (the root package's ``__init__`` excluded: a
        copy gets its own).
    """
    todo, seen = list(entries), set()
    while todo:
        name = todo.pop()
        for m in _with_packages(name):
            if m not in seen:
                seen.add(m)
                todo.extend(imports_of(m) | ({m} if m != name else set()))
    seen.discard("")
    return sorted(seen)


def files_of(entries) -> list:
    """The files to copy for ``entries``, relative to the package folder.

    Args:
        entries: Dotted module names the reader wants.

    Returns:
        Relative paths: the modules' ``.py`` files and the data files their folders ship
        (the CPU kernel's C++ source).
    """
    files = []
    for name in closure(entries):
        path = module_path(name)
        files.append(path.relative_to(PKG))
        if path.name == "__init__.py":
            files += [p.relative_to(PKG) for p in sorted(path.parent.glob("*.cc"))]
    return sorted(set(files))


def copy_into(dest: Path, entries) -> list:
    """Copy a set into the folder ``dest`` (a package under another name).

    Args:
        dest: The new package's folder; it gets an empty ``__init__.py``.
        entries: Dotted module names the reader wants.

    Returns:
        The relative paths copied.
    """
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "__init__.py").touch()
    files = files_of(entries)
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(PKG / rel, dest / rel)
    return files


def markdown_table() -> str:
    """The API page's table: each set and its files.

    Returns:
        A Markdown table.
    """
    rows = ["| to | copy these files from `src/tutorial_utils/` |", "|---|---|"]
    for what, entries in COPY_SETS.items():
        files = [str(p) for p in files_of(entries) if p.suffix == ".py"]
        rows.append(f"| {what} | " + ", ".join(f"`{f}`" for f in files) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
