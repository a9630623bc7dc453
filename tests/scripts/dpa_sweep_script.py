"""TE's Flax ``DotProductAttention``, one public argument at a time, defaults included.

Run by tests/te_on_cpu/test_dpa_sweep.py through the runner (``python -m tutorial_utils.te_on_cpu
--devices 2 tests/scripts/dpa_sweep_script.py``); it imports only JAX, NumPy, Flax and TE, so on a
GPU node it runs against real TE as it is. Each case builds the layer, runs it forward (and, where
the case says so, backward) on small bf16 inputs, and compares with
``jax.nn.dot_product_attention(implementation="xla")``. Prints one JSON line per case:
``{"case", "ok", "err"}`` (the largest error of the output, and of dQ when backward ran), or
``{"case", "ok": false, "error"}`` with the exception TE's code raised.
"""

import json
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from transformer_engine.jax import autocast
from transformer_engine.jax.attention import SequenceDescriptor
from transformer_engine.jax.flax import DotProductAttention
from transformer_engine.jax.sharding import MeshResource

B, S, HQ, HKV, D = 2, 64, 4, 2, 16
rng = np.random.default_rng(0)
Q = jnp.asarray(rng.standard_normal((B, S, HQ, D)), jnp.bfloat16)
K = jnp.asarray(rng.standard_normal((B, S, HKV, D)), jnp.bfloat16)
V = jnp.asarray(rng.standard_normal((B, S, HKV, D)), jnp.bfloat16)


def reference(q, k, v, *, causal, window=None, scale=None):
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    local = None if window is None else (window[0], window[1])
    return jax.nn.dot_product_attention(
        *f32, is_causal=causal, local_window_size=local, scale=scale, implementation="xla"
    )


#: name -> (layer arguments, call arguments, how to compare: reference kwargs or None)
CASES = {
    "defaults (num_gqa_groups=None)": ({}, {}, {"causal": True}),
    "num_gqa_groups=2": ({"num_gqa_groups": HKV}, {}, {"causal": True}),
    "attn_mask_type=no_mask": (
        {"num_gqa_groups": HKV, "attn_mask_type": "no_mask"},
        {},
        {"causal": False},
    ),
    "attn_mask_type=padding": (
        {"num_gqa_groups": HKV, "attn_mask_type": "padding"},
        {},
        {"causal": False},
    ),
    "attn_mask_type=padding_causal": (
        {"num_gqa_groups": HKV, "attn_mask_type": "padding_causal"},
        {},
        {"causal": True},
    ),
    "attn_mask_type=causal_bottom_right": (
        {"num_gqa_groups": HKV, "attn_mask_type": "causal_bottom_right"},
        {},
        {"causal": True},
    ),
    "window_size=(8, 0)": (
        {"num_gqa_groups": HKV, "window_size": (8, 0)},
        {},
        {"causal": True, "window": (8, 0)},
    ),
    "scale_factor=0.5": (
        {"num_gqa_groups": HKV, "scale_factor": 0.5},
        {},
        {"causal": True, "scale": 0.5},
    ),
    "float32_logits=True": ({"num_gqa_groups": HKV, "float32_logits": True}, {}, {"causal": True}),
    "softmax_type=off_by_one": ({"num_gqa_groups": HKV, "softmax_type": "off_by_one"}, {}, None),
    "return_max_logit=True": ({"num_gqa_groups": HKV, "return_max_logit": True}, {}, None),
    "attention_dropout=0.1, deterministic=False": (
        {"num_gqa_groups": HKV, "attention_dropout": 0.1},
        {"deterministic": False},
        None,
    ),
    "deterministic=True (is_training=False), backward": (
        {"num_gqa_groups": HKV},
        {"deterministic": True, "backward": True},
        {"causal": True},
    ),
    "deterministic=False (is_training=True), backward": (
        {"num_gqa_groups": HKV},
        {"deterministic": False, "backward": True},
        {"causal": True},
    ),
    "float32 inputs, bshd": ({"num_gqa_groups": HKV}, {"float32": True}, {"causal": True}),
    "float32 inputs, thd": (
        {"num_gqa_groups": HKV, "qkv_layout": "thd_thd_thd", "attn_mask_type": "padding_causal"},
        {"float32": True, "thd": True},
        {"causal": True},
    ),
    "qkv_layout=thd_thd_thd": (
        {"num_gqa_groups": HKV, "qkv_layout": "thd_thd_thd", "attn_mask_type": "padding_causal"},
        {"thd": True},
        {"causal": True},
    ),
    "context_parallel_strategy=DEFAULT, thd, cp=2": (
        {
            "num_gqa_groups": HKV,
            "qkv_layout": "thd_thd_thd",
            "attn_mask_type": "padding_causal",
            "context_parallel_axis": "cp",
            "context_parallel_causal_load_balanced": True,
        },
        {"thd": True, "cp": True},
        None,
    ),
    "context_parallel_strategy=RING, thd, cp=2": (
        {
            "num_gqa_groups": HKV,
            "qkv_layout": "thd_thd_thd",
            "attn_mask_type": "padding_causal",
            "context_parallel_axis": "cp",
            "context_parallel_causal_load_balanced": True,
            "context_parallel_strategy": "RING",
        },
        {"thd": True, "cp": True},
        None,
    ),
}


def run(kwargs, call, compare):
    dtype = jnp.float32 if call.get("float32") else jnp.bfloat16
    q, k, v = (x.astype(dtype) for x in (Q, K, V))
    layer = DotProductAttention(head_dim=D, num_attention_heads=HQ, **kwargs)
    extra = {}
    if call.get("thd"):
        ids = jnp.ones((B, S), jnp.int32)
        pos = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
        extra["sequence_descriptor"] = SequenceDescriptor.from_segment_ids_and_pos(ids, pos)
    det = call.get("deterministic", True)

    def go(q, k, v):
        def forward(q_):
            params = layer.init(jax.random.PRNGKey(0), q_, k, v, deterministic=det, **extra)
            rngs = {"dropout": jax.random.PRNGKey(1)}
            out = layer.apply(params, q_, k, v, deterministic=det, rngs=rngs, **extra)
            return out[0] if isinstance(out, tuple) else out

        out = jax.jit(forward)(q)
        result = {"ok": True}
        if compare is not None:
            want = reference(q, k, v, **compare)
            result["err"] = float(jnp.max(jnp.abs(out.astype(jnp.float32) - want)))
            if call.get("backward"):
                dq = jax.jit(jax.grad(lambda x: jnp.sum(forward(x).astype(jnp.float32))))(q)
                dq_ref = jax.grad(lambda x: jnp.sum(reference(x, k, v, **compare)))(q)
                result["err_dq"] = float(jnp.max(jnp.abs(dq.astype(jnp.float32) - dq_ref)))
        return result

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if call.get("cp"):
            mesh = Mesh(np.asarray(jax.devices()[:2]), ("cp",))
            with jax.set_mesh(mesh), autocast(mesh_resource=MeshResource(cp_resource="cp")):
                seq = NamedSharding(mesh, P(None, "cp"))
                q, k, v = (jax.device_put(x, seq) for x in (q, k, v))
                result = go(q, k, v)
        else:
            result = go(q, k, v)
    te_warnings = sorted(
        {str(w.message).split("\n")[0][:160] for w in caught if "transformer_engine" in w.filename}
    )
    if te_warnings:
        result["warnings"] = te_warnings
    return result


for name, (kwargs, call, compare) in CASES.items():
    try:
        result = run(kwargs, call, compare)
    except Exception as err:  # noqa: BLE001 - the case's outcome is what TE raised
        text = f"{type(err).__name__}: {err}"
        # a partitioner's error carries a traceback: its last "...Error: ..." line is TE's refusal
        raised = [
            line.strip()
            for line in text.splitlines()
            if re.match(r"\s*\w*(Error|Exception)\b", line)
        ]
        result = {"ok": False, "error": (raised[-1] if raised else text)[:400]}
    print(json.dumps({"case": name, **result}), flush=True)
