"""Run an unmodified TE script on CPU: ``python -m tutorial_utils.te_on_cpu script.py``."""

from __future__ import annotations

import argparse
import importlib
import os
import runpy
import sys

import jax

from .extension import BACKEND_DESCRIPTION
from .lowerings import CUSTOM_CALLS_ENV, CUSTOM_CALLS_OFF, custom_calls_left_on

# ----------------------------------------------------------------------------- the runner for unmod

#: Frameworks a script may try to import that the runner cannot stand in for (TE's JAX API only).
OTHER_FRAMEWORKS = (
    "torch",
    "tensorflow",
    "paddle",
    "transformer_engine.pytorch",
    "transformer_engine.paddle",
)


class _OtherFrameworkError(ModuleNotFoundError):
    """Raised for ``import torch`` & co. under the runner.

    An ImportError, so optional imports still fall back.
    """


def _probing() -> bool:
    """Whether ``importlib.util.find_spec`` (is it installed?) asks, rather than an import.

    Libraries probe for optional frameworks that way (etils, behind JAX's persistent compilation
    cache, asks for TensorFlow); a probe must read "not installed", not fail.
    """
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return False
        code = frame.f_code
        if (
            code.co_name == "find_spec"
            and "importlib" in code.co_filename
            and "util" in code.co_filename
        ):
            return True
        frame = frame.f_back
    return False


class _RefuseOtherFrameworks:
    """A meta-path finder that refuses the frameworks the runner does not run, naming the fix."""

    def find_spec(self, name, path=None, target=None):
        if any(name == f or name.startswith(f + ".") for f in OTHER_FRAMEWORKS) and not _probing():
            raise _OtherFrameworkError(
                f"`import {name}`: `python -m tutorial_utils.te_on_cpu` runs scripts written"
                " against TE's JAX API (transformer_engine.jax) on CPU; it cannot run PyTorch,"
                " TensorFlow or Paddle code. Port the script to transformer_engine.jax, or run it"
                " on a GPU node with the real framework.",
                name=name,
            )
        return None


_CHILD_MARK = "TUTORIAL_TE_ON_CPU_RUNNER"


def _parse_runner_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m tutorial_utils.te_on_cpu",
        description=(
            "Run an unmodified script written against TransformerEngine's JAX API on CPU: TE's own"
            " Python, a reference kernel in place of cuDNN, N simulated devices."
        ),
    )
    parser.add_argument(
        "--devices",
        type=int,
        default=4,
        metavar="N",
        help="simulated CPU devices (default 4, the published CP tutorial's cp_size)",
    )
    parser.add_argument("script", help="the Python script to run as __main__")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    ns = parser.parse_args(argv)
    if ns.devices < 1:
        parser.error(f"--devices={ns.devices} must be >= 1 (the number of simulated CPU devices)")
    if not os.path.isfile(ns.script):
        parser.error(f"script {ns.script!r} does not exist (give the path of a .py file)")
    return ns


def simulate_cpu_devices(n: int) -> None:
    """Make JAX start a CPU backend with ``n`` devices; call before the first JAX computation.

    Why both the environment and the config: a process JAX has not imported yet reads
    ``XLA_FLAGS``/``JAX_PLATFORMS`` (and passes them to processes it starts); one that has
    imported it (this package imports JAX) reads the config.

    Args:
        n: The number of CPU devices.
    """
    flags = [
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", n)


def custom_calls_note() -> str:
    """One line when the user's own TE switch leaves custom calls on that fail on CPU ('' if not).

    The runner sets ``NVTE_JAX_CUSTOM_CALLS=false`` unless the user set it; a value of the
    user's that leaves e.g. ``NormFwdPrimitive`` on sends TE's layers to a C function the
    stand-in does not have.

    Returns:
        The note, or ``''``.
    """
    first = ["NormFwdPrimitive", "GemmPrimitive", "ActLuPrimitive"]  # what TE's layers use
    rank = {name: i for i, name in enumerate(first)}
    left_on = sorted(custom_calls_left_on(), key=lambda name: (rank.get(name, 3), name))
    if not left_on:
        return ""
    more = f" and {len(left_on) - 3} more" if len(left_on) > 3 else ""
    setting = " ".join(
        f"{k}={v!r}" for k, v in sorted(os.environ.items()) if k.startswith(CUSTOM_CALLS_ENV)
    )
    return (
        f"te_on_cpu: note: your {setting} leaves TE's {', '.join(left_on[:3])}{more} on; the"
        " CPU stand-in runs only fused attention, so TE layers that use them fail here. Unset"
        f" it and te_on_cpu sets {CUSTOM_CALLS_ENV}=false (TE's pure-JAX paths)."
    )


def main(argv=None) -> int:
    """``python -m tutorial_utils.te_on_cpu [--devices N] script.py [args...]``.

    Sets the CPU platform and device count before JAX starts a backend, and TE's
    ``NVTE_JAX_CUSTOM_CALLS=false`` unless the user set it (TE's layers then run as TE's pure
    JAX; its fused attention ignores the switch; a note on stderr says when the user's own
    setting leaves custom calls on), installs the stand-in, prints a three-line banner (the
    script; TE's version and the device count; what runs in place of cuDNN), then runs the
    script with ``runpy`` as ``__main__``.

    Args:
        argv: The command line after the program name; default ``sys.argv[1:]``.

    Returns:
        The script's exit status (2 if it imports a framework the runner refuses).
    """
    ns = _parse_runner_args(sys.argv[1:] if argv is None else argv)
    simulate_cpu_devices(ns.devices)
    if not any(name.startswith(CUSTOM_CALLS_ENV) for name in os.environ):  # or its _RE form
        os.environ[CUSTOM_CALLS_ENV] = CUSTOM_CALLS_OFF  # TE reads it at each call
    # the importable module, not this __main__ copy, so that its state is the one everybody sees
    runtime = importlib.import_module(__package__)
    te_jax = runtime.install()
    version = getattr(importlib.import_module("transformer_engine"), "__version__", "?")
    sys.meta_path.insert(0, _RefuseOtherFrameworks())
    if not os.environ.get(
        _CHILD_MARK
    ):  # processes a script starts with the same command line stay quiet
        plural = "s" if ns.devices != 1 else ""
        print(  # three short lines (at most 88 characters): a page shows them without scrolling
            f"te_on_cpu: {ns.script}\n"
            f"te_on_cpu: it runs TransformerEngine {version} on {ns.devices} simulated"
            f" CPU device{plural}\n ({BACKEND_DESCRIPTION}; CPU numbers are not GPU numbers)",
            flush=True,
        )
        note = custom_calls_note()
        if note:
            print(note, file=sys.stderr, flush=True)
    os.environ[_CHILD_MARK] = "1"
    del te_jax
    sys.argv = [ns.script, *ns.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(ns.script)))
    try:
        runpy.run_path(ns.script, run_name="__main__")
    except _OtherFrameworkError as err:
        print(f"te_on_cpu: error: {err}", file=sys.stderr)
        return 2
    except SystemExit as done:
        code = done.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
