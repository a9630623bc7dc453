"""The code on the chapter pages: short, inside the code box, and every line teaching.

Counted over the code cells of every chapter in the site's table of contents (jupytext MyST
sources), as ``make lint`` formats them (ruff, 88 columns):

* at most 1,400 reader-visible lines in all and 270 in any one chapter (non-blank,
  non-comment lines of cells that are not hidden with ``hide-input``, ``remove-input`` or
  ``remove-cell``), the ``standalone`` cell at each chapter's end apart, at most 80 lines;
* no line of any code cell wider than 88 characters, the width of the code box;
* no imported name that the chapter does not use;
* no function defined on two chapter pages (a helper shared by chapters lives in the package);
* hidden cells draw figures (they call ``plt`` or ``plots``), nothing else.
"""

import ast
import re
from pathlib import Path

import pytest
from site_pages import chapter_sources

ALL_CHAPTERS = chapter_sources()
BUDGET, CHAPTER_BUDGET = 1400, 270
STANDALONE, STANDALONE_BUDGET = "standalone", 80
WIDTH = 88
HIDDEN = ("hide-input", "remove-input", "remove-cell")


def cells(path: Path):
    """``(options, source lines)`` of each code cell."""
    for match in re.finditer(r"```\{code-cell\}[^\n]*\n(.*?)```", path.read_text(), re.S):
        lines = match.group(1).split("\n")
        options = []
        while lines and lines[0].startswith(":"):
            options.append(lines.pop(0))
        yield " ".join(options), lines


def visible_lines(path: Path, *, standalone: bool = False) -> int:
    """Reader-visible code lines of the teaching cells, or of the ``standalone`` cell."""
    return sum(
        1
        for opts, lines in cells(path)
        if not any(t in opts for t in HIDDEN) and (STANDALONE in opts) == standalone
        for line in lines
        if line.strip() and not line.strip().startswith("#")
    )


def test_the_chapters_show_a_bounded_amount_of_formatted_code():
    counts = {p.stem: visible_lines(p) for p in ALL_CHAPTERS}
    assert len(counts) == len(ALL_CHAPTERS) >= 9
    assert sum(counts.values()) <= BUDGET, (
        f"{sum(counts.values())} visible code lines > {BUDGET}: {counts}"
    )
    assert max(counts.values()) <= CHAPTER_BUDGET, counts


def test_each_standalone_cell_is_short():
    """The paste-able cell at a chapter's end repeats its imports and inputs, so it is
    counted apart from the teaching code, with a cap of its own."""
    counts = {p.stem: visible_lines(p, standalone=True) for p in ALL_CHAPTERS}
    assert max(counts.values()) <= STANDALONE_BUDGET, counts


@pytest.mark.parametrize("path", ALL_CHAPTERS, ids=lambda p: p.stem)
def test_no_code_line_is_wider_than_the_code_box(path):
    wide = [line for _, lines in cells(path) for line in lines if len(line) > WIDTH]
    assert not wide, f"{len(wide)} code line(s) wider than {WIDTH}: {wide[:3]}"


def _code(path: Path) -> str:
    return "\n".join(
        "\n".join(l for l in lines if not l.lstrip().startswith(("%", "!")))
        for _, lines in cells(path)
    )


@pytest.mark.parametrize("path", ALL_CHAPTERS, ids=lambda p: p.stem)
def test_each_chapter_imports_only_what_it_uses(path):
    tree = ast.parse(_code(path))
    imported = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                name = (alias.asname or alias.name).split(".")[0]
                imported[name] = node.lineno
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {
        n.value.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
    }
    unused = sorted(set(imported) - used)
    assert not unused, f"{path.stem} imports names it never uses: {unused}"


def test_no_helper_is_defined_on_two_pages():
    where = {}
    for path in ALL_CHAPTERS:
        for node in ast.walk(ast.parse(_code(path))):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                where.setdefault(node.name, set()).add(path.stem)
    twice = {name: sorted(pages) for name, pages in where.items() if len(pages) > 1}
    assert not twice, f"defined on several pages (move them into the package): {twice}"


@pytest.mark.parametrize("path", ALL_CHAPTERS, ids=lambda p: p.stem)
def test_hidden_cells_only_draw_figures(path):
    for opts, lines in cells(path):
        if any(t in opts for t in HIDDEN) and "remove-cell" not in opts:
            text = "\n".join(lines)
            assert "plt." in text or "plots." in text, (
                f"{path.stem}: a hidden cell that draws no figure:\n{text[:300]}"
            )
