"""Ruff on the code cells of the chapters (MyST Markdown notebooks), at the width a page shows.

Ruff reads ``.py`` and ``.ipynb`` files, not MyST Markdown, so each ``{code-cell}`` is handed to
``ruff format`` and ``ruff check`` on its own, as a module, with ``notebooks/ruff.toml``'s
settings (88 columns). ``--fix`` writes the formatted cells back in place; the Markdown around
them is left as it is.

    python devtools/lint_notebooks.py [--fix] [notebooks/*.md]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CELL = re.compile(r"(```\{code-cell\}[^\n]*\n(?::[^\n]*\n)*)(.*?)(\n?```)", re.S)
CONFIG = ROOT / "notebooks" / "ruff.toml"


def _ruff(*args: str, source: str, name: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            *args,
            "--config",
            str(CONFIG),
            "--stdin-filename",
            name,
            "-",
        ],
        input=source,
        capture_output=True,
        text=True,
    )


def lint(path: Path, fix: bool) -> list[str]:
    """Problems in ``path``'s code cells (after formatting them, with ``fix``).

    Each cell is formatted on its own; the cells are checked together, in order, as the kernel
    runs them (a name one cell defines is used by the next). A cell tagged ``standalone`` is a
    program of its own (a reader pastes it into a fresh Python), so it is checked alone.
    """
    text = path.read_text()
    problems, pieces, cells, alone, last = [], [], [], [], 0
    for k, m in enumerate(CELL.finditer(text), start=1):
        head, code, tail = m.group(1), m.group(2), m.group(3)
        name = f"{path.name}:cell{k}"
        source = code + "\n"
        if fix:  # sort the cell's imports first, as ruff check --fix would
            sorted_ = _ruff(
                "check", "--fix", "--select", "I", "--quiet", source=source, name=name + ".py"
            )
            source = sorted_.stdout or source
        formatted = _ruff("format", source=source, name=name + ".py")
        if formatted.returncode != 0:
            problems.append(f"{name}: ruff format failed: {formatted.stderr.strip()}")
            new = code
        else:
            new = formatted.stdout.rstrip("\n")
            if new != code and not fix:
                problems.append(f"{name}: not formatted (python devtools/lint_notebooks.py --fix)")
        (alone if "standalone" in head else cells).append((name, f"# {name}\n{new}\n"))
        pieces += [text[last : m.start()], head, new, tail]
        last = m.end()
    pieces.append(text[last:])
    programs = [(path.with_suffix(".py").name, "\n".join(c for _, c in cells))]
    for name, source in programs + [(f"{name}.py", c) for name, c in alone]:
        check = _ruff("check", "--quiet", "--output-format", "concise", source=source, name=name)
        if check.returncode != 0:
            problems += [line for line in check.stdout.splitlines() if line.strip()]
    if fix:
        path.write_text("".join(pieces))
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fix", action="store_true", help="write the formatted cells back")
    p.add_argument("paths", nargs="*", type=Path)
    args = p.parse_args(argv)
    paths = args.paths or sorted((ROOT / "notebooks").glob("*.md"))
    problems = [q for path in paths for q in lint(path, args.fix)]
    for q in problems:
        print(q)
    print(f"lint_notebooks: {len(paths)} notebooks, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
