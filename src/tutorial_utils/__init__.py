"""tutorial_utils: context-parallel attention for JAX with TransformerEngine, to read and copy.

What a reader copies lives at the top level and in :mod:`tutorial_utils.te` (``import
tutorial_utils.te as te`` in place of ``import transformer_engine.jax as te``). The rest is
grouped by who uses it: :mod:`tutorial_utils.te_on_cpu` (TE's own JAX code on CPU),
:mod:`tutorial_utils.cli` (the command-line tools), :mod:`tutorial_utils.pages` (the chapters'
plumbing) and :mod:`tutorial_utils.perfmodel` (the performance model). Importing this package
only imports the names below.
"""

from .reorder import (
    ReorderStrategy,
    inverse_reorder_causal_load_balancing,
    reorder_causal_load_balancing,
)
from .validation import validate_packed_inputs

__all__ = [
    "ReorderStrategy",
    "reorder_causal_load_balancing",
    "inverse_reorder_causal_load_balancing",
    "validate_packed_inputs",
]
__version__ = "0.1.0"
