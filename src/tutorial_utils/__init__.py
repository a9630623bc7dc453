"""tutorial_utils: context-parallel attention helpers that mirror TransformerEngine's JAX API.

Import :mod:`tutorial_utils.runtime` (or call ``setup_devices``) *before* JAX to get 4
simulated CPU devices on a machine without GPUs; ``tutorial_utils.te`` is a drop-in for
``transformer_engine.jax`` that uses real TE on a GPU node and a pure-JAX reference elsewhere.
"""

from .reorder import (  # noqa: F401
    ReorderStrategy,
    inverse_reorder_causal_load_balancing,
    reorder_causal_load_balancing,
)
from .validation import validate_packed_inputs  # noqa: F401
from .workload import PRESETS, Workload, get_workload, preset_from_env  # noqa: F401

__all__ = [
    "ReorderStrategy", "reorder_causal_load_balancing", "inverse_reorder_causal_load_balancing",
    "validate_packed_inputs", "PRESETS", "Workload", "get_workload", "preset_from_env",
]
__version__ = "0.1.0"
