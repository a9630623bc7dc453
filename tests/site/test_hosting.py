"""Hosting: Read the Docs builds the site with the same command a reader runs.

The site test builds exactly what ``make docs`` builds (``test_site.SPHINX_ARGS``, into its
own folder); here the hosting configuration is tied to that same target, so the hosted site
cannot drift from the tested one.
"""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_read_the_docs_runs_make_docs_and_publishes_its_output():
    config = yaml.safe_load((ROOT / ".readthedocs.yaml").read_text())
    assert config["version"] == 2 and config["build"]["tools"]["python"] == "3.11"
    commands = config["build"]["commands"]
    assert commands[0].startswith("make docs"), commands
    assert any("_build/html/." in c and "$READTHEDOCS_OUTPUT/html" in c for c in commands), commands


def test_make_docs_is_the_sphinx_build_the_site_test_runs():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^docs: .*\n\t(.+)$", makefile, re.M).group(1)
    # $(PYC) only lets Python write the .pyc files of what it imports (the Makefile says why)
    assert recipe == "$(PYC) $(PY) -m sphinx -b html -W --keep-going -j 1 . _build/html", recipe
    assert re.search(r"^PYC = PYTHONDONTWRITEBYTECODE=$", makefile, re.M)
    site_test = (ROOT / "tests" / "site" / "test_site.py").read_text()
    assert (
        '"-m", "sphinx", "-b", "html", "-W", "--keep-going", "-j", "1", ".", "_build_test/html"'
        in site_test
    )
