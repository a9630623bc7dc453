"""Each chapter ends with code a reader can paste into a fresh Python, and it runs there.

A chapter's last code cell carries the tag ``standalone``: it imports only JAX, NumPy, Flax,
optax and ``transformer_engine``, builds its own inputs, does the chapter's job and checks
itself. The landing page's first code cell not tagged ``remove-cell`` is the complete CP
call, held to the same rule.
Each such cell is written to a file alone and run through ``python -m tutorial_utils.te_on_cpu
--devices 4``, as a reader without a GPU would run it. A chapter's cell is also tagged
``skip-execution``: it repeats the chapter's job from scratch, so the site build shows it
without running it again (its compiles were a sixth of the build's CPU), and this test runs it.
"""

import ast
import re
from pathlib import Path

import pytest
from helpers import run_script
from site_pages import chapter_sources

ROOT = Path(__file__).resolve().parents[2]
ALLOWED_ROOTS = {"jax", "numpy", "flax", "optax", "transformer_engine", "functools", "math"}
TAG = "standalone"


def code_cells(path: Path) -> list[tuple[str, str]]:
    """``(options, source)`` of each code cell of a MyST page, in order."""
    found = []
    for match in re.finditer(r"```\{code-cell\}[^\n]*\n(.*?)```", path.read_text(), re.S):
        lines = match.group(1).split("\n")
        options = []
        while lines and lines[0].startswith(":"):
            options.append(lines.pop(0))
        found.append((" ".join(options), "\n".join(lines)))
    return found


def standalone_cell(path: Path) -> str:
    """The page's cell tagged ``standalone``: a chapter's last code cell, the landing page's first
    shown one (its device set-up, tagged ``remove-cell``, may come before it).

    Raises:
        AssertionError: The page has none, several, or one in the wrong place.
    """
    cells = code_cells(path)
    tagged = [i for i, (opts, _) in enumerate(cells) if TAG in opts]
    assert len(tagged) == 1, f"{path.name}: {len(tagged)} cells tagged {TAG!r}; want exactly one"
    shown = [i for i, (opts, _) in enumerate(cells) if "remove-cell" not in opts]
    where = shown[0] if path.name == "index.md" else len(cells) - 1
    assert tagged[0] == where, f"{path.name}: the {TAG!r} cell is cell {tagged[0]}, not {where}"
    return cells[where][1]


def foreign_imports(source: str) -> list[str]:
    """Top-level packages the code imports beyond the ones a reader already has."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append("." * node.level + (node.module or ""))
    return sorted({n for n in names if n.split(".")[0] not in ALLOWED_ROOTS})


PAGES = [*chapter_sources(), ROOT / "index.md"]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.stem)
def test_the_page_has_one_standalone_cell_with_a_readers_imports(path):
    assert not foreign_imports(standalone_cell(path)), path.name
    options = [opts for opts, _ in code_cells(path) if TAG in opts]
    # a chapter's is shown, not run, by the build; the landing page's call shows its output
    assert ("skip-execution" in options[0]) == (path.name != "index.md"), options


@pytest.mark.slow
@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.stem)
def test_the_standalone_cell_runs_alone_through_the_runner(path, tmp_path):
    script = tmp_path / f"{path.stem}.py"
    script.write_text(standalone_cell(path))
    proc = run_script(script, 4, timeout=600)
    assert proc.returncode == 0, f"{path.name}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


def test_the_landing_pages_call_is_thirty_lines_at_most_within_88_columns():
    lines = [line for line in standalone_cell(ROOT / "index.md").strip().splitlines()]
    assert len(lines) <= 30 and max(map(len, lines)) <= 88, (len(lines), max(map(len, lines)))


def test_the_import_rule_flags_a_tutorial_import():
    code = "import jax\nfrom tutorial_utils import model\nimport numpy as np\nfrom . import x\n"
    assert foreign_imports(code) == [".", "tutorial_utils"]
