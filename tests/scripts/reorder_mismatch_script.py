"""Run by test_device_counts.py in its own process (TE-on-CPU backend, 4 simulated devices)."""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["TUTORIAL_TE_BACKEND"] = "te-cpu"
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tutorial_utils.te as te
from tutorial_utils.inputs import pack_segments
from tutorial_utils.te.attention import *
from tutorial_utils.te.sharding import MeshResource

ids, pos = pack_segments([[30, 20], [64]], 64, align=32)
mesh = Mesh(np.array(jax.devices()[:4]), ("cp",))
sh = NamedSharding(mesh, P(None, "cp"))
q = jnp.zeros((2, 64, 2, 8), jnp.bfloat16)
k = jnp.zeros((2, 64, 1, 8), jnp.bfloat16)


def call(cp_reorder):
    ro = lambda x: reorder_causal_load_balancing(
        jnp.asarray(x), ReorderStrategy.Striped, cp_reorder, 1, 4
    )
    desc = SequenceDescriptor.from_segment_ids_and_pos(ro(ids), ro(pos))
    desc = jax.tree.map(
        lambda x: jax.device_put(x, sh if x.ndim == 2 else NamedSharding(mesh, P())), desc
    )
    qkv = tuple(
        jax.device_put(ro(x), NamedSharding(mesh, P(None, "cp", None, None))) for x in (q, k, k)
    )
    with jax.set_mesh(mesh), te.autocast(mesh_resource=MeshResource(cp_resource="cp")):
        return fused_attn(
            qkv,
            None,
            desc,
            None,
            AttnBiasType.NO_BIAS,
            AttnMaskType.PADDING_CAUSAL_MASK,
            QKVLayout.THD_THD_THD,
            AttnSoftmaxType.VANILLA_SOFTMAX,
            0.3,
            0.0,
            False,
            max_segments_per_seq=2,
            context_parallel_strategy=CPStrategy.ALL_GATHER,
            context_parallel_causal_load_balanced=True,
            context_parallel_axis="cp",
            stripe_size=4,
        )


print("cp4 ok", call(4).shape)
for cp in (2, 1):
    try:
        call(cp)
        print("cp", cp, "NOT RAISED")
    except ValueError as e:
        print("cp", cp, "->", str(e)[:200])
