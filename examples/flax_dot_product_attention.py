"""TE's Flax DotProductAttention with context parallelism in a small Flax module, one
optax step.

This is the path MaxText takes: the layer gets the CP strategy, axis and load balancing
and max_segments_per_seq; the batch is reordered once, before the step. The self-check
at the end compares the CP step (Ring) with the same step on one device (loss,
gradients, updated parameters), then asks the layer for THD AllGather and prints TE's
refusal: the layer takes no stripe_size (call fused_attn directly for AllGather).
"""

import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import transformer_engine.jax as te
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from transformer_engine.jax.attention import (
    ReorderStrategy,
    SequenceDescriptor,
    reorder_causal_load_balancing,
)
from transformer_engine.jax.flax import DotProductAttention
from transformer_engine.jax.sharding import MeshResource

CP, B, S, E, HQ, HKV, D, SEGS = len(jax.devices()), 2, 128, 32, 4, 2, 16, 2
if CP < 2:
    raise SystemExit(f"flax_dot_product_attention.py needs >= 2 devices, found {CP}")


class Block(nn.Module):
    cp_axis: str = ""
    strategy: str = "ring"

    @nn.compact
    def __call__(self, x, ids, pos):
        def dense(heads, name):
            return nn.DenseGeneral((heads, D), dtype=jnp.bfloat16, name=name)(x)

        attention = DotProductAttention(
            head_dim=D,
            num_attention_heads=HQ,
            num_gqa_groups=HKV,
            attn_mask_type="padding_causal",
            qkv_layout="thd_thd_thd",
            transpose_batch_sequence=False,
            max_segments_per_seq=SEGS,
            context_parallel_strategy=self.strategy,
            context_parallel_axis=self.cp_axis,
            context_parallel_causal_load_balanced=bool(self.cp_axis),
        )
        desc = SequenceDescriptor.from_segment_ids_and_pos(ids, pos)
        out = attention(dense(HQ, "q"), dense(HKV, "k"), dense(HKV, "v"), desc)
        return nn.DenseGeneral(E, axis=(-2, -1), dtype=jnp.bfloat16, name="out")(out)


# two documents per row (80 + 48 tokens); inputs, targets and positions travel together
ids = jnp.asarray(np.tile(np.repeat([1, 2], [80, 48]), (B, 1)), jnp.int32)
pos = jnp.asarray(np.tile(np.r_[np.arange(80), np.arange(48)], (B, 1)), jnp.int32)
x, y = (
    jax.random.normal(k, (B, S, E)) for k in jax.random.split(jax.random.PRNGKey(0))
)
params = jax.jit(Block().init)(jax.random.PRNGKey(1), x, ids, pos)
opt = optax.sgd(0.1)  # the update is proportional to the gradient: a strict check


def make_step(model):
    def loss_fn(params, x, y, ids, pos):
        out = model.apply(params, x, ids, pos).astype(jnp.float32)
        return jnp.mean((out - y) ** 2)

    def step(params, x, y, ids, pos):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, ids, pos)
        updates, _ = opt.update(grads, opt.init(params), params)
        return loss, grads, optax.apply_updates(params, updates)

    return jax.jit(step)


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
    loss_cp, grads_cp, params_cp = make_step(Block(cp_axis="cp"))(params, *batch)

# -------------------------------------------------------------------------- self-check
# The same step on one device, outside the mesh context; max errors on the host.
loss_1, grads_1, params_1 = make_step(Block())(params, x, y, ids, pos)


def max_err(a, b):
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b))
    return max(float(np.max(np.abs(np.float32(u) - np.float32(v)))) for u, v in pairs)


err_grads, err_params = max_err(grads_cp, grads_1), max_err(params_cp, params_1)
print(
    f"Flax DotProductAttention, Ring, cp={CP}, bf16: loss {float(loss_cp):.5f}",
    f"vs one device {float(loss_1):.5f};\n  max |CP - one device| over gradients",
    f"{err_grads:.3g}, updated parameters {err_params:.3g}",
)
close = abs(float(loss_cp) - float(loss_1)) < 1e-2 * abs(float(loss_1))
if not (close and max(err_grads, err_params) < 0.05):
    raise SystemExit("CP differs from one device by more than the step's tolerance")

try:  # THD AllGather through the layer: TE refuses in its partitioner
    with jax.set_mesh(mesh), te.autocast(mesh_resource=MeshResource(cp_resource="cp")):
        make_step(Block(cp_axis="cp", strategy="all_gather"))(params, *batch)
    print("AllGather THD through the Flax layer ran")
except Exception as err:  # noqa: BLE001 - printing TE's own error is the point
    lines = str(err).splitlines()
    te_error = [ln for ln in lines if ln.startswith(("ValueError", "AssertionError"))]
    name = type(err).__name__
    print(f"AllGather THD through the Flax layer: {name} from TE's partitioner:")
    message = te_error[-1] if te_error else str(err)[:300]
    print(textwrap.fill(message, 88, initial_indent="  ", subsequent_indent="  "))
