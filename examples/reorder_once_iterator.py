"""A reorder-once data iterator for context parallelism: what MaxText does in its input
pipeline.

Variable-length documents are packed into rows; targets are shifted inside each
document *before* the reorder; the loss mask drops padding and each document's last
token; then every per-token array (tokens, targets, loss mask, segment ids, positions)
is reordered the same way, once. The model never reorders. Check: a tiny attention
model's loss and gradients on the reordered, sharded batch (Ring) equal one device on
the packed batch; shifting targets after the reorder instead gives wrong targets.
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
    reorder_causal_load_balancing,
)
from transformer_engine.jax.sharding import MeshResource

CP, B, S, V, E, H, D, SEGS = len(jax.devices()), 2, 128, 64, 32, 2, 16, 8
if CP < 2:
    raise SystemExit(
        f"reorder_once_iterator.py needs >= 2 devices for a CP mesh, found {CP}"
    )
FIELDS = ("tokens", "targets", "loss_mask", "segment_ids", "segment_pos")


def pack(docs):
    """Greedy packing into [B, S] rows; targets shifted inside each document; padding
    has id 0."""
    rows = {f: np.zeros((B, S), np.int32) for f in FIELDS}
    row, t, sid = 0, 0, 1
    for doc in docs:
        if t + len(doc) > S or sid > SEGS:
            row, t, sid = row + 1, 0, 1
        if row == B:
            break
        span = slice(t, t + len(doc))
        rows["tokens"][row, span], rows["targets"][row, span] = (
            doc,
            np.append(doc[1:], 0),
        )
        rows["loss_mask"][row, span] = (
            np.arange(len(doc)) < len(doc) - 1
        )  # the last token has no target
        rows["segment_ids"][row, span], rows["segment_pos"][row, span] = (
            sid,
            np.arange(len(doc)),
        )
        t, sid = t + len(doc), sid + 1
    return rows


def batches(seed, reorder_for_cp):
    rng = np.random.default_rng(seed)
    while True:
        batch = pack([rng.integers(1, V, rng.integers(5, 60)) for _ in range(3 * SEGS)])
        yield {f: reorder_for_cp(batch[f]) for f in FIELDS} if reorder_for_cp else batch


def loss_fn(params, b, cp_axis):
    x = params["emb"][b["tokens"]]
    q, k, v = (
        jnp.einsum("bse,ehd->bshd", x, params[w]).astype(jnp.bfloat16)
        for w in ("wq", "wk", "wv")
    )
    out = fused_attn(
        (q, k, v),
        bias=None,
        sequence_descriptor=SequenceDescriptor.from_segment_ids_and_pos(
            b["segment_ids"], b["segment_pos"]
        ),
        seed=None,
        attn_bias_type=AttnBiasType.NO_BIAS,
        attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
        qkv_layout=QKVLayout.THD_THD_THD,
        softmax_type=AttnSoftmaxType.VANILLA_SOFTMAX,
        scaling_factor=D**-0.5,
        dropout_probability=0.0,
        is_training=True,
        max_segments_per_seq=SEGS,
        context_parallel_strategy=CPStrategy.RING,
        context_parallel_causal_load_balanced=bool(cp_axis),
        context_parallel_axis=cp_axis,
        stripe_size=1 if cp_axis else None,
    )
    logits = jnp.einsum("bshd,hdv->bsv", out.astype(jnp.float32), params["wo"])
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), b["targets"][..., None], -1)[
        ..., 0
    ]
    return jnp.sum(nll * b["loss_mask"]) / jnp.sum(b["loss_mask"])


ks = jax.random.split(jax.random.PRNGKey(0), 5)
params = {
    "emb": jax.random.normal(ks[0], (V, E)),
    "wo": jax.random.normal(ks[4], (H, D, V)) * 0.3,
    **{
        w: jax.random.normal(kk, (E, H, D)) * E**-0.5
        for w, kk in zip(("wq", "wk", "wv"), ks[1:4])
    },
}
loss_1, grads_1 = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b, "")))(
    params, next(batches(7, None))
)

mesh = Mesh(np.array(jax.devices()), ("cp",))
reorder = lambda x: jax.device_put(
    reorder_causal_load_balancing(
        jnp.asarray(x),
        strategy=ReorderStrategy.Striped,
        cp_size=CP,
        seq_dim=1,
        stripe_size=1,
    ),
    NamedSharding(mesh, P(None, "cp")),
)  # noqa: E731
cp_batch = next(batches(7, reorder))
late = dict(
    cp_batch, targets=reorder(np.roll(np.asarray(cp_batch["tokens"]), -1, axis=1))
)  # shifted after the reorder
with jax.set_mesh(mesh), te.autocast(mesh_resource=MeshResource(cp_resource="cp")):
    step = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b, "cp")))
    loss_cp, grads_cp = step(params, cp_batch)
wrong = int(jnp.sum((late["targets"] != cp_batch["targets"]) * cp_batch["loss_mask"]))
err = max(
    float(jnp.max(jnp.abs(a - b)))
    for a, b in zip(jax.tree.leaves(grads_cp), jax.tree.leaves(grads_1))
)
print(
    f"reorder-once iterator, Ring, cp={CP}: max |grad diff| {err:.3g}\n"
    f"  loss {float(loss_cp):.5f} vs one device {float(loss_1):.5f}"
    f" (|diff| {abs(float(loss_cp - loss_1)):.2g})\n"
    f"  targets shifted after the reorder: {wrong} of"
    f" {int(jnp.sum(cp_batch['loss_mask']))} trained tokens get a wrong target"
)
assert abs(float(loss_cp - loss_1)) < 1e-2 and err < 2e-2 and wrong > 0
