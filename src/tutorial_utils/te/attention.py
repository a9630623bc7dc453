"""``transformer_engine.jax.attention`` with the same names, signatures and defaults (TE 2.20.2).

Why: readers copy these calls into models that run real TE. Whenever TE's own Python runs
(real TE on a GPU node, or TE's JAX code on CPU with :mod:`tutorial_utils.te_on_cpu`'s
kernel), every name here is TE's, and ``fused_attn`` is TE's behind
:func:`silent_failure_checks`: static checks for the inputs TE accepts and computes
*wrongly* (each has a test in which TE, without the check, returns a wrong result). Under
``TUTORIAL_TE_BACKEND=reference`` the names are implemented by the pure-JAX reference
(:mod:`tutorial_utils.reference`, :mod:`tutorial_utils.context_parallel`), with
:func:`static_checks` standing in for the errors TE itself would raise.
"""

from __future__ import annotations

import enum
import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

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
    reorder_mismatch,
)
from ._backend import REAL_TE
from .placement import check_placement, guard_placement, pin_sequence
from .sharding import batch_axes, cp_axis_and_size

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


# ----------------------------------------------------------------------------- checks shared by bot


def _name(x) -> str:
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
        is_thd = _name(qkv_layout).startswith("T")
        where = f"with context parallelism (cp_size={cp_size})"
        if _name(attn_bias_type) != "NO_BIAS":
            raise ValueError(
                f"attn_bias_type={_name(attn_bias_type)} is not supported {where}; use"
                " AttnBiasType.NO_BIAS."
            )
        if float(dropout_probability) != 0.0:
            raise ValueError(
                f"dropout_probability={dropout_probability} is not supported {where}; use 0.0."
            )
        if _name(softmax_type) != "VANILLA_SOFTMAX":
            raise ValueError(
                f"softmax_type={_name(softmax_type)} is not supported {where}; use"
                " AttnSoftmaxType.VANILLA_SOFTMAX."
            )
        if _name(qkv_layout) in ("BS3HD", "T3HD"):
            raise ValueError(
                f"qkv_layout={_name(qkv_layout)} (packed QKV) is not supported {where}; use"
                " THD_THD_THD, THD_T2HD, BSHD_BSHD_BSHD or BSHD_BS2HD."
            )
        if is_thd:
            if _name(attn_mask_type) != "PADDING_CAUSAL_MASK":
                raise ValueError(
                    f"attn_mask_type={_name(attn_mask_type)} is not supported for THD layouts"
                    f" {where}; use PADDING_CAUSAL_MASK."
                )
            if strategy == "ring":
                _check_thd_ring(stripe_size, window, cp_size)
            else:
                rules.check_stripe_given(stripe_size)
                rules.check_allgather_load_balanced(context_parallel_causal_load_balanced)
            rules.check_divisible_seq(q_shape[1], cp_size, stripe_size or 1, name="q.shape[1]")
        else:
            if _name(attn_mask_type) not in ("NO_MASK", "CAUSAL_MASK"):
                raise ValueError(
                    f"attn_mask_type={_name(attn_mask_type)} is not supported for BSHD layouts"
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
    (``tests/test_te_on_cpu.py::test_each_facade_check_prevents_a_wrong_result``):

    * THD Ring with ``stripe_size > 1``: TE's ring steps assume stripes of one token;
    * THD Ring with a left window ``< cp_size - 1``: cuDNN cannot express the empty band of
      a striped ring step, so spurious pairs appear;
    * THD AllGather without ``context_parallel_causal_load_balanced=True``: TE then treats
      the striped shards as contiguous.
    """
    if cp_size <= 1 or not _name(qkv_layout).startswith("T"):
        return
    window = check_window(window_size)
    if rules.normalize_strategy(context_parallel_strategy) == "ring":
        _check_thd_ring(stripe_size, window, cp_size)
    else:
        rules.check_allgather_load_balanced(context_parallel_causal_load_balanced)


def _unpack_qkv(qkv, qkv_layout, *, slice_packed: bool = True):
    """``(q, k, v)`` from the tuple ``fused_attn`` takes, after checking the packed axis.

    With ``slice_packed=False`` packed tensors give ``jax.ShapeDtypeStruct`` views (the
    checks need shapes only, and slicing would add work to a traced computation).
    """
    if not isinstance(qkv, (tuple, list)) or not 1 <= len(qkv) <= 3:
        raise ValueError(
            f"qkv must be a tuple (packed,), (q, kv) or (q, k, v); got {type(qkv).__name__} of"
            f" length {len(qkv) if isinstance(qkv, (tuple, list)) else 'n/a'}."
        )
    layout = _name(qkv_layout)
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
    and (when concrete, i.e. not traced) THD seqlens/offsets. Returns ``qkv`` with NumPy
    arrays made JAX arrays, so an eager call behaves as under ``jit``.
    """
    qkv = (
        type(qkv)(jnp.asarray(x) if isinstance(x, np.ndarray) else x for x in qkv)
        if isinstance(qkv, (tuple, list))
        else qkv
    )
    q, k, v = _unpack_qkv(qkv, qkv_layout, slice_packed=False)
    check_qkv(q, k, v)
    check_scaling_factor(scaling_factor)
    b, sq, hq, _ = q.shape
    if _name(attn_bias_type) != "NO_BIAS":
        if bias is None:
            raise ValueError(
                f"attn_bias_type={_name(attn_bias_type)} but bias=None; pass a [1 or b, h, s_q,"
                " s_kv] bias or use AttnBiasType.NO_BIAS."
            )
        check_bias(bias, batch=b, num_q_heads=hq, seq_q=sq, seq_kv=k.shape[1])
    desc = sequence_descriptor
    offsets = getattr(desc, "seq_offsets", None)
    if offsets is not None and getattr(offsets[0], "size", 0) and _name(qkv_layout).startswith("T"):
        leaves = (*desc.seqlens, *offsets)
        if not any(isinstance(x, jax.core.Tracer) for x in leaves):
            check_seqlens_offsets(desc.seqlens[0], offsets[0], sq, name="q")
            check_seqlens_offsets(desc.seqlens[1], offsets[1], k.shape[1], name="kv")
    return qkv


if REAL_TE is not None:
    # ------------------------------------------------------------------------- real TransformerEngi
    from transformer_engine.jax.attention import (  # noqa: F401
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
        """TE's ``fused_attn`` after :func:`silent_failure_checks` (and, for concrete segment ids
        and
        positions, :func:`reorder_mismatch`; under ``jit`` they are traced and only the static
        checks apply). With a CP axis of size > 1, inputs whose placement is visible must be
        sharded over it (:func:`~tutorial_utils.te.placement.check_placement`), and TE's call runs
        compiled as a whole with the sequence shardings pinned (:func:`_te_cp_call`)."""
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
            and _name(qkv_layout).startswith("T")
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
            except (
                TypeError
            ):  # an unhashable static argument (e.g. window_size as a list): no cache
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

        Why each part (each shown on TE's own code in ``tests/test_placement.py``): called
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

else:
    # ------------------------------------------------------------------------- reference backend
    from ..context_parallel import context_parallel_attention
    from ..reference import MaskSpec, blockwise_attention, bottom_right_positions, dense_attention
    from ..reorder import (  # noqa: F401
        ReorderStrategy,  # noqa: F401  (same members and values as TE's)
        inverse_reorder_causal_load_balancing,
        reorder_causal_load_balancing,
    )

    class AttnBiasType(enum.Enum):
        """Bias added to the attention logits (the reference supports NO_BIAS and
        POST_SCALE_BIAS)."""

        NO_BIAS = 0
        PRE_SCALE_BIAS = 1
        POST_SCALE_BIAS = 2

    class AttnMaskType(enum.Enum):
        """Which tokens may attend which; values follow TE's NVTE_Mask_Type order."""

        NO_MASK = 0
        PADDING_MASK = 1
        CAUSAL_MASK = 2
        PADDING_CAUSAL_MASK = 3
        CAUSAL_BOTTOM_RIGHT_MASK = 4
        PADDING_CAUSAL_BOTTOM_RIGHT_MASK = 5

        def is_causal(self):
            return self in (
                AttnMaskType.CAUSAL_MASK,
                AttnMaskType.PADDING_CAUSAL_MASK,
                AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK,
                AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
            )

        def is_padding(self):
            return self in (
                AttnMaskType.PADDING_MASK,
                AttnMaskType.PADDING_CAUSAL_MASK,
                AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
            )

        def is_bottom_right(self):
            return self in (
                AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK,
                AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
            )

    class AttnSoftmaxType(enum.Enum):
        """Vanilla, off-by-one (an extra zero logit) or learnable (a per-head sink logit)."""

        VANILLA_SOFTMAX = 0
        OFF_BY_ONE_SOFTMAX = 1
        LEARNABLE_SOFTMAX = 2

        @classmethod
        def from_str(cls, softmax_type: str) -> AttnSoftmaxType:
            table = {
                "vanilla": cls.VANILLA_SOFTMAX,
                "off_by_one": cls.OFF_BY_ONE_SOFTMAX,
                "learnable": cls.LEARNABLE_SOFTMAX,
            }
            if softmax_type not in table:
                raise ValueError(
                    f"softmax_type={softmax_type!r} is unknown; use one of {sorted(table)}."
                )
            return table[softmax_type]

    class QKVFormat(enum.Enum):
        SBHD = 0
        BSHD = 1
        THD = 2

    class QKVLayout(enum.Enum):
        """How Q, K, V are passed: packed, KV-packed or separate; BSHD (padded) or THD (packed
        segments)."""

        BS3HD = 0
        BSHD_BS2HD = 1
        BSHD_BSHD_BSHD = 2
        T3HD = 3
        THD_T2HD = 4
        THD_THD_THD = 5

        def get_qkv_format(self):
            return QKVFormat.THD if self.is_thd() else QKVFormat.BSHD

        def is_qkvpacked(self):
            return self in (QKVLayout.BS3HD, QKVLayout.T3HD)

        def is_kvpacked(self):
            return self in (QKVLayout.BSHD_BS2HD, QKVLayout.THD_T2HD)

        def is_separate(self):
            return self in (QKVLayout.BSHD_BSHD_BSHD, QKVLayout.THD_THD_THD)

        def is_thd(self):
            return self in (QKVLayout.T3HD, QKVLayout.THD_T2HD, QKVLayout.THD_THD_THD)

        def to_qkvpacked(self):
            return QKVLayout.T3HD if self.is_thd() else QKVLayout.BS3HD

        def to_kvpacked(self):
            return QKVLayout.THD_T2HD if self.is_thd() else QKVLayout.BSHD_BS2HD

        def to_separate(self):
            return QKVLayout.THD_THD_THD if self.is_thd() else QKVLayout.BSHD_BSHD_BSHD

    class CPStrategy(enum.Enum):
        """DEFAULT and ALL_GATHER both mean AllGather (as in TE); RING is ring attention."""

        DEFAULT = 0
        ALL_GATHER = 1
        RING = 2

    def _empty():
        return jnp.zeros(0)

    def _pair(value, what):
        if isinstance(value, tuple):
            if len(value) != 2:
                raise ValueError(f"{what} tuple must be (q, kv), got length {len(value)}.")
            return value
        return (value, value)

    @jax.tree_util.register_pytree_node_class
    class SequenceDescriptor:
        """Describes packed/padded sequences: seqlens+offsets or segment ids+positions, each a (q,
        kv) pair.

        A pytree with 8 leaves in TE's order (q/kv seqlens, q/kv offsets, q/kv segment ids,
        q/kv segment positions); unused fields hold size-0 placeholders.
        """

        def __init__(self, seqlens=None, seq_offsets=None, segment_ids=None, segment_pos=None):
            self.seqlens = seqlens if seqlens is not None else (_empty(), _empty())
            self.seq_offsets = seq_offsets if seq_offsets is not None else (_empty(), _empty())
            self.segment_ids = segment_ids if segment_ids is not None else (_empty(), _empty())
            self.segment_pos = segment_pos if segment_pos is not None else (_empty(), _empty())

        def tree_flatten(self):
            return (self.seqlens, self.seq_offsets, self.segment_ids, self.segment_pos), None

        @classmethod
        def tree_unflatten(cls, aux_data, children):
            del aux_data
            return cls(*children)

        @classmethod
        def from_seqlens(cls, seqlens):
            """BSHD: valid lengths ``[batch]`` (or a (q, kv) pair); tokens past the length are
            padding."""
            q, kv = _pair(seqlens, "seqlens")
            return cls(seqlens=(q, kv))

        @classmethod
        def from_seqlens_and_offsets(cls, seqlens, seq_offsets):
            """THD: per-row segment lengths ``[batch, K]`` and segment *start* offsets, padded with
            -1."""
            return cls(
                seqlens=_pair(seqlens, "seqlens"), seq_offsets=_pair(seq_offsets, "seq_offsets")
            )

        @classmethod
        def from_segment_ids_and_pos(cls, segment_ids, segment_pos=None):
            """THD: per-token segment ids (0 = padding) and positions inside the segment, ``[batch,
            seq]``."""
            if segment_pos is None:
                raise ValueError(
                    "segment_pos=None: segment positions are required (automatic generation cannot"
                    " be right for reordered/context-parallel inputs). Pass positions counting"
                    " 0,1,2,... from each segment start."
                )
            return cls(
                segment_ids=_pair(segment_ids, "segment_ids"),
                segment_pos=_pair(segment_pos, "segment_pos"),
            )

        def token_ids_and_pos(self, batch: int, seq_q: int, seq_kv: int, qkv_layout):
            """Per-token ``(ids_q, ids_kv, pos_q, pos_kv)`` for the reference kernels."""
            if self.segment_ids[0].size:
                ids_q, ids_kv = self.segment_ids
                pos_q, pos_kv = self.segment_pos
                if (
                    ids_q.ndim != 2
                    or ids_q.shape != (batch, seq_q)
                    or ids_kv.shape != (batch, seq_kv)
                ):
                    raise ValueError(
                        f"segment_ids must be [batch, seq] = {(batch, seq_q)}/{(batch, seq_kv)},"
                        f" got {tuple(ids_q.shape)}/{tuple(ids_kv.shape)}."
                    )
                if pos_q.shape != ids_q.shape or pos_kv.shape != ids_kv.shape:
                    raise ValueError("segment_pos must have the same shape as segment_ids.")
                return ids_q, ids_kv, pos_q, pos_kv
            if self.seq_offsets[0].size:
                ids_q, pos_q = self._from_offsets(self.seqlens[0], self.seq_offsets[0], seq_q)
                ids_kv, pos_kv = self._from_offsets(self.seqlens[1], self.seq_offsets[1], seq_kv)
                return ids_q, ids_kv, pos_q, pos_kv
            if self.seqlens[0].size:

                def lengths(n, s):
                    if n.ndim != 1 or n.shape[0] != batch:
                        raise ValueError(
                            f"from_seqlens expects 1-D [batch]={batch} lengths, got shape"
                            f" {tuple(n.shape)}."
                        )
                    ar = jnp.arange(s)[None, :]
                    return (ar < n[:, None]).astype(jnp.int32), jnp.broadcast_to(
                        ar, (batch, s)
                    ).astype(jnp.int32)

                ids_q, pos_q = lengths(self.seqlens[0], seq_q)
                ids_kv, pos_kv = lengths(self.seqlens[1], seq_kv)
                return ids_q, ids_kv, pos_q, pos_kv
            raise ValueError(
                "the SequenceDescriptor is empty; build it with from_segment_ids_and_pos,"
                " from_seqlens or from_seqlens_and_offsets."
            )

        @staticmethod
        def _from_offsets(seqlens, offsets, seq):
            if seqlens.ndim != 2 or offsets.ndim != 2:
                raise ValueError(
                    "from_seqlens_and_offsets expects 2-D [batch, K] arrays, got"
                    f" {tuple(seqlens.shape)}/{tuple(offsets.shape)}."
                )
            k = min(seqlens.shape[1], offsets.shape[1])
            lens, offs = seqlens[:, :k, None], offsets[:, :k, None]
            t = jnp.arange(seq)[None, None, :]
            inside = (lens > 0) & (offs >= 0) & (t >= offs) & (t < offs + lens)  # [b, K, s]
            seg = jnp.arange(1, k + 1)[None, :, None]
            ids = jnp.sum(jnp.where(inside, seg, 0), axis=1).astype(jnp.int32)
            pos = jnp.sum(jnp.where(inside, t - offs, 0), axis=1).astype(jnp.int32)
            return ids, pos

    def _sink(softmax_type, softmax_offset, hq):
        name = _name(softmax_type)
        if name == "VANILLA_SOFTMAX":
            return None
        if name == "OFF_BY_ONE_SOFTMAX":
            return jnp.zeros((hq,), jnp.float32)
        if softmax_offset is None:
            raise ValueError(
                "softmax_type=LEARNABLE_SOFTMAX needs softmax_offset, a float32 [1, num_q_heads, 1,"
                " 1] parameter."
            )
        if softmax_offset.size != hq:
            raise ValueError(
                f"softmax_offset has {softmax_offset.size} elements, expected"
                f" num_q_heads={hq} (shape [1, {hq}, 1, 1])."
            )
        return softmax_offset.reshape(hq).astype(jnp.float32)

    def fused_attn(
        qkv: tuple[jnp.ndarray, ...],
        bias: jnp.ndarray | None,
        sequence_descriptor: SequenceDescriptor | None,
        seed: jnp.ndarray | None,
        attn_bias_type: AttnBiasType,
        attn_mask_type: AttnMaskType,
        qkv_layout: QKVLayout,
        softmax_type: AttnSoftmaxType,
        scaling_factor: float,
        dropout_probability: float,
        is_training: bool,
        max_segments_per_seq: int = 1,
        window_size: tuple[int, int] | None = None,
        context_parallel_strategy: CPStrategy = CPStrategy.DEFAULT,
        context_parallel_causal_load_balanced: bool = False,
        context_parallel_axis: str = "",
        context_checkpoint_name: str = "context",
        softmax_offset: jnp.ndarray | None = None,
        stripe_size: int | None = None,
        score_mod: Callable | None = None,
        score_mod_bprop: Callable | None = None,
        score_mod_tensors: Mapping[str, Any] | None = None,
        score_mod_bprop_tensors: Mapping[str, Any] | None = None,
        return_max_logit: bool = False,
    ):
        """Fused attention with TE's semantics, computed by the pure-JAX reference.

        Returns ``[b, s_q, h_q, d_v]`` in the query dtype (``(out, max_logit)`` with
        ``return_max_logit``). Differentiable in ``qkv`` (and bias / learnable
        ``softmax_offset``). Under an active mesh whose CP axis (``context_parallel_axis`` or
        ``MeshResource.cp_resource``) has size > 1, runs the chosen CP strategy.
        """
        del seed, context_checkpoint_name
        for arg, enum_cls in (
            (attn_bias_type, AttnBiasType),
            (attn_mask_type, AttnMaskType),
            (qkv_layout, QKVLayout),
            (softmax_type, AttnSoftmaxType),
            (context_parallel_strategy, CPStrategy),
        ):
            if not isinstance(arg, enum_cls):
                raise ValueError(
                    f"expected a {enum_cls.__name__} member, got {arg!r}; import the enums from"
                    " tutorial_utils.te.attention."
                )
        if (
            score_mod is not None
            or score_mod_bprop is not None
            or score_mod_tensors
            or score_mod_bprop_tensors
        ):
            raise ValueError(
                "score_mod is not supported by the reference backend; pass score_mod=None (it needs"
                " TE's cuDNN frontend graph on a GPU)."
            )
        if dropout_probability and is_training:
            raise ValueError(
                f"dropout_probability={dropout_probability} with is_training=True: the reference"
                " backend has no dropout (cuDNN's RNG cannot be reproduced); use 0.0 or"
                " is_training=False."
            )
        qkv = check_call(
            qkv,
            bias,
            sequence_descriptor,
            attn_bias_type=attn_bias_type,
            qkv_layout=qkv_layout,
            scaling_factor=scaling_factor,
        )
        q, k, v = _unpack_qkv(qkv, qkv_layout)
        mesh, cp_axis, cp_size = cp_axis_and_size(context_parallel_axis)
        window = static_checks(
            q.shape,
            k.shape,
            attn_bias_type=attn_bias_type,
            attn_mask_type=attn_mask_type,
            qkv_layout=qkv_layout,
            softmax_type=softmax_type,
            dropout_probability=dropout_probability,
            max_segments_per_seq=max_segments_per_seq,
            window_size=window_size,
            context_parallel_strategy=context_parallel_strategy,
            context_parallel_causal_load_balanced=context_parallel_causal_load_balanced,
            stripe_size=stripe_size,
            cp_size=cp_size,
        )
        if max_segments_per_seq > 1 and not qkv_layout.is_thd():
            warnings.warn(
                f"max_segments_per_seq={max_segments_per_seq} only applies to THD layouts;"
                f" qkv_layout={qkv_layout.name}.",
                UserWarning,
                stacklevel=2,
            )
        b, sq, hq, _ = q.shape
        skv = k.shape[1]
        if sequence_descriptor is None:
            ones = jnp.ones((b, sq), jnp.int32)
            ids_q, ids_kv = ones, jnp.ones((b, skv), jnp.int32)
            pos_q = jnp.broadcast_to(jnp.arange(sq, dtype=jnp.int32), (b, sq))
            pos_kv = jnp.broadcast_to(jnp.arange(skv, dtype=jnp.int32), (b, skv))
        elif isinstance(sequence_descriptor, SequenceDescriptor):
            ids_q, ids_kv, pos_q, pos_kv = sequence_descriptor.token_ids_and_pos(
                b, sq, skv, qkv_layout
            )
        else:
            raise ValueError(
                "sequence_descriptor must be a SequenceDescriptor or None, got"
                f" {type(sequence_descriptor).__name__}; build one with"
                " SequenceDescriptor.from_segment_ids_and_pos(ids, pos)."
            )
        synthesized = sequence_descriptor is None or not sequence_descriptor.segment_ids[0].size
        if (
            cp_size > 1
            and context_parallel_causal_load_balanced
            and not qkv_layout.is_thd()
            and synthesized
        ):
            # BSHD ids/positions are built here in natural order, but q/k/v arrive
            # DualChunkSwap-reordered:
            # reorder the token metadata the same way so the causal mask sees true positions.
            ids_q, ids_kv, pos_q, pos_kv = (
                reorder_causal_load_balancing(x, ReorderStrategy.DualChunkSwap, cp_size, 1)
                for x in (ids_q, ids_kv, pos_q, pos_kv)
            )
        padding = attn_mask_type.is_padding()
        if not padding:
            ids_q, ids_kv = jnp.ones_like(ids_q), jnp.ones_like(ids_kv)
        if attn_mask_type.is_bottom_right():
            pos_q = bottom_right_positions(ids_q, ids_kv, pos_q, max_segments_per_seq)
        spec = MaskSpec(padding=padding, causal=attn_mask_type.is_causal(), window=window)
        scale = float(scaling_factor)
        sink = _sink(softmax_type, softmax_offset, hq)
        bias_arr = None
        if attn_bias_type != AttnBiasType.NO_BIAS:
            bias_arr = bias if attn_bias_type == AttnBiasType.POST_SCALE_BIAS else bias * scale

        if cp_size > 1:
            strategy = rules.normalize_strategy(context_parallel_strategy)
            reorder = (
                ReorderStrategy.Striped if qkv_layout.is_thd() else ReorderStrategy.DualChunkSwap
            )
            out = context_parallel_attention(
                q,
                k,
                v,
                ids_q,
                pos_q,
                mesh=mesh,
                axis_name=cp_axis,
                strategy=strategy,
                stripe_size=stripe_size,
                load_balanced=context_parallel_causal_load_balanced,
                reorder_strategy=reorder,
                window_size=window,
                scaling_factor=scale,
                causal=spec.causal,
                padding=padding,
                kv_segment_ids=ids_kv,
                kv_segment_pos=pos_kv,
                batch_axis=batch_axes(mesh),
            )
            max_logit = None
        elif bias_arr is not None:
            out, _ = dense_attention(
                q,
                k,
                v,
                ids_q,
                ids_kv,
                pos_q,
                pos_kv,
                scale=scale,
                spec=spec,
                sink=sink,
                bias=bias_arr,
            )
            max_logit = None
        else:
            out, _, mx = blockwise_attention(
                q,
                k,
                v,
                ids_q,
                ids_kv,
                pos_q,
                pos_kv,
                scale=scale,
                spec=spec,
                sink=sink,
                return_max_logit=True,
            )
            max_logit = jnp.max(mx, axis=(0, 2)).astype(
                out.dtype
            )  # TE returns it in the output dtype
        if return_max_logit:
            if max_logit is None:
                raise ValueError(
                    "return_max_logit=True is supported by the reference backend only without bias"
                    " and without CP."
                )
            return out, max_logit
        return out

    def is_fused_attn_kernel_available(
        is_training,
        batch_size,
        q_dtype,
        kv_dtype,
        qkv_layout,
        attn_bias_type,
        attn_mask_type,
        softmax_type,
        dropout_probability,
        q_num_heads,
        kv_num_heads,
        q_max_seqlen,
        kv_max_seqlen,
        head_dim_qk,
        head_dim_v,
        window_size: tuple[int, int] | None = None,
        return_max_logit: bool = False,
        bottom_right_diagonal: bool | None = None,
        bias_batch: int | None = None,
        bias_heads: int | None = None,
        bias_seqlen_q: int | None = None,
        bias_seqlen_kv: int | None = None,
        max_segments_per_seq: int = 1,
    ):
        """Reference backend: True when the *reference* can compute this configuration.

        It says nothing about cuDNN on your GPU (THD needs sm90+, THD GQA/SWA need cuDNN >= 9.6);
        on a GPU node this name is TE's own function.
        """
        del (
            batch_size,
            q_dtype,
            kv_dtype,
            attn_mask_type,
            softmax_type,
            q_max_seqlen,
            kv_max_seqlen,
            head_dim_qk,
        )
        del (
            head_dim_v,
            return_max_logit,
            bottom_right_diagonal,
            bias_batch,
            bias_heads,
            bias_seqlen_q,
            bias_seqlen_kv,
        )
        del max_segments_per_seq, qkv_layout
        for name, value in (("q_num_heads", q_num_heads), ("kv_num_heads", kv_num_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int (a head count).")
        try:
            check_window(window_size)
        except ValueError:
            return False
        if is_training and dropout_probability:
            return False
        return not rules.reason(rules.check_gqa_heads, q_num_heads, kv_num_heads)
