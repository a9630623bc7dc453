"""``transformer_engine.jax.attention`` with the same names, signatures and defaults (TE 2.20.2).

Why: readers copy these calls into models that run real TE. Whenever TE's own Python runs
(real TE on a GPU node, or TE's JAX code on CPU with :mod:`tutorial_utils.te_on_cpu`'s
kernel), every name here is TE's, and ``fused_attn`` is TE's behind
:func:`silent_failure_checks`: static checks for the inputs TE accepts and computes
*wrongly* (each has a test in which TE, without the check, returns a wrong result). Under
``TUTORIAL_TE_BACKEND=reference`` the names are implemented by the pure-JAX reference
(:mod:`tutorial_utils.reference`, :mod:`tutorial_utils.context_parallel`), with
:func:`static_checks` standing in for the errors TE itself would raise.

The parts: the checks both backends run (``_attention_checks.py``), TE's names with the checked
``fused_attn`` (``_attention_te.py``, imported only when TE's code runs) and the reference's
(``_attention_reference.py``).
"""

from __future__ import annotations

from ..validation import reorder_mismatch
from ._attention_checks import check_call, check_scalars, silent_failure_checks, static_checks
from ._backend import REAL_TE

if REAL_TE is not None:
    from ._attention_te import (
        AttnBiasType,
        AttnMaskType,
        AttnSoftmaxType,
        CPStrategy,
        QKVFormat,
        QKVLayout,
        ReorderStrategy,
        SequenceDescriptor,
        fused_attn,
        inverse_reorder_causal_load_balancing,
        is_fused_attn_kernel_available,
        reorder_causal_load_balancing,
    )
else:
    from ._attention_reference import (
        AttnBiasType,
        AttnMaskType,
        AttnSoftmaxType,
        CPStrategy,
        QKVFormat,
        QKVLayout,
        ReorderStrategy,
        SequenceDescriptor,
        fused_attn,
        inverse_reorder_causal_load_balancing,
        is_fused_attn_kernel_available,
        reorder_causal_load_balancing,
    )

__all__ = [
    "AttnBiasType",
    "AttnMaskType",
    "AttnSoftmaxType",
    "QKVFormat",
    "QKVLayout",
    "CPStrategy",
    "ReorderStrategy",
    "SequenceDescriptor",
    "fused_attn",
    "reorder_causal_load_balancing",
    "inverse_reorder_causal_load_balancing",
    "is_fused_attn_kernel_available",
    "static_checks",
    "check_scalars",
    "silent_failure_checks",
    "reorder_mismatch",
    "check_call",
]
