"""TE's Flax DotProductAttention with context parallelism inside a small Flax module,
one optax step.

This is the path MaxText takes: the layer gets
context_parallel_strategy/axis/causal_load_balanced and max_segments_per_seq; the batch
is reordered once, before the step. The CP step (Ring) is checked against the same step
on one device: loss, gradients and updated parameters. Then AllGather with THD is tried
through the same layer, and TE's own error is printed: the layer has no stripe_size
argument, and TE's THD AllGather path requires one (call fused_attn directly for
AllGather).
"""

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
    raise SystemExit(
        f"flax_dot_product_attention.py needs >= 2 devices for a CP mesh, found {CP}"
    )


class Block(nn.Module):
    cp_axis: str = ""
    strategy: str = "RING"

    @nn.compact
    def __call__(self, x, ids, pos):
        dense = lambda h, name: nn.DenseGeneral((h, D), dtype=jnp.bfloat16, name=name)(
            x
        )  # noqa: E731
        attn = DotProductAttention(
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
        out = attn(
            dense(HQ, "q"),
            dense(HKV, "k"),
            dense(HKV, "v"),
            SequenceDescriptor.from_segment_ids_and_pos(ids, pos),
        )
        return nn.DenseGeneral(E, axis=(-2, -1), dtype=jnp.bfloat16, name="out")(out)


# two documents per row (80 + 48 tokens), no padding; inputs, targets and the loss mask
# travel together
ids = jnp.asarray(np.tile(np.repeat([1, 2], [80, 48]), (B, 1)), jnp.int32)
pos = jnp.asarray(
    np.tile(np.concatenate([np.arange(80), np.arange(48)]), (B, 1)), jnp.int32
)
x, y = (
    jax.random.normal(k, (B, S, E)) for k in jax.random.split(jax.random.PRNGKey(0), 2)
)
params = jax.jit(Block().init)(jax.random.PRNGKey(1), x, ids, pos)
opt = optax.sgd(
    0.1
)  # SGD: the update is proportional to the gradient, so the check is strict


def make_step(model):
    def step(params, x, y, ids, pos):
        loss_fn = lambda p: jnp.mean(
            (model.apply(p, x, ids, pos).astype(jnp.float32) - y) ** 2
        )  # noqa: E731
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, _ = opt.update(grads, opt.init(params), params)
        return loss, grads, optax.apply_updates(params, updates)

    return jax.jit(step)


one = make_step(Block())(params, x, y, ids, pos)
mesh = Mesh(np.array(jax.devices()), ("cp",))
shard = lambda a: jax.device_put(
    reorder_causal_load_balancing(
        jnp.asarray(a), strategy=ReorderStrategy.Striped, cp_size=CP, seq_dim=1
    ),
    NamedSharding(mesh, P(None, "cp")),
)  # noqa: E731
batch = [
    shard(a) for a in (x, y, ids, pos)
]  # reorder once: every per-token array, the same way
with jax.set_mesh(mesh), te.autocast(mesh_resource=MeshResource(cp_resource="cp")):
    cp = make_step(Block(cp_axis="cp", strategy="RING"))(params, *batch)
    err = [
        float(
            np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)))
        )  # on the host
        for part in (1, 2)
        for a, b in zip(jax.tree.leaves(cp[part]), jax.tree.leaves(one[part]))
    ]
    print(
        f"Flax DotProductAttention, Ring, cp={CP}, bf16: loss {float(cp[0]):.5f} vs one"
        f" device {float(one[0]):.5f}; max |CP - one device| over gradients"
        f" {max(err[: len(err) // 2]):.3g}, updated parameters"
        f" {max(err[len(err) // 2 :]):.3g}"
    )
    assert (
        abs(float(cp[0]) - float(one[0])) < 1e-2 * abs(float(one[0]))
        and max(err) < 0.05
    ), err
    try:
        make_step(Block(cp_axis="cp", strategy="ALL_GATHER"))(params, *batch)
        print("AllGather THD through the Flax layer ran")
    except Exception as e:  # noqa: BLE001 - printing TE's own error is the point
        te_error = [
            line
            for line in str(e).splitlines()
            if line.startswith(("ValueError", "AssertionError"))
        ]
        print(
            f"AllGather THD through the Flax layer: {type(e).__name__} from TE's"
            " partitioner:",
            te_error[-1] if te_error else str(e)[:300],
        )
