"""TE's Flax ``DotProductAttention`` swept argument by argument through the runner, defaults
included (tests/scripts/dpa_sweep_script.py): what runs matches ``jax.nn.dot_product_attention``
at TE's bf16 tolerance, and what TE refuses, it refuses with the error real TE raises.

The stand-in's one deliberate difference: dropout, which the CPU kernel cannot reproduce: TE
warns and falls back to its unfused path (its softmax as TE's pure JAX, the runner having turned
TE's custom calls off), where a GPU runs cuDNN's fused dropout.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BF16 = 0.0394  # TE's dtype_tols for bfloat16
#: What TE's own extension raises for num_gqa_groups=None, read from TE 2.20.2 built from its
#: sdist (csrc/extensions/attention.cpp casts every field with pybind11)
PYBIND_NONE = (
    "RuntimeError: Unable to cast Python instance of type <class 'NoneType'> to C++ type '?'"
)
EXPECTED_ERRORS = {
    "defaults (num_gqa_groups=None)": PYBIND_NONE,
    # padding masks need the sequence descriptor: TE asserts without a message
    "attn_mask_type=padding": "AssertionError:",
    "attn_mask_type=padding_causal": "AssertionError:",
    # float32 falls back to TE's unfused path, which takes no SequenceDescriptor
    "float32 inputs, thd": "AssertionError: sequence_descriptor must be None or ndarray",
    # the layer has no stripe_size: DEFAULT (AllGather) with THD is refused at partition time
    "context_parallel_strategy=DEFAULT, thd, cp=2": (
        "ValueError: Context parallel fused attention only supports Dual Chunk load balancing "
        "with BSHD layouts and Striped load balancing with THD layouts"
    ),
}


@pytest.fixture(scope="module")
def outcomes():
    proc = subprocess.run(
        [sys.executable, "-m", "tutorial_utils.te_on_cpu", "--devices", "2",
         "tests/scripts/dpa_sweep_script.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {row.pop("case"): row for row in rows}


def test_every_case_ran(outcomes):
    script = (ROOT / "tests" / "scripts" / "dpa_sweep_script.py").read_text()
    assert len(outcomes) >= 19 and all(f'"{case}"' in script for case in outcomes)


def test_what_runs_matches_the_oracle_and_what_te_refuses_is_named(outcomes):
    for case, row in outcomes.items():
        if case in EXPECTED_ERRORS:
            assert not row["ok"] and row["error"].startswith(EXPECTED_ERRORS[case]), (case, row)
            continue
        assert row["ok"], (case, row)
        for key in ("err", "err_dq"):
            assert row.get(key, 0.0) <= BF16, (case, row)


def test_float32_through_the_layer_warns_and_falls_back_to_the_unfused_path(outcomes):
    row = outcomes["float32 inputs, bshd"]
    assert row["ok"] and row["err"] < 1e-5
    assert any(
        w.startswith("Falling back to the unfused attention backend") for w in row["warnings"]
    )


def test_dropout_in_training_warns_and_runs_tes_unfused_attention(outcomes):
    row = outcomes["attention_dropout=0.1, deterministic=False"]
    assert row["ok"] and any(
        w.startswith("Falling back to the unfused attention backend") for w in row["warnings"]
    )


def test_deterministic_is_the_layers_is_training_and_both_give_gradients(outcomes):
    """``deterministic=True`` is ``is_training=False`` in TE's layer: on the stand-in the
    gradients still match (that cuDNN does the same rests on the stand-in's reading of its
    contract)."""
    for case in ("deterministic=True (is_training=False), backward",
                 "deterministic=False (is_training=True), backward"):  # fmt: skip
        assert outcomes[case]["err_dq"] <= BF16


def test_the_stand_in_casts_the_params_as_tes_binding_does():
    """Each integer field TE's binding casts refuses None (and size_t a negative), as pybind11
    does; valid values pass. The message is the one TE 2.20.2's real extension raised."""
    import types

    from tutorial_utils.te_on_cpu import extension as X

    valid = {name: 1 for name in X._CAST_SIZE_T + X._CAST_INT64} | {
        "dropout": 0.0,
        "attn_scale": 0.5,
    }
    X._cast_like_te(types.SimpleNamespace(**valid))
    for name in X._CAST_SIZE_T + X._CAST_INT64 + X._CAST_FLOAT:
        with pytest.raises(
            RuntimeError, match=r"Unable to cast Python instance of type <class 'NoneType'>"
        ):
            X._cast_like_te(types.SimpleNamespace(**{**valid, name: None}))
    with pytest.raises(RuntimeError, match=r"<class 'int'>"):
        X._cast_like_te(types.SimpleNamespace(**{**valid, "num_gqa_groups": -1}))
    X._cast_like_te(types.SimpleNamespace(**{**valid, "window_size_left": -1}))  # int64: fine
