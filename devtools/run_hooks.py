"""The project's own run settings, applied to every Python process of a test run or site build.

* the run's XLA flags (:func:`compile_cache.add_run_flags`), at once, before JAX can start;
* the shared compilation cache (:func:`compile_cache.enable`), the fusion emitters for TE's
  AllGather programs (:func:`xla_flags.emitters_for_te_allgather`;
  ``TUTORIAL_TE_ALLGATHER_EMITTERS=0`` leaves them off) and the collector's settings
  (:func:`run_gc.tune_from_env`), right after ``jax`` is first imported, before anything compiles.

Loaded by ``sitecustomize.py`` next to this file; ``tutorial_utils`` knows nothing of it.
"""

import importlib.abc
import importlib.util
import os
import sys

TRIGGER = "jax"


def _after_jax(module) -> None:
    import compile_cache
    import run_gc
    import xla_flags

    compile_cache.enable_from_env()  # first: it adds the run's flags the hook below reads
    if os.environ.get("TUTORIAL_TE_ALLGATHER_EMITTERS", "1") != "0":
        xla_flags.emitters_for_te_allgather()
    run_gc.tune_from_env()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Call ``callback(module)`` once ``name`` has been imported (its module executed)."""

    def __init__(self, name, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_call(module):
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_call
        return spec


def install() -> None:
    """Apply the run's settings to this process (once)."""
    import compile_cache

    compile_cache.add_run_flags()
    if TRIGGER in sys.modules:
        _after_jax(sys.modules[TRIGGER])
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(TRIGGER, _after_jax))
