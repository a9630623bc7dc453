"""Run by test_bad_input.py in its own process: TE-on-CPU, the facade and TE alone on bad inputs.

Prints one JSON line: for each case, the facade's error and what TE's own ``fused_attn``
does with the same call (raises, returns a wrong result, or returns the right one).
"""

import json
import os

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["TUTORIAL_TE_BACKEND"] = "te-cpu"

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from tutorial_utils.te import (
    attention as facade,
)  # noqa: E402  (installs TE-on-CPU before TE is imported)

from transformer_engine.jax import attention as te_alone  # noqa: E402  isort: skip

assert facade.fused_attn is not te_alone.fused_attn, "the facade must wrap TE's fused_attn"
rng = np.random.default_rng(0)
Q = jnp.asarray(rng.normal(size=(1, 8, 2, 8)), jnp.bfloat16)
K = jnp.asarray(rng.normal(size=(1, 8, 1, 8)), jnp.bfloat16)
V = jnp.asarray(rng.normal(size=(1, 8, 1, 8)), jnp.bfloat16)
IDS, POS = jnp.ones((1, 8), jnp.int32), jnp.arange(8, dtype=jnp.int32)[None]


def call(api, qkv, layout="THD_THD_THD", scale=0.35, desc=None, dropout=0.0, max_segments=1):
    desc = desc or api.SequenceDescriptor.from_segment_ids_and_pos(IDS, POS)
    return api.fused_attn(
        qkv,
        None,
        desc,
        None,
        api.AttnBiasType.NO_BIAS,
        api.AttnMaskType.PADDING_CAUSAL_MASK,
        api.QKVLayout[layout],
        api.AttnSoftmaxType.VANILLA_SOFTMAX,
        scale,
        dropout,
        False,
        max_segments_per_seq=max_segments,
    )


RIGHT = np.asarray(call(te_alone, (Q, K, V)), np.float32)  # the well-formed call, for comparison
CASES = {
    "kv packed on the heads axis": lambda api: call(
        api, (Q, jnp.stack([K, V], axis=3)), "THD_T2HD"
    ),
    "v shorter than k": lambda api: call(api, (Q, K, V[:, :6])),
    "v with fewer heads than k": lambda api: call(
        api, (jnp.concatenate([Q, Q], 2), jnp.concatenate([K, K], 2), V)
    ),
    "int q": lambda api: call(api, (Q.astype(jnp.int32), K, V)),
    "scaling_factor nan": lambda api: call(api, (Q, K, V), scale=float("nan")),
    "overlapping offsets": lambda api: call(
        api,
        (Q, K, V),
        desc=api.SequenceDescriptor.from_seqlens_and_offsets(
            jnp.array([[6, 6, -1]]), jnp.array([[0, 2, -1]])
        ),
    ),
    "dropout 1.5 at inference": lambda api: call(api, (Q, K, V), dropout=1.5),
    "max_segments_per_seq 0": lambda api: call(api, (Q, K, V), max_segments=0),
}
report = {}
for name, run in CASES.items():
    try:
        run(facade)
        facade_error = None
    except ValueError as err:
        facade_error = str(err)
    try:
        out = run(te_alone)
        out = np.asarray(out, np.float32) if jnp.issubdtype(out.dtype, jnp.floating) else None
        alone = (
            "wrong: not a floating output"
            if out is None
            else (
                "wrong: not finite"
                if not np.all(np.isfinite(out))
                else (
                    "ran, max |out - well-formed out| ="
                    f" {np.max(np.abs(out[..., : RIGHT.shape[-1]] - RIGHT)):.3g}"
                    if out.shape == RIGHT.shape
                    else f"ran, output shape {out.shape}"
                )
            )
        )
    except Exception as err:  # noqa: BLE001 - what TE alone does is the point
        alone = f"raised {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
    report[name] = {"facade": facade_error, "te_alone": alone}
print(json.dumps(report))
