"""A small decoder-only language model; its attention is TE's ``fused_attn`` on THD.

Why: the tutorial's attention calls become useful once they sit inside a model that
trains. This one is plain JAX (a dict of arrays for the parameters) and optax, so every
line can be read and copied. Context parallelism touches it in one place:
:class:`AttentionSharding` passes the CP strategy and stripe to ``fused_attn``. All else
works on the batch as given, natural order or striped, because nothing here depends on
where a token sits in the row: RoPE reads the token's *segment position*, attention
masks come from segment ids and positions, and the loss is an average over tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import rules
from .te.attention import (
    AttnBiasType,
    AttnMaskType,
    AttnSoftmaxType,
    CPStrategy,
    QKVLayout,
    SequenceDescriptor,
    fused_attn,
)
from .validation import check_window

__all__ = [
    "ModelConfig",
    "AttentionSharding",
    "NO_CP",
    "init_params",
    "rms_norm",
    "rope",
    "attention",
    "forward",
    "loss_fn",
    "make_train_step",
    "relative_update_difference",
]

COMPUTE_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Sizes of the model.

    Parameters are always float32; ``dtype`` is the compute dtype: bf16 by default because
    TE's cuDNN kernels take bf16/fp16 only (float32 suits tight comparisons with the reference
    backend). ``max_segments_per_seq`` must be at least the largest segment id in any row (TE
    treats later segments as padding).

    Raises:
        ValueError: If a size is not a positive int, the heads do not group (GQA),
            ``head_dim`` is odd, the window sees future tokens, ``dtype`` is not a compute
            dtype or ``rope_base <= 1``.
    """

    vocab_size: int = 256
    d_model: int = 64
    num_layers: int = 2
    num_q_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    mlp_dim: int = 128
    max_segments_per_seq: int = 1
    window_size: tuple[int, int] | None = None
    dtype: Any = jnp.bfloat16
    rope_base: float = 10000.0

    def __post_init__(self):
        for name in (
            "vocab_size",
            "d_model",
            "num_layers",
            "num_q_heads",
            "num_kv_heads",
            "head_dim",
            "mlp_dim",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int.")
        rules.check_max_segments(self.max_segments_per_seq)
        rules.check_gqa_heads(self.num_q_heads, self.num_kv_heads)
        if self.head_dim % 2:
            raise ValueError(
                f"head_dim={self.head_dim} is odd; RoPE rotates pairs of "
                "features, so use an even head_dim."
            )
        window = self.window_size
        if window is not None and check_window(window)[1] not in (0, -1):
            raise ValueError(
                f"window_size={window}: a causal model sees no future "
                "tokens; use (left, 0) or None."
            )
        if jnp.dtype(self.dtype) not in [jnp.dtype(d) for d in COMPUTE_DTYPES]:
            raise ValueError(
                f"dtype={self.dtype!r} is not a compute dtype; use "
                "jnp.float32, jnp.bfloat16 or jnp.float16."
            )
        if not self.rope_base > 1:
            raise ValueError(f"rope_base={self.rope_base!r} must be > 1 (often 10000).")


@dataclasses.dataclass(frozen=True)
class AttentionSharding:
    """How ``fused_attn`` splits the sequence; ``strategy=None`` means no CP.

    With a strategy, call the model under ``jax.set_mesh(mesh)`` and
    ``te.autocast(mesh_resource=MeshResource(..., cp_resource=axis))``, on a batch
    striped with the same ``stripe_size`` for that axis's size
    (``text_data.reorder_for_cp``).

    Raises:
        ValueError: If ``strategy`` is not a ``CPStrategy`` or ``None``, or the stripe is
            missing or invalid for it.
    """

    strategy: CPStrategy | None = None
    stripe_size: int | None = None
    axis: str = "cp"

    def __post_init__(self):
        if self.strategy is not None and not isinstance(self.strategy, CPStrategy):
            raise ValueError(
                f"strategy={self.strategy!r} must be a CPStrategy from "
                "tutorial_utils.te.attention, or None for no CP."
            )
        if self.strategy is None:
            return
        # the model always runs THD: Ring too is given its stripe explicitly (TE's Ring takes 1)
        rules.check_stripe_given(self.stripe_size, label="a CP strategy")
        rules.check_stripe_size(self.stripe_size)
        if self.strategy == CPStrategy.RING:
            rules.check_ring_stripe(self.stripe_size, label="CPStrategy.RING")

    def fused_attn_kwargs(self) -> dict:
        """The keywords that tell ``fused_attn`` to split the sequence this way.

        Returns:
            ``context_parallel_*`` and ``stripe_size`` keywords; none without a strategy.
        """
        if self.strategy is None:
            return {}
        return dict(
            context_parallel_strategy=self.strategy,
            context_parallel_causal_load_balanced=True,
            context_parallel_axis=self.axis,
            stripe_size=self.stripe_size,
        )


NO_CP = AttentionSharding()


def init_params(config: ModelConfig, key) -> dict:
    """Float32 parameters: embedding (also the output layer), blocks, final norm.

    Args:
        config: The model's sizes.
        key: A JAX random key.

    Returns:
        ``{"embed", "blocks": [per-layer dicts], "final_norm"}``.
    """
    c = config
    q_dim, kv_dim = c.num_q_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = dict(
        wq=(c.d_model, q_dim),
        wk=(c.d_model, kv_dim),
        wv=(c.d_model, kv_dim),
        wo=(q_dim, c.d_model),
        w_in=(c.d_model, 2 * c.mlp_dim),
        w_out=(c.mlp_dim, c.d_model),
    )
    key, embed_key = jax.random.split(key)
    blocks = []
    for layer_key in jax.random.split(key, c.num_layers):
        keys = dict(zip(shapes, jax.random.split(layer_key, len(shapes))))
        block = {
            name: jax.random.normal(keys[name], shape) * shape[0] ** -0.5
            for name, shape in shapes.items()
        }  # keeps activations near unit scale
        block.update(norm1=jnp.ones(c.d_model), norm2=jnp.ones(c.d_model))
        blocks.append(block)
    embed = jax.random.normal(embed_key, (c.vocab_size, c.d_model)) * c.d_model**-0.5
    return dict(embed=embed, blocks=blocks, final_norm=jnp.ones(c.d_model))


def rms_norm(x, scale, eps: float = 1e-6):
    """Scale each token to unit root-mean-square (in float32), then by ``scale``.

    Args:
        x: ``[..., d]`` activations.
        scale: ``[d]`` weights.
        eps: Added to the mean square.

    Returns:
        The normalised ``x``, in its dtype.
    """
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * scale).astype(x.dtype)


def rope(x, positions, base: float = 10000.0):
    """Rotary embedding of ``x [b, s, h, d]`` at ``positions [b, s]``.

    The angle comes from each token's position *inside its segment*, which travels with
    the token, not from its index in the row. So a document starts at angle 0 wherever
    it is packed, and a striped batch needs no change here: the positions were
    reordered together with the tokens.

    Args:
        x: ``[b, s, h, d]`` queries or keys (``d`` even).
        positions: ``[b, s]`` positions inside each segment.
        base: The rotation's frequency base.

    Returns:
        The rotated ``x``, in its dtype.
    """
    half = x.shape[-1] // 2
    freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = positions.astype(jnp.float32)[:, :, None, None] * freq  # [b, s, 1, half]
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return out.astype(x.dtype)


def attention(
    q, k, v, segment_ids, segment_pos, config: ModelConfig, attn: AttentionSharding = NO_CP
):
    """Causal attention inside each packed segment (THD), through ``fused_attn``.

    Args:
        q: ``[b, s, num_q_heads, head_dim]``.
        k: ``[b, s, num_kv_heads, head_dim]``.
        v: Like ``k``.
        segment_ids: ``[b, s]`` segment ids (0 = padding).
        segment_pos: ``[b, s]`` positions inside each segment.
        config: The model's sizes (scale, window, ``max_segments_per_seq``).
        attn: How the sequence is split (default no CP).

    Returns:
        ``[b, s, num_q_heads, head_dim]``.
    """
    return fused_attn(
        (q, k, v),
        None,
        SequenceDescriptor.from_segment_ids_and_pos(segment_ids, segment_pos),
        None,
        attn_bias_type=AttnBiasType.NO_BIAS,
        attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
        qkv_layout=QKVLayout.THD_THD_THD,
        softmax_type=AttnSoftmaxType.VANILLA_SOFTMAX,
        scaling_factor=config.head_dim**-0.5,
        dropout_probability=0.0,
        is_training=True,
        max_segments_per_seq=config.max_segments_per_seq,
        window_size=config.window_size,
        **attn.fused_attn_kwargs(),
    )


def _block(x, p, segment_ids, segment_pos, config, attn):
    """Pre-norm residual block: x + attention(norm(x)), then x + SwiGLU(norm(x))."""
    c, dt = config, config.dtype
    b, s, _ = x.shape
    h = rms_norm(x, p["norm1"]).astype(dt)
    q = (h @ p["wq"].astype(dt)).reshape(b, s, c.num_q_heads, c.head_dim)
    k = (h @ p["wk"].astype(dt)).reshape(b, s, c.num_kv_heads, c.head_dim)
    v = (h @ p["wv"].astype(dt)).reshape(b, s, c.num_kv_heads, c.head_dim)
    q, k = rope(q, segment_pos, c.rope_base), rope(k, segment_pos, c.rope_base)
    out = attention(q, k, v, segment_ids, segment_pos, c, attn).reshape(b, s, -1)
    x = x + (out.astype(dt) @ p["wo"].astype(dt)).astype(jnp.float32)
    h = rms_norm(x, p["norm2"]).astype(dt)
    gate, up = jnp.split(h @ p["w_in"].astype(dt), 2, axis=-1)
    mlp = (jax.nn.silu(gate) * up) @ p["w_out"].astype(dt)
    return x + mlp.astype(jnp.float32)


def forward(
    params, tokens, segment_ids, segment_pos, config: ModelConfig, attn: AttentionSharding = NO_CP
):
    """Logits ``[batch, seq, vocab]`` in float32; the residual stream stays float32.

    Args:
        params: From :func:`init_params`.
        tokens: ``[batch, seq]`` token ids.
        segment_ids: ``[batch, seq]`` segment ids (0 = padding).
        segment_pos: ``[batch, seq]`` positions inside each segment.
        config: The model's sizes.
        attn: How the sequence is split (default no CP).

    Returns:
        The logits.
    """
    x = jnp.take(params["embed"], tokens, axis=0)  # NumPy parameters work too
    for p in params["blocks"]:
        x = _block(x, p, segment_ids, segment_pos, config, attn)
    x = rms_norm(x, params["final_norm"])
    return x @ params["embed"].T  # tied: one matrix reads and writes tokens


def loss_fn(
    params,
    tokens,
    targets,
    loss_mask,
    segment_ids,
    segment_pos,
    config: ModelConfig,
    attn: AttentionSharding = NO_CP,
):
    """Mean next-token cross-entropy over the tokens with ``loss_mask == 1``.

    A sum divided by a count does not depend on the order of the tokens, and every
    input here is indexed by token. So a batch striped for context parallelism (all
    five arrays reordered together) has the same loss and gradients as the natural-order
    batch, provided attention is computed correctly for it: on the matching CP mesh, or
    on one device with the reference backend, whose masks come from ids and positions.

    Args:
        params: From :func:`init_params`.
        tokens: ``[batch, seq]`` input tokens.
        targets: ``[batch, seq]`` next tokens.
        loss_mask: ``[batch, seq]``, 1 where a token counts.
        segment_ids: ``[batch, seq]`` segment ids.
        segment_pos: ``[batch, seq]`` positions inside each segment.
        config: The model's sizes.
        attn: How the sequence is split (default no CP).

    Returns:
        The mean loss, a float32 scalar.
    """
    logits = forward(params, tokens, segment_ids, segment_pos, config, attn)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    mask = loss_mask.astype(jnp.float32)
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def make_train_step(
    config: ModelConfig, optimizer: optax.GradientTransformation, attn: AttentionSharding = NO_CP
):
    """A training step: ``step(params, opt_state, tokens, targets, loss_mask, ids, pos)``.

    Jit it yourself, with your shardings.

    Args:
        config: The model's sizes.
        optimizer: An optax optimizer.
        attn: How the sequence is split (default no CP).

    Returns:
        ``train_step(params, opt_state, tokens, targets, loss_mask, segment_ids,
        segment_pos) -> (params, opt_state, loss)``.
    """

    def train_step(params, opt_state, tokens, targets, loss_mask, segment_ids, segment_pos):
        loss, grads = jax.value_and_grad(loss_fn)(
            params, tokens, targets, loss_mask, segment_ids, segment_pos, config, attn
        )
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def relative_update_difference(init, reference, other) -> float:
    """``||(other - init) - (reference - init)|| / ||reference - init||`` over all parameters.

    Why: AdamW moves each weight by about the learning rate per step whatever the gradient,
    so after a few steps every run's parameters are within ``lr * steps`` of each other and
    a tolerance on ``max |param diff|`` can hardly fail. Measured against the size of the
    update itself, a run whose gradients point elsewhere differs by a sizeable fraction of
    1, while rounding differences stay far below. Norms over all leaves, in float64.

    Args:
        init: The parameters both runs started from.
        reference: The reference run's parameters.
        other: The other run's.

    Returns:
        The relative difference of the two updates.

    Raises:
        ValueError: If the trees have different leaf counts, or ``reference`` equals ``init``.
    """
    leaves = [jax.tree.leaves(tree) for tree in (init, reference, other)]
    if not len(leaves[0]) == len(leaves[1]) == len(leaves[2]):
        raise ValueError(
            "init, reference and other must be parameter trees of one model; "
            f"they have {[len(x) for x in leaves]} leaves."
        )
    num = den = 0.0
    for i, r, o in zip(*leaves):
        i, r, o = (np.asarray(x, np.float64) for x in (i, r, o))
        num += float(np.sum((o - r) ** 2))
        den += float(np.sum((r - i) ** 2))
    if den == 0.0:
        raise ValueError(
            "reference equals init: the reference run did not move the "
            "parameters, so there is no update to compare against."
        )
    return float(np.sqrt(num / den))
