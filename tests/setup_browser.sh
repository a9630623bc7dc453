#!/usr/bin/env bash
# Make sure the browser test (tests/test_site.py) can run: a Chromium on the PATH and the
# Playwright Python package in the venv. Idempotent; `make test` runs it before pytest.
#
# Playwright drives the system Chromium (executable_path); it never downloads browsers.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PY:-.venv/bin/python}"

find_chromium() {
    for name in chromium chromium-browser google-chrome google-chrome-stable; do
        if command -v "$name" >/dev/null 2>&1; then
            command -v "$name"
            return 0
        fi
    done
    return 1
}

if path="$(find_chromium)"; then
    echo "setup_browser: using $path"
elif [ "$(id -u)" != "0" ]; then
    echo "setup_browser: no Chromium on PATH and not root; skipping the install." >&2
    echo "setup_browser: install Debian's 'chromium' package (or set CHROMIUM_PATH) to run tests/test_site.py." >&2
elif ! command -v apt-get >/dev/null 2>&1; then
    echo "setup_browser: no Chromium on PATH and no apt-get; install Chromium by hand (or set CHROMIUM_PATH)." >&2
else
    echo "setup_browser: installing Debian's chromium package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends chromium
    path="$(find_chromium)"
    echo "setup_browser: using $path"
fi

if [ -x "$PY" ]; then
    if ! "$PY" -c "import playwright.sync_api" >/dev/null 2>&1; then
        # Normally installed through the 'test' extra in pyproject.toml; this covers old venvs.
        echo "setup_browser: installing the playwright Python package into $(dirname "$(dirname "$PY")")"
        "$PY" -m pip install --quiet "playwright>=1.45"
    fi
else
    echo "setup_browser: $PY not found; run 'make venv' first." >&2
    exit 1
fi
