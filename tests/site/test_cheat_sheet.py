"""The cheat sheet's call runs as shown: pasted after a few lines that make its inputs, on four
simulated CPU devices through TE's own code (``python -m tutorial_utils.te_on_cpu``), it gives
the one-device attention within TE's bf16 tolerance. The page's snippet is read from the page,
so an edit there is what this test runs."""

from __future__ import annotations

import pathlib
import re

from helpers import run_script

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cheat_sheet.md"

# the inputs the snippet's comment names: q, k, v, ids, pos (reordered), head_dim, left, mesh
BEFORE = """
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from transformer_engine.jax.attention import (
    ReorderStrategy,
    inverse_reorder_causal_load_balancing,
    reorder_causal_load_balancing,
)

B, S, H, KV, head_dim, left = 2, 256, 4, 2, 32, 32
slot = np.arange(S) // 64 + 1
ids0 = np.tile(slot * (np.arange(S) % 64 < 48), (B, 1)).astype(np.int32)
pos0 = np.tile(np.arange(S) % 64, (B, 1)).astype(np.int32)
keys = jax.random.split(jax.random.PRNGKey(0), 3)
q0 = jax.random.normal(keys[0], (B, S, H, head_dim), jnp.bfloat16)
k0, v0 = (jax.random.normal(k, (B, S, KV, head_dim), jnp.bfloat16) for k in keys[1:])
mesh = Mesh(np.array(jax.devices()), ("cp",))
kw = dict(strategy=ReorderStrategy.Striped, cp_size=len(jax.devices()), seq_dim=1, stripe_size=1)
q, k, v, ids, pos = (
    reorder_causal_load_balancing(jnp.asarray(x), **kw) for x in (q0, k0, v0, ids0, pos0)
)
"""

AFTER = """
import functools
from transformer_engine.jax.attention import CPStrategy as _S

one = functools.partial(  # the same call on one device: TE's defaults for the CP arguments
    fused_attn,
    bias=None,
    seed=None,
    attn_bias_type=AttnBiasType.NO_BIAS,
    attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
    qkv_layout=QKVLayout.THD_THD_THD,
    softmax_type=AttnSoftmaxType.VANILLA_SOFTMAX,
    scaling_factor=head_dim**-0.5,
    dropout_probability=0.0,
    is_training=True,
    max_segments_per_seq=4,
    window_size=(left, 0),
)
want = jax.jit(
    lambda q, k, v, i, p: one(
        (q, k, v), sequence_descriptor=SequenceDescriptor.from_segment_ids_and_pos(i, p)
    )
)(q0, k0, v0, jnp.asarray(ids0), jnp.asarray(pos0))
got = inverse_reorder_causal_load_balancing(out, **kw)
err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
assert out.sharding.spec == P(None, "cp", None, None), out.sharding
print(f"cheat sheet call: max |CP - one device| = {err:.3g}")
assert err < 0.0394, err
"""


def test_the_cheat_sheet_call_runs_and_matches_one_device(tmp_path):
    text = PAGE.read_text(encoding="utf-8")
    snippet = re.search(r"## The call\n\n```python\n(.*?)\n```", text, re.S).group(1)
    script = tmp_path / "cheat_sheet_call.py"
    script.write_text(BEFORE + "\n" + snippet + "\n" + AFTER, encoding="utf-8")
    proc = run_script(script, 4, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "cheat sheet call: max |CP - one device| =" in proc.stdout, proc.stdout[-2000:]
