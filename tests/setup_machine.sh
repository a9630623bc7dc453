#!/usr/bin/env bash
# What `make test` needs from the machine, installed when missing (idempotent; `make test` runs
# it before pytest, and the test targets call `--malloc` for the library to preload):
#
# * a Chromium on the PATH and the Playwright Python package in the venv, for the browser test
#   (tests/site/test_site.py). Playwright drives the system Chromium (executable_path); it never
#   downloads browsers.
# * TCMalloc (Debian's libtcmalloc-minimal4). The run preloads it into every process: XLA's
#   compiles allocate heavily, and under TCMalloc the suite's processes use about a tenth less
#   CPU than under glibc's malloc (CONTRIBUTING.md gives the figures). It changes no result.
#   Without root or apt-get the run goes on with glibc's malloc.
#
# `bash tests/setup_machine.sh --malloc` only prints the TCMalloc library to preload (nothing
# when there is none, or when TUTORIAL_FAST_MALLOC=0). `--system` installs the Debian packages
# only, without looking at the venv: .ci/run starts it while the venvs are being built.
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

find_tcmalloc() {
    for dir in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib; do
        if [ -f "$dir/libtcmalloc_minimal.so.4" ]; then
            echo "$dir/libtcmalloc_minimal.so.4"
            return 0
        fi
    done
    return 1
}

if [ "${1:-}" = "--malloc" ]; then
    [ "${TUTORIAL_FAST_MALLOC:-1}" = "0" ] || find_tcmalloc || true
    exit 0
fi

missing=()
find_chromium >/dev/null || missing+=(chromium)
find_tcmalloc >/dev/null || missing+=(libtcmalloc-minimal4)

if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != "0" ]; then
        echo "setup_machine: missing ${missing[*]} and not root; skipping the install." >&2
    elif ! command -v apt-get >/dev/null 2>&1; then
        echo "setup_machine: missing ${missing[*]} and no apt-get; install by hand." >&2
    else
        echo "setup_machine: installing Debian's ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        # together (one transaction), else one by one, so that one missing package does not
        # keep the other from being installed
        apt-get update && apt-get install -y --no-install-recommends "${missing[@]}" || \
            for package in "${missing[@]}"; do
                apt-get install -y --no-install-recommends "$package" \
                    || echo "setup_machine: apt-get could not install $package" >&2
            done
    fi
fi

[ "${1:-}" = "--system" ] && exit 0

if path="$(find_chromium)"; then
    echo "setup_machine: browser $path"
else
    echo "setup_machine: no Chromium: install Debian's 'chromium' package (or set CHROMIUM_PATH) to run tests/site/test_site.py." >&2
fi
if path="$(find_tcmalloc)"; then
    echo "setup_machine: malloc $path (preloaded by make test; TUTORIAL_FAST_MALLOC=0 turns it off)"
else
    echo "setup_machine: no TCMalloc; the tests run with glibc's malloc, about a tenth slower." >&2
fi

if [ -x "$PY" ]; then
    if ! "$PY" -c "import playwright.sync_api" >/dev/null 2>&1; then
        # Normally installed through the 'test' extra in pyproject.toml; this covers old venvs.
        echo "setup_machine: installing the playwright Python package into $(dirname "$(dirname "$PY")")"
        "$PY" -m pip install --quiet "playwright>=1.45"
    fi
else
    echo "setup_machine: $PY not found; run 'make venv' first." >&2
    exit 1
fi
