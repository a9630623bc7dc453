"""Run by test_model.py in its own process: the model's loss and gradients with TE's own JAX code.

TE-on-CPU backend, 4 simulated devices, fp32 (``allow_fp32``; tracing happens inside it).
One device on the natural-order batch against a (dp=2, cp=2) mesh on the striped batch, for
Ring (stripe 1) and AllGather (stripe 2). Prints one JSON line of max abs differences.
"""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["TUTORIAL_TE_BACKEND"] = "te-cpu"
os.environ["NVTE_FUSED_RING_ATTENTION_USE_SCAN"] = (
    "0"  # TE's THD ring + window needs the unrolled loop
)

import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tutorial_utils.te as te
from tutorial_utils import model, te_on_cpu, text_data
from tutorial_utils.te.attention import CPStrategy
from tutorial_utils.te.sharding import MeshResource

config = model.ModelConfig(
    d_model=32,
    num_layers=1,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    max_segments_per_seq=4,
    window_size=(16, 0),
    dtype=jnp.float32,
)
params = model.init_params(config, jax.random.PRNGKey(0))
batch = text_data.pack_documents(
    text_data.load_documents(30),
    batch=2,
    seq_len=64,
    max_segments_per_seq=4,
    segment_len=13,
    align=4,
)


def value_and_grad(attn):
    return jax.value_and_grad(lambda p, *arrays: model.loss_fn(p, *arrays, config, attn))


with te_on_cpu.allow_fp32():
    loss0, grads0 = jax.jit(value_and_grad(model.NO_CP))(params, *batch.arrays())
mesh = Mesh(np.asarray(jax.devices()[:4]).reshape(2, 2), ("dp", "cp"))
data, replicated = NamedSharding(mesh, P("dp", "cp")), NamedSharding(mesh, P())
result = {"backend": te.backend_name()}
for name, strategy, stripe in (
    ("ring", CPStrategy.RING, 1),
    ("allgather", CPStrategy.ALL_GATHER, 2),
):
    striped = text_data.reorder_for_cp(
        batch, cp_size=2, stripe_size=stripe, strategy=name, window_size=config.window_size
    )
    with (
        te_on_cpu.allow_fp32(),
        jax.set_mesh(mesh),
        te.autocast(mesh_resource=MeshResource(dp_resource="dp", cp_resource="cp")),
    ):
        arrays = [jax.device_put(x, data) for x in striped.arrays()]
        step = jax.jit(
            value_and_grad(model.AttentionSharding(strategy, stripe)),
            in_shardings=(replicated,) + (data,) * 5,
            out_shardings=(replicated, replicated),
        )
        loss, grads = step(jax.device_put(params, replicated), *arrays)
    result[name] = {
        "loss": abs(float(loss) - float(loss0)),
        "grads": max(
            float(jnp.max(jnp.abs(a - b)))
            for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads0))
        ),
    }
print(json.dumps(result))
