"""Each copy set, copied into a package with another name, imports and does its job there.

The sets and their files come from ``devtools/copy_sets.py`` (derived from the imports). Each is
copied into ``tmp/<name>/`` and run in a fresh Python in which ``import tutorial_utils`` fails,
so one absolute import left in a copied module fails the test instead of quietly reaching the
original.
"""

import os
import subprocess
import sys

import copy_sets
import pytest

# Blocks the original package in the child process.
BLOCK = """
import importlib.abc, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tutorial_utils":
            raise ImportError(f"the copy imported {name}")
sys.meta_path.insert(0, _Block())
"""

# What each module of a set must do once copied (``P`` is the new package's name).
CHECKS = {
    "reorder": """
import numpy as np
from P.reorder import ReorderStrategy, reorder_causal_load_balancing
from P.reorder import inverse_reorder_causal_load_balancing
x = np.arange(2 * 16 * 3).reshape(2, 16, 3)
kw = dict(strategy=ReorderStrategy.Striped, cp_size=4, seq_dim=1, stripe_size=2)
y = reorder_causal_load_balancing(x, **kw)
assert not np.array_equal(x, y)
back = inverse_reorder_causal_load_balancing(y, **kw)
assert np.array_equal(x, back)
""",
    "validation": """
import numpy as np
from P.validation import validate_packed_inputs
ids = np.array([[1] * 8 + [2] * 8])
pos = np.array([list(range(8)) * 2])
validate_packed_inputs(ids, pos, max_segments_per_seq=2, cp_size=2)
try:
    validate_packed_inputs(ids, pos, max_segments_per_seq=1, cp_size=2)
except ValueError as err:
    assert "max_segments_per_seq" in str(err), err
else:
    raise AssertionError("two segments passed with max_segments_per_seq=1")
""",
    "inputs": """
import numpy as np
from P.inputs import pack_segments
ids, pos = pack_segments([[5, 3]], seq_len=16, align=4)
assert ids.shape == (1, 16) and list(np.asarray(ids)[0, :5]) == [1] * 5
""",
    "reference": """
import jax, jax.numpy as jnp, numpy as np
from P.reference import MaskSpec, blockwise_attention, dense_attention
q = jax.random.normal(jax.random.PRNGKey(0), (1, 32, 2, 8))
ids = jnp.ones((1, 32), jnp.int32); pos = jnp.arange(32)[None]
args = (q, q, q, ids, ids, pos, pos)
a = dense_attention(*args, scale=8 ** -0.5, spec=MaskSpec(causal=True))[0]
b = blockwise_attention(*args, scale=8**-0.5, spec=MaskSpec(causal=True), block_q=8, block_kv=8)[0]
assert float(jnp.max(jnp.abs(a - b))) < 1e-5
""",
    "context_parallel": """
import P.context_parallel as cp
assert callable(cp.context_parallel_attention)
""",
    "te": """
import jax, jax.numpy as jnp, numpy as np
import P.te as te
from P.te.attention import (AttnBiasType, AttnMaskType, AttnSoftmaxType, QKVLayout,
    SequenceDescriptor, fused_attn)
assert te.using_te_code(), te.backend_name()
q = jax.random.normal(jax.random.PRNGKey(0), (1, 64, 2, 16), jnp.bfloat16)
ids = jnp.asarray(np.repeat([1, 2], 32)[None], jnp.int32)
pos = jnp.asarray(np.tile(np.arange(32), 2)[None], jnp.int32)
out = fused_attn((q, q, q), None, SequenceDescriptor.from_segment_ids_and_pos(ids, pos), None,
    attn_bias_type=AttnBiasType.NO_BIAS, attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
    qkv_layout=QKVLayout.THD_THD_THD, softmax_type=AttnSoftmaxType.VANILLA_SOFTMAX,
    scaling_factor=0.25, dropout_probability=0.0, is_training=False, max_segments_per_seq=2)
assert out.shape == q.shape and bool(jnp.isfinite(out.astype(jnp.float32)).all())
try:
    fused_attn((q, q, q), None, SequenceDescriptor.from_segment_ids_and_pos(ids, pos), None,
        attn_bias_type=AttnBiasType.NO_BIAS, attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
        qkv_layout=QKVLayout.THD_THD_THD, softmax_type=AttnSoftmaxType.VANILLA_SOFTMAX,
        scaling_factor=0.25, dropout_probability=1.5, is_training=False, max_segments_per_seq=2)
except ValueError as err:
    assert "dropout_probability=1.5" in str(err), err
else:
    raise AssertionError("the copied facade passed dropout_probability=1.5")
""",
    "model": """
import jax, jax.numpy as jnp, numpy as np
from P.model import ModelConfig, init_params, loss_fn
config = ModelConfig(dtype=jnp.bfloat16, max_segments_per_seq=2)
params = init_params(config, jax.random.PRNGKey(0))
tokens = jnp.asarray(np.arange(64)[None] % 256, jnp.int32)
ids = jnp.asarray(np.repeat([1, 2], 32)[None], jnp.int32)
pos = jnp.asarray(np.tile(np.arange(32), 2)[None], jnp.int32)
loss = loss_fn(params, tokens, tokens, jnp.ones_like(tokens), ids, pos, config)
assert np.isfinite(float(loss)) and float(loss) > 1.0, loss
""",
    "gradient_check": """
import jax.numpy as jnp
from P.gradient_check import check_cp_gradients, gradients_rel_l2
ref = {"w": jnp.ones(8)}
assert gradients_rel_l2(ref, ref) == 0.0
near = {"w": jnp.ones(8) * 1.001}; far = {"w": jnp.ones(8) * 1.5}
assert check_cp_gradients(near, near, ref).passed
assert not check_cp_gradients(far, near, ref).passed
""",
    "text_data": """
from P.text_data import decode, encode
assert decode(encode("copied")) == "copied"
""",
}


def _sets():
    return [pytest.param(entries, id="+".join(entries)) for entries in copy_sets.COPY_SETS.values()]


def test_every_module_of_every_set_has_a_check():
    assert {m for entries in copy_sets.COPY_SETS.values() for m in entries} <= set(CHECKS)


@pytest.mark.parametrize("entries", _sets())
def test_a_copy_set_runs_under_another_name(tmp_path, entries):
    files = copy_sets.copy_into(tmp_path / "mymodel_attention", entries)
    assert files, entries
    code = BLOCK + "".join(CHECKS[m] for m in entries).replace("P.", "mymodel_attention.")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TUTORIAL_TE_BACKEND")}
    env.update(PYTHONPATH=str(tmp_path), JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{[str(f) for f in files]}\n{proc.stderr[-3000:]}"


def test_an_absolute_import_in_a_copy_fails_the_check(tmp_path):
    """The check is not vacuous: a copy that still says `from tutorial_utils import rules`."""
    dest = tmp_path / "mymodel_attention"
    copy_sets.copy_into(dest, ["validation"])
    path = dest / "validation.py"
    path.write_text(
        path.read_text().replace("from . import rules", "from tutorial_utils import rules")
    )
    code = BLOCK + CHECKS["validation"].replace("P.", "mymodel_attention.")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "the copy imported tutorial_utils" in proc.stderr
