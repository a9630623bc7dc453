"""A decoder block of TE's own Flax layers with context parallelism, checked against
one device.

TE's LayerNorm, DenseGeneral and LayerNormMLP around its DotProductAttention, the one
TE layer that takes the CP arguments (MultiHeadAttention and TransformerLayer pass none
on). THD packed rows are reordered once, outside the model; Ring runs on a `cp` mesh
over every device. The check: the parameter gradients of the CP run and of one device,
both in bfloat16, each as a relative L2 error from a float32 one-device reference; CP
passes when its error is at most 2.5 times one device's (or 1e-4). cuDNN has no float32
attention, so the reference runs TE's unfused attention (NVTE_FUSED_ATTN=0) on a dense
mask built from the same segment ids and positions.
"""

import os
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import transformer_engine.jax as te
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from transformer_engine.jax.attention import (
    ReorderStrategy,
    SequenceDescriptor,
    reorder_causal_load_balancing,
)
from transformer_engine.jax.flax import (
    DenseGeneral,
    DotProductAttention,
    LayerNorm,
    LayerNormMLP,
)
from transformer_engine.jax.sharding import MeshResource

CP, B, S, E, HQ, HKV, D, SEGS = len(jax.devices()), 2, 256, 64, 4, 2, 16, 3
if CP < 2:
    raise SystemExit(f"te_decoder_block.py needs >= 2 devices, found {CP}")


class DecoderBlock(nn.Module):
    cp_axis: str = ""

    @nn.compact
    def __call__(self, x, ids, pos, mask=None):
        h = LayerNorm(layernorm_type="rmsnorm", name="attn_norm")(x)
        q, k, v = (
            DenseGeneral(features=(heads, D), name=name)(h)
            for heads, name in ((HQ, "q"), (HKV, "k"), (HKV, "v"))
        )
        attention = DotProductAttention(
            head_dim=D,
            num_attention_heads=HQ,
            num_gqa_groups=HKV,
            attn_mask_type="padding_causal",
            qkv_layout="thd_thd_thd",
            transpose_batch_sequence=False,
            max_segments_per_seq=SEGS,
            context_parallel_strategy="ring",
            context_parallel_axis=self.cp_axis,
            context_parallel_causal_load_balanced=bool(self.cp_axis),
        )
        desc = SequenceDescriptor.from_segment_ids_and_pos(ids, pos)
        out = attention(q, k, v, desc if mask is None else mask)
        x = x + DenseGeneral(features=E, axis=(-2, -1), name="out")(out)
        mlp, _ = LayerNormMLP(
            intermediate_dim=2 * E,
            layernorm_type="rmsnorm",
            activations=("silu", "linear"),
            name="mlp",
        )(x, deterministic=True)
        return x + mlp


# three documents per row (112 + 80 + 64 tokens); inputs, targets, ids, positions
lens = [112, 80, 64]
ids = jnp.asarray(np.tile(np.repeat([1, 2, 3], lens), (B, 1)), jnp.int32)
pos = jnp.asarray(np.tile(np.concatenate([np.arange(n) for n in lens]), (B, 1)))
x, y = (
    jax.random.normal(k, (B, S, E)) for k in jax.random.split(jax.random.PRNGKey(0))
)
init = jax.jit(DecoderBlock().init)
params = nn.meta.unbox(init(jax.random.PRNGKey(1), x.astype(jnp.bfloat16), ids, pos))


def loss_and_grads(model, dtype):
    def loss_fn(params, x, y, ids, pos, mask=None):
        out = model.apply(params, x.astype(dtype), ids, pos, mask)
        return jnp.mean((out.astype(jnp.float32) - y) ** 2)

    return jax.jit(jax.value_and_grad(loss_fn))


def reorder(a, mesh):
    """Stripe a per-token array for the cp ranks and shard its sequence axis."""
    a = reorder_causal_load_balancing(
        jnp.asarray(a), strategy=ReorderStrategy.Striped, cp_size=CP, seq_dim=1
    )
    return jax.device_put(a, NamedSharding(mesh, P(None, "cp")))


# reorder once, in the pipeline: every per-token array, the same way
mesh = Mesh(np.array(jax.devices()), ("cp",))
batch = [reorder(a, mesh) for a in (x, y, ids, pos)]
with jax.set_mesh(mesh), te.autocast(mesh_resource=MeshResource(cp_resource="cp")):
    run_cp = loss_and_grads(DecoderBlock(cp_axis="cp"), jnp.bfloat16)
    loss_cp, grads_cp = run_cp(params, *batch)

# -------------------------------------------------------------------------- self-check
# One device in bfloat16, and the float32 reference: TE's unfused attention, whose dense
# mask (1 = masked out) lets each token see the earlier tokens of its own document.
loss_1, grads_1 = loss_and_grads(DecoderBlock(), jnp.bfloat16)(params, x, y, ids, pos)
sees = (ids[:, :, None] == ids[:, None, :]) & (pos[:, None, :] <= pos[:, :, None])
mask = (~sees).astype(jnp.uint8)[:, None]
os.environ["NVTE_FUSED_ATTN"] = "0"  # read when the layer is traced
warnings.filterwarnings("ignore", "Using unfused JAX softmax")  # TE's, for float32
loss_ref, grads_ref = loss_and_grads(DecoderBlock(), jnp.float32)(
    params, x, y, ids, pos, mask
)


def rel_l2(grads, reference):
    """One relative L2 error over all gradient leaves together, in float32."""
    pairs = list(zip(jax.tree.leaves(grads), jax.tree.leaves(reference)))
    diff = sum(float(jnp.sum((jnp.float32(a) - b) ** 2)) for a, b in pairs)
    return (diff / sum(float(jnp.sum(jnp.float32(b) ** 2)) for _, b in pairs)) ** 0.5


err_cp, err_one = rel_l2(grads_cp, grads_ref), rel_l2(grads_1, grads_ref)
bound = max(2.5 * err_one, 1e-4)
max_diff = max(
    float(jnp.max(jnp.abs(a - b)))
    for a, b in zip(jax.tree.leaves(grads_cp), jax.tree.leaves(grads_1))
)
losses = f"loss {float(loss_cp):.5f} vs one device {float(loss_1):.5f}"
errors = f"CP {err_cp:.3g}, one device {err_one:.3g}, bound {bound:.3g}"
print(f"TE decoder block, Ring, cp={CP}, bf16: {losses}")
print(f"  (float32 {float(loss_ref):.5f}); max |CP - one device|", end=" ")
print(f"over gradients {max_diff:.3g};\n  gradient error vs float32: {errors}")
print("  (CP may be 2.5 x one device's error, at least 1e-4)")
if not (err_cp <= bound and err_one <= 0.1):
    raise SystemExit(
        f"gradient error: CP {err_cp:.3g}, one device {err_one:.3g}, bound {bound:.3g}:"
        " is every per-token array reordered once, the same way, for this mesh?"
    )
