"""``tutorial_utils.te.attention`` under ``TUTORIAL_TE_BACKEND=reference``: TE's names in pure JAX.

Imported by :mod:`tutorial_utils.te.attention` only when TE's code does not run. The enums,
``SequenceDescriptor`` and ``fused_attn`` follow TE 2.20.2's names, signatures and defaults;
the attention is computed by :mod:`tutorial_utils.reference` (one device) and
:mod:`tutorial_utils.context_parallel` (a CP axis of size > 1), with
:func:`~tutorial_utils.te.attention.static_checks` raising the errors TE itself would.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from .. import rules
from ..context_parallel import context_parallel_attention
from ..reference import MaskSpec, blockwise_attention, bottom_right_positions, dense_attention
from ..reorder import (  # noqa: F401  (re-exported by te.attention)
    ReorderStrategy,  # same members and values as TE's
    inverse_reorder_causal_load_balancing,
    reorder_causal_load_balancing,
)
from ..validation import check_window
from ._attention_checks import check_call, name_of, static_checks, unpack_qkv
from .sharding import batch_axes, cp_axis_and_size


class AttnBiasType(enum.Enum):
    """Bias added to the attention logits (the reference supports NO_BIAS, POST_SCALE_BIAS)."""

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
        """Whether the mask is causal.

        Returns:
            True for the four causal masks.
        """
        return self in (
            AttnMaskType.CAUSAL_MASK,
            AttnMaskType.PADDING_CAUSAL_MASK,
            AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK,
            AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
        )

    def is_padding(self):
        """Whether padding tokens are masked.

        Returns:
            True for the three padding masks.
        """
        return self in (
            AttnMaskType.PADDING_MASK,
            AttnMaskType.PADDING_CAUSAL_MASK,
            AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
        )

    def is_bottom_right(self):
        """Whether the causal diagonal is aligned to the bottom right.

        Returns:
            True for the two bottom-right masks.
        """
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
        """The member for a name, as TE spells it.

        Args:
            softmax_type: ``"vanilla"``, ``"off_by_one"`` or ``"learnable"``.

        Returns:
            The member.

        Raises:
            ValueError: If the name is not one of those.
        """
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
    """The tensor format of a layout: SBHD, BSHD (padded rows) or THD (packed segments)."""

    SBHD = 0
    BSHD = 1
    THD = 2


class QKVLayout(enum.Enum):
    """How Q, K, V are passed: packed, KV-packed or separate; BSHD (padded) or THD (packed)."""

    BS3HD = 0
    BSHD_BS2HD = 1
    BSHD_BSHD_BSHD = 2
    T3HD = 3
    THD_T2HD = 4
    THD_THD_THD = 5

    def get_qkv_format(self):
        """The layout's tensor format.

        Returns:
            ``QKVFormat.THD`` or ``QKVFormat.BSHD``.
        """
        return QKVFormat.THD if self.is_thd() else QKVFormat.BSHD

    def is_qkvpacked(self):
        """Whether Q, K and V are one packed tensor.

        Returns:
            True for BS3HD and T3HD.
        """
        return self in (QKVLayout.BS3HD, QKVLayout.T3HD)

    def is_kvpacked(self):
        """Whether K and V are one packed tensor.

        Returns:
            True for BSHD_BS2HD and THD_T2HD.
        """
        return self in (QKVLayout.BSHD_BS2HD, QKVLayout.THD_T2HD)

    def is_separate(self):
        """Whether Q, K and V are three tensors.

        Returns:
            True for BSHD_BSHD_BSHD and THD_THD_THD.
        """
        return self in (QKVLayout.BSHD_BSHD_BSHD, QKVLayout.THD_THD_THD)

    def is_thd(self):
        """Whether the layout is THD.

        Returns:
            True for the three THD layouts.
        """
        return self in (QKVLayout.T3HD, QKVLayout.THD_T2HD, QKVLayout.THD_THD_THD)

    def to_qkvpacked(self):
        """The QKV-packed layout of the same format.

        Returns:
            T3HD or BS3HD.
        """
        return QKVLayout.T3HD if self.is_thd() else QKVLayout.BS3HD

    def to_kvpacked(self):
        """The KV-packed layout of the same format.

        Returns:
            THD_T2HD or BSHD_BS2HD.
        """
        return QKVLayout.THD_T2HD if self.is_thd() else QKVLayout.BSHD_BS2HD

    def to_separate(self):
        """The separate layout of the same format.

        Returns:
            THD_THD_THD or BSHD_BSHD_BSHD.
        """
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
    """Packed or padded sequences: seqlens and offsets, or segment ids and positions.

    Each field is a ``(q, kv)`` pair. A pytree with 8 leaves in TE's order (q/kv seqlens, q/kv
    offsets, q/kv segment ids, q/kv segment positions); unused fields hold size-0 placeholders.
    """

    def __init__(self, seqlens=None, seq_offsets=None, segment_ids=None, segment_pos=None):
        self.seqlens = seqlens if seqlens is not None else (_empty(), _empty())
        self.seq_offsets = seq_offsets if seq_offsets is not None else (_empty(), _empty())
        self.segment_ids = segment_ids if segment_ids is not None else (_empty(), _empty())
        self.segment_pos = segment_pos if segment_pos is not None else (_empty(), _empty())

    def tree_flatten(self):
        """The pytree's children, in TE's order.

        Returns:
            ``((seqlens, seq_offsets, segment_ids, segment_pos), None)``.
        """
        return (self.seqlens, self.seq_offsets, self.segment_ids, self.segment_pos), None

    @classmethod
    def tree_unflatten(cls, aux_data, children):
        """Rebuild a descriptor from :meth:`tree_flatten`'s output.

        Args:
            aux_data: Unused.
            children: The four ``(q, kv)`` pairs.

        Returns:
            The descriptor.
        """
        del aux_data
        return cls(*children)

    @classmethod
    def from_seqlens(cls, seqlens):
        """BSHD: valid lengths; tokens past the length are padding.

        Args:
            seqlens: ``[batch]`` lengths, or a ``(q, kv)`` pair of them.

        Returns:
            The descriptor.

        Raises:
            ValueError: If a tuple is not a ``(q, kv)`` pair.
        """
        q, kv = _pair(seqlens, "seqlens")
        return cls(seqlens=(q, kv))

    @classmethod
    def from_seqlens_and_offsets(cls, seqlens, seq_offsets):
        """THD: per-row segment lengths and segment *start* offsets, padded with -1.

        Args:
            seqlens: ``[batch, K]`` lengths, or a ``(q, kv)`` pair of them.
            seq_offsets: ``[batch, K]`` start offsets, or a ``(q, kv)`` pair.

        Returns:
            The descriptor.

        Raises:
            ValueError: If a tuple is not a ``(q, kv)`` pair.
        """
        return cls(seqlens=_pair(seqlens, "seqlens"), seq_offsets=_pair(seq_offsets, "seq_offsets"))

    @classmethod
    def from_segment_ids_and_pos(cls, segment_ids, segment_pos=None):
        """THD: per-token segment ids (0 = padding) and positions inside the segment.

        Args:
            segment_ids: ``[batch, seq]`` ids, or a ``(q, kv)`` pair of them.
            segment_pos: ``[batch, seq]`` positions, or a ``(q, kv)`` pair; required.

        Returns:
            The descriptor.

        Raises:
            ValueError: If ``segment_pos`` is ``None``, or a tuple is not a ``(q, kv)`` pair.
        """
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
        """Per-token ``(ids_q, ids_kv, pos_q, pos_kv)`` for the reference kernels.

        Args:
            batch: The batch size.
            seq_q: The query length.
            seq_kv: The key length.
            qkv_layout: The layout (unused: the fields say which form was given).

        Returns:
            ``(ids_q, ids_kv, pos_q, pos_kv)``, each ``[batch, seq]`` int32.

        Raises:
            ValueError: If the descriptor is empty or its arrays have the wrong shapes.
        """
        if self.segment_ids[0].size:
            ids_q, ids_kv = self.segment_ids
            pos_q, pos_kv = self.segment_pos
            if ids_q.ndim != 2 or ids_q.shape != (batch, seq_q) or ids_kv.shape != (batch, seq_kv):
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
                return (ar < n[:, None]).astype(jnp.int32), jnp.broadcast_to(ar, (batch, s)).astype(
                    jnp.int32
                )

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
    name = name_of(softmax_type)
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

    Differentiable in ``qkv`` (and bias / learnable ``softmax_offset``). Under an active mesh
    whose CP axis (``context_parallel_axis`` or ``MeshResource.cp_resource``) has size > 1,
    runs the chosen CP strategy.

    Args:
        qkv: ``(q, k, v)``, ``(q, kv_packed)`` or ``(qkv_packed,)``, as ``qkv_layout`` says.
        bias: The attention bias, or ``None``.
        sequence_descriptor: A ``SequenceDescriptor``, or ``None`` for whole rows.
        seed: The dropout seed (unused: the reference has no dropout).
        attn_bias_type: An ``AttnBiasType``.
        attn_mask_type: An ``AttnMaskType``.
        qkv_layout: A ``QKVLayout``.
        softmax_type: An ``AttnSoftmaxType``.
        scaling_factor: The softmax scale, usually ``head_dim ** -0.5``.
        dropout_probability: In ``[0, 1)`` and 0.0 when training: the reference has no dropout.
        is_training: Whether dropout applies.
        max_segments_per_seq: The most segments a THD row holds.
        window_size: A ``(left, right)`` sliding window, or ``None``.
        context_parallel_strategy: A ``CPStrategy``.
        context_parallel_causal_load_balanced: Whether the inputs are reordered for CP.
        context_parallel_axis: The CP mesh axis; ``""`` for ``MeshResource.cp_resource``.
        context_checkpoint_name: TE's checkpoint name for the attention context (unused here).
        softmax_offset: The learnable softmax's ``[1, h_q, 1, 1]`` sink logits, or ``None``.
        stripe_size: The striped reorder's stripe (THD with CP).
        score_mod: A score modifier (cuDNN's frontend graph); must be ``None`` here.
        score_mod_bprop: Likewise, for the backward.
        score_mod_tensors: The tensors ``score_mod`` reads.
        score_mod_bprop_tensors: The tensors ``score_mod_bprop`` reads.
        return_max_logit: Also return each head's largest logit.

    Returns:
        ``[b, s_q, h_q, d_v]`` in the query dtype; ``(out, max_logit)`` with
        ``return_max_logit``.

    Raises:
        ValueError: For an argument TE would refuse or compute wrongly, ``score_mod``, dropout
            while training, or ``return_max_logit`` with a bias or CP.
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
    q, k, v = unpack_qkv(qkv, qkv_layout)
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
        ids_q, ids_kv, pos_q, pos_kv = sequence_descriptor.token_ids_and_pos(b, sq, skv, qkv_layout)
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
        reorder = ReorderStrategy.Striped if qkv_layout.is_thd() else ReorderStrategy.DualChunkSwap
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
        max_logit = jnp.max(mx, axis=(0, 2)).astype(out.dtype)  # TE returns it in the output dtype
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
    on a GPU node this name is TE's own function. The arguments are TE's; those the reference
    does not need are unused.

    Args:
        is_training: Whether dropout would apply.
        batch_size: Unused.
        q_dtype: Unused.
        kv_dtype: Unused.
        qkv_layout: Unused.
        attn_bias_type: Unused.
        attn_mask_type: Unused.
        softmax_type: Unused.
        dropout_probability: Nonzero while training is not supported.
        q_num_heads: The query heads.
        kv_num_heads: The kv heads; they must divide ``q_num_heads``.
        q_max_seqlen: Unused.
        kv_max_seqlen: Unused.
        head_dim_qk: Unused.
        head_dim_v: Unused.
        window_size: A ``(left, right)`` window, or ``None``.
        return_max_logit: Unused.
        bottom_right_diagonal: Unused.
        bias_batch: Unused.
        bias_heads: Unused.
        bias_seqlen_q: Unused.
        bias_seqlen_kv: Unused.
        max_segments_per_seq: Unused.

    Returns:
        Whether the reference computes it.

    Raises:
        ValueError: If a head count is not a positive int.
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
