"""Run by test_compile_cache.py in its own process: the shared compilation cache on TE's CP
programs.

``python compile_cache_script.py CACHE_DIR MODE`` compiles three fresh jitted TE AllGather calls
on two devices, with the cache at CACHE_DIR: load balanced, not load balanced, load balanced
again. The two configurations lower to the same HLO except for the partition callback, so only
the key's fingerprint tells them apart. MODE ``safe`` uses compile_cache's key; ``blind`` gives
every partitioned op the same fingerprint, as a key that ignores TE's configuration would. Prints
one JSON line: per call, whether it was a persistent-cache hit and its output; and how many
programs were compiled without the cache (a host callback's).
"""

import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["TUTORIAL_TE_BACKEND"] = "te-cpu"
os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0"
)
os.environ["TUTORIAL_COMPILE_CACHE_DIR"] = sys.argv[1]

import compile_cache  # noqa: E402  (devtools/, on the path the test run gives)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

from tutorial_utils import te_on_cpu  # noqa: E402

compile_cache.enable(
    sys.argv[1]
)  # devtools/sitecustomize.py did already, if the run's variables were set

if sys.argv[2] == "blind":
    compile_cache._fingerprint = lambda info, global_state: "the same for every configuration"
te_on_cpu.install()
import transformer_engine.jax as te  # noqa: E402
from transformer_engine.jax.attention import (  # noqa: E402
    AttnBiasType,
    AttnMaskType,
    AttnSoftmaxType,
    CPStrategy,
    QKVLayout,
    fused_attn,
)
from transformer_engine.jax.sharding import MeshResource  # noqa: E402

hits = []
jax.monitoring.register_event_listener(
    lambda name, **_: hits.append(1) if name == "/jax/compilation_cache/cache_hits" else None
)

B, S, H, D = 1, 32, 2, 16
q, k, v = (
    jax.random.normal(key, (B, S, H, D)).astype(jnp.bfloat16)
    for key in jax.random.split(jax.random.PRNGKey(1), 3)
)
mesh = Mesh(np.array(jax.devices()), ("cp",))
shard = NamedSharding(mesh, P(None, "cp"))
q, k, v = (jax.device_put(x, shard) for x in (q, k, v))


def call(load_balanced: bool):
    def attend(q, k, v):  # a new function each time: no in-memory cache, the persistent one decides
        return fused_attn(
            (q, k, v),
            None,
            None,
            None,
            AttnBiasType.NO_BIAS,
            AttnMaskType.CAUSAL_MASK,
            QKVLayout.BSHD_BSHD_BSHD,
            AttnSoftmaxType.VANILLA_SOFTMAX,
            D**-0.5,
            0.0,
            False,
            context_parallel_strategy=CPStrategy.ALL_GATHER,
            context_parallel_causal_load_balanced=load_balanced,
            context_parallel_axis="cp",
        )

    before = len(hits)
    with jax.set_mesh(mesh), te.autocast(mesh_resource=MeshResource(cp_resource="cp")):
        out = jax.jit(attend, in_shardings=(shard,) * 3)(q, k, v)
    return {
        "load_balanced": load_balanced,
        "hit": len(hits) > before,
        "out": np.asarray(out.astype(jnp.float32)).round(4).ravel().tolist(),
    }


uncached = compile_cache._state["uncached"]
runs = [call(True), call(False), call(True)]
jax.jit(lambda x: jax.pure_callback(np.sin, x, x))(jnp.ones(3)).block_until_ready()
print(
    json.dumps(
        {
            "enabled": compile_cache._state["enabled"],
            "runs": runs,
            "uncached": compile_cache._state["uncached"] - uncached,
        }
    )
)
