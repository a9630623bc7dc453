"""tutorial_utils: context-parallel attention for JAX, written to be read and copied.

What a reader copies into a model lives at the top level:

* :mod:`tutorial_utils.te` - ``import tutorial_utils.te as te`` in place of
  ``import transformer_engine.jax as te``: real TE on a GPU node, TE's own JAX code on CPU;
* :mod:`tutorial_utils.reorder` - striped and dual-chunk load balancing (TE's functions);
* :mod:`tutorial_utils.validation` - the checks for layouts TE would compute wrongly;
* :mod:`tutorial_utils.reference` - readable attention kernels, the oracle for everything;
* :mod:`tutorial_utils.context_parallel` - Ring, AllGather and Ulysses, one device's view;
* :mod:`tutorial_utils.inputs` - packing documents into THD rows;
* :mod:`tutorial_utils.model` and :mod:`tutorial_utils.text_data` - a small language model
  and its data pipeline, with CP attention inside.

:mod:`tutorial_utils.tools` is the tutorial's own tooling (device set-up, workloads,
benchmarks and their records, plots, the cost model and the command-line tools); nothing
above imports it except to find out where it runs. The exceptions at import, both standard
library only and inert unless the tutorial's test run sets their variables:
:mod:`tutorial_utils.tools.compile_cache` turns on the run's shared compilation cache
(``TUTORIAL_COMPILE_CACHE_DIR``), and :mod:`tutorial_utils.tools.run_gc` tunes the garbage
collector (``TUTORIAL_RUN_GC_THRESHOLDS``).
"""

from .tools import compile_cache as _compile_cache

_compile_cache.enable_from_env()  # only for the tutorial's own test runs; see that module

from .reorder import (  # noqa: F401
    ReorderStrategy,
    inverse_reorder_causal_load_balancing,
    reorder_causal_load_balancing,
)
from .validation import validate_packed_inputs  # noqa: F401
from .tools import run_gc as _run_gc

_run_gc.tune_from_env()  # only for the tutorial's own test runs, after JAX's import; see that module

__all__ = [
    "ReorderStrategy", "reorder_causal_load_balancing", "inverse_reorder_causal_load_balancing",
    "validate_packed_inputs",
]
__version__ = "0.1.0"
