"""Python's cyclic garbage collector, tuned for every process of the tutorial's own test runs.

Why: a test run starts well over a hundred Python processes (pytest workers, notebook kernels,
recipes, commands, launcher ranks). Each imports JAX and TE, whose modules, caches and traced
programs are hundreds of thousands of objects that live until the process ends, and the
collector's default thresholds (700, 10, 10) make it walk them again and again: sampled across
a whole ``make test``, 3.5 % of the run's CPU was the collector. One TE context-parallel
compile spent 0.50 of its 10.6 CPU seconds there (426 collections), chapter 5b's kernel 2.1 of
96.5 s. Freezing what has been imported so far takes those objects out of every later
collection, and larger thresholds collect less often: 0.26 s (13 collections) and 0.63 s.
Only when garbage is collected changes; what is garbage still is.

``tests/conftest.py`` sets :data:`ENV`; importing :mod:`tutorial_utils` calls
:func:`tune_from_env`, which does nothing when the variable is unset, so a reader's processes
keep Python's defaults.
"""

from __future__ import annotations

import gc
import os

#: Three collector thresholds, e.g. ``"20000 20 20"``; unset (the default) changes nothing.
ENV = "TUTORIAL_RUN_GC_THRESHOLDS"


def thresholds_from_env() -> tuple[int, int, int] | None:
    """``$TUTORIAL_RUN_GC_THRESHOLDS`` as three positive integers, or None when it is unset or
    empty."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    parts = text.replace(",", " ").split()
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 1:
        raise ValueError(
            f"{ENV}={os.environ[ENV]!r} must be three positive integers, the collector's thresholds"
            " for generations 0, 1 and 2 (e.g. '20000 20 20'); unset it for Python's defaults."
        )
    return values  # type: ignore[return-value]


def tune_from_env(collect_first: bool = False) -> bool:
    """Freeze the objects that exist now and set the thresholds, if :data:`ENV` asks; return whether
    it did.

    ``collect_first`` collects before freezing, so that no garbage is frozen with the live
    objects (a pytest worker calls it after collection; at import it would cost more than it saves).
    """
    thresholds = thresholds_from_env()
    if thresholds is None:
        return False
    if collect_first:
        gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
    return True
