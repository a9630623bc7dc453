"""CP with data parallelism, FSDP and tensor parallelism: THD Ring attention on a
2 x 2 x 2 mesh, forward and backward.

The batch is sharded over "dp" (or "fsdp"), the heads over "tp", the sequence over
"cp". Packed rows (one document per 64-token slot, 48 valid tokens, padding whose
positions keep counting), GQA with q heads and kv heads both divisible by tp. Every
per-token array is reordered for load balancing once, before it is sharded. The same
attention runs two ways: TE's fused_attn on a ("dp", "tp", "cp") mesh, and TE's Flax
DotProductAttention on an ("fsdp", "tp", "cp") mesh; attention has no weights, so for
it FSDP shards the batch exactly as DP does. The self-check at the end compares both
with the same step on one device.
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
from transformer_engine.jax.flax import DotProductAttention
from transformer_engine.jax.sharding import MeshResource

DP, TP, CP = 2, 2, 2  # batch, heads, sequence
STRIPE = 1  # Ring takes stripe 1
B, S, HQ, HKV, D = 4, 256, 4, 2, 32  # B % DP == HQ % TP == HKV % TP == 0
SLOT, VALID = 64, 48
if len(jax.devices()) < DP * TP * CP:
    raise SystemExit(
        f"cp_dp_fsdp_tp.py needs {DP * TP * CP} devices for a {DP} x {TP} x {CP} mesh,"
        f" found {len(jax.devices())}"
    )

slot = np.arange(S) // SLOT + 1
segment_ids = np.tile(slot * (np.arange(S) % SLOT < VALID), (B, 1))
segment_pos = np.tile(np.arange(S) % SLOT, (B, 1))
keys = jax.random.split(jax.random.PRNGKey(0), 4)
q, dout = (jax.random.normal(k, (B, S, HQ, D), jnp.bfloat16) for k in keys[:2])
k, v = (jax.random.normal(k, (B, S, HKV, D), jnp.bfloat16) for k in keys[2:])


def fused(q, k, v, ids, pos, cp_axis):
    """TE's fused attention on packed rows; ``cp_axis=""`` is the one-device call."""
    return fused_attn(
        qkv=(q, k, v),
        bias=None,
        sequence_descriptor=SequenceDescriptor.from_segment_ids_and_pos(
            segment_ids=ids, segment_pos=pos
        ),
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
        context_parallel_causal_load_balanced=bool(cp_axis),
        context_parallel_axis=cp_axis,
        stripe_size=STRIPE if cp_axis else None,
    )


def flax_layer(q, k, v, ids, pos, cp_axis):
    """TE's Flax layer, the same attention; it has no parameters, hence ``{}``."""
    layer = DotProductAttention(
        head_dim=D,
        num_attention_heads=HQ,
        num_gqa_groups=HKV,
        attn_mask_type="padding_causal",
        qkv_layout="thd_thd_thd",
        scale_factor=D**-0.5,
        transpose_batch_sequence=False,
        max_segments_per_seq=S // SLOT,
        context_parallel_strategy="ring",
        context_parallel_axis=cp_axis,
        context_parallel_causal_load_balanced=bool(cp_axis),
    )
    return layer.apply(
        {},
        query=q,
        key=k,
        value=v,
        sequence_descriptor=SequenceDescriptor.from_segment_ids_and_pos(
            segment_ids=ids, segment_pos=pos
        ),
    )


def step(attend, q, k, v, ids, pos, dout, cp_axis):
    def loss(q, k, v):
        out = attend(q, k, v, ids, pos, cp_axis)
        # an elementwise loss keeps out's sharding (jnp.vdot would flatten, gathering)
        return jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32)), out

    return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)


@jax.jit  # one compiled program per shape, rather than one per operation
def reorder(x):
    return reorder_causal_load_balancing(
        x, strategy=ReorderStrategy.Striped, cp_size=CP, seq_dim=1, stripe_size=STRIPE
    )


@jax.jit
def compare(got, want):
    """max |CP - one device|, all within TE's bf16 tolerance?, relative L2 error."""
    got = inverse_reorder_causal_load_balancing(
        got, strategy=ReorderStrategy.Striped, cp_size=CP, seq_dim=1, stripe_size=STRIPE
    ).astype(jnp.float32)
    want = want.astype(jnp.float32)
    diff = jnp.abs(got - want)
    within = jnp.all(diff <= 0.0394 * (1 + jnp.abs(want)))
    return jnp.max(diff), within, jnp.linalg.norm(got - want) / jnp.linalg.norm(want)


# Reorder every per-token array alike, once, before sharding; then shard the batch over
# the data axis, the sequence over "cp", the heads of q, k, v and dout over "tp". TE
# takes each operand's sharding as it comes: k and v must be sharded over "tp" like q.
per_token = [reorder(x) for x in (q, k, v, segment_ids, segment_pos, dout)]
devices = np.array(jax.devices()[: DP * TP * CP]).reshape(DP, TP, CP)
ways = (
    (fused, "dp", MeshResource(dp_resource="dp", tp_resource="tp", cp_resource="cp")),
    (
        flax_layer,
        "fsdp",
        MeshResource(tp_resource="tp", fsdp_resource="fsdp", cp_resource="cp"),
    ),
)
results = {}
for attend, data_axis, resource in ways:
    mesh = Mesh(devices, (data_axis, "tp", "cp"))
    heads = NamedSharding(mesh, P(data_axis, "cp", "tp", None))  # q, k, v, dout
    tokens = NamedSharding(mesh, P(data_axis, "cp"))  # segment ids and positions
    shardings = (heads, heads, heads, tokens, tokens, heads)
    inputs = [jax.device_put(x, s) for x, s in zip(per_token, shardings)]
    with jax.set_mesh(mesh), te.autocast(mesh_resource=resource):
        cp_step = jax.jit(step, static_argnums=(0, 7), in_shardings=shardings)
        (_, out_cp), grads_cp = cp_step(attend, *inputs, "cp")
    results[attend] = (out_cp, *grads_cp)
block = out_cp.sharding.shard_shape(out_cp.shape)

# -------------------------------------------------------------------------- self-check
# The same step on one device, outside the mesh, on the arrays as they are (compare).
ok, parts = True, []
for attend, label in ((fused, "fused_attn (dp)"), (flax_layer, "Flax layer (fsdp)")):
    (_, out_1), grads_1 = jax.jit(step, static_argnums=(0, 7))(
        attend, q, k, v, segment_ids, segment_pos, dout, ""
    )
    errors, rel_l2 = [], []
    for name, got, want in zip(
        ("out", "dq", "dk", "dv"), results[attend], (out_1, *grads_1)
    ):
        err, within, rel = compare(got, want)
        ok &= bool(within)
        errors.append(f"{name} {float(err):.3g}")
        if name != "out":
            rel_l2.append(f"{name} {float(rel):.2g}")
    parts += [f"  {label}: max {', '.join(errors)}", f"    rel L2 {', '.join(rel_l2)}"]
print(
    f"THD Ring on {DP}x{TP}x{CP} (data, tp, cp), per-device q block {block}, bf16,\n"
    "  max |CP - one device| (max) and relative L2 error of the gradients (rel L2):"
)
print("\n".join(parts))
if not ok:
    raise SystemExit("CP differs from one device by more than TE's bf16 tolerance")
