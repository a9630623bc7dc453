"""Python runs this at the start of every process whose path holds ``devtools/``: the test
suite's processes (``tests/conftest.py`` puts the folder on ``PYTHONPATH``) and the notebook
kernels of a site build (``conf.py`` does the same). It turns on the run's own settings
(:mod:`run_hooks`) only where the run's variables are set, and a page's cost accounting
(:mod:`page_stats`) only where ``CP_PAGE_STATS`` is set; otherwise it does nothing."""

import os

if any(
    os.environ.get(v)
    for v in ("TUTORIAL_COMPILE_CACHE_DIR", "TUTORIAL_RUN_XLA_FLAGS", "TUTORIAL_RUN_GC_THRESHOLDS")
):
    import run_hooks

    run_hooks.install()

if os.environ.get("CP_PAGE_STATS"):
    import page_stats

    page_stats.install()
