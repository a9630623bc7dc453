"""``tutorial_utils.te.attention`` when TE's own Python runs: TE's names, ``fused_attn`` checked.

Imported by :mod:`tutorial_utils.te.attention` only when the backend is real TE or TE's code on
CPU (:mod:`tutorial_utils.te._backend`), so ``transformer_engine.jax`` is importable here. Every
name is TE's; ``fused_attn`` is TE's behind :func:`~tutorial_utils.te.attention.check_call`,
:func:`~tutorial_utils.te.attention.silent_failure_checks` and, for concrete segment ids,
:func:`~tutorial_utils.validation.reorder_mismatch`, and with CP it runs compiled with the
sequence shardings pinned.
"""

from __future__ import annotations

import functools

import jax
from transformer_engine.jax.attention import (  # noqa: F401  (re-exported by te.attention)
    AttnBiasType,
    AttnMaskType,
    AttnSoftmaxType,
    CPStrategy,
    QKVFormat,
    QKVLayout,
    ReorderStrategy,
    SequenceDescriptor,
    inverse_reorder_causal_load_balancing,
    is_fused_attn_kernel_available,
    reorder_causal_load_balancing,
)
from transformer_engine.jax.attention import fused_attn as _te_fused_attn

from ..validation import reorder_mismatch
from ._attention_checks import check_call, check_scalars, name_of, silent_failure_checks
from .placement import check_placement, guard_placement, pin_sequence
from .sharding import batch_axes, cp_axis_and_size


def fused_attn(
    qkv,
    bias,
    sequence_descriptor,
    seed,
    attn_bias_type,
    attn_mask_type,
    qkv_layout,
    softmax_type,
    scaling_factor,
    dropout_probability,
    is_training,
    max_segments_per_seq=1,
    window_size=None,
    context_parallel_strategy=CPStrategy.DEFAULT,
    context_parallel_causal_load_balanced=False,
    context_parallel_axis="",
    context_checkpoint_name="context",
    softmax_offset=None,
    stripe_size=None,
    score_mod=None,
    score_mod_bprop=None,
    score_mod_tensors=None,
    score_mod_bprop_tensors=None,
    return_max_logit=False,
):
    """TE's ``fused_attn`` after :func:`silent_failure_checks` and :func:`reorder_mismatch`.

    :func:`reorder_mismatch` reads concrete segment ids and positions (under ``jit`` they are
    traced and only the static checks apply). With a CP axis of size > 1, inputs whose
    placement is visible must be sharded over it
    (:func:`~tutorial_utils.te.placement.check_placement`), and TE's call runs compiled as a
    whole with the sequence shardings pinned (:func:`_te_cp_call`).

    Args:
        qkv: ``(q, k, v)``, ``(q, kv_packed)`` or ``(qkv_packed,)``, as ``qkv_layout`` says.
        bias: The attention bias, or ``None``.
        sequence_descriptor: A ``SequenceDescriptor``, or ``None`` for whole rows.
        seed: The dropout seed (TE's; ``None`` without dropout).
        attn_bias_type: An ``AttnBiasType``.
        attn_mask_type: An ``AttnMaskType``.
        qkv_layout: A ``QKVLayout``.
        softmax_type: An ``AttnSoftmaxType``.
        scaling_factor: The softmax scale, usually ``head_dim ** -0.5``.
        dropout_probability: In ``[0, 1)``.
        is_training: Whether dropout applies.
        max_segments_per_seq: The most segments a THD row holds.
        window_size: A ``(left, right)`` sliding window, or ``None``.
        context_parallel_strategy: A ``CPStrategy``.
        context_parallel_causal_load_balanced: Whether the inputs are reordered for CP.
        context_parallel_axis: The CP mesh axis; ``""`` for ``MeshResource.cp_resource``.
        context_checkpoint_name: TE's checkpoint name for the attention context.
        softmax_offset: The learnable softmax's ``[1, h_q, 1, 1]`` sink logits, or ``None``.
        stripe_size: The striped reorder's stripe (THD with CP).
        score_mod: A score modifier (TE's cuDNN frontend graph), or ``None``.
        score_mod_bprop: Likewise, for the backward.
        score_mod_tensors: The tensors ``score_mod`` reads.
        score_mod_bprop_tensors: The tensors ``score_mod_bprop`` reads.
        return_max_logit: Also return each head's largest logit.

    Returns:
        ``[b, s_q, h_q, d_v]`` in the query dtype; ``(out, max_logit)`` with
        ``return_max_logit``.

    Raises:
        ValueError: For the inputs TE accepts and computes wrongly, a misplaced input, or
            ids/positions reordered for another CP size (TE's own errors pass through).
    """
    qkv = check_call(
        qkv,
        bias,
        sequence_descriptor,
        attn_bias_type=attn_bias_type,
        qkv_layout=qkv_layout,
        scaling_factor=scaling_factor,
    )
    check_scalars(
        dropout_probability=dropout_probability, max_segments_per_seq=max_segments_per_seq
    )
    mesh, cp_axis, cp_size = cp_axis_and_size(context_parallel_axis)
    silent_failure_checks(
        qkv_layout=qkv_layout,
        window_size=window_size,
        context_parallel_strategy=context_parallel_strategy,
        context_parallel_causal_load_balanced=context_parallel_causal_load_balanced,
        stripe_size=stripe_size,
        cp_size=cp_size,
    )
    ids_pos = (
        None
        if sequence_descriptor is None
        else (sequence_descriptor.segment_ids[0], sequence_descriptor.segment_pos[0])
    )
    if (
        cp_size > 1
        and name_of(qkv_layout).startswith("T")
        and ids_pos is not None
        and ids_pos[0].size
        and not any(isinstance(x, jax.core.Tracer) for x in ids_pos)
    ):
        why = reorder_mismatch(*ids_pos, cp_size=cp_size, stripe_size=stripe_size)
        if why:
            raise ValueError(f"sequence_descriptor: {why}")
    static = dict(
        attn_bias_type=attn_bias_type,
        attn_mask_type=attn_mask_type,
        qkv_layout=qkv_layout,
        softmax_type=softmax_type,
        scaling_factor=scaling_factor,
        dropout_probability=dropout_probability,
        is_training=is_training,
        max_segments_per_seq=max_segments_per_seq,
        window_size=window_size,
        context_parallel_strategy=context_parallel_strategy,
        context_parallel_causal_load_balanced=context_parallel_causal_load_balanced,
        context_parallel_axis=context_parallel_axis,
        context_checkpoint_name=context_checkpoint_name,
        stripe_size=stripe_size,
        score_mod=score_mod,
        score_mod_bprop=score_mod_bprop,
        return_max_logit=return_max_logit,
    )
    arrays = (
        qkv,
        bias,
        sequence_descriptor,
        seed,
        softmax_offset,
        score_mod_tensors,
        score_mod_bprop_tensors,
    )
    if cp_size > 1:
        check_placement(
            _sequence_arrays(qkv, sequence_descriptor), cp_axis=cp_axis, cp_size=cp_size
        )
        key = tuple(sorted(static.items(), key=lambda kv: kv[0]))
        try:
            call = _te_cp_call(key, cp_axis, batch_axes(mesh))
        except TypeError:  # an unhashable static argument (e.g. window_size as a list): no cache
            call = _te_cp_call.__wrapped__(key, cp_axis, batch_axes(mesh))
        return call(*arrays)
    return _call_te(static, *arrays)


def _sequence_arrays(qkv, desc):
    """The inputs whose axis 1 is the sequence, by the name a user knows them by."""
    named = dict(
        zip(
            ("q", "k", "v") if len(qkv) == 3 else ("q", "kv") if len(qkv) == 2 else ("qkv",),
            qkv,
        )
    )
    if desc is not None:
        for field in ("segment_ids", "segment_pos"):
            for i, x in enumerate(getattr(desc, field, ()) or ()):
                named[f"sequence_descriptor.{field}[{i}]"] = x
    return named


def _call_te(
    static, qkv, bias, desc, seed, softmax_offset, score_mod_tensors, score_mod_bprop_tensors
):
    return _te_fused_attn(
        qkv,
        bias,
        desc,
        seed,
        softmax_offset=softmax_offset,
        score_mod_tensors=score_mod_tensors,
        score_mod_bprop_tensors=score_mod_bprop_tensors,
        **static,
    )


@functools.lru_cache(maxsize=64)
def _te_cp_call(static_items, cp_axis, batch):
    """TE's CP call under one ``jax.jit``, with the sequence axis pinned to ``cp_axis``.

    Why each part (each shown on TE's own code in ``tests/te/test_placement.py``): called
    eagerly, TE's CP primitives are dispatched one by one and return wrong outputs even for
    correctly placed arrays; under ``jit``, an input (or an output cotangent) whose
    sharding XLA has to infer can reach TE's partitioner as one it cannot name over the
    mesh (a bare ``cp is not a axis`` or ``explode_superdims`` assertion,
    NVIDIA/TransformerEngine#3516). Constraining q/k/v, the segment ids/positions and the
    output to ``P(batch, cp, ...)`` removes both; the output's constraint applies to dO too.
    """
    static = dict(static_items)

    def pin(x, name):
        return guard_placement(pin_sequence(x, cp_axis, batch), name, cp_axis)

    def run(qkv, bias, desc, seed, softmax_offset, score_mod_tensors, score_mod_bprop_tensors):
        qkv = tuple(pin(x, name) for x, name in zip(qkv, _sequence_arrays(qkv, None)))
        if desc is not None:
            desc = SequenceDescriptor(
                seqlens=desc.seqlens,
                seq_offsets=desc.seq_offsets,
                segment_ids=tuple(
                    pin(x, f"sequence_descriptor.segment_ids[{i}]")
                    for i, x in enumerate(desc.segment_ids)
                ),
                segment_pos=tuple(
                    pin(x, f"sequence_descriptor.segment_pos[{i}]")
                    for i, x in enumerate(desc.segment_pos)
                ),
            )
        result = _call_te(
            static,
            qkv,
            bias,
            desc,
            seed,
            softmax_offset,
            score_mod_tensors,
            score_mod_bprop_tensors,
        )
        if isinstance(result, tuple):
            return (pin_sequence(result[0], cp_axis, batch),) + tuple(result[1:])
        return pin_sequence(result, cp_axis, batch)

    return jax.jit(run)
