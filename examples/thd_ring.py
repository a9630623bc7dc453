"""THD Ring attention, forward and backward, on a context-parallel mesh.

Packed rows (one document per 64-token slot, 48 valid tokens, padding whose positions
keep counting), GQA, a causal sliding window. Every per-token array is reordered for
load balancing and sharded over "cp" before the jitted call sees it. The self-check at
the end compares the CP step with the same step on one device.
"""

import os

# Ring with a sliding window takes TE's non-scan path
os.environ.setdefault("NVTE_FUSED_RING_ATTENTION_USE_SCAN", "0")

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

CP = len(jax.devices())
STRIPE = 1  # Ring takes stripe 1
WINDOW = (32, 0)  # and a left window >= CP - 1
B, S, HQ, HKV, D = 2, 256, 4, 2, 32
SLOT, VALID = 64, 48
if CP < 2:
    raise SystemExit(f"thd_ring.py needs >= 2 devices for a CP mesh, found {CP}")

slot = np.arange(S) // SLOT + 1
segment_ids = np.tile(slot * (np.arange(S) % SLOT < VALID), (B, 1))
segment_pos = np.tile(np.arange(S) % SLOT, (B, 1))
keys = jax.random.split(jax.random.PRNGKey(0), 4)
q, dout = (jax.random.normal(k, (B, S, HQ, D), jnp.bfloat16) for k in keys[:2])
k, v = (jax.random.normal(k, (B, S, HKV, D), jnp.bfloat16) for k in keys[2:])


def attention(q, k, v, ids, pos, cp_axis):
    """TE's fused attention on packed rows; ``cp_axis=""`` is the one-device call."""
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
        max_segments_per_seq=S // SLOT,
        window_size=WINDOW,
        context_parallel_strategy=CPStrategy.RING,
        context_parallel_causal_load_balanced=bool(cp_axis),
        context_parallel_axis=cp_axis,
        stripe_size=STRIPE if cp_axis else None,
    )


def step(q, k, v, ids, pos, dout, cp_axis):
    def loss(q, k, v):
        out = attention(q, k, v, ids, pos, cp_axis)
        return jnp.vdot(out.astype(jnp.float32), dout.astype(jnp.float32)), out

    return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)


@jax.jit  # one compiled program per shape, rather than one per operation
def reorder(x):
    return reorder_causal_load_balancing(
        jnp.asarray(x),
        strategy=ReorderStrategy.Striped,
        cp_size=CP,
        seq_dim=1,
        stripe_size=STRIPE,
    )


@jax.jit
def restore(x):
    return inverse_reorder_causal_load_balancing(
        x, strategy=ReorderStrategy.Striped, cp_size=CP, seq_dim=1, stripe_size=STRIPE
    )


@jax.jit
def compare(got, want):
    """max |CP - one device|, and whether each element is within TE's bf16 tolerance."""
    got, want = restore(got).astype(jnp.float32), want.astype(jnp.float32)
    diff = jnp.abs(got - want)
    return jnp.max(diff), jnp.all(diff <= 0.0394 * (1 + jnp.abs(want)))


# CP: reorder every per-token array alike, shard the sequence, call under the mesh
mesh = Mesh(np.array(jax.devices()), ("cp",))
seq_sharded = NamedSharding(mesh, P(None, "cp"))
per_token = (q, k, v, segment_ids, segment_pos, dout)
inputs = [jax.device_put(reorder(x), seq_sharded) for x in per_token]
with jax.set_mesh(mesh), te.autocast(mesh_resource=MeshResource(cp_resource="cp")):
    cp_step = jax.jit(step, static_argnums=6, in_shardings=(seq_sharded,) * 6)
    (_, out_cp), grads_cp = cp_step(*inputs, "cp")

# -------------------------------------------------------------------------- self-check
# The same step on one device, on the arrays as they are; TE's bf16 test tolerance.
(_, out_1), grads_1 = jax.jit(step, static_argnums=6)(
    q, k, v, segment_ids, segment_pos, dout, ""
)
errors, ok = {}, True
for name, got, want in zip(
    ("out", "dq", "dk", "dv"), (out_cp, *grads_cp), (out_1, *grads_1)
):
    err, within = compare(got, want)
    errors[name], ok = float(err), ok and bool(within)
summary = ", ".join(f"{n} {e:.3g}" for n, e in errors.items())
print(
    f"THD Ring, cp={CP}, stripe={STRIPE}, window={WINDOW}, bf16: max |CP - one device|"
)
print(f"  {summary}")
if not ok:
    raise SystemExit("CP differs from one device by more than TE's bf16 tolerance")
