"""TE's ``fused_attn`` keyword block, written once for the tools.

The chapters and :mod:`tutorial_utils.model` spell TE's call out in full, because that call is
what they teach. The command-line tools and the page plumbing call it through
:func:`call_fused_attn` so that TE's eleven arguments live in one place.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

__all__ = ["call_fused_attn"]


def call_fused_attn(
    api: ModuleType,
    qkv: tuple,
    sequence_descriptor: Any,
    *,
    scaling_factor: float,
    max_segments_per_seq: int,
    window_size: tuple[int, int] | None = None,
    **options: Any,
):
    """Call ``api.fused_attn`` on THD inputs with TE's keyword block filled in.

    Defaults: no bias and no seed, ``PADDING_CAUSAL_MASK``, ``THD_THD_THD``, vanilla softmax,
    no dropout, ``is_training=True``. Any keyword of TE's ``fused_attn`` in ``options`` (the
    mask, the layout, ``softmax_offset``, the ``context_parallel_*`` arguments, ``stripe_size``)
    overrides or extends them.

    Args:
        api: The module that holds ``fused_attn`` and TE's enums:
            ``transformer_engine.jax.attention`` or ``tutorial_utils.te.attention``.
        qkv: The ``(q, k, v)`` tuple (or the packed tensors the layout names).
        sequence_descriptor: TE's ``SequenceDescriptor`` (or TE's older mask argument).
        scaling_factor: The softmax scale, usually ``head_dim ** -0.5``.
        max_segments_per_seq: The most documents a row holds (TE's THD bound).
        window_size: TE's ``(left, right)`` window, or ``None`` for no window.
        **options: Further keywords of TE's ``fused_attn``, passed on unchanged.

    Returns:
        TE's attention output, shaped like ``q``.
    """
    keywords = {
        "bias": None,
        "seed": None,
        "attn_bias_type": api.AttnBiasType.NO_BIAS,
        "attn_mask_type": api.AttnMaskType.PADDING_CAUSAL_MASK,
        "qkv_layout": api.QKVLayout.THD_THD_THD,
        "softmax_type": api.AttnSoftmaxType.VANILLA_SOFTMAX,
        "dropout_probability": 0.0,
        "is_training": True,
    }
    keywords.update(options)
    return api.fused_attn(
        qkv,
        sequence_descriptor=sequence_descriptor,
        scaling_factor=scaling_factor,
        max_segments_per_seq=max_segments_per_seq,
        window_size=window_size,
        **keywords,
    )
