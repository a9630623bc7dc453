"""THD AllGather attention with striped load balancing (stripe 4), forward and backward,
checked against one device.

Packed rows (four documents per row, one per 64-token slot, padding whose positions keep
counting),
GQA, causal sliding window. Every per-token array is reordered for load balancing and
placed
on the mesh with the sequence axis sharded over "cp" before the jitted call sees it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import transformer_engine.jax as te
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

CP, STRIPE, WINDOW = (
    len(jax.devices()),
    4,
    (32, 0),
)  # AllGather takes any stripe dividing S / CP
B, S, HQ, HKV, D, SLOT, VALID = 2, 256, 4, 2, 32, 64, 48
if CP < 2:
    raise SystemExit(
        f"thd_allgather_striped.py needs >= 2 devices for a CP mesh, found {CP}"
    )

# one document per 64-token slot, 48 valid tokens, padding positions keep counting;
# AllGather needs every
# slot to start at a multiple of CP * STRIPE (64 is one for CP <= 16 at stripe 4)
segment_ids = np.tile(
    np.repeat(np.arange(1, S // SLOT + 1), SLOT) * (np.arange(S) % SLOT < VALID), (B, 1)
)
segment_pos = np.tile(np.arange(S) % SLOT, (B, 1))
keys = jax.random.split(jax.random.PRNGKey(0), 4)
q, dout = (jax.random.normal(k, (B, S, HQ, D)).astype(jnp.bfloat16) for k in keys[:2])
k, v = (jax.random.normal(k, (B, S, HKV, D)).astype(jnp.bfloat16) for k in keys[2:])


def loss_fn(q, k, v, ids, pos, dout, cp_axis):
    out = fused_attn(
        (q, k, v),
        None,
        SequenceDescriptor.from_segment_ids_and_pos(ids, pos),
        None,
        AttnBiasType.NO_BIAS,
        AttnMaskType.PADDING_CAUSAL_MASK,
        QKVLayout.THD_THD_THD,
        AttnSoftmaxType.VANILLA_SOFTMAX,
        D**-0.5,
        0.0,
        True,
        max_segments_per_seq=S // SLOT,
        window_size=WINDOW,
        context_parallel_strategy=CPStrategy.ALL_GATHER,
        context_parallel_causal_load_balanced=bool(cp_axis),
        context_parallel_axis=cp_axis,
        stripe_size=STRIPE if cp_axis else None,
    )
    return jnp.vdot(out.astype(jnp.float32), dout.astype(jnp.float32)), out


def fwd_bwd(cp_axis):
    return jax.value_and_grad(
        lambda *a: loss_fn(*a, cp_axis), argnums=(0, 1, 2), has_aux=True
    )


# one device: the plain call on the arrays as they are
(_, out_1), grads_1 = jax.jit(fwd_bwd(""))(q, k, v, segment_ids, segment_pos, dout)

# CP: reorder every per-token array the same way, shard the sequence axis, call under
# the mesh
mesh = Mesh(np.array(jax.devices()), ("cp",))
shard = NamedSharding(mesh, P(None, "cp"))
reorder = lambda x: jax.device_put(
    reorder_causal_load_balancing(
        jnp.asarray(x), ReorderStrategy.Striped, CP, 1, STRIPE
    ),
    shard,
)  # noqa: E731
restore = lambda x: inverse_reorder_causal_load_balancing(
    x, ReorderStrategy.Striped, CP, 1, STRIPE
)  # noqa: E731
with jax.set_mesh(mesh), te.autocast(mesh_resource=MeshResource(cp_resource="cp")):
    (_, out_cp), grads_cp = jax.jit(fwd_bwd("cp"), in_shardings=(shard,) * 6)(
        *(reorder(x) for x in (q, k, v, segment_ids, segment_pos, dout))
    )

errors, ok = {}, True
for name, a, b in zip(
    ("out", "dq", "dk", "dv"), (out_cp, *grads_cp), (out_1, *grads_1)
):
    a, b = restore(a).astype(jnp.float32), b.astype(jnp.float32)
    errors[name] = float(jnp.max(jnp.abs(a - b)))
    ok &= bool(
        jnp.all(jnp.abs(a - b) <= 0.0394 * (1 + jnp.abs(b)))
    )  # TE's bf16 test tolerance (atol = rtol)
print(
    f"THD AllGather, cp={CP}, stripe={STRIPE}, window={WINDOW}, bf16: max |CP - one"
    " device|",
    ", ".join(f"{n} {e:.3g}" for n, e in errors.items()),
)
if not ok:
    raise SystemExit("CP differs from one device by more than TE's bf16 tolerance")
