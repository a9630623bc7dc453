"""TE's whole layers on CPU: TE's custom calls off by TE's own switch, attention on the stand-in.

* the switch: :func:`tutorial_utils.te_on_cpu.install` turns every non-attention primitive
  class off (TE's ``set_enabled``), a user's ``NVTE_JAX_CUSTOM_CALLS`` still decides, and the
  runner's note names what a user's value leaves on;
* TE's ``TransformerLayer`` through the runner on 4 devices: one device and data-parallel
  (batch sharded) agree, attention goes through TE's fused call, the norms do not;
* every FP8/FP4 recipe under ``te.autocast`` is refused in TE's own check, with the reason.

Cost: one runner process (TransformerLayer init, one-device and data-parallel steps: about
10 CPU s); the rest is in-process and compiles nothing.
"""

from __future__ import annotations

import os
import pathlib
import re

import pytest
from helpers import run_script

from tutorial_utils import te_on_cpu
from tutorial_utils.te_on_cpu import lowerings, runner

te_on_cpu.install()
from transformer_engine.jax.cpp_extensions.attention import (  # noqa: E402  (after install)
    FusedAttnFwdPrimitive,
)
from transformer_engine.jax.cpp_extensions.normalization import NormFwdPrimitive  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "te_transformer_layer_script.py"
RECIPES = ("DelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling", "NVFP4BlockScaling")


@pytest.fixture
def no_switch(monkeypatch):
    """Neither form of TE's switch set, as in a fresh shell; restored after the test."""
    for name in (lowerings.CUSTOM_CALLS_ENV, lowerings.CUSTOM_CALLS_ENV + "_RE"):
        monkeypatch.delenv(name, raising=False)


def test_install_turns_tes_non_attention_custom_calls_off_without_the_environment(no_switch):
    names = [c.__name__ for c in lowerings._te_primitive_classes()]
    assert {"NormFwdPrimitive", "GemmPrimitive", "ActLuPrimitive"} <= set(names)
    assert not [n for n in names if "Attn" in n]
    assert lowerings.custom_calls_left_on() == []
    assert not NormFwdPrimitive.enabled() and FusedAttnFwdPrimitive._is_enabled
    # a process this one starts (a GPU job from a CPU test) does not inherit the setting
    assert lowerings.CUSTOM_CALLS_ENV not in os.environ
    assert runner.custom_calls_note() == ""


def test_a_users_switch_decides_and_the_runner_says_what_it_leaves_on(no_switch, monkeypatch):
    monkeypatch.setenv(lowerings.CUSTOM_CALLS_ENV, "GemmPrimitive=true")
    assert lowerings.custom_calls_left_on() == ["GemmPrimitive"]
    note = runner.custom_calls_note()
    assert note.startswith("te_on_cpu: note: your NVTE_JAX_CUSTOM_CALLS='GemmPrimitive=true'")
    assert "leaves TE's GemmPrimitive on" in note and "\n" not in note
    monkeypatch.setenv(lowerings.CUSTOM_CALLS_ENV, "true")
    left_on = lowerings.custom_calls_left_on()
    assert {"NormFwdPrimitive", "GemmPrimitive"} <= set(left_on), left_on
    assert "TE's NormFwdPrimitive, GemmPrimitive, ActLuPrimitive and " in runner.custom_calls_note()
    monkeypatch.setenv(lowerings.CUSTOM_CALLS_ENV, "false")
    assert lowerings.custom_calls_left_on() == [] and runner.custom_calls_note() == ""


def _result(lines, key):
    found = [line.split(": ", 1)[1] for line in lines if line.startswith(key + ": ")]
    assert len(found) == 1, (key, lines)
    return found[0]


def test_transformer_layer_runs_on_one_device_and_data_parallel_and_fp8_is_refused(no_switch):
    proc = run_script(SCRIPT, 4)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    lines = proc.stdout.splitlines()[3:]  # after the runner's banner
    assert _result(lines, "NVTE_JAX_CUSTOM_CALLS") == "false"  # set by the runner
    assert _result(lines, "attention through TE's custom call") == "True"
    assert _result(lines, "norm through TE's custom call") == "False"
    loss_1 = float(_result(lines, "one device").split()[1])
    loss_dp = float(_result(lines, "data-parallel dp=4").split()[1])
    assert abs(loss_dp - loss_1) <= 1e-3 * loss_1, (loss_dp, loss_1)
    grads = _result(lines, "max |dp - one device| over gradients")
    diff = re.fullmatch(r"(\S+) \(largest gradient (\S+)\)", grads)
    assert float(diff[1]) <= 0.02 * float(diff[2]), grads  # bf16 rounding of the batch mean
    assert _result(lines, "gradient leaves") == "7"
    for name in RECIPES:
        refusal = _result(lines, name)
        assert refusal.startswith("AssertionError: ") and "does not run on CPU" in refusal
        assert "Run quantized recipes on a GPU node" in refusal, refusal
