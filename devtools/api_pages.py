"""The site's two API pages, generated from the package when Sphinx reads them.

* ``docs/api.md``, the reader's page, documents what a reader copies and nothing else: the
  modules of :mod:`copy_sets`' sets, derived from their imports, private ``_`` modules left out
  (:func:`copied_modules`), after the sets' table (its ``<!-- copy-sets -->`` marker). Each
  module shows its docstring and a table of its names with their first sentences; the names in
  full (arguments, returns, raises) fold below the table, so the page stays short.
* ``docs/contributing_api.md`` documents every other public module of the package, in full
  (:func:`tooling_modules`).

``conf.py`` expands each page's ``<!-- api-modules -->`` marker with :func:`expand`. No module
list is kept by hand. :func:`public_members` imports the module it asks about (the package's
modules import JAX), so the import is inside it.
"""

from __future__ import annotations

import ast
import importlib
import inspect

import copy_sets

API_MARKER = "<!-- api-modules -->"
COPY_SETS_MARKER = "<!-- copy-sets -->"
READER_PAGE = "docs/api"
CONTRIBUTOR_PAGE = "docs/contributing_api"
FOLD_TITLE = "In full: arguments, returns, raises"


def _private(name: str) -> bool:
    return any(part.startswith("_") for part in name.split("."))


def copied_modules() -> list[str]:
    """The modules the reader's page documents: the copy sets' modules, private ones left out.

    Returns:
        Dotted names inside the package, in the sets' order (each set's own modules, then the
        others its files import), a package's modules next to it.
    """
    out: list[str] = []
    for entries in copy_sets.COPY_SETS.values():
        for name in [*entries, *copy_sets.closure(entries)]:
            if name not in out and not _private(name):
                out.append(name)
    tops = list(dict.fromkeys(name.split(".")[0] for name in out))
    return sorted(out, key=lambda name: tops.index(name.split(".")[0]))


def tooling_modules() -> list[str]:
    """The contributors' page: every other public module of the package.

    Returns:
        Dotted names, alphabetically; a sub-package such as ``cli/`` contributes its modules,
        not its ``__init__``.
    """
    copied = set(copied_modules())
    found = set()
    for path in copy_sets.PKG.rglob("*.py"):
        name = copy_sets.module_name(path)
        if path.name in ("__init__.py", "__main__.py") or _private(name) or name in copied:
            continue
        found.add(name)
    return sorted(found)


PAGES = {READER_PAGE: copied_modules, CONTRIBUTOR_PAGE: tooling_modules}


def documented_elsewhere(name: str, documented: list[str]) -> list[str]:
    """The names a package re-exports from a module the page documents (or that are modules).

    ``te/__init__.py`` re-exports ``MeshResource`` from ``te.sharding``, documented there, and
    ``backend_name`` from the private ``te._backend``, documented with the package.

    Args:
        name: A package's dotted name.
        documented: The modules the page documents.

    Returns:
        Names its ``from .x import ...`` lines bring from those modules, and its submodules.
    """
    elsewhere = []
    for node in ast.parse(copy_sets.module_path(name).read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if not node.module or f"{name}.{node.module}" in documented:
                elsewhere += [a.asname or a.name for a in node.names]
    return elsewhere


def public_members(name: str, skip=()) -> list[tuple[str, str]]:
    """Each name a module documents, with the autodoc directive that documents it.

    Args:
        name: A dotted name inside the package.
        skip: Names to leave out.

    Returns:
        ``(name, directive)`` pairs: the module's ``__all__`` or, without one, the functions
        and classes it defines, in order; submodules and private names left out.
    """
    module = importlib.import_module(f"tutorial_utils.{name}")
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            n
            for n, obj in vars(module).items()
            if (inspect.isfunction(obj) or inspect.isclass(obj))
            and obj.__module__ == module.__name__
        ]
    out = []
    for n in names:
        obj = getattr(module, n)
        if n.startswith("_") or n in skip or inspect.ismodule(obj):
            continue
        kind = "autoclass" if inspect.isclass(obj) else "autofunction" if callable(obj) else None
        out.append((n, kind or "autodata"))
    return out


def _rst(lines: list[str]) -> str:
    # autodoc emits reStructuredText, so its directives run inside eval-rst.
    return "```{eval-rst}\n" + "\n".join(lines) + "\n```\n"


def reader_section(name: str, documented: list[str]) -> str:
    """A module's section on the reader's page: docstring, names table, the names folded.

    Args:
        name: A dotted name inside the package.
        documented: The modules the page documents.

    Returns:
        MyST Markdown: a heading, the module's docstring, an ``autosummary`` table and a
        dropdown with each name's autodoc entry (TransformerEngine's own classes without
        their members).
    """
    full = f"tutorial_utils.{name}"
    is_package = copy_sets.module_path(name).name == "__init__.py"
    skip = documented_elsewhere(name, documented) if is_package else ()
    members = public_members(name, skip)
    lines = [f".. automodule:: {full}", "   :no-members:"]
    if members:
        # names only: a signature's non-breaking spaces would widen the table past the column
        lines += ["", ".. autosummary::", "   :nosignatures:", ""] + [f"   {n}" for n, _ in members]
        lines += ["", f".. dropdown:: {FOLD_TITLE}"]
        module = importlib.import_module(full)
        for n, kind in members:
            lines += ["", f"   .. {kind}:: {n}"]
            obj = getattr(module, n)
            if kind == "autoclass" and obj.__module__.startswith("transformer_engine"):
                lines.append("      :no-members:")
    return f"## `{full}`\n\n" + _rst(lines)


def tooling_section(name: str) -> str:
    """A module's section on the contributors' page: its ``automodule``, members in full.

    Args:
        name: A dotted name inside the package.

    Returns:
        MyST Markdown: a heading and the directive.
    """
    full = f"tutorial_utils.{name}"
    return f"## `{full}`\n\n" + _rst([f".. automodule:: {full}"])


def expand(docname: str, text: str) -> str:
    """An API page's source with its markers expanded; any other page's unchanged.

    Args:
        docname: The page, e.g. ``docs/api``.
        text: Its source.

    Returns:
        The source with ``<!-- copy-sets -->`` replaced by the copy sets' table and
        ``<!-- api-modules -->`` by one section per module.
    """
    if docname not in PAGES:
        return text
    text = text.replace(COPY_SETS_MARKER, copy_sets.markdown_table())
    if API_MARKER in text:
        modules = PAGES[docname]()
        if docname == READER_PAGE:
            sections = [reader_section(m, modules) for m in modules]
        else:
            sections = [tooling_section(m) for m in modules]
        text = text.replace(API_MARKER, "\n".join(sections))
    return text
