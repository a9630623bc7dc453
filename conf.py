"""Sphinx configuration for the "Context-parallel attention in JAX" site.

The source directory is the repository root: the landing page is ``index.md`` here, the
narrative pages live in ``docs/`` and the chapters are the jupytext MyST notebooks in
``notebooks/``. ``make docs`` runs ``python -m sphinx -b html -W --keep-going . _build/html``.

Notebooks are executed by myst-nb in ``cache`` mode: jupyter-cache (in
``_build/.jupyter_cache-<preset>-<backend>-<cpu|gpu>``) re-runs a notebook only when its code cells
change, so a clean build executes every chapter and an unchanged rebuild re-executes nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
SRC = ROOT / "src"

# -- Environment shared with the notebook kernels ---------------------------------------------
# Kernels are started by the Sphinx process and inherit its environment, so what we set here
# is what every executed notebook sees. XLA reads the device-count flag only when JAX starts,
# which is why it goes into the environment rather than into the notebooks' first cells.

# The package is installed editable, but make ``src/`` importable for autodoc and for the
# kernels even when it is not (e.g. a plain checkout with only the docs dependencies).
# devtools/ goes on the kernels' path too: its sitecustomize.py lets each page's processes record
# their cost (devtools/page_stats.py) for the table printed at the end.
DEVTOOLS = ROOT / "devtools"
sys.path[:0] = [str(SRC), str(DEVTOOLS)]
os.environ["PYTHONPATH"] = os.pathsep.join(
    dict.fromkeys(
        p
        for p in [str(SRC), str(DEVTOOLS), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
        if p
    )
)
import api_pages  # noqa: E402  (devtools/: the API pages, from what a reader copies)
import docs_execute  # noqa: E402  (devtools/: runs the notebooks side by side, then reports)
import xla_flags  # noqa: E402  (devtools/: the compile flags the test run uses too)

from tutorial_utils.gpu import gpu_present  # noqa: E402  (imports no JAX)
from tutorial_utils.pages import run_status  # noqa: E402  (imports no JAX)

if not gpu_present():
    # Four simulated CPU devices: enough for a cp=4 mesh on a laptop. Cheaper compiles
    # (devtools/xla_flags.py): at the chapters' sizes compiling is most of a page's time, and the
    # attention itself is the compiled stand-in kernel, which these flags do not touch. Every
    # record names the flags it ran with.
    os.environ.setdefault(
        "XLA_FLAGS",
        f"--xla_force_host_platform_device_count=4 {xla_flags.fast_compile_flags()}",
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The test run's process settings, for the kernels and every process they start
# (devtools/README.md, "The test run"; none changes a result):
# TCMalloc where the machine has it (XLA's compiles allocate heavily; TUTORIAL_FAST_MALLOC=0
# keeps glibc's malloc), one OpenBLAS thread (idle ones spin on cores the build keeps busy), and
# the collector's larger thresholds (devtools/run_gc.py, applied by devtools/sitecustomize.py).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("TUTORIAL_RUN_GC_THRESHOLDS", "20000 20 20")
try:
    _MALLOC = subprocess.run(
        ["bash", str(ROOT / "tests" / "setup_machine.sh"), "--malloc"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
except OSError:  # no bash: glibc's malloc
    _MALLOC = ""
if _MALLOC and _MALLOC not in os.environ.get("LD_PRELOAD", "").split():
    os.environ["LD_PRELOAD"] = " ".join(filter(None, [_MALLOC, os.environ.get("LD_PRELOAD")]))

# -- Project -------------------------------------------------------------------------------------
project = "Context-parallel attention in JAX"
html_title = project
author = "cp-attention-tutorial contributors"
copyright = "cp-attention-tutorial contributors"
release = "0.1.0"

root_doc = "index"  # index.md at the repository root -> _build/html/index.html

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax served from _static: formulas render offline
    "sphinx_copybutton",
    "sphinx_design",
]

# Only these files are documents; everything else in the repository is not part of the site.
include_patterns = ["index.md", "docs/*.md", "docs/**/*.md", "notebooks/*.md"]
exclude_patterns = [
    ".venv",
    "_build",
    "_build_test",
    "README.md",
    "tests",
    "benchmarks",
    "results",
    "src",
    "test-artifacts",
    "**/.ipynb_checkpoints",
    "**/jupyter_execute",
]
templates_path: list[str] = []

# -- MyST ----------------------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# -- MyST-NB execution ---------------------------------------------------------------------------
nb_execution_mode = "cache"
# One cache per (preset, backend, device count, CP size): switching any of them re-executes the
# chapters instead of reusing outputs made with another workload, device count or machine.
_DEVICES = re.search(
    r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", "")
)
_CACHE_KEY = "-".join(
    (
        os.environ.get("CP_TUTORIAL_PRESET", "default"),
        os.environ.get("TUTORIAL_TE_BACKEND", "auto"),
        "gpu" if gpu_present() else "cpu",
        f"{_DEVICES.group(1) if _DEVICES else 'all'}dev",
        "cp" + os.environ.get("CP_TUTORIAL_CP", "auto"),
    )
)
# The test suite builds its own site elsewhere (CP_TUTORIAL_BUILD_DIR) so that it never
# touches the reader's _build/ and its notebook cache.
BUILD_DIR = Path(os.environ.get("CP_TUTORIAL_BUILD_DIR", ROOT / "_build"))
nb_execution_cache_path = str(BUILD_DIR / f".jupyter_cache-{_CACHE_KEY}")
if not gpu_present():
    # One XLA compilation cache for the build's kernels and the processes they start, in the
    # build folder (a clean build starts it empty): pages and recipes compile many of the same
    # programs. Its key is the one devtools/compile_cache.py makes safe for TE's CP programs.
    os.environ.setdefault("TUTORIAL_COMPILE_CACHE_DIR", str(BUILD_DIR / ".xla-cache"))
nb_execution_raise_on_error = True
nb_execution_allow_errors = False
nb_execution_timeout = 600
nb_execution_show_tb = True
nb_merge_streams = True
# Markdown emitted by cells (e.g. IPython.display.Markdown tables) is parsed as MyST.
nb_render_markdown_format = "myst"

# -- Autodoc -------------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = True

# -- API pages ---------------------------------------------------------------------------------
# docs/api.md documents what a reader copies (devtools/copy_sets.py's sets, derived from their
# imports), after the sets' table; docs/contributing_api.md the rest of the package. Both module
# lists are derived (devtools/api_pages.py), never kept by hand.
autosummary_generate = False  # the reader's page's tables only: no generated stub pages


def _api_source(app, docname, source):
    """Expand an API page's markers: the copy sets' table, and one section per module."""
    source[0] = api_pages.expand(docname, source[0])


def _run_status_box(app, docname, source):
    """The generated "how this page ran / what ran where" box on the landing page and every
    chapter."""
    source[0] = run_status.insert_box(
        docname,
        source[0],
        run_status.gpu_records(ROOT / "results"),
        run_status.build_from_environment(gpu_present()),
    )


def _fingerprints() -> dict:
    """What each generated page depends on beyond its own source file.

    autodoc already re-reads an API page when a documented module changes; this adds each API
    page's set of modules (a new module must appear) and the copy sets' table (an import
    changes it), and for the benchmarks page every record in results/ (a force-executed
    notebook: re-reading it re-runs it).
    """
    records = sorted(
        (p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in (ROOT / "results").glob("*.json")
    )
    # The landing page and every chapter name the GPU records (the run-status box).
    gpu = [Path(r["_path"]).name for r in run_status.gpu_records(ROOT / "results")]
    pages = {
        p.relative_to(ROOT).with_suffix("").as_posix(): gpu
        for p in (ROOT / "notebooks").glob("*.md")
    }
    api = {
        api_pages.READER_PAGE: [api_pages.copied_modules(), api_pages.copy_sets.markdown_table()],
        api_pages.CONTRIBUTOR_PAGE: api_pages.tooling_modules(),
    }
    return {**api, "docs/benchmarks": records, "index": gpu, **pages}


def _env_get_outdated(app, env, added, changed, removed):
    old = getattr(env, "cp_tutorial_fingerprints", {})
    new = _fingerprints()
    env.cp_tutorial_fingerprints = new
    return [doc for doc, value in new.items() if old.get(doc) != value and doc in env.found_docs]


# -- HTML ----------------------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_theme_options = {
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "home_page_in_toc": True,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "use_repository_button": False,
}
html_static_path = ["_static"]
html_css_files = ["custom.css"]
# The theme's script rejects an empty mode on a first visit (a console error); start in light
# mode so notebook figures (white backgrounds) read well. Readers can still switch.
html_context = {"default_mode": "light"}

# sphinx-copybutton: do not copy prompts or output markers.
copybutton_prompt_text = r">>> |\.\.\. |\$ |In \[\d*\]: | {2,5}\.\.\.: | {5,8}: "
copybutton_prompt_is_regexp = True


def _te_docstring(app, what, name, obj, options, lines):
    """Names the facade hands over to TransformerEngine are documented by TE, not here."""
    module = getattr(obj, "__module__", "") or ""
    if module.startswith("transformer_engine"):
        # the module apart from the name: one long dotted literal would widen the API page's tables
        lines[:] = [
            f"TransformerEngine's own ``{getattr(obj, '__qualname__', name)}``, from ``{module}``; "
            "see TE's documentation. (It is TE's code, here running with the backend named on each "
            "page.)"
        ]


NOTEBOOK_LINK = (
    "<p class='notebook-download'><a href='{name}' download>Download this chapter as a Jupyter "
    "notebook (<code>{name}</code>)</a>, with the outputs shown here.</p>"
)


def _notebook_link(app, pagename, templatename, context, doctree):
    """Each chapter page offers its executed notebook (copied next to it by _copy_notebooks)."""
    if pagename.startswith("notebooks/") and "body" in context:
        context["body"] = (
            NOTEBOOK_LINK.format(name=Path(pagename).name + ".ipynb") + context["body"]
        )


def _copy_notebooks(app, exception):
    """Copy the executed notebooks into the site, next to their pages, with their outputs.

    myst-nb writes ``jupyter_execute/*.ipynb`` from the notebook as read; when the outputs come
    from its cache (every page does: devtools/docs_execute.py executes them ahead), that copy
    has none. The outputs are merged back from the same cache here.
    """
    if exception is not None or app.builder.format != "html":
        return
    import nbformat
    from jupyter_cache import get_cache

    cache = get_cache(nb_execution_cache_path)
    executed = Path(app.outdir).parent / "jupyter_execute" / "notebooks"
    target = Path(app.outdir) / "notebooks"
    for notebook in sorted(executed.glob("*.ipynb")):
        nb = nbformat.read(notebook, as_version=4)
        try:
            _, nb = cache.merge_match_into_notebook(nb)
        except KeyError:
            pass  # executed by Sphinx itself: its outputs are in it already
        nbformat.write(nb, target / notebook.name)


def setup(app):
    app.connect("html-page-context", _notebook_link)
    app.connect("build-finished", _copy_notebooks)
    # Notebooks run side by side before the read; each page's time, CPU, compiles and memory
    # are printed at the end and written to _build/page-times.json (devtools/docs_execute.py).
    app.connect("env-before-read-docs", docs_execute.execute_outdated)
    app.connect("source-read", docs_execute.page_being_read)
    app.connect("html-page-context", docs_execute.page_written)
    app.connect("build-finished", docs_execute.report)
    app.connect("source-read", _api_source)
    app.connect("source-read", _run_status_box)
    app.connect("autodoc-process-docstring", _te_docstring)
    app.connect("env-get-outdated", _env_get_outdated)
