"""One process per device with jax.distributed: THD Ring attention across processes,
checked against one device.

Without PROCESS_ID in the environment the script is its own launcher: it starts one copy
of its command line per device of this node (PROCESS_ID, NUM_PROCESSES, COORDINATOR_PORT
set) and waits. On CPU each process owns one host device and talks gloo; on a GPU node,
one GPU. Every process places its shard of the same global batch; process 0 compares the
gathered result with its own one-device call.
"""

import functools
import os
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import transformer_engine.jax as te
from jax.experimental.multihost_utils import process_allgather
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
    inverse_reorder_causal_load_balancing,
    reorder_causal_load_balancing,
)
from transformer_engine.jax.sharding import MeshResource

rank, n, port = (
    int(os.environ.get(var, -1))
    for var in ("PROCESS_ID", "NUM_PROCESSES", "COORDINATOR_PORT")
)
on_cpu = os.environ.get("JAX_PLATFORMS", "").startswith("cpu")
if rank < 0:  # the launcher: one copy of this command line per device
    n = n if n > 0 else jax.local_device_count()
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
    env = dict(os.environ, NUM_PROCESSES=str(n), COORDINATOR_PORT=str(port))
    procs = [
        subprocess.Popen(
            [sys.executable, *sys.orig_argv[1:]], env=dict(env, PROCESS_ID=str(i))
        )
        for i in range(n)
    ]
    while all(p.poll() in (None, 0) for p in procs) and any(
        p.poll() is None for p in procs
    ):
        time.sleep(0.5)
    [
        p.kill() for p in procs if p.poll() is None
    ]  # one failed: stop the others, never leave them waiting
    sys.exit(max((p.wait() for p in procs), key=abs))

if on_cpu:
    jax.config.update("jax_num_cpu_devices", 1)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    f"127.0.0.1:{port}",
    n,
    rank,
    local_device_ids=None if on_cpu else [rank],
    initialization_timeout=120,
)
CP, B, S, HQ, HKV, D, SLOT = jax.device_count(), 2, 128, 4, 2, 16, 32
ids = np.tile(
    np.repeat(np.arange(1, S // SLOT + 1), SLOT) * (np.arange(S) % SLOT < 24), (B, 1)
).astype(np.int32)
pos = np.tile(np.arange(S) % SLOT, (B, 1)).astype(np.int32)
keys = jax.random.split(
    jax.random.PRNGKey(0), 4
)  # the same global batch in every process
q, k, v, dout = (
    jax.random.normal(kk, (B, S, h, D)).astype(jnp.bfloat16)
    for kk, h in zip(keys, (HQ, HKV, HKV, HQ))
)


def fwd_bwd(q, k, v, ids, pos, dout, cp_axis):
    def loss(q, k, v):
        out = fused_attn(
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
            max_segments_per_seq=S // SLOT,
            context_parallel_strategy=CPStrategy.RING,
            context_parallel_axis=cp_axis,
            context_parallel_causal_load_balanced=bool(cp_axis),
            stripe_size=1 if cp_axis else None,
        )
        return jnp.vdot(out.astype(jnp.float32), dout.astype(jnp.float32)), out

    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return out, *grads


mesh, stripe = (
    Mesh(np.array(jax.devices()), ("cp",)),
    dict(strategy=ReorderStrategy.Striped, cp_size=CP, seq_dim=1),
)
reorder, restore = (  # jitted: one program per shape, not one per operation
    jax.jit(functools.partial(f, **stripe))
    for f in (reorder_causal_load_balancing, inverse_reorder_causal_load_balancing)
)
shard = NamedSharding(mesh, P(None, "cp"))
local = [np.asarray(reorder(x)) for x in (q, k, v, ids, pos, dout)]
glob = [
    jax.make_array_from_callback(x.shape, shard, lambda i, x=x: x[i]) for x in local
]
with jax.set_mesh(mesh), te.autocast(mesh_resource=MeshResource(cp_resource="cp")):
    cp = jax.jit(fwd_bwd, static_argnums=6, in_shardings=(shard,) * 6)(*glob, "cp")
cp = [restore(process_allgather(x, tiled=True)) for x in cp]
ok = True
if rank == 0:  # process 0 alone runs the one-device call, on its own device
    one = jax.jit(fwd_bwd, static_argnums=6)(q, k, v, ids, pos, dout, "")
    err = {
        n: float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
        for n, a, b in zip(("out", "dq", "dk", "dv"), cp, one)
    }
    print(
        f"{n} processes, THD Ring over {CP} devices, bf16: max |CP - one device|\n  "
        + ", ".join(f"{n} {e:.3g}" for n, e in err.items()),
        flush=True,
    )
    ok = max(err.values()) < 0.05  # bf16: a few units in the last place
jax.distributed.shutdown()
sys.exit(0 if ok else 1)
