"""Install packages into a virtual environment with uv where it can be had, else with pip.

Why: ``make docs`` and ``make test`` start by creating ``.venv`` (CI builds a second one for
Python 3.12). pip takes about a minute for this project's ~120 wheels on a 2-core machine, most
of it resolving and unpacking in Python; uv installs the same versions in seconds. So the
Makefile calls::

    python devtools/venv_install.py .venv/bin/python -e '.[test,docs]'

which upgrades the venv's pip and installs uv into the venv with that pip, then installs the
requested packages with ``uv pip install``. uv does not read pip's configuration, so the index
settings pip has (``pip config list``: index-url, extra-index-url, find-links, constraint, cert)
are passed on to it, and both look at the same indexes and pins. Where uv cannot be installed
or fails, the same install runs with pip, after one line saying why; ``TUTORIAL_INSTALLER=pip``
asks for pip outright.

Neither installer compiles the whole venv to bytecode (uv's default; ``--no-compile`` for pip).
Compiling its ~8,200 source files took 44 of the 48 CPU seconds of a uv install on a 2-core
machine (9 s without), and a run imports about a quarter of them. Instead, after the install,
one process imports what nearly every process of a run imports (:data:`WARM_CODE`: JAX, TE's JAX
code on the CPU stand-in, flax, optax, matplotlib, IPython, Sphinx, myst-nb, pytest...) and so
writes their ``.pyc`` files: about 14 CPU seconds, once. Without it the first processes of a run
(two pytest workers and the site build start together) would each compile the same modules.
What else a run imports gets its ``.pyc`` on first import (``PYC`` in the Makefile).

It runs before the package is installed, so it uses the standard library only.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

CHOICES = ("auto", "uv", "pip")
#: pip setting -> uv option (the multi-valued ones are space-separated in pip's configuration)
_OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def pip_settings(python: str) -> dict[str, list[str]]:
    """pip's effective settings from ``pip config list`` (files and ``PIP_*`` variables), as
    lists."""
    proc = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True)
    settings: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        name = key.rsplit(".", 1)[-1]  # "global.find-links", ":env:.find-links" -> "find-links"
        value = value.strip().strip("'\"")
        if name in _OPTIONS or name == "cert":
            settings.setdefault(name, [])
            for item in value.split():
                if item not in settings[name]:
                    settings[name].append(item)
    return settings


def uv_command(
    uv: str, python: str, settings: dict[str, list[str]], packages: Sequence[str]
) -> list[str]:
    """``uv pip install`` with pip's indexes; ``unsafe-best-match`` picks across indexes as pip
    does."""
    # no --compile-bytecode: the modules a run imports get their .pyc on first import (module
    # docstring)
    cmd = [
        uv,
        "pip",
        "install",
        "--quiet",
        "--python",
        python,
        "--index-strategy",
        "unsafe-best-match",
    ]
    for name, option in _OPTIONS.items():
        for value in settings.get(name, []):
            if (
                name in ("find-links", "constraint")
                and "://" not in value
                and not Path(value).exists()
            ):
                continue  # pip skips a missing local path with a warning; uv would stop
            cmd += [option, value]
    return cmd + list(packages)


# : Run by the venv's Python after an install: imports whose .pyc files every run needs (module :
# docstring). : A module that is not installed (another extra, no TE) is skipped.
WARM_CODE = """
import importlib
for name in ("jax", "tutorial_utils.te_on_cpu", "flax.linen", "optax", "matplotlib.pyplot",
"IPython",
             "ipykernel.kernelapp", "nbclient", "jupytext", "sphinx.application",
             "sphinx.builders.html", "myst_nb",
             "pytest", "xdist", "hypothesis", "playwright.sync_api"):
    try:
        module = importlib.import_module(name)
        if name == "tutorial_utils.te_on_cpu":
            module.install()
            importlib.import_module("transformer_engine.jax")
    except Exception:
        pass
"""


def warm_bytecode(python: str) -> int:
    """Write the ``.pyc`` files of :data:`WARM_CODE`'s imports into the venv of ``python``; its exit
    status."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.setdefault("JAX_PLATFORMS", "cpu")  # importing JAX must not look for accelerators here
    return subprocess.run([python, "-c", WARM_CODE], env=env).returncode


def install(python: str, packages: Sequence[str], *, choice: str = "auto") -> str:
    """Install ``packages`` into the venv of ``python``; return which installer did it."""
    if choice not in CHOICES:
        raise ValueError(
            f"TUTORIAL_INSTALLER={choice!r} must be one of {', '.join(CHOICES)}; unset it to use uv"
            " where it installs, else pip."
        )
    pip = [python, "-m", "pip", "install", "--quiet"]
    subprocess.run(pip + ["--upgrade", "pip"], check=True)
    no_bytecode = ["--no-compile"]  # as uv: bytecode on first import (module docstring)
    if choice != "pip":
        why = None
        uv = Path(python).with_name("uv")
        if subprocess.run(pip + ["uv"]).returncode != 0 or not uv.exists():
            why = "pip could not install uv"
        else:
            settings = pip_settings(python)
            env = dict(os.environ)
            if settings.get("cert") and "SSL_CERT_FILE" not in env:
                env["SSL_CERT_FILE"] = settings["cert"][0]
            cmd = uv_command(str(uv), python, settings, packages)
            if subprocess.run(cmd, env=env).returncode == 0:
                return "uv"
            why = f"{shlex.join(cmd)} failed"
        if choice == "uv":
            raise RuntimeError(
                f"TUTORIAL_INSTALLER=uv, but {why}; unset TUTORIAL_INSTALLER to fall back to pip."
            )
        print(f"venv_install: {why}; installing with pip instead", file=sys.stderr)
    subprocess.run(pip + no_bytecode + list(packages), check=True)
    return "pip"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0].startswith("-"):
        print(
            "usage: python venv_install.py VENV_PYTHON PACKAGE_OR_PIP_ARG...  (e.g."
            " .venv/bin/python -e '.[test]')",
            file=sys.stderr,
        )
        return 2
    python = args[0]
    if not Path(python).exists():
        print(
            f"venv_install: VENV_PYTHON={python!r} does not exist; create the venv first (python3"
            " -m venv .venv).",
            file=sys.stderr,
        )
        return 2
    try:
        install(
            python,
            args[1:],
            choice=os.environ.get("TUTORIAL_INSTALLER", "auto").strip().lower() or "auto",
        )
    except (ValueError, RuntimeError, subprocess.CalledProcessError) as err:
        print(f"venv_install: {err}", file=sys.stderr)
        return 1
    if warm_bytecode(python) != 0:
        print(
            "venv_install: writing the bytecode of the common imports failed; each run compiles"
            " them instead",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
