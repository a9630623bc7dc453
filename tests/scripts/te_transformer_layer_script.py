"""Run by tests/te_on_cpu/test_te_layers.py through ``python -m tutorial_utils.te_on_cpu``.

TE's own ``TransformerLayer`` (norms, fused QKV, RoPE, GQA attention, SwiGLU MLP) on CPU:
its loss and parameter gradients on one device, then data-parallel with the batch sharded
over every device, compared. Then each FP8/FP4 recipe under ``te.autocast``, and the line
TE refuses it with. Prints one ``key: value`` line per result.
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import transformer_engine.jax as te
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from transformer_engine.common import recipe
from transformer_engine.jax.cpp_extensions.attention import FusedAttnFwdPrimitive
from transformer_engine.jax.cpp_extensions.normalization import NormFwdPrimitive
from transformer_engine.jax.flax import DenseGeneral, TransformerLayer, TransformerLayerType
from transformer_engine.jax.sharding import MeshResource

print(f"NVTE_JAX_CUSTOM_CALLS: {os.environ.get('NVTE_JAX_CUSTOM_CALLS')}")  # the runner's
N, S, E = len(jax.devices()), 128, 64
layer = TransformerLayer(
    hidden_size=E,
    mlp_hidden_size=2 * E,
    num_attention_heads=4,
    num_gqa_groups=2,
    layernorm_type="rmsnorm",
    mlp_activations=("silu", "linear"),
    hidden_dropout=0.0,
    attention_dropout=0.0,
    layer_type=TransformerLayerType.ENCODER,  # self-attention only: a decoder-only block
    self_attn_mask_type="causal",
    enable_relative_embedding=False,
    enable_rotary_pos_emb=True,
    transpose_batch_sequence=False,
)
x, y = (jax.random.normal(k, (2 * N, S, E)) for k in jax.random.split(jax.random.PRNGKey(0)))
x = x.astype(jnp.bfloat16)
params = jax.jit(functools.partial(layer.init, deterministic=True))(jax.random.PRNGKey(1), x)


def loss_fn(params, x, y):
    out = layer.apply(params, x, deterministic=True)
    return jnp.mean((out.astype(jnp.float32) - y) ** 2)


jaxpr = str(jax.make_jaxpr(jax.grad(loss_fn))(params, x, y))
for kind, primitive in (("attention", FusedAttnFwdPrimitive), ("norm", NormFwdPrimitive)):
    print(f"{kind} through TE's custom call: {primitive.outer_primitive.name in jaxpr}")
step = jax.jit(jax.value_and_grad(loss_fn))
loss_1, grads_1 = step(params, x, y)
print(f"one device: loss {float(loss_1):.6f}")

mesh = Mesh(np.array(jax.devices()), ("dp",))
batch = [jax.device_put(a, NamedSharding(mesh, P("dp"))) for a in (x, y)]
with jax.set_mesh(mesh), te.autocast(mesh_resource=MeshResource(dp_resource="dp")):
    loss_dp, grads_dp = jax.jit(jax.value_and_grad(loss_fn))(params, *batch)
diff = max(
    float(jnp.max(jnp.abs(jnp.float32(a) - jnp.float32(b))))
    for a, b in zip(jax.tree.leaves(grads_dp), jax.tree.leaves(grads_1))
)
scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads_1))
print(f"data-parallel dp={N}: loss {float(loss_dp):.6f}")
print(f"max |dp - one device| over gradients: {diff:.3g} (largest gradient {scale:.3g})")
print(f"gradient leaves: {len(jax.tree.leaves(grads_1))}")

for name in ("DelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling", "NVFP4BlockScaling"):
    try:
        with te.autocast(enabled=True, recipe=getattr(recipe, name)()):
            DenseGeneral(features=E).init(jax.random.PRNGKey(2), x)
        print(f"{name}: ran")
    except AssertionError as err:
        print(f"{name}: AssertionError: {err}")
