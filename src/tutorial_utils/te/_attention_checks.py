"""The checks on a ``fused_attn`` call that both backends of :mod:`tutorial_utils.te.attention` run.

:func:`static_checks` reads only static values and stands in, on the reference backend, for
the errors TE itself would raise; :func:`silent_failure_checks` refuses the CP inputs TE
2.20.2 accepts and computes wrongly; :func:`check_call` checks the arrays. All are exported by
:mod:`tutorial_utils.te.attention`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import rules
from ..validation import (
    check_bias,
    check_gqa_heads,
    check_qkv,
    check_scaling_factor,
    check_seqlens_offsets,
    check_window,
)


def name_of(x) -> str:
    """An enum member's name, TE's or the reference's (anything else as text).

    Args:
        x: An enum member, or anything.

    Returns:
        Its ``.name``, or ``str(x)``.
    """
    return getattr(x, "name", str(x))


def static_checks(
    q_shape,
    k_shape,
    *,
    attn_bias_type,
    attn_mask_type,
    qkv_layout,
    softmax_type,
    dropout_probability,
    max_segments_per_seq,
    window_size,
    context_parallel_strategy,
    context_parallel_causal_load_balanced,
    stripe_size,
    cp_size,
) -> tuple[int, int]:
    """Checks that need only static values; raise ``ValueError`` naming parameter, value and fix.

    Covers the cases where TE itself would raise an obscure error deep in a primitive, or
    (Ring with ``stripe_size > 1``, Ring + window ``left < cp-1``) would return wrong results.

    Args:
        q_shape: The queries' shape ``[b, s_q, h_q, d]``.
        k_shape: The keys' shape.
        attn_bias_type: ``fused_attn``'s argument of that name.
        attn_mask_type: Likewise.
        qkv_layout: Likewise.
        softmax_type: Likewise.
        dropout_probability: Likewise.
        max_segments_per_seq: Likewise.
        window_size: Likewise.
        context_parallel_strategy: Likewise.
        context_parallel_causal_load_balanced: Likewise.
        stripe_size: Likewise.
        cp_size: The size of the CP mesh axis (1 without CP).

    Returns:
        The window as ``(left, right)``.

    Raises:
        ValueError: For the first setting TE would refuse obscurely or compute wrongly.
    """
    window = check_window(window_size)
    check_scalars(
        dropout_probability=dropout_probability, max_segments_per_seq=max_segments_per_seq
    )
    if len(q_shape) != 4 or len(k_shape) != 4:
        raise ValueError(
            f"q and k must be [batch, seq, heads, dim]; got shapes {tuple(q_shape)} and"
            f" {tuple(k_shape)}."
        )
    check_gqa_heads(q_shape[2], k_shape[2], name="kv heads (k.shape[2])")
    rules.check_stripe_size(stripe_size)
    if cp_size > 1:
        strategy = rules.normalize_strategy(context_parallel_strategy)
        is_thd = name_of(qkv_layout).startswith("T")
        where = f"with context parallelism (cp_size={cp_size})"
        if name_of(attn_bias_type) != "NO_BIAS":
            raise ValueError(
                f"attn_bias_type={name_of(attn_bias_type)} is not supported {where}; use"
                " AttnBiasType.NO_BIAS."
            )
        if float(dropout_probability) != 0.0:
            raise ValueError(
                f"dropout_probability={dropout_probability} is not supported {where}; use 0.0."
            )
        if name_of(softmax_type) != "VANILLA_SOFTMAX":
            raise ValueError(
                f"softmax_type={name_of(softmax_type)} is not supported {where}; use"
                " AttnSoftmaxType.VANILLA_SOFTMAX."
            )
        if name_of(qkv_layout) in ("BS3HD", "T3HD"):
            raise ValueError(
                f"qkv_layout={name_of(qkv_layout)} (packed QKV) is not supported {where}; use"
                " THD_THD_THD, THD_T2HD, BSHD_BSHD_BSHD or BSHD_BS2HD."
            )
        if is_thd:
            if name_of(attn_mask_type) != "PADDING_CAUSAL_MASK":
                raise ValueError(
                    f"attn_mask_type={name_of(attn_mask_type)} is not supported for THD layouts"
                    f" {where}; use PADDING_CAUSAL_MASK."
                )
            if strategy == "ring":
                _check_thd_ring(stripe_size, window, cp_size)
            else:
                rules.check_stripe_given(stripe_size)
                rules.check_allgather_load_balanced(context_parallel_causal_load_balanced)
            rules.check_divisible_seq(q_shape[1], cp_size, stripe_size or 1, name="q.shape[1]")
        else:
            if name_of(attn_mask_type) not in ("NO_MASK", "CAUSAL_MASK"):
                raise ValueError(
                    f"attn_mask_type={name_of(attn_mask_type)} is not supported for BSHD layouts"
                    f" {where}; use NO_MASK or CAUSAL_MASK."
                )
            rules.check_bshd_stripe(stripe_size, cp_size=cp_size)
            rules.check_bshd_window(window, cp_size=cp_size)
            rules.check_bshd_max_segments(max_segments_per_seq, cp_size=cp_size)
            if context_parallel_causal_load_balanced:
                rules.check_dual_chunk(q_shape[1], cp_size, name="q.shape[1]")
            else:
                rules.check_divisible_seq(q_shape[1], cp_size, None, name="q.shape[1]")
    return window


def check_scalars(*, dropout_probability, max_segments_per_seq) -> None:
    """The two scalars both backends check before anything runs.

    On TE's path without this, ``dropout_probability=1.5`` with ``is_training=False`` is
    accepted silently (TE ignores dropout at inference, so a typo survives until training)
    and ``max_segments_per_seq=0`` fails inside JAX with a zero-size reduction.

    Args:
        dropout_probability: Must be a float in ``[0, 1)``.
        max_segments_per_seq: Must be a positive int.

    Raises:
        ValueError: If either is out of range.
    """
    rules.check_max_segments(max_segments_per_seq)
    try:
        ok = 0.0 <= float(dropout_probability) < 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(
            f"dropout_probability={dropout_probability!r} must be a float in [0, 1), whether or not"
            " is_training is set; use 0.0 for no dropout."
        )


def _check_thd_ring(stripe_size, window, cp_size) -> None:
    """The two THD Ring inputs TE computes wrongly: a stripe above 1, a left window below cp-1."""
    rules.check_ring_stripe(stripe_size, label="CPStrategy.RING")
    rules.check_ring_window(window, cp_size, label="CPStrategy.RING")


def silent_failure_checks(
    *,
    qkv_layout,
    window_size,
    context_parallel_strategy,
    context_parallel_causal_load_balanced,
    stripe_size,
    cp_size,
) -> None:
    """Raise ``ValueError`` for CP inputs that TE 2.20.2 accepts and computes wrongly.

    Only static values are read, so nothing is added to the traced computation. Each rule
    is here because TE's own code, run on CPU, returns wrong outputs without it
    (``tests/te_on_cpu/test_te_on_cpu.py::test_each_facade_check_prevents_a_wrong_result``):

    * THD Ring with ``stripe_size > 1``: TE's ring steps assume stripes of one token;
    * THD Ring with a left window ``< cp_size - 1``: cuDNN cannot express the empty band of
      a striped ring step, so spurious pairs appear;
    * THD AllGather without ``context_parallel_causal_load_balanced=True``: TE then treats
      the striped shards as contiguous.

    Args:
        qkv_layout: ``fused_attn``'s argument of that name.
        window_size: Likewise.
        context_parallel_strategy: Likewise.
        context_parallel_causal_load_balanced: Likewise.
        stripe_size: Likewise.
        cp_size: The size of the CP mesh axis.
    """
    if cp_size <= 1 or not name_of(qkv_layout).startswith("T"):
        return
    window = check_window(window_size)
    if rules.normalize_strategy(context_parallel_strategy) == "ring":
        _check_thd_ring(stripe_size, window, cp_size)
    else:
        rules.check_allgather_load_balanced(context_parallel_causal_load_balanced)


def unpack_qkv(qkv, qkv_layout, *, slice_packed: bool = True):
    """``(q, k, v)`` from the tuple ``fused_attn`` takes, after checking the packed axis.

    With ``slice_packed=False`` packed tensors give ``jax.ShapeDtypeStruct`` views (the
    checks need shapes only, and slicing would add work to a traced computation).

    Args:
        qkv: ``(packed,)``, ``(q, kv)`` or ``(q, k, v)``.
        qkv_layout: The layout they are in.
        slice_packed: Slice packed tensors (else shape-only views).

    Returns:
        ``(q, k, v)``.

    Raises:
        ValueError: If ``qkv`` is not such a tuple, its length does not match the layout, or a
            packed tensor is not ``[batch, seq, n, heads, head_dim]``.
    """
    if not isinstance(qkv, (tuple, list)) or not 1 <= len(qkv) <= 3:
        raise ValueError(
            f"qkv must be a tuple (packed,), (q, kv) or (q, k, v); got {type(qkv).__name__} of"
            f" length {len(qkv) if isinstance(qkv, (tuple, list)) else 'n/a'}."
        )
    layout = name_of(qkv_layout)
    want = 1 if layout in ("BS3HD", "T3HD") else 2 if layout in ("BSHD_BS2HD", "THD_T2HD") else 3
    if len(qkv) != want:
        raise ValueError(
            f"qkv has {len(qkv)} tensors but qkv_layout={layout} needs {want}; pass "
            f"{ {1: '(qkv_packed,)', 2: '(q, kv_packed)', 3: '(q, k, v)'}[want] }."
        )
    if want == 3:
        return tuple(qkv)
    packed, n = qkv[-1], 4 - want  # 3 for QKV, 2 for KV
    shape = tuple(getattr(packed, "shape", ()))
    if len(shape) != 5 or shape[2] != n:
        what = "qkv" if n == 3 else "kv"
        raise ValueError(
            f"qkv_layout={layout}: the packed {what} tensor has shape"
            f" {shape or type(packed).__name__}; it must be [batch, seq, {n}, heads, head_dim],"
            f" packed on axis 2, e.g. jnp.stack([{'q, k, v' if n == 3 else 'k, v'}], axis=2)."
        )
    if slice_packed:
        parts = tuple(packed[:, :, i] for i in range(n))
    else:
        part = jax.ShapeDtypeStruct(shape[:2] + shape[3:], packed.dtype)
        parts = (part,) * n
    return parts if n == 3 else (qkv[0],) + parts


def check_call(qkv, bias, sequence_descriptor, *, attn_bias_type, qkv_layout, scaling_factor):
    """The checks on the *arrays* of a ``fused_attn`` call, for both backends.

    Shapes and dtypes of q/k/v (and the packed axis), ``scaling_factor``, the bias shape,
    and (when concrete, i.e. not traced) THD seqlens/offsets.

    Args:
        qkv: ``fused_attn``'s argument of that name.
        bias: Likewise.
        sequence_descriptor: Likewise.
        attn_bias_type: Likewise.
        qkv_layout: Likewise.
        scaling_factor: Likewise.

    Returns:
        ``qkv`` with NumPy arrays made JAX arrays, so an eager call behaves as under ``jit``.

    Raises:
        ValueError: If an array, the scale, the bias or the seqlens/offsets are invalid.
    """
    qkv = (
        type(qkv)(jnp.asarray(x) if isinstance(x, np.ndarray) else x for x in qkv)
        if isinstance(qkv, (tuple, list))
        else qkv
    )
    q, k, v = unpack_qkv(qkv, qkv_layout, slice_packed=False)
    check_qkv(q, k, v)
    check_scaling_factor(scaling_factor)
    b, sq, hq, _ = q.shape
    if name_of(attn_bias_type) != "NO_BIAS":
        if bias is None:
            raise ValueError(
                f"attn_bias_type={name_of(attn_bias_type)} but bias=None; pass a [1 or b, h, s_q,"
                " s_kv] bias or use AttnBiasType.NO_BIAS."
            )
        check_bias(bias, batch=b, num_q_heads=hq, seq_q=sq, seq_kv=k.shape[1])
    desc = sequence_descriptor
    offsets = getattr(desc, "seq_offsets", None)
    if (
        offsets is not None
        and getattr(offsets[0], "size", 0)
        and name_of(qkv_layout).startswith("T")
    ):
        leaves = (*desc.seqlens, *offsets)
        if not any(isinstance(x, jax.core.Tracer) for x in leaves):
            check_seqlens_offsets(desc.seqlens[0], offsets[0], sq, name="q")
            check_seqlens_offsets(desc.seqlens[1], offsets[1], k.shape[1], name="kv")
    return qkv
