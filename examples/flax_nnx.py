"""TE's attention with context parallelism in a Flax NNX model; the gradients of its
NNX State checked against one device.

Two ways in: an nnx.Module that calls TE's fused_attn itself (THD Ring, stripe 1), and
TE's Linen DotProductAttention wrapped by nnx.bridge.ToNNX (the layer holds no
parameters, so the wrapper holds no state: ``layer.apply({}, ...)`` is the same call).
The packed batch is reordered once, outside the model, every per-token array alike.
The check: the CP and the one-device gradients, both bfloat16, measured from a float32
reference (the block with its attention in plain JAX, which runs on a GPU too); CP
passes within 2.5 times one device's error (floor 1e-4), as chapter 9's check does.
"""

import jax
import jax.numpy as jnp
import numpy as np
import transformer_engine.jax as te
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from transformer_engine.jax.attention import (
    AttnBiasType,
    AttnMaskType,
    AttnSoftmaxType,
    CPStrategy,
    QKVLayout,
    ReorderStrategy,
    SequenceDescriptor,
    fused_attn,
    reorder_causal_load_balancing,
)
from transformer_engine.jax.flax import DotProductAttention
from transformer_engine.jax.sharding import MeshResource

CP, B, S, E, HQ, HKV, D, SEGS = len(jax.devices()), 2, 128, 32, 4, 2, 16, 2
if CP < 2:
    raise SystemExit(f"flax_nnx.py needs >= 2 devices for a CP mesh, found {CP}")


class FusedAttention(nnx.Module):
    """TE's fused_attn, called from NNX; ``cp_axis=""`` is the one-device call."""

    def __init__(self, *, cp_axis=""):
        self.cp_axis = cp_axis

    def __call__(self, q, k, v, ids, pos):
        return fused_attn(
            (q, k, v),
            bias=None,
            sequence_descriptor=SequenceDescriptor.from_segment_ids_and_pos(ids, pos),
            seed=None,
            attn_bias_type=AttnBiasType.NO_BIAS,
            attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
            qkv_layout=QKVLayout.THD_THD_THD,
            softmax_type=AttnSoftmaxType.VANILLA_SOFTMAX,
            scaling_factor=D**-0.5,
            dropout_probability=0.0,
            is_training=True,
            max_segments_per_seq=SEGS,
            context_parallel_strategy=CPStrategy.RING,
            context_parallel_causal_load_balanced=bool(self.cp_axis),
            context_parallel_axis=self.cp_axis,
            stripe_size=1 if self.cp_axis else None,
        )


class LinenAttention(nnx.Module):
    """TE's Linen DotProductAttention from NNX, through Flax's bridge."""

    def __init__(self, *, cp_axis=""):
        layer = DotProductAttention(
            head_dim=D,
            num_attention_heads=HQ,
            num_gqa_groups=HKV,
            attn_mask_type="padding_causal",
            qkv_layout="thd_thd_thd",
            transpose_batch_sequence=False,
            max_segments_per_seq=SEGS,
            context_parallel_strategy="ring",
            context_parallel_axis=cp_axis,
            context_parallel_causal_load_balanced=bool(cp_axis),
        )
        self.layer = nnx.bridge.ToNNX(layer)  # no rngs: no dropout, no state

    def __call__(self, q, k, v, ids, pos):
        desc = SequenceDescriptor.from_segment_ids_and_pos(ids, pos)
        return self.layer(q, k, v, desc)


class PlainAttention(nnx.Module):
    """The same attention in plain JAX: the float32 reference, on any device."""

    def __call__(self, q, k, v, ids, pos):
        same = (ids[:, :, None] == ids[:, None, :]) & (ids[:, :, None] > 0)
        mask = (same & (pos[:, :, None] >= pos[:, None, :]))[:, None]
        return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=D**-0.5)


class Block(nnx.Module):
    """Projections in NNX around one of the attentions above."""

    def __init__(self, attention, *, dtype=jnp.bfloat16):
        rngs = nnx.Rngs(params=0)  # every Block starts from the same parameters
        self.q, self.k, self.v = (
            nnx.LinearGeneral(E, (h, D), dtype=dtype, rngs=rngs) for h in (HQ, HKV, HKV)
        )
        self.o = nnx.LinearGeneral((HQ, D), E, axis=(-2, -1), dtype=dtype, rngs=rngs)
        self.attention = attention

    def __call__(self, x, ids, pos):
        return self.o(self.attention(self.q(x), self.k(x), self.v(x), ids, pos))


@nnx.jit
def gradients(model, x, y, ids, pos):
    """The loss's gradients with respect to the model's parameters: an NNX State."""

    def loss_fn(model):
        out = model(x, ids, pos).astype(jnp.float32)
        return jnp.mean((out - y) ** 2)

    return nnx.grad(loss_fn)(model)


@jax.jit  # one compiled program per shape, rather than one per operation
def reorder(a):
    return reorder_causal_load_balancing(
        a, strategy=ReorderStrategy.Striped, cp_size=CP, seq_dim=1, stripe_size=1
    )


def rel_l2(grads, reference):
    """One relative L2 error over all leaves of two States, in float32."""
    pairs = list(zip(jax.tree.leaves(grads), jax.tree.leaves(reference)))
    diff = sum(float(jnp.sum((jnp.float32(a) - b) ** 2)) for a, b in pairs)
    return (diff / sum(float(jnp.sum(jnp.float32(b) ** 2)) for _, b in pairs)) ** 0.5


# two documents per row (80 + 48 tokens); the batch as the pipeline packs it
ids = jnp.asarray(np.tile(np.repeat([1, 2], [80, 48]), (B, 1)), jnp.int32)
pos = jnp.asarray(np.tile(np.r_[np.arange(80), np.arange(48)], (B, 1)), jnp.int32)
x, y = (jax.random.normal(k, (B, S, E)) for k in jax.random.split(jax.random.key(0)))
reference = gradients(Block(PlainAttention(), dtype=jnp.float32), x, y, ids, pos)

# reorder once, outside the model: every per-token array, the same way
mesh = Mesh(np.array(jax.devices()), ("cp",))
seq_sharded = NamedSharding(mesh, P(None, "cp"))
batch = [jax.device_put(reorder(a), seq_sharded) for a in (x, y, ids, pos)]
failed = False
for name, attention in (
    ("fused_attn in an nnx.Module", FusedAttention),
    ("TE's Linen layer via nnx.bridge", LinenAttention),
):
    with jax.set_mesh(mesh), te.autocast(mesh_resource=MeshResource(cp_resource="cp")):
        grads_cp = gradients(Block(attention(cp_axis="cp")), *batch)
    # ---------------------------------------------------------------------- self-check
    # The same block on one device, outside the mesh context, on the batch as packed.
    grads_one = gradients(Block(attention()), x, y, ids, pos)
    err_cp, err_one = rel_l2(grads_cp, reference), rel_l2(grads_one, reference)
    bound = max(2.5 * err_one, 1e-4)
    max_diff = max(
        float(jnp.max(jnp.abs(jnp.float32(a) - jnp.float32(b))))
        for a, b in zip(jax.tree.leaves(grads_cp), jax.tree.leaves(grads_one))
    )
    passed = err_cp <= bound and err_one <= 0.1
    print(f"Flax NNX, {name}, Ring, cp={CP}, bf16:")
    print(f"  max |CP - one device| over the State's gradients {max_diff:.3g}")
    print(
        f"  vs float32: CP {err_cp:.3g} {'<=' if passed else '> (FAILED)'} bound"
        f" {bound:.3g} (2.5 x one device {err_one:.3g})"
    )
    failed = failed or not passed
if failed:
    raise SystemExit("CP gradients are farther from float32 than bfloat16 explains")
