"""Show a package function's source on a chapter page, as the cell's output.

A chapter that explains an algorithm should show the code that runs, not a pasted copy that
drifts: :func:`show_source` reads it with :func:`inspect.getsource` when the notebook executes.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path

__all__ = ["SourceCode", "show_source"]


class SourceCode:
    """A function's source, shown by Jupyter as a highlighted Python block (Markdown output)."""

    def __init__(self, name: str, where: str, code: str, folded: bool = False):
        self.name, self.where, self.code, self.folded = name, where, code, folded

    def markdown(self) -> str:
        longest = max((len(run) for run in re.findall(r"`+", self.code)), default=0)
        fence = "`" * max(3, longest + 1)
        block = f"{fence}python\n{self.code.rstrip()}\n{fence}\n"
        lines = len(self.code.rstrip().splitlines())
        if self.folded:
            # a dropdown whose title names the source, in a colon fence: a backtick fence's
            # title may not hold backticks, and the code block inside keeps its own fence
            return f":::{{dropdown}} {self.name} ({self.where}), {lines} lines\n{block}:::\n"
        return f"`{self.name}` ({self.where})\n\n{block}"

    def _repr_markdown_(self) -> str:
        return self.markdown()

    def __repr__(self) -> str:
        return f"# {self.name} ({self.where})\n{self.code.rstrip()}"


def _where(obj) -> str:
    """``src/tutorial_utils/x.py, lines a-b`` (the path from ``src/`` when the file lies there)."""
    path = Path(inspect.getsourcefile(obj) or "?")
    parts = path.parts
    shown = Path(*parts[parts.index("src") :]) if "src" in parts else Path(path.name)
    lines, first = inspect.getsourcelines(obj)
    return f"{shown.as_posix()}, lines {first}-{first + len(lines) - 1}"


def show_source(obj, *, folded: bool = False) -> SourceCode:
    """The source of a function or class, for display as a notebook cell's output.

    The result renders as a highlighted code block headed by the object's qualified name and
    file; ``folded=True`` puts it in a closed dropdown titled with the name, for code the
    text has already explained, so that the page stays short. Raises ``TypeError`` for
    objects without Python source (builtins, C functions).
    """
    target = inspect.unwrap(obj)
    if not (inspect.isfunction(target) or inspect.isclass(target) or inspect.ismethod(target)):
        raise TypeError(
            f"show_source needs a Python function or class, got {type(obj).__name__} {obj!r}."
        )
    try:
        code = inspect.getsource(target)
    except (OSError, TypeError) as err:
        raise TypeError(f"no source found for {obj!r} ({err}).") from err
    name = f"{target.__module__}.{target.__qualname__}"
    return SourceCode(name, _where(target), textwrap.dedent(code), folded)
