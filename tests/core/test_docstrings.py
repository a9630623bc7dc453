"""Every public function of the files a reader copies says what it takes, returns and raises.

The files: the copy sets' (``devtools/copy_sets.py``, derived from the imports) and every module
of ``te/`` and ``te_on_cpu/``. Ruff's pydocstyle rules check their docstrings' form (``D``,
Google convention, these files only: pyproject.toml), and that an ``Args:`` section names every
parameter (D417). Ruff has no stable rule for a section that is missing altogether (its
pydoclint rules are preview-only, and preview changes other rules too), so this test asks that:

* a public function or method with parameters has ``Args:`` naming each one;
* one that returns a value has ``Returns:`` (a generator ``Yields:`` or ``Returns:``; a
  property documents an attribute and needs neither);
* one with a ``raise`` that it does not catch itself has ``Raises:`` naming each exception
  class.

Public: no leading underscore, at a module's top level (inside ``if``/``try`` blocks too) or a
method of such a class.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import copy_sets
import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("Args", "Returns", "Yields", "Raises", "Example", "Examples", "Note", "Notes")


def copied_files() -> list[Path]:
    """The files the rule covers: the copy sets' modules and all of ``te/`` and ``te_on_cpu/``."""
    entries = [m for entries in copy_sets.COPY_SETS.values() for m in entries]
    files = {copy_sets.PKG / f for f in copy_sets.files_of(entries) if f.suffix == ".py"}
    files |= {copy_sets.PKG / "__init__.py"}
    for folder in ("te", "te_on_cpu"):
        files |= set((copy_sets.PKG / folder).glob("*.py"))
    return sorted(files)


def sections(doc: str) -> dict:
    """A Google-style docstring's sections: name -> the section's text."""
    out, name = {}, None
    for line in doc.splitlines():
        head = re.fullmatch(r"\s*(\w+):\s*", line)
        if head and head.group(1) in SECTIONS:
            name = head.group(1)
            out[name] = ""
        elif name is not None:
            out[name] += line + "\n"
    return out


def _own_nodes(func):
    """The nodes of ``func``'s body, not those of functions, lambdas or classes inside it."""
    todo = list(func.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))


def _uncaught_raises(nodes, catch_all=False, caught=frozenset()):
    """The ``raise`` statements among ``nodes`` (a body) that no enclosing ``except`` catches."""
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Raise) and node.exc is not None:
            if not catch_all and _raised_name(node) not in caught:
                yield node
        if isinstance(node, ast.Try):
            types = [h.type for h in node.handlers]
            names = {getattr(t, "id", getattr(t, "attr", None)) for t in types if t is not None}
            for t in types:
                if isinstance(t, ast.Tuple):
                    names |= {getattr(e, "id", getattr(e, "attr", None)) for e in t.elts}
            everything = None in types or bool(names & {"Exception", "BaseException"})
            yield from _uncaught_raises(node.body, catch_all or everything, caught | names)
            for block in (*[h.body for h in node.handlers], node.orelse, node.finalbody):
                yield from _uncaught_raises(block, catch_all, caught)
        else:
            yield from _uncaught_raises(ast.iter_child_nodes(node), catch_all, caught)


def _raised_name(node: ast.Raise):
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    name = exc.attr if isinstance(exc, ast.Attribute) else getattr(exc, "id", "")
    return name if name[:1].isupper() else None  # ``raise err``: a variable, not a class


def _parameters(func, is_method: bool) -> list[str]:
    args = func.args
    names = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    static = any(getattr(d, "id", None) == "staticmethod" for d in func.decorator_list)
    return names[1:] if is_method and not static and names else names


def _public_functions(tree: ast.Module):
    """``(qualified name, function, is a method)`` for each public function and method."""

    def walk(body, prefix, in_class):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not node.name.startswith("_"):
                    yield prefix + node.name, node, in_class
            elif isinstance(node, ast.ClassDef):
                if not node.name.startswith("_") and not in_class:
                    yield from walk(node.body, f"{prefix}{node.name}.", True)
            elif isinstance(node, (ast.If, ast.Try)):  # ``if REAL_TE is not None: ... else: ...``
                blocks = [node.body, node.orelse, getattr(node, "finalbody", [])]
                blocks += [h.body for h in getattr(node, "handlers", [])]
                for block in blocks:
                    yield from walk(block, prefix, in_class)

    yield from walk(tree.body, "", False)


def docstring_problems(source: str) -> list[str]:
    """What the public functions of ``source`` (a module's text) leave undocumented."""
    problems = []
    for name, func, is_method in _public_functions(ast.parse(source)):
        doc = ast.get_docstring(func)
        if doc is None:
            problems.append(f"{name}: no docstring")
            continue
        found = sections(doc)
        params = _parameters(func, is_method)
        if params and "Args" not in found:
            problems.append(f"{name}: no Args: section (parameters {', '.join(params)})")
        elif params:
            listed = set(re.findall(r"^\s*\**(\w+)(?:\s*\([^)]*\))?:", found["Args"], re.M))
            missing = [p for p in params if p not in listed]
            if missing:
                problems.append(f"{name}: Args: does not name {', '.join(missing)}")
        own = list(_own_nodes(func))
        is_property = any(
            getattr(d, "id", None) == "property" or getattr(d, "attr", None) == "setter"
            for d in func.decorator_list
        )
        if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in own):
            if "Yields" not in found and "Returns" not in found:
                problems.append(f"{name}: a generator without Yields: (or Returns:)")
        elif not is_property and any(
            isinstance(n, ast.Return)
            and n.value is not None
            and not (isinstance(n.value, ast.Constant) and n.value.value is None)
            for n in own
        ):
            if "Returns" not in found:
                problems.append(f"{name}: returns a value but has no Returns: section")
        raises = list(_uncaught_raises(func.body))
        if raises and "Raises" not in found:
            problems.append(f"{name}: raises but has no Raises: section")
        elif raises:
            names = sorted({n for n in map(_raised_name, raises) if n})
            missing = [n for n in names if not re.search(rf"\b{n}\b", found["Raises"])]
            if missing:
                problems.append(f"{name}: Raises: does not name {', '.join(missing)}")
    return problems


BAD = '''"""A module."""


def no_args(x, *, y=1):
    """Does something."""
    return x


def raises(x):
    """Checks.

    Args:
        x: A number.
    """
    if x < 0:
        raise ValueError("negative")


def wrong_raise(x):
    """Checks.

    Args:
        x: A number.

    Raises:
        TypeError: Never.
    """
    if x < 0:
        raise ValueError("negative")


def half(x, y):
    """Half.

    Args:
        x: A number.

    Returns:
        Its half.
    """
    return x / 2


class Box:
    """A box."""

    def put(self, item):
        """Put."""

    def _private(self, a):
        return a

    @property
    def size(self):
        """The size."""
        return 1


def undocumented():
    pass


def _private(a):
    return a


def caught():
    """Never raises to its caller.

    Returns:
        Whether it worked.
    """
    try:
        raise RuntimeError("inside")
    except Exception:
        return False


def fine(a, **options):
    """Fine.

    Args:
        a: Something.
        **options: More.

    Returns:
        A value.

    Raises:
        KeyError: If ``a`` is missing.
    """

    def inner(b):
        raise TypeError(b)

    if not a:
        raise KeyError(a)
    return inner
'''


def test_the_check_finds_each_kind_of_gap_in_a_bad_module():
    assert docstring_problems(BAD) == [
        "no_args: no Args: section (parameters x, y)",
        "no_args: returns a value but has no Returns: section",
        "raises: raises but has no Raises: section",
        "wrong_raise: Raises: does not name ValueError",
        "half: Args: does not name y",
        "Box.put: no Args: section (parameters item)",
        "undocumented: no docstring",
    ]


@pytest.mark.parametrize("path", copied_files(), ids=lambda p: str(p.relative_to(copy_sets.PKG)))
def test_public_functions_document_args_returns_raises(path):
    problems = docstring_problems(path.read_text())
    assert not problems, f"{path.relative_to(ROOT)}:\n" + "\n".join(problems)


def _ruff_d(filename: str) -> str:
    """Ruff's ``D`` findings for ``BAD`` as if it were the file ``filename`` of the checkout."""
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run(
        [str(ruff), "check", "--select", "D", "--output-format", "concise", "--no-cache"]
        + ["--stdin-filename", filename, "-"],
        input=BAD,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return done.stdout


def test_ruff_checks_docstrings_in_the_copied_files_only():
    """pyproject.toml scopes pydocstyle to the files a reader copies: the bad module fails as
    ``validation.py`` or ``te/attention.py`` and passes as a tool's or a test's module."""
    for copied in ("src/tutorial_utils/validation.py", "src/tutorial_utils/te/attention.py"):
        found = _ruff_d(copied)
        assert "D103" in found and "D417" in found, found  # no docstring; Args: lacks y
    for other in ("src/tutorial_utils/cli/bench.py", "tests/core/test_x.py", "devtools/x.py"):
        assert " D" not in _ruff_d(other), other
