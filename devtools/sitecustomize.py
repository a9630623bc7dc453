"""Python runs this at the start of every process whose path holds ``devtools/``: the test
suite's processes (``tests/conftest.py`` puts the folder on ``PYTHONPATH``) and the site build
of ``make docs``. It turns on the run's own settings (:mod:`run_hooks`) only where the run's
variables are set; a reader's processes never load it."""

import os

if any(
    os.environ.get(v)
    for v in ("TUTORIAL_COMPILE_CACHE_DIR", "TUTORIAL_RUN_XLA_FLAGS", "TUTORIAL_RUN_GC_THRESHOLDS")
):
    import run_hooks

    run_hooks.install()
