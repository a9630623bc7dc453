"""Build the documentation site exactly as ``make docs`` does, then check it in a real browser.

The session fixtures:

1. delete ``_build_test/`` (the test's own site *and* notebook cache) and build into it as
   ``make docs`` builds ``_build/``, executing every notebook; the reader's ``_build/`` is
   never touched, so ``make docs`` after ``make test`` stays a no-change rebuild;
2. build again without changes and record both durations in ``test-artifacts/build-times.json``;
3. serve ``_build_test/html`` on 127.0.0.1 (a free port, in a thread);
4. load every page in headless Chromium (the system browser, driven by Playwright).

Every page must load without console errors, uncaught exceptions, failed requests or broken
images. Every same-site link must point to a file that exists, and to an element id that
exists when the link has a fragment. Every chapter must print its ``Backend:`` line and show
at least one figure.

Rendering, on every built page at 1280 px (new pages are covered without an edit): code and
output boxes never soft-wrap (a long line scrolls horizontally), no box clips a line without a
scroll bar or sticks out of the article, and no table cell breaks a word across lines. The
landing page and every chapter carry the generated run-status box (``pages.run_status``). Page
heights go to ``test-artifacts/page-heights.json``.

What a reader sees, on every page, hidden cells opened: no absolute path of the build machine
(a checkout, home or temporary folder, an installed package's file) in prose or output, and no
word of the project's own machinery (TCMalloc, xdist, "per call", "lent": devtools/README.md's).
Nothing is wider than its box at 1280 px (no sideways scroll): chapter code cells, code blocks
and other pages' code cells, cell outputs and tables, each kind its own test.

The clean build stays within its budget (``devtools/docs_execute.py``): the summed CPU seconds
of the pages' processes, and the largest process's peak memory.

``python tests/site/test_site.py [DIR]`` runs those page checks on a site already built in ``DIR``.

Requests to other hosts are never sent. They are answered with an empty body and listed in
``test-artifacts/external-requests.json``. The site is self-contained (MathJax included), so
any request to another host fails the test.

Set ``CP_SITE_TEST_REUSE_BUILD=1`` to skip the clean build while iterating on the checks.
The clean-build time is then recorded as ``null``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

if __name__ == "__main__":  # run as a script: the paths conftest.py gives a test run
    _ROOT = Path(__file__).resolve().parents[2]
    sys.path[:0] = [str(_ROOT / "tests"), str(_ROOT / "devtools")]

import calibrate  # noqa: E402
import docs_execute  # noqa: E402
import pytest  # noqa: E402
from site_pages import chapters, toctree_entries  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "_build_test"  # its own folder: the reader's _build/ is left alone
HTML = BUILD / "html"
ARTIFACTS = ROOT / "test-artifacts"

# The same command as the Makefile's `docs` target, run from the repository root.
# (one line: tests/site/test_hosting.py finds these arguments, as written, in this file)
# fmt: off
SPHINX_ARGS = ["-m", "sphinx", "-b", "html", "-W", "--keep-going", "-j", "1", ".", "_build_test/html"]  # noqa: E501
# fmt: on
BUILD_TIMEOUT_S = 900  # a hang guard, not a speed check

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
EXTERNAL_HOSTS_ALLOWED: set = set()  # MathJax is served from _static (sphinx-mathjax-offline)
# The widest code line a chapter may have (tests/site/test_chapter_code.py); such lines fit the
# code box.
CODE_WIDTH = 88
# Generated pages that are not content pages.
SKIP_PAGES = {"search.html", "genindex.html", "py-modindex.html"}

CHAPTERS = chapters()  # from index.md's table of contents


# --------------------------------------------------------------------------- build


def _run_sphinx(log_name: str) -> float:
    ARTIFACTS.mkdir(exist_ok=True)
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, *SPHINX_ARGS],
            cwd=ROOT,
            # the site is built as `make docs` builds it: TE's own code (TE-on-CPU here), not
            # the reference backend the unit tests pin in conftest.py
            # the unit tests pin in conftest.py; and with conf.py's four simulated devices, not the
            # tests' eight
            # and with its own compilation cache in the build folder, as `make docs` has it (a
            # clean build starts it empty), so that the budget check measures what make docs does
            env={
                **{
                    k: v
                    for k, v in os.environ.items()
                    if k not in ("TUTORIAL_TE_BACKEND", "XLA_FLAGS", "TUTORIAL_COMPILE_CACHE_DIR")
                },
                "CP_TUTORIAL_BUILD_DIR": str(BUILD),
                "CP_TUTORIAL_RECORDS_DIR": str(BUILD / "records"),
            },
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as err:
        out = err.stdout or ""
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        pytest.fail(
            f"site build ({log_name}) exceeded {BUILD_TIMEOUT_S} s; last output:\n{out[-4000:]}"
        )
    elapsed = time.perf_counter() - start
    log = proc.stdout + "\n--- stderr ---\n" + proc.stderr
    (ARTIFACTS / f"{log_name}.log").write_text(log)
    if proc.returncode != 0:
        pytest.fail(
            f"site build ({log_name}) failed with exit code {proc.returncode}: `python"
            f" {' '.join(SPHINX_ARGS)}` (full log: test-artifacts/{log_name}.log). Last lines:\n"
            + "\n".join(log.splitlines()[-60:])
        )
    return elapsed


@dataclass
class BuildInfo:
    clean_s: float | None
    rebuild_s: float
    calibration_cpu_s: float | None
    rebuild: dict  # what the unchanged rebuild read, executed and wrote


@pytest.fixture(scope="session")
def built_site() -> BuildInfo:
    reuse = os.environ.get("CP_SITE_TEST_REUSE_BUILD") == "1" and (HTML / "index.html").is_file()
    clean_s = calibration = None
    if not reuse:
        shutil.rmtree(BUILD, ignore_errors=True)
        calibration = calibrate.calibration_cpu_s()  # the machine's speed, in the same run
        clean_s = _run_sphinx("build-clean")
        shutil.copy2(BUILD / "page-times.json", ARTIFACTS / "page-times-clean.json")
    rebuild_s = _run_sphinx("build-unchanged")
    rebuild = json.loads((BUILD / "page-times.json").read_text())["this_build"]
    times = {
        "clean_build_s": None if clean_s is None else round(clean_s, 2),
        "calibration_cpu_s": calibration,
        "unchanged_rebuild_s": round(rebuild_s, 2),
        "unchanged_rebuild": rebuild,
        "command": f"python {' '.join(SPHINX_ARGS)}",
        "python": sys.executable,
        "measured": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    (ARTIFACTS / "build-times.json").write_text(json.dumps(times, indent=2) + "\n")
    return BuildInfo(clean_s, rebuild_s, calibration, rebuild)


# --------------------------------------------------------------------------- serve


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - signature fixed by the base class
        pass


@contextlib.contextmanager
def serve(folder: Path):
    """Serve ``folder`` on 127.0.0.1 (a free port, in a thread); yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="session")
def server(built_site) -> str:
    with serve(HTML) as url:
        yield url


# --------------------------------------------------------------------------- browser


def _chromium_path() -> str:
    env = os.environ.get("CHROMIUM_PATH")
    if env:
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "No Chromium found on PATH (or in CHROMIUM_PATH): run `bash tests/setup_machine.sh`."
    )


@contextlib.contextmanager
def launch_browser():
    """Headless Chromium (the system browser) driven by Playwright."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "The playwright package is missing: `pip install -e '.[test]'` or `bash"
            " tests/setup_machine.sh`."
        )
    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=_chromium_path(), headless=True, args=CHROMIUM_FLAGS)
    except Exception:
        pw.stop()
        raise
    try:
        yield b
    finally:
        b.close()
        pw.stop()


@pytest.fixture(scope="session")
def browser(built_site):
    with launch_browser() as b:
        yield b


# --------------------------------------------------------------------------- crawl

_IMAGES_JS = r"""
async () => {
  const imgs = Array.from(document.images);
  await Promise.all(imgs.map(img => {
    if (img.loading === 'lazy') img.loading = 'eager';
    if (img.complete) return null;
    return new Promise(resolve => { img.addEventListener('load', resolve);
    img.addEventListener('error', resolve); });
  }));
  const article = document.querySelector('article') || document.body;
  // An SVG figure's smallest text as displayed: the SVG is drawn again, off screen, at the
  // <img>'s displayed size, and each <text>'s font size is scaled by its screen transform.
  const smallestSvgText = async (img, shownWidth) => {
    try {
      const doc = new DOMParser().parseFromString(
        await (await fetch(img.currentSrc || img.src)).text(), 'image/svg+xml');
      const svg = document.importNode(doc.documentElement, true);
      const box = document.createElement('div');
      box.style.cssText = 'position:absolute;left:-20000px;top:0;width:' + shownWidth + 'px';
      svg.setAttribute('width', shownWidth + 'px');
      svg.removeAttribute('height');
      box.appendChild(svg);
      document.body.appendChild(box);
      const sizes = Array.from(svg.querySelectorAll('text')).filter(t => t.textContent.trim())
        .map(t => { const m = t.getScreenCTM();
          const scale = Math.sqrt(Math.abs(m.a * m.d - m.b * m.c));
          return parseFloat(getComputedStyle(t).fontSize) * scale; });
      box.remove();
      return {texts: sizes.length, smallest: sizes.length ? Math.min(...sizes) : null};
    } catch (e) { return {texts: 0, smallest: null, error: String(e)}; }
  };
  return Promise.all(imgs.map(async img => {
    const src = img.currentSrc || img.src;
    const shown = img.getBoundingClientRect().width;
    const isSvg = /\.svg([?#]|$)/i.test(src);
    return {
      src,
      width: img.naturalWidth,
      inArticle: article.contains(img),
      figure: article.contains(img) && /\/_images\//.test(src),
      shownWidth: shown,
      alt: img.getAttribute('alt') || '',
      svgText: isSvg && shown > 0 ? await smallestSvgText(img, shown) : null,
    };
  }));
}
"""

_LINKS_JS = """
() => Array.from(document.querySelectorAll('a[href]')).map(a => ({raw: a.getAttribute('href'), url:
a.href}))
"""


# Rendering at the test's 1280 px viewport, after every <details> (hidden cells) is opened. For each
# <pre> in the article: the white-space values in force in it (a wrapping value soft-wraps code),
# whether its content is wider than its box and whether the box scrolls, and whether the box sticks
# out of the article. For each table cell: the words (split at white space and hyphens) whose
# glyphs land on more than one line, i.e. words the browser broke.
_LAYOUT_JS = r"""
() => {
  const article = document.querySelector('article') || document.body;
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const wrapping = new Set(['normal', 'pre-wrap', 'pre-line', 'break-spaces']);
  const right = article.getBoundingClientRect().right;
  const pres = Array.from(article.querySelectorAll('pre')).map(pre => {
    const styles = [pre, ...pre.querySelectorAll('*')].map(e => getComputedStyle(e));
    const wraps = [...new Set(styles.map(cs => cs.whiteSpace).filter(w => wrapping.has(w)))];
    const cs = styles[0];
    const lines = (pre.textContent || '').split('\n');
    return {head: lines[0].slice(0, 70), wraps, longest: Math.max(...lines.map(l => l.length)),
            source: !!pre.closest('.cell_input'),
            overflowing: pre.scrollWidth > pre.clientWidth + 1,
            scrolls: ['auto', 'scroll'].includes(cs.overflowX),
            sticksOut: pre.getBoundingClientRect().right > right + 1};
  });
  // The distinct lines a range's glyphs land on.
  const lineCount = range => new Set(Array.from(range.getClientRects()).filter(r => r.width > 0)
    .map(r => Math.round(r.top))).size;
  // The matches of `pattern` in table cells whose glyphs land on more than one line.
  const brokenInCells = pattern => {
    const found = [];
    for (const cell of article.querySelectorAll('td, th')) {
      const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
      for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        for (const m of node.data.matchAll(pattern)) {
          const range = document.createRange();
          range.setStart(node, m.index);
          range.setEnd(node, m.index + m[0].length);
          if (lineCount(range) > 1) found.push(m[0]);
        }
      }
    }
    return found;
  };
  // Words (split at white space and hyphens) the browser broke.
  const broken = brokenInCells(/[^\s\-\u2010-\u2014\/]+/g);
  // Numbers, with their exponent, unit and range ("4.0e-03", "2.22-2.34x", "<= 16").
  const unit = '(?:e[-+]?\\d+)?[x\\u00d7%]?';
  const brokenNumbers = brokenInCells(new RegExp(
    `[\\u2264\\u2265]?\\u00a0?\\d[\\d.,]*${unit}(?:[-\\u2010-\\u2013]\\d[\\d.,]*${unit})*`, 'g'));
  const box = document.querySelector('.cp-run-status');
  // A chapter's box is one line in view: the lines its summary's text occupies.
  const summary = box && (box.querySelector('summary .sd-summary-text') ||
                          box.querySelector('summary'));
  let summaryLines = null;
  if (summary) {
    const range = document.createRange();
    range.selectNodeContents(summary);
    summaryLines = lineCount(range);
  }
  return {pres, broken, brokenNumbers, statusBox: box ? box.innerText : null, summaryLines,
          openText: article.innerText};
}
"""

# At the same 1280 px, hidden cells open: every code block, cell output and table whose content is
# wider than its box (scrollWidth > clientWidth: the reader must scroll sideways to read it). A
# table is measured in the box that scrolls it (the theme wraps tables in one) or, without one, in
# its parent. The kinds: "code cell" (a chapter's source), "code block" (a fenced block or an
# included file on a page), "cell output" (what a cell printed or displayed, tables included) and
# "table" (a table of the page's text).
_WIDE_JS = r"""
() => {
  const article = document.querySelector('article') || document.body;
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const kind = el => el.closest('.cell_input') ? 'code cell'
    : el.closest('.cell_output') ? 'cell output'
    : el.tagName === 'TABLE' ? 'table' : 'code block';
  const first = el => ((el.innerText || '').trim().split('\n')[0] || '').slice(0, 70);
  const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  const out = [];
  for (const pre of article.querySelectorAll('pre')) {
    out.push({kind: kind(pre), text: first(pre), scrollWidth: pre.scrollWidth,
              clientWidth: pre.clientWidth});
  }
  for (const table of article.querySelectorAll('table')) {
    let box = table.parentElement;
    for (let el = box; el && el !== article; el = el.parentElement) {
      if (scrolls(el)) { box = el; break; }
    }
    const width = Math.ceil(table.getBoundingClientRect().width);
    out.push({kind: kind(table), text: first(table),
              scrollWidth: Math.max(box.scrollWidth, width), clientWidth: box.clientWidth});
  }
  return out.filter(b => b.scrollWidth > b.clientWidth + 1);
}
"""

# The page's height as a reader first sees it (hidden cells closed).
_HEIGHT_JS = "() => document.documentElement.scrollHeight"

# Number of formulas MathJax typeset, after its start-up promise resolves (0 on pages without
# maths).
_MATH_JS = """() => (window.MathJax && MathJax.startup && MathJax.startup.promise)
    ? MathJax.startup.promise.then(() => document.querySelectorAll('mjx-container').length) : 0"""


@dataclass
class PageResult:
    rel: str
    console_errors: list = field(default_factory=list)
    page_errors: list = field(default_factory=list)
    failed_requests: list = field(default_factory=list)
    bad_responses: list = field(default_factory=list)
    images: list = field(default_factory=list)
    links: list = field(default_factory=list)
    text: str = ""
    math_rendered: int = 0
    height: int = 0
    layout: dict = field(default_factory=dict)
    wide: list = field(default_factory=list)


@dataclass
class Crawl:
    base: str
    pages: dict
    external_requests: list


def _content_pages(html: Path = HTML) -> list[str]:
    pages = []
    for path in sorted(html.rglob("*.html")):
        rel = path.relative_to(html).as_posix()
        if rel in SKIP_PAGES or any(part.startswith("_") for part in Path(rel).parts[:-1]):
            continue
        pages.append(rel)
    return pages


def crawl_pages(browser, base: str, html: Path = HTML, artifacts: Path | None = ARTIFACTS) -> Crawl:
    """Load every content page of ``html`` (served at ``base``) in ``browser`` at 1280 px.

    With ``artifacts``, the screenshots, external requests and page heights are written there.
    """
    base_host = urlsplit(base).netloc
    external: list = []

    def route(route_obj):
        url = route_obj.request.url
        if urlsplit(url).netloc == base_host:
            route_obj.continue_()
        else:
            external.append(url)
            route_obj.fulfill(status=200, body="", content_type="application/javascript")

    results = {}
    for rel in _content_pages(html):
        # A fresh context per page: every page is checked as a first visit (empty storage).
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.route("**/*", route)
        res = PageResult(rel)
        page = context.new_page()
        page.on(
            "console",
            lambda msg, r=res: (
                r.console_errors.append(f"{msg.text} @ {msg.location}")
                if msg.type == "error"
                else None
            ),
        )
        page.on("pageerror", lambda exc, r=res: r.page_errors.append(str(exc)))
        page.on(
            "requestfailed",
            lambda req, r=res: r.failed_requests.append(f"{req.url}: {req.failure}"),
        )
        page.on(
            "response",
            lambda resp, r=res: (
                r.bad_responses.append(f"{resp.status} {resp.url}") if resp.status >= 400 else None
            ),
        )
        page.goto(f"{base}/{rel}", wait_until="load")
        page.wait_for_load_state("networkidle")
        res.images = page.evaluate(_IMAGES_JS)
        res.math_rendered = page.evaluate(_MATH_JS)
        res.links = page.evaluate(_LINKS_JS)
        article = page.query_selector("article")
        res.text = (article or page.query_selector("body")).inner_text()
        res.height = page.evaluate(_HEIGHT_JS)
        res.layout = page.evaluate(_LAYOUT_JS)
        res.wide = page.evaluate(_WIDE_JS)
        if artifacts is not None and rel == "index.html":
            page.screenshot(path=str(artifacts / "landing.png"), full_page=True)
        elif artifacts is not None and rel == f"{CHAPTERS[0]}.html":
            page.screenshot(path=str(artifacts / "chapter.png"), full_page=True)
        context.close()
        results[rel] = res
    if artifacts is not None:
        (artifacts / "external-requests.json").write_text(
            json.dumps(sorted(set(external)), indent=2) + "\n"
        )
        heights = {rel: res.height for rel, res in results.items()}
        (artifacts / "page-heights.json").write_text(json.dumps(heights, indent=2) + "\n")
    return Crawl(base, results, external)


@pytest.fixture(scope="session")
def crawl(browser, server) -> Crawl:
    ARTIFACTS.mkdir(exist_ok=True)
    return crawl_pages(browser, server)


class _IdCollector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if key in ("id", "name") and value:
                self.ids.add(value)


@functools.cache
def _ids_in(path: Path) -> frozenset:
    parser = _IdCollector()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return frozenset(parser.ids)


def _format(problems: dict) -> str:
    return "\n".join(f"{page}:\n  " + "\n  ".join(items) for page, items in problems.items())


# --------------------------------------------------------------------------- tests


# Sphinx writes its generated pages at every build
ALWAYS_WRITTEN = {"genindex", "search", "py-modindex"}


def test_an_unchanged_rebuild_reads_and_executes_nothing(built_site):
    """What a second `make docs` redoes, not its seconds (which depend on the machine)."""
    done = built_site.rebuild
    assert done["read"] == [] and done["executed"] == [], (
        f"an unchanged rebuild re-read {done['read']} and re-executed {done['executed']}:"
        " something marks them outdated; see test-artifacts/build-unchanged.log"
    )
    assert set(done["written"]) <= ALWAYS_WRITTEN, sorted(set(done["written"]) - ALWAYS_WRITTEN)


def test_clean_build_stays_within_its_budget(built_site):
    """The rule (devtools/docs_execute.py): a clean build's pages may ask XLA for
    BUDGET_PROGRAMS programs (the same count on any machine) and spend BUDGET_CPU_RATIO times
    the CPU of devtools/calibrate.py's workload, timed on this machine in this run; a slow or
    busy machine scales both sides. The table is in test-artifacts/page-times-clean.json."""
    if built_site.clean_s is None:
        pytest.skip("CP_SITE_TEST_REUSE_BUILD=1: no clean build in this run")
    report = json.loads((ARTIFACTS / "page-times-clean.json").read_text())
    assert report["clean_build"], [r for r in report["pages"] if "executed" in r]
    slowest = ", ".join(
        f"{r['page']} {r.get('cpu_s', 0):.0f} s, {r.get('compiles', 0)} compiles"
        for r in report["pages"][:5]
    )
    assert report["within_budget"], (
        f"a clean build's pages asked for {report['programs']} XLA programs, over the"
        f" {report['budget_programs']} budget (devtools/docs_execute.py BUDGET_PROGRAMS); the"
        f" largest: {slowest}. Make the page cheaper, or raise the budget with a measurement."
    )
    ratio = report["cpu_s"] / built_site.calibration_cpu_s
    assert ratio <= docs_execute.BUDGET_CPU_RATIO, (
        f"a clean build's pages used {report['cpu_s']:.0f} CPU s, {ratio:.0f} times the"
        f" calibration workload's {built_site.calibration_cpu_s} s, over the"
        f" {docs_execute.BUDGET_CPU_RATIO:.0f}x budget (devtools/docs_execute.py"
        f" BUDGET_CPU_RATIO); the largest: {slowest}."
    )


def test_landing_page_is_site_root(built_site):
    index = (HTML / "index.html").read_text(encoding="utf-8")
    assert "Context-parallel attention in JAX" in index
    for chapter in CHAPTERS:
        assert f'href="{chapter}.html"' in index, f"the landing page does not link to {chapter}"


def test_every_source_page_is_built(built_site):
    sources = [
        "index.md",
        *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")),
        *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").glob("*.md")),
    ]
    missing = [s for s in sources if not (HTML / Path(s).with_suffix(".html")).is_file()]
    assert not missing, f"source files without a built page: {missing}"
    for chapter in CHAPTERS:
        assert (HTML / f"{chapter}.html").is_file(), f"chapter page {chapter}.html was not built"


def test_pages_load_without_errors(crawl):
    problems = {}
    for rel, res in crawl.pages.items():
        items = (
            [f"console error: {e}" for e in res.console_errors]
            + [f"uncaught exception: {e}" for e in res.page_errors]
            + [f"request failed: {e}" for e in res.failed_requests]
            + [f"HTTP error: {e}" for e in res.bad_responses]
        )
        if items:
            problems[rel] = items
    assert crawl.pages, "no pages were crawled"
    assert not problems, "pages with browser errors:\n" + _format(problems)


def test_only_known_external_requests(crawl):
    hosts = {urlsplit(u).netloc for u in crawl.external_requests}
    unexpected = sorted(hosts - EXTERNAL_HOSTS_ALLOWED)
    assert not unexpected, (
        f"pages request resources from unexpected hosts {unexpected} "
        "(see test-artifacts/external-requests.json); the site should be self-contained"
    )


def test_images_render(crawl):
    problems = {}
    for rel, res in crawl.pages.items():
        broken = [f"image did not load: {img['src']}" for img in res.images if img["width"] == 0]
        if broken:
            problems[rel] = broken
    assert not problems, "pages with missing images:\n" + _format(problems)


def test_internal_links_resolve(crawl):
    base = urlsplit(crawl.base)
    problems = {}
    for rel, res in crawl.pages.items():
        bad = []
        for link in res.links:
            url = urlsplit(link["url"])
            if url.scheme not in ("http", "https") or url.netloc != base.netloc:
                continue  # external, mailto:, javascript: ...
            target = HTML / unquote(url.path).lstrip("/")
            if url.path.endswith("/"):
                target = target / "index.html"
            if not target.is_file():
                bad.append(
                    f"{link['raw']!r} -> missing file"
                    f" {target.relative_to(HTML) if target.is_relative_to(HTML) else target}"
                )
                continue
            fragment = unquote(url.fragment)
            if fragment and target.suffix == ".html" and fragment not in _ids_in(target):
                bad.append(
                    f"{link['raw']!r} -> no element with id {fragment!r} in"
                    f" {target.relative_to(HTML)}"
                )
        if bad:
            problems[rel] = sorted(set(bad))
    assert not problems, "broken internal links:\n" + _format(problems)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_shows_backend_and_figure(crawl, chapter):
    res = crawl.pages.get(f"{chapter}.html")
    assert res is not None, f"{chapter}.html was not crawled"
    assert "Backend:" in res.text, f"{chapter} does not print its 'Backend:' line"
    figures = [img for img in res.images if img["inArticle"] and img["width"] > 0]
    assert figures, (
        f"{chapter} shows no rendered figure (no <img> with naturalWidth > 0 in the article)"
    )


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_offers_its_notebook(crawl, chapter):
    """The page links its executed notebook, and the file is a notebook of that chapter."""
    res = crawl.pages.get(f"{chapter}.html")
    name = Path(chapter).name + ".ipynb"
    assert res is not None and any(
        urlsplit(link["url"]).path.endswith("/" + name) for link in res.links
    ), f"{chapter} has no link to {name}"
    notebook = json.loads((HTML / "notebooks" / name).read_text())
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert code and any(c.get("outputs") for c in code), f"{name} has no executed code cells"


def test_formulas_render_offline(crawl):
    """Chapter 6 writes its formulas in $...$; MathJax (served locally) must typeset them."""
    res = crawl.pages.get("notebooks/06_when_does_cp_pay_off.html")
    assert res is not None
    assert res.math_rendered > 0, "no MathJax output on chapter 6: formulas would show as raw TeX"


def test_screenshots_saved(crawl):
    for name in ("landing.png", "chapter.png"):
        path = ARTIFACTS / name
        assert path.is_file() and path.stat().st_size > 10_000, (
            f"screenshot {name} missing or empty"
        )


# --------------------------------------------------------------------------- rendering (every page)


def test_code_and_output_never_soft_wrap(crawl):
    """Source and printed output keep their lines (Python's indentation depends on it)."""
    problems = {}
    for rel, res in crawl.pages.items():
        bad = [
            f"{p['head']!r} wraps (white-space {', '.join(p['wraps'])})"
            for p in res.layout["pres"]
            if p["wraps"]
        ]
        if bad:
            problems[rel] = bad[:5] + ([f"... and {len(bad) - 5} more"] if len(bad) > 5 else [])
    assert crawl.pages and all("pres" in r.layout for r in crawl.pages.values())
    assert not problems, "code or output boxes that soft-wrap:\n" + _format(problems)


def test_no_code_box_clips_a_line_at_1280px(crawl):
    """A line wider than its box scrolls horizontally (overflow-x auto/scroll), inside the
    article."""
    problems = {}
    for rel, res in crawl.pages.items():
        bad = [
            f"{p['head']!r}: "
            + (
                "wider than its box, which does not scroll"
                if p["overflowing"] and not p["scrolls"]
                else "sticks out of the article"
            )
            for p in res.layout["pres"]
            if (p["overflowing"] and not p["scrolls"]) or p["sticksOut"]
        ]
        # a code cell's lines are at most CODE_WIDTH characters (test_chapter_code.py): they fit, no
        # scrolling
        bad += [
            f"{p['head']!r}: a {p['longest']}-character code line does not fit its box"
            for p in res.layout["pres"]
            if p["source"] and p["longest"] <= CODE_WIDTH and p["overflowing"]
        ]
        if bad:
            problems[rel] = bad[:5]
    assert not problems, "code boxes that clip lines at 1280 px:\n" + _format(problems)


def test_tables_do_not_break_words(crawl):
    problems = {
        rel: [f"broken word: {w!r}" for w in sorted(set(res.layout["broken"]))][:8]
        for rel, res in crawl.pages.items()
        if res.layout["broken"]
    }
    assert not problems, "table cells that break a word across lines:\n" + _format(problems)


# MyST markup that a reader must never see as text: a directive that did not render (a bad
# fence leaves its "{dropdown}" or "````" on the page).
_RAW_MARKUP = re.compile(r"[`:]{3,}\{[a-z-]+\}|\{(?:dropdown|admonition|code-cell)\}")


def markup_problems(pages: dict) -> dict:
    """Per page, directive markup shown as text."""
    return {
        rel: [f"markup shown as text: {m!r}" for m in sorted(set(found))][:5]
        for rel, res in pages.items()
        if (found := _RAW_MARKUP.findall(res.layout.get("openText", "")))
    }


def test_no_directive_shows_as_text(crawl):
    problems = markup_problems(crawl.pages)
    assert crawl.pages and not problems, "pages that show MyST markup:\n" + _format(problems)


def number_problems(pages: dict) -> dict:
    """Per page, the numbers in table cells that the browser split over two lines."""
    return {
        rel: [f"broken number: {w!r}" for w in sorted(set(res.layout["brokenNumbers"]))][:8]
        for rel, res in pages.items()
        if res.layout["brokenNumbers"]
    }


def test_tables_do_not_break_numbers(crawl):
    problems = number_problems(crawl.pages)
    assert not problems, "table cells that split a number over two lines:\n" + _format(problems)


def test_the_number_check_fails_on_a_number_split_at_its_hyphen(browser, tmp_path):
    """The number check can fail: a narrow cell holding "4.0e-03" and "2.22-2.34x" (the support
    matrix's and chapter 6's cells before they were split) is flagged for both numbers, and the
    same numbers in a ``cp-num`` span are not."""
    html = tmp_path / "html"
    (html / "notebooks").mkdir(parents=True)
    (html / "_static").symlink_to(HTML / "_static", target_is_directory=True)
    page = (HTML / f"{CHAPTERS[0]}.html").read_text(encoding="utf-8")
    narrow = "<td style='width:3.2em;max-width:3.2em'>{}</td>"
    injected = (
        "<table><tr>"
        + narrow.format("right 4.0e-03")
        + narrow.format("0.58x / 2.22-2.34x")
        + narrow.format("right <span class='cp-num'>5.0e-03</span>")
        + narrow.format("<span class='cp-num'>2.25-2.36x</span>")
        + "</tr></table>"
    )
    at = page.index("</article>")
    (html / f"{CHAPTERS[0]}.html").write_text(page[:at] + injected + page[at:], encoding="utf-8")
    with serve(html) as base:
        pages = crawl_pages(browser, base, html, artifacts=None).pages
    flagged = number_problems(pages)[f"{CHAPTERS[0]}.html"]
    assert flagged == ["broken number: '2.22-2.34x'", "broken number: '4.0e-03'"], flagged


MIN_FIGURE_TEXT_PX = 10  # a figure's smallest text, as displayed at 1280 px
MIN_PNG_DENSITY = 2  # a PNG's pixels per displayed pixel
_FILE_LIKE = re.compile(r"^\S*[/\\]\S*$|\.(?:png|svg|jpe?g|gif)$", re.IGNORECASE)


def figure_problems(pages: dict) -> dict:
    """Per page, the article's figures that a reader cannot read or a screen reader cannot name:
    an SVG whose smallest text shows under ``MIN_FIGURE_TEXT_PX`` (or whose text is drawn as
    paths, so no size can be read), a PNG with fewer than ``MIN_PNG_DENSITY`` pixels per
    displayed pixel, and alt text that is empty, a file path or a single word."""
    problems = {}
    for rel, res in pages.items():
        found = []
        for img in res.images:
            if not img.get("figure") or not img.get("shownWidth"):
                continue
            name = img["src"].rsplit("/", 1)[-1][:16]
            svg = img.get("svgText")
            if svg is not None:
                if not svg["texts"]:
                    found.append(f"{name}: SVG without <text> (text as paths, or unreadable)")
                elif svg["smallest"] < MIN_FIGURE_TEXT_PX:
                    found.append(f"{name}: smallest text {svg['smallest']:.1f} px")
            elif img["width"] < MIN_PNG_DENSITY * img["shownWidth"]:
                found.append(
                    f"{name}: {img['width']} px shown at {img['shownWidth']:.0f} px"
                    f" (under {MIN_PNG_DENSITY}x)"
                )
            alt = img.get("alt", "").strip()
            if not alt or _FILE_LIKE.search(alt) or len(alt.split()) < 3:
                found.append(f"{name}: alt text {alt[:40]!r} does not describe the figure")
        if found:
            problems[rel] = found
    return problems


def test_figures_are_sharp_readable_and_described(crawl):
    problems = figure_problems(crawl.pages)
    assert not problems, "figures too small to read or without alt text:\n" + _format(problems)


def test_the_figure_check_fails_on_a_blurry_png_a_tiny_font_and_a_path_alt(browser, tmp_path):
    """The figure check can fail: a PNG shown at its own width, an SVG whose 8-unit text is
    shown at full size (8 px) and a path as alt text are flagged; an SVG with 12-unit text at
    full size and a described 2x PNG are not."""
    html = tmp_path / "html"
    images = html / "_images"
    images.mkdir(parents=True)
    (html / "_static").symlink_to(HTML / "_static", target_is_directory=True)
    svg = (
        "<svg xmlns='http://www.w3.org/2000/svg' width='400' height='100'"
        " viewBox='0 0 400 100'><text x='10' y='50' style='font: {}px sans-serif'>ab</text></svg>"
    )
    (images / "tiny.svg").write_text(svg.format(8))
    (images / "fine.svg").write_text(svg.format(12))
    # a 1x1 PNG: stretched to 200 px it is blurry, and at 0.5 px it is dense enough
    png = bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360f8cfc0000003010100c9fe92ef0000000049454e44ae426082"
    )
    (images / "blurry.png").write_bytes(png)
    page = (HTML / f"{CHAPTERS[0]}.html").read_text(encoding="utf-8")
    alt = "alt='A bar for each device'"
    injected = (
        f"<img src='../_images/tiny.svg' {alt} style='width:400px'>"
        "<img src='../_images/fine.svg' alt='../_images/fine.svg' style='width:400px'>"
        f"<img src='../_images/blurry.png' {alt} style='width:200px'>"
        f"<img src='../_images/blurry.png' {alt} style='width:0.5px'>"
    )
    at = page.index("</article>")
    (html / "notebooks").mkdir()
    (html / f"{CHAPTERS[0]}.html").write_text(page[:at] + injected + page[at:], encoding="utf-8")
    with serve(html) as base:
        pages = crawl_pages(browser, base, html, artifacts=None).pages
    flagged = [
        p
        for p in figure_problems(pages).get(f"{CHAPTERS[0]}.html", [])
        if p.split(":")[0] in ("tiny.svg", "fine.svg", "blurry.png")
    ]
    assert flagged == [
        "tiny.svg: smallest text 8.0 px",
        "fine.svg: alt text '../_images/fine.svg' does not describe the figure",
        "blurry.png: 1 px shown at 200 px (under 2x)",
    ], flagged


def test_run_status_box_on_the_landing_page_and_every_chapter(crawl):
    """The generated box (pages.run_status) is on each chapter that was built, new ones included."""
    from tutorial_utils.pages import run_status

    recs = run_status.gpu_records(ROOT / "results")
    expected = (
        [f"results/{Path(r['_path']).name}" for r in recs[-run_status.MAX_NAMED :]]
        if recs
        else [run_status.NO_GPU_TEXT.replace("`", "")]
    )
    pages = ["index.html", *sorted(rel for rel in crawl.pages if rel.startswith("notebooks/"))]
    assert len(pages) > len(CHAPTERS), "no chapter pages were crawled"
    problems = {}
    for rel in pages:
        box = crawl.pages[rel].layout.get("statusBox")
        if box is None:
            problems[rel] = ["no run-status box"]
            continue
        missing = [text for text in ["What ran where", *expected] if text not in box]
        if rel != "index.html" and not box.startswith("Ran on "):
            missing.append("its one line, 'Ran on ...'")
        lines = crawl.pages[rel].layout.get("summaryLines")
        if rel != "index.html" and lines != 1:
            missing.append(f"a one-line summary at 1280 px (it takes {lines})")
        if missing:
            problems[rel] = [f"the box lacks {m!r}" for m in missing]
    assert not problems, "pages without the generated run-status box:\n" + _format(problems)


def test_support_matrix_page_shows_the_record(crawl):
    """docs/support_matrix: the executed table of TE's verdicts, its backend line, and refusals
    linked to rules."""
    from tutorial_utils.cli import support_matrix as sm

    res = crawl.pages.get("docs/support_matrix.html")
    assert res is not None, "docs/support_matrix.html was not crawled"
    record = json.loads(sm.DEFAULT_OUT.read_text(encoding="utf-8"))
    assert "Backend:" in res.text and f"cp = {record['hardware']['cp_size']}" in res.text
    for label in record["columns"].values():
        assert label in res.text, f"the matrix lacks the column {label!r}"
    for row in record["rows"]:
        assert row["label"] in res.text, f"the matrix lacks the row {row['label']!r}"
    refused = [
        c for row in record["rows"] for c in row["cells"].values() if c["verdict"] == "refused"
    ]
    if refused:
        assert any("faq.html#" in link["url"] for link in res.links), (
            "refusals are not linked to the FAQ"
        )


def test_recipes_page_shows_each_recipe_in_full_with_its_output(crawl):
    """docs/recipes: every examples/*.py in full (literalinclude, in a dropdown a reader opens) and
    the output its run printed at build time."""
    import re

    from recipe_runs import ON_THE_RECIPES_PAGE

    res = crawl.pages.get("docs/recipes.html")
    assert res is not None, "docs/recipes.html was not crawled"
    recipes = sorted((ROOT / "examples").glob("*.py"))
    assert recipes
    for path in recipes:
        lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        missing = [line for line in lines if line not in res.layout["openText"]]
        assert not missing, (
            f"{path.name}: {len(missing)} of its lines are not on the page, e.g. {missing[:2]}"
        )
    banners = re.findall(
        r"te_on_cpu: \S+ runs TransformerEngine 2\.20\.2 on (\d+) simulated CPU devices",
        res.text,
    )
    if (
        not banners
    ):  # a GPU build runs the recipes directly: their result lines still name the device count
        assert "cp=" in res.text
    else:
        # one per recipe run, each on the devices the page runs it with
        assert sorted(banners) == sorted(str(d) for _, d, _ in ON_THE_RECIPES_PAGE), banners
    # each recipe's four-device run, as tests/examples/test_examples.py checks its other runs
    # (tests/recipe_runs.py)
    from recipe_runs import FLAX_REFUSAL, ON_THE_RECIPES_PAGE, check_result_lines

    lines = res.text.splitlines()
    for _, _, says in ON_THE_RECIPES_PAGE:
        check_result_lines(lines, says)
    refusal = [line for line in lines if line.strip().startswith(FLAX_REFUSAL[0])]
    assert refusal and FLAX_REFUSAL[1] in refusal[0], (
        "the Flax recipe's AllGather refusal is not on the page"
    )
    for says in ("check_layout: examples/packed_batch.npz", "verdict:"):
        assert says in res.text, f"the recipes page lacks {says!r}"


# --------------------------------------------------------------------------- what readers see

# An absolute path of the machine that built the site, in what a page shows (prose or a cell's
# output): the usual places of a checkout, a home, a temporary file, and any absolute path into
# an installed package (a warning's file name, a traceback). A relative ``site-packages/nvidia/...``
# in the text is the name of a folder, not this machine's path, and is not flagged.
_STARTS = r"(?<![\w.~$-])"  # not inside a word, a relative path or a URL
_ABSOLUTE = _STARTS + "/"
MACHINE_PATH = re.compile(
    _ABSOLUTE + r"(?:tmp|home|work|root)/\S*" + "|" + _ABSOLUTE + r"\S*?(?:site|dist)-packages\S*"
)
# ... and wherever the build's own checkout, venv and temporary folder happen to be
_GENERIC_PREFIXES = {"/", "/usr", "/usr/local", "/opt"}
MACHINE_PREFIXES = sorted(
    {str(ROOT), sys.prefix, tempfile.gettempdir()} - _GENERIC_PREFIXES, key=len, reverse=True
)
# Words of the project's own machinery (the test run, the lent GPU machine): they belong in
# devtools/README.md, not on a reader's page.
CONTRIBUTOR_WORDS = re.compile(r"\b(?:(?:lib)?TCMalloc|xdist|per call|lent)\b", re.IGNORECASE)


def _context(text: str, start: int, end: int, width: int = 50) -> str:
    return " ".join(text[max(0, start - width) : end + width].split())


def machine_paths(text: str) -> list[str]:
    """The build machine's absolute paths in ``text``, each with a little context."""
    found = [(m.start(), m.end()) for m in MACHINE_PATH.finditer(text)]
    for prefix in MACHINE_PREFIXES:
        found += [
            (m.start(), m.end()) for m in re.finditer(_STARTS + re.escape(prefix) + r"\b", text)
        ]
    spans: dict = {}  # one report per place, however many patterns match there: the longest
    for start, end in found:
        spans[start] = max(end, spans.get(start, end))
    return [f"{text[s:e]!r} in: ...{_context(text, s, e)}..." for s, e in sorted(spans.items())]


def contributor_words(text: str) -> list[str]:
    """Contributor words in ``text`` (a reader's page), each with a little context."""
    return [
        f"{m.group(0)!r} in: ...{_context(text, m.start(), m.end())}..."
        for m in CONTRIBUTOR_WORDS.finditer(text)
    ]


def _shown_text(res: PageResult) -> str:
    """What the page shows, hidden cells opened (a reader opens them with one click)."""
    return res.layout.get("openText") or res.text


def path_problems(pages: dict) -> dict:
    found = {rel: machine_paths(_shown_text(res)) for rel, res in pages.items()}
    return {rel: items for rel, items in found.items() if items}


def word_problems(pages: dict) -> dict:
    """Contributor words on the reader's pages (the "For contributors" pages may use them)."""
    theirs = {f"{doc}.html" for doc in toctree_entries("For contributors")}
    found = {
        rel: contributor_words(_shown_text(res)) for rel, res in pages.items() if rel not in theirs
    }
    return {rel: items for rel, items in found.items() if items}


def wide_boxes(pages: dict, select) -> dict:
    """Per page, the boxes wider than they show at 1280 px (``_WIDE_JS``) for which
    ``select(page, box)`` holds."""
    found = {
        rel: [
            f"{b['kind']} {b['text']!r}: scrollWidth {b['scrollWidth']} > clientWidth"
            f" {b['clientWidth']}"
            for b in res.wide
            if select(rel, b)
        ]
        for rel, res in pages.items()
    }
    return {rel: items for rel, items in found.items() if items}


def _chapter_code(rel: str, box: dict) -> bool:
    """A chapter's code cell: formatted at 88 columns (make lint), it must fit."""
    return box["kind"] == "code cell" and rel[: -len(".html")] in CHAPTERS


def _other_code(rel: str, box: dict) -> bool:
    """Code blocks on any page, and the code cells of pages that are not chapters."""
    return box["kind"] in ("code cell", "code block") and not _chapter_code(rel, box)


def _output_or_table(rel: str, box: dict) -> bool:
    return box["kind"] in ("cell output", "table")


def test_no_machine_path_on_any_page(crawl):
    """No page shows where it was built: no checkout, home, temporary or site-packages path (a
    warning printed by a library names its file; filter it where it arises, in the chapter)."""
    problems = path_problems(crawl.pages)
    assert crawl.pages and not problems, (
        "absolute paths of the build machine on reader pages:\n" + _format(problems)
    )


def test_no_contributor_words_on_reader_pages(crawl):
    """The test run's settings and the lent GPU machine are devtools/README.md's, not the site's."""
    problems = word_problems(crawl.pages)
    assert crawl.pages and not problems, (
        "contributor words on reader pages (move the passage to devtools/README.md):\n"
        + _format(problems)
    )


def test_chapter_code_cells_fit_their_box_at_1280px(crawl):
    """A chapter's code cells (at most 88 columns) never scroll sideways."""
    problems = wide_boxes(crawl.pages, _chapter_code)
    assert crawl.pages and not problems, (
        "chapter code cells wider than their box at 1280 px:\n" + _format(problems)
    )


# KNOWN, NOT FIXED YET (the next two tests are expected to fail and list every offender): at
# 1280 px some boxes are wider than the text column and scroll sideways (they never clip:
# test_no_code_box_clips_a_line_at_1280px). Code blocks on the guides (fenced commands with long
# comments, the recipes' 88-column files at the code blocks' larger font) and the docs pages'
# own code cells; and cell outputs (long result lines, printed tables) and wide tables. When one
# of these passes, remove its mark.
def test_no_other_code_is_wider_than_its_box_at_1280px(crawl):
    problems = wide_boxes(crawl.pages, _other_code)
    assert crawl.pages and not problems, (
        "code blocks and non-chapter code cells wider than their box at 1280 px:\n"
        + _format(problems)
    )


def test_the_width_check_fails_on_a_page_with_a_wide_output_and_table(browser, tmp_path):
    """The width tests can fail: a built chapter, copied with a 120-character printed line and
    a ten-column table added to its article, is flagged for exactly those two boxes."""
    html = tmp_path / "html"
    (html / "notebooks").mkdir(parents=True)
    (html / "_static").symlink_to(HTML / "_static", target_is_directory=True)
    page = (HTML / f"{CHAPTERS[0]}.html").read_text(encoding="utf-8")
    wide_line = "x" * 120
    cells = "".join(f"<td>column{i}wideword</td>" for i in range(10))  # no break points
    injected = (
        f'<div class="cell_output"><pre>{wide_line}</pre></div><table><tr>{cells}</tr></table>'
    )
    at = page.index("</article>")
    (html / f"{CHAPTERS[0]}.html").write_text(page[:at] + injected + page[at:], encoding="utf-8")
    with serve(html) as base:
        pages = crawl_pages(browser, base, html, artifacts=None).pages
    flagged = wide_boxes(pages, _output_or_table)[f"{CHAPTERS[0]}.html"]
    assert len(flagged) == 2, flagged
    assert flagged[0].startswith(f"cell output {wide_line[:70]!r}"), flagged
    assert flagged[1].startswith("table 'column0wideword"), flagged


def test_no_output_or_table_is_wider_than_its_box_at_1280px(crawl):
    problems = wide_boxes(crawl.pages, _output_or_table)
    assert crawl.pages and not problems, (
        "cell outputs and tables wider than their box at 1280 px:\n" + _format(problems)
    )


# Word budgets, counted as a reader first sees each page (hidden cells closed): the article's
# text, prose, code and outputs alike. The chapters together and each alone; the other pages
# together (the API page is measured by its height instead).
CHAPTER_WORDS, CHAPTERS_WORDS, OTHER_WORDS, API_HEIGHT_PX = 2500, 18000, 20000, 25000
CONTRIBUTOR_PAGES = tuple(f"{doc}.html" for doc in toctree_entries("For contributors"))


def word_counts(pages: dict) -> dict:
    """Per page, the words a reader sees before opening any hidden cell."""
    return {rel: len(res.text.split()) for rel, res in pages.items()}


def word_budget_problems(pages: dict) -> list:
    """What breaks the word budgets above, each naming the pages and their counts."""
    words = word_counts(pages)
    chapters = {rel: n for rel, n in words.items() if rel.startswith("notebooks/")}
    others = {  # the reader's pages: the API page has its height budget, contributors' pages none
        rel: n
        for rel, n in words.items()
        if rel not in chapters and rel not in ("docs/api.html", *CONTRIBUTOR_PAGES)
    }
    problems = [
        f"{rel}: {n:,} words (a chapter's budget is {CHAPTER_WORDS:,})"
        for rel, n in chapters.items()
        if n > CHAPTER_WORDS
    ]
    if sum(chapters.values()) > CHAPTERS_WORDS:
        problems.append(
            f"the chapters: {sum(chapters.values()):,} words (budget {CHAPTERS_WORDS:,})"
        )
    if sum(others.values()) > OTHER_WORDS:
        largest = ", ".join(
            f"{r} {n:,}" for r, n in sorted(others.items(), key=lambda x: -x[1])[:4]
        )
        problems.append(
            f"the other pages: {sum(others.values()):,} words (budget {OTHER_WORDS:,});"
            f" the largest: {largest}"
        )
    api = pages.get("docs/api.html")
    if api is not None and api.height > API_HEIGHT_PX:
        problems.append(
            f"docs/api.html: {api.height:,} px tall at 1280 px (budget {API_HEIGHT_PX:,})"
        )
    return problems


def test_pages_stay_within_their_word_budgets(crawl):
    problems = word_budget_problems(crawl.pages)
    assert not problems, "\n".join(problems)


def test_the_word_budget_fails_a_chapter_over_it():
    """The budget check can fail: one chapter of 2,501 words and a long API page are flagged."""
    fake = {
        "notebooks/01_x.html": PageResult("notebooks/01_x.html", text="word " * 2501),
        "docs/api.html": PageResult("docs/api.html", text="api", height=API_HEIGHT_PX + 1),
        "index.html": PageResult("index.html", text="short page"),
    }
    problems = word_budget_problems(fake)
    assert len(problems) == 2 and "2,501 words" in problems[0] and "px tall" in problems[1]
    fake["notebooks/01_x.html"].text = "word " * 2500
    fake["docs/api.html"].height = API_HEIGHT_PX
    assert word_budget_problems(fake) == []


def main(argv: list[str]) -> int:
    """``python tests/site/test_site.py [HTML_DIR]``: the reader-facing checks above on a site
    already built (default ``_build_test/html``), without building it again, and each page's
    height. Exit status 1 on any problem."""
    html = Path(argv[0]).resolve() if argv else HTML
    with serve(html) as base, launch_browser() as b:
        pages = crawl_pages(b, base, html, artifacts=None).pages
    checks = [
        ("machine paths", path_problems(pages), True),
        ("contributor words", word_problems(pages), True),
        ("chapter code cells wider than their box", wide_boxes(pages, _chapter_code), True),
        ("other code wider than its box", wide_boxes(pages, _other_code), True),
        ("outputs and tables wider than their box", wide_boxes(pages, _output_or_table), True),
        ("numbers split over two lines in tables", number_problems(pages), True),
        ("MyST markup shown as text", markup_problems(pages), True),
        ("figures: text under 10 px, PNG under 2x, alt text", figure_problems(pages), True),
        (
            "word budgets",
            {"": word_budget_problems(pages)} if word_budget_problems(pages) else {},
            True,
        ),
    ]
    failed = False
    for name, problems, counts in checks:
        print(f"== {name}: {'FAIL' if problems else 'ok'} ({len(pages)} pages)")
        if problems:
            print(_format(problems))
        failed |= counts and bool(problems)
    print("== page heights at 1280 px and words (hidden cells closed):")
    words = word_counts(pages)
    for rel, res in pages.items():
        print(f"  {res.height:7,d} px {words[rel]:6,d} words  {rel}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
