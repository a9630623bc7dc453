"""Run by test_placement.py in its own process: TE-on-CPU, TE alone and the facade, on CP placement.

Prints one JSON line. Each case runs TE's own ``fused_attn`` (``te_alone``) and the facade's
(``facade``) on the same arrays and reports the max error against a float64 oracle, or the
first line of the error raised.

* ``placement``: AllGather, cp=4, one 16-token row (a 5-token segment in an 8-token slot whose
  padding positions keep counting, then a 6-token segment restarting at 0), stripes 1 and 2:
  eager on plain arrays (both stripes); at stripe 2 also eager on arrays placed on the mesh, and
  jitted without shardings.
* ``dout``: a training step's gradients (loss = sum(out * w) for a random w, so dO differs per
  token) with the striped reorder inside the jitted step, AllGather stripe 2 on 4 and 8 devices.
"""

import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["TUTORIAL_TE_BACKEND"] = "te-cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from helpers import np_attention, np_visible, oracle_fn  # noqa: E402  (tests/, on the run's path)
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

import tutorial_utils.te as te  # noqa: E402  (installs TE-on-CPU before TE is imported)
from tutorial_utils.te import attention as facade  # noqa: E402

from transformer_engine.jax import attention as te_alone  # noqa: E402  isort: skip
from transformer_engine.jax.sharding import MeshResource  # noqa: E402  isort: skip

SCALE = 0.3
BF16 = 0.0394  # TE's bf16 tolerance (dtype_tols)


def first_line(err) -> str:
    text = str(err)
    for marker in (
        "ValueError: ",
        "AssertionError",
    ):  # errors from a partition callback arrive wrapped
        if marker in text:
            text = text[text.index(marker) :]
            break
    return f"{type(err).__name__}: {text.splitlines()[0][:300] if text else ''}"


def call(api, qkv, ids, pos, stripe, max_segments):
    desc = api.SequenceDescriptor.from_segment_ids_and_pos(ids, pos)
    return api.fused_attn(
        qkv,
        None,
        desc,
        None,
        api.AttnBiasType.NO_BIAS,
        api.AttnMaskType.PADDING_CAUSAL_MASK,
        api.QKVLayout.THD_THD_THD,
        api.AttnSoftmaxType.VANILLA_SOFTMAX,
        SCALE,
        0.0,
        True,
        max_segments_per_seq=max_segments,
        context_parallel_strategy=api.CPStrategy.ALL_GATHER,
        context_parallel_causal_load_balanced=True,
        stripe_size=stripe,
    )


def placement_cases():
    cp = 4
    mesh = Mesh(np.array(jax.devices()[:cp]), ("cp",))
    ids = np.array([[1] * 5 + [0] * 3 + [2] * 6 + [0] * 2], np.int32)
    pos = np.array([list(range(8)) + list(range(6)) + [6, 7]], np.int32)
    rng = np.random.default_rng(0)
    q, k, v = (
        rng.normal(size=s).astype(np.float32) for s in ((1, 16, 2, 8), (1, 16, 1, 8), (1, 16, 1, 8))
    )
    q, k, v = (np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32)) for x in (q, k, v))
    vis = np_visible(ids, ids, pos, pos, causal=True, window=(-1, -1))
    want, _ = np_attention(q, k, v, vis, SCALE)
    has = vis.any(-1)
    report = {}
    for stripe in (1, 2):
        ro = lambda x: te_alone.reorder_causal_load_balancing(
            jnp.asarray(x),
            te_alone.ReorderStrategy.Striped,
            cp,
            1,
            stripe,
        )  # noqa: E731
        back = lambda x: te_alone.inverse_reorder_causal_load_balancing(
            x,
            te_alone.ReorderStrategy.Striped,
            cp,
            1,
            stripe,
        )  # noqa: E731
        plain = [ro(x).astype(jnp.bfloat16) for x in (q, k, v)] + [ro(ids), ro(pos)]
        placed = [jax.device_put(x, NamedSharding(mesh, P(None, "cp"))) for x in plain]
        modes = [("eager, plain arrays", plain)]  # stripe 1: the headline fault only (CI time)
        if stripe > 1:
            modes += [("eager, placed on the mesh", placed), ("jit without shardings", plain)]
        for mode, arrays in modes:
            for name, api in (("te_alone", te_alone), ("facade", facade)):

                def f(q, k, v, i, p, api=api):
                    return call(api, (q, k, v), i, p, stripe, 2)

                try:
                    with (
                        jax.set_mesh(mesh),
                        te.autocast(mesh_resource=MeshResource(cp_resource="cp")),
                    ):
                        out = (jax.jit(f) if mode.startswith("jit") else f)(*arrays)
                        out = np.asarray(back(out).astype(jnp.float32))
                    result = {"max_error": float(np.max(np.abs(out[has] - want[has])))}
                except Exception as err:  # noqa: BLE001 - what each does is the point
                    result = {"error": first_line(err)}
                report[f"stripe {stripe}, {mode}, {name}"] = result
    return report


def dout_cases():
    report = {}
    for cp in (4, 8):
        stripe, batch, heads = 2, 1, 2
        seq = cp * stripe * 4
        mesh = Mesh(np.array(jax.devices()[:cp]), ("cp",))
        sharding = NamedSharding(mesh, P(None, "cp"))
        rng = np.random.default_rng(cp)
        ids = np.ones((batch, seq), np.int32)
        ids[:, seq // 2 + 3 :] = 2  # two documents, the second not aligned to a stripe
        pos = np.concatenate([np.arange(seq // 2 + 3), np.arange(seq - seq // 2 - 3)])[None].astype(
            np.int32
        )
        q, k, v, w = (
            jnp.asarray(rng.normal(size=s), jnp.bfloat16)
            for s in (
                (batch, seq, heads, 8),
                (batch, seq, 1, 8),
                (batch, seq, 1, 8),
                (batch, seq, heads, 8),
            )
        )
        vis = np_visible(ids, ids, pos, pos, causal=True, window=(-1, -1))
        f32 = [x.astype(jnp.float32) for x in (q, k, v, w)]
        _, grads_o = oracle_fn(SCALE)(*f32[:3], jnp.asarray(vis), f32[3])

        for name, api in (("te_alone", te_alone), ("facade", facade)):

            def step(q, k, v, ids, pos, w, api=api):
                """A training step's gradient: reorder, attention, inverse reorder, a weighted
                loss."""

                def loss(q, k, v):
                    ro = lambda x: api.reorder_causal_load_balancing(
                        x,
                        api.ReorderStrategy.Striped,
                        cp,
                        1,
                        stripe,
                    )  # noqa: E731
                    out = call(api, tuple(map(ro, (q, k, v))), ro(ids), ro(pos), stripe, 3)
                    out = api.inverse_reorder_causal_load_balancing(
                        out,
                        api.ReorderStrategy.Striped,
                        cp,
                        1,
                        stripe,
                    )
                    return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32))

                return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

            try:
                with jax.set_mesh(mesh), te.autocast(mesh_resource=MeshResource(cp_resource="cp")):
                    args = [
                        jax.device_put(x, sharding)
                        for x in (q, k, v, jnp.asarray(ids), jnp.asarray(pos), w)
                    ]
                    grads = jax.jit(step, in_shardings=(sharding,) * 6)(*args)
                errors = [
                    float(np.max(np.abs(np.asarray(g.astype(jnp.float32)) - np.asarray(o))))
                    for g, o in zip(grads, grads_o)
                ]
                result = {
                    "max_grad_error": max(errors),
                    "grad_scale": float(np.max(np.abs(np.asarray(grads_o[0])))),
                }
            except Exception as err:  # noqa: BLE001
                result = {"error": first_line(err)}
            report[f"cp {cp}, stripe {stripe}, {name}"] = result
    return report


if __name__ == "__main__":
    which = sys.argv[1:] or ["placement", "dout"]
    out = {}
    if "placement" in which:
        out["placement"] = placement_cases()
    if "dout" in which:
        out["dout"] = dout_cases()
    out["tolerance"] = BF16
    print(json.dumps(out))
