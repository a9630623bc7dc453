"""The tutorial's own tooling: not part of what a reader copies into a model.

Device set-up and provenance lines (:mod:`~tutorial_utils.tools.runtime`), workload presets
(:mod:`~tutorial_utils.tools.workload`), TE's code on CPU (:mod:`~tutorial_utils.tools.te_on_cpu`),
timing and records (:mod:`~tutorial_utils.tools.timing`, :mod:`~tutorial_utils.tools.records`),
plots, exact work and byte counts, the cost model, and the command-line tools
``python -m tutorial_utils.tools.bench | check | plan | launch | gpu_setup``.
"""
