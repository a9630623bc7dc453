"""The API pages document exactly what they promise, without a site build.

The reader's page (``docs/api.md``) documents the modules a reader copies: the files of
``devtools/copy_sets.py``'s sets, private ``_`` modules left out, after the sets' table. The
contributors' page (``docs/contributing_api.md``) documents the rest of the package. Both are
expanded here as ``conf.py`` expands them when Sphinx reads them (``devtools/api_pages.py``).
"""

import re
from pathlib import Path

import api_pages
import copy_sets
from site_pages import toctree_entries

ROOT = Path(__file__).resolve().parents[2]
AUTOMODULE = re.compile(r"^\.\. automodule:: tutorial_utils\.(\S+)$", re.M)


def expanded(page: str) -> str:
    return api_pages.expand(page, (ROOT / f"{page}.md").read_text())


def copied_modules() -> set:
    """What the sets copy, from copy_sets' closure: every module but the private ones."""
    entries = [m for entries in copy_sets.COPY_SETS.values() for m in entries]
    names = copy_sets.closure(entries)
    return {m for m in names if not any(part.startswith("_") for part in m.split("."))}


def test_the_readers_page_documents_the_copy_sets_modules_and_nothing_else():
    text = expanded(api_pages.READER_PAGE)
    documented = AUTOMODULE.findall(text)
    assert len(documented) == len(set(documented)), documented
    assert set(documented) == copied_modules()
    assert "te_on_cpu.runner" in documented  # python -m tutorial_utils.te_on_cpu script.py


def test_the_copy_sets_table_comes_first():
    text = expanded(api_pages.READER_PAGE)
    table = copy_sets.markdown_table()
    assert table in text
    assert text.index(table) < text.index(".. automodule::")
    assert api_pages.COPY_SETS_MARKER not in text and api_pages.API_MARKER not in text


def test_the_readers_page_folds_each_modules_names_below_its_table():
    """Each module: its docstring, a table of its names, then the names in full in a dropdown
    (the page stays short); a package lists only the names no module on the page documents."""
    sections = expanded(api_pages.READER_PAGE).split("\n## ")[1:]
    assert sections
    for section in sections:
        name = AUTOMODULE.search(section).group(1)
        summary = section.partition(".. autosummary::")[2].partition(".. dropdown::")[0]
        table = re.findall(r"^   (\w+)$", summary, re.M)
        full = re.findall(r"^   \.\. auto(?:function|class|data):: (\w+)$", section, re.M)
        assert table == full, name
        if full:
            assert section.index(".. autosummary::") < section.index(api_pages.FOLD_TITLE)
    te = next(s for s in sections if s.startswith("`tutorial_utils.te`"))
    assert "backend_name" in te and "MeshResource" not in te  # te.sharding documents it


def test_the_contributors_page_documents_the_rest_of_the_package():
    reader = set(AUTOMODULE.findall(expanded(api_pages.READER_PAGE)))
    tooling = set(AUTOMODULE.findall(expanded(api_pages.CONTRIBUTOR_PAGE)))
    assert not reader & tooling
    public = {
        copy_sets.module_name(p)
        for p in copy_sets.PKG.rglob("*.py")
        if p.name != "__main__.py"
        and not any(part.startswith("_") for part in copy_sets.module_name(p).split("."))
    }
    packages = {copy_sets.module_name(p) for p in copy_sets.PKG.rglob("__init__.py")}
    assert public - packages <= reader | tooling, sorted(public - packages - reader - tooling)
    assert {"cli.bench", "perfmodel.costmodel", "pages.runtime"} <= tooling


def test_the_contributors_page_is_outside_the_readers_sections():
    assert toctree_entries("For contributors") == [api_pages.CONTRIBUTOR_PAGE]
    assert api_pages.READER_PAGE in toctree_entries("Reference")
