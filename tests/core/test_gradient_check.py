"""``tutorial_utils.gradient_check``: the verdict on made-up gradients, then on one correct and one
broken CP run through TE's own code on 4 simulated CPU devices (the calibration script's cases,
``benchmarks/gradient_check_matrix.py``)."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from tutorial_utils.gradient_check import (
    FACTOR,
    FLOOR,
    CPGradientCheck,
    check_cp_gradients,
    gradients_rel_l2,
)

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = {
    "dense": {"kernel": jnp.arange(1.0, 13.0).reshape(3, 4), "bias": jnp.ones(4)},
    "embed": jnp.full((5, 2), 0.5),
}


def off_by(err, seed=0):
    """REFERENCE plus noise whose relative L2 over all leaves is exactly ``err``."""
    rng = np.random.default_rng(seed)
    leaves = {"kernel": (3, 4), "bias": (4,), "embed": (5, 2)}
    noise = {k: rng.standard_normal(s) for k, s in leaves.items()}
    norm = np.sqrt(sum(np.sum(n**2) for n in noise.values()))
    ref_norm = float(np.sqrt(sum(np.sum(np.asarray(x) ** 2) for x in _leaves(REFERENCE))))
    scale = err * ref_norm / norm
    return {
        "dense": {
            "kernel": REFERENCE["dense"]["kernel"] + scale * noise["kernel"],
            "bias": REFERENCE["dense"]["bias"] + scale * noise["bias"],
        },
        "embed": REFERENCE["embed"] + scale * noise["embed"],
    }


def _leaves(tree):
    return [tree["dense"]["kernel"], tree["dense"]["bias"], tree["embed"]]


def test_rel_l2_is_one_norm_over_all_leaves_not_a_mean_per_leaf():
    reference = {"a": jnp.array([3.0]), "b": jnp.array([4.0])}
    grads = {"a": jnp.array([3.0]), "b": jnp.array([5.0])}
    # ||(0, 1)|| / ||(3, 4)|| = 0.2; the mean of the per-leaf errors would be 0.125
    assert gradients_rel_l2(grads, reference) == pytest.approx(0.2)
    assert gradients_rel_l2(off_by(0.01), REFERENCE) == pytest.approx(0.01, rel=1e-4)
    assert gradients_rel_l2(REFERENCE, REFERENCE) == 0.0


def test_a_cp_run_as_close_as_one_device_passes():
    check = check_cp_gradients(off_by(0.007, seed=1), off_by(0.006, seed=2), REFERENCE)
    assert isinstance(check, CPGradientCheck) and check.passed
    assert check.err_cp == pytest.approx(0.007, rel=1e-3)
    assert check.err_one == pytest.approx(0.006, rel=1e-3)
    assert check.bound == pytest.approx(FACTOR * 0.006, rel=1e-3)
    assert check.summary.startswith("CP check passed: err_cp 0.007 <= bound")
    assert "\n" not in check.summary and len(check.summary) <= 88
    assert check.raise_if_failed() is check
    assert check_cp_gradients(off_by(0.007), off_by(0.006), REFERENCE, strict=True).passed
    with pytest.raises(dataclasses.FrozenInstanceError):
        check.passed = False


def test_the_old_rule_fails_the_same_correct_run():
    """CP vs one device directly, within one device's gap: the two roundings add up."""
    cp, one = off_by(0.007, seed=1), off_by(0.006, seed=2)
    assert gradients_rel_l2(cp, one) > gradients_rel_l2(one, REFERENCE)
    assert check_cp_gradients(cp, one, REFERENCE).passed


def test_a_cp_run_beyond_the_bound_fails_and_names_numbers_and_causes():
    check = check_cp_gradients(off_by(0.2, seed=1), off_by(0.006, seed=2), REFERENCE)
    assert not check.passed
    bound = f"{FACTOR * 0.006:.3g}"
    assert (
        check.summary == f"CP check FAILED: err_cp 0.2 > bound {bound} ({FACTOR:g} x err_one 0.006)"
    )
    with pytest.raises(AssertionError) as raised:
        check.raise_if_failed()
    message = str(raised.value)
    for words in ("0.2", bound, "not reordered", "shift inside the model", "(47, 0)", "(-1, 0)"):
        assert words in message, (words, message)
    with pytest.raises(AssertionError, match="not reordered"):
        check_cp_gradients(off_by(0.2), off_by(0.006), REFERENCE, strict=True)
    # just beyond the bound fails, just inside passes
    just = FACTOR * 0.006
    assert not check_cp_gradients(off_by(just * 1.01), off_by(0.006, 2), REFERENCE).passed
    assert check_cp_gradients(off_by(just * 0.99), off_by(0.006, 2), REFERENCE).passed


def test_the_floor_bounds_runs_whose_one_device_error_is_zero():
    exact = check_cp_gradients(off_by(1e-6), REFERENCE, REFERENCE)
    assert exact.err_one == 0.0 and exact.bound == FLOOR and exact.passed
    assert exact.summary.endswith("<= bound 0.0001 (the floor; err_one 0)"), exact.summary
    assert not check_cp_gradients(off_by(1e-3), REFERENCE, REFERENCE).passed
    assert check_cp_gradients(off_by(1e-3), REFERENCE, REFERENCE, floor=2e-3).passed
    assert check_cp_gradients(off_by(0.05), off_by(0.006, 2), REFERENCE, factor=10).passed


def test_a_one_device_run_far_from_the_reference_fails_even_when_cp_is_close_to_it():
    one = off_by(0.3, seed=2)
    check = check_cp_gradients(off_by(0.31, seed=1), one, REFERENCE)
    assert not check.passed and check.err_cp <= check.bound
    assert check.summary == "CP check FAILED: err_one 0.3 > max_err_one 0.1"
    with pytest.raises(AssertionError, match="wrong before CP"):
        check.raise_if_failed()
    assert check_cp_gradients(off_by(0.31), one, REFERENCE, max_err_one=0.5).passed


def test_nan_gradients_fail():
    nan = {**REFERENCE, "embed": REFERENCE["embed"].at[0, 0].set(jnp.nan)}
    check = check_cp_gradients(nan, off_by(0.006), REFERENCE)
    assert not check.passed and "not finite" in check.summary
    with pytest.raises(AssertionError, match="NaN"):
        check.raise_if_failed()


def test_mismatched_trees_and_bad_settings_raise():
    with pytest.raises(ValueError, match="tree"):
        check_cp_gradients({"a": jnp.ones(3)}, {"b": jnp.ones(3)}, {"b": jnp.ones(3)})
    with pytest.raises(ValueError, match="tree"):
        gradients_rel_l2({"a": jnp.ones(3)}, {"a": jnp.ones(3), "b": jnp.ones(3)})
    with pytest.raises(ValueError, match="shape"):
        check_cp_gradients({"a": jnp.ones(2)}, {"a": jnp.ones(3)}, {"a": jnp.ones(3)})
    with pytest.raises(ValueError, match="all zero"):
        gradients_rel_l2({"a": jnp.ones(3)}, {"a": jnp.zeros(3)})
    for bad in ({"factor": 0}, {"floor": -1e-4}, {"max_err_one": float("nan")}, {"factor": True}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            check_cp_gradients(REFERENCE, REFERENCE, REFERENCE, **bad)


@pytest.mark.slow
def test_a_correct_and_a_broken_cp_run_through_te_code(tmp_path):
    """Chapter 9's decoder, Ring over 4 simulated devices in bfloat16: the batch reordered
    passes, the same batch not reordered fails (TE itself raises nothing)."""
    out = tmp_path / "matrix.json"
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    env.pop("TUTORIAL_TE_ON_CPU_RUNNER", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    cases = ["ch9-ring-cp4", "ch9-ring-cp4-not-reordered"]
    proc = subprocess.run(
        [sys.executable, "-m", "tutorial_utils.te_on_cpu", "--devices", "4"]
        + ["benchmarks/gradient_check_matrix.py", "--out", str(out), "--only", *cases],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=1200,  # a hang guard only
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    record = json.loads(out.read_text())
    assert record["source"] == "TE's code on CPU, 4 simulated devices"
    rows = {row["id"]: row for row in record["rows"]}
    correct, broken = rows["ch9-ring-cp4"], rows["ch9-ring-cp4-not-reordered"]
    assert (correct["verdict"], broken["verdict"]) == ("pass", "fail")
    assert correct["err_one"] == broken["err_one"] < 0.05  # the same one-device run
    assert correct["err_cp"] <= correct["bound"] < broken["err_cp"] / 10
    assert record["summary"]["false_alarms"] == record["summary"]["misses"] == []
    assert "0 wrong verdicts" in proc.stdout
