"""Chapter 3's oracle bookkeeping (tutorial_utils.pages.oracle_check)."""

import jax.numpy as jnp
import numpy as np
import pytest

from tutorial_utils.pages.oracle_check import ToleranceTable, oracle_workload, tolerance_table
from tutorial_utils.perfmodel.workload import get_workload


def test_oracle_workload_keeps_small_presets_and_shrinks_the_seed():
    cpu = get_workload("cpu")
    assert oracle_workload(cpu) is cpu
    small = oracle_workload(get_workload("seed"))
    assert small.name == "cpu" and small.dtype == "bfloat16"
    assert oracle_workload(get_workload("seed", dtype="float16")).dtype == "float16"
    assert oracle_workload(cpu, max_scores=10).name == "cpu"
    with pytest.raises(ValueError, match="max_scores"):
        oracle_workload(cpu, max_scores=0)


def test_tolerance_table_passes_within_and_fails_beyond_the_bound():
    ref = jnp.asarray(np.linspace(-2, 2, 64, dtype=np.float32))
    tol = 0.01
    inside = tolerance_table({"output": (ref + 0.99 * (tol + tol * jnp.abs(ref)), ref)}, tol)
    assert inside.ok and 0.98 < inside.worst_ratio <= 1.0
    outside = tolerance_table({"a": (ref, ref), "b": (ref + 0.05, ref)}, tol)
    assert not outside.ok and outside.rows[0][1] == 0.0 and outside.worst_ratio > 1.0
    assert str(outside).splitlines()[1].startswith("b  max |error| = 5.000e-02")


def test_tolerance_table_takes_bf16_and_flags_nonfinite_values():
    ref = jnp.ones((4, 8), jnp.float32)
    assert tolerance_table({"x": (ref.astype(jnp.bfloat16), ref)}, 0.04).ok
    bad = tolerance_table({"x": (ref.at[0, 0].set(jnp.nan), ref)}, 0.04)
    assert isinstance(bad, ToleranceTable) and not bad.ok


def test_tolerance_table_rejects_bad_input():
    x = jnp.zeros(3)
    with pytest.raises(ValueError, match="empty"):
        tolerance_table({}, 0.1)
    with pytest.raises(ValueError, match="tol"):
        tolerance_table({"x": (x, x)}, 0.0)
    with pytest.raises(ValueError, match="shape"):
        tolerance_table({"x": (x, jnp.zeros(4))}, 0.1)
