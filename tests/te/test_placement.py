"""The facade's CP placement check and its dO fix, both ways, on TE's own code (TE-on-CPU).

One subprocess (``tests/scripts/placement_script.py``, the backend must be chosen before TE is
imported) runs TE alone and the facade on the same arrays. Without the facade, TE 2.20.2 is
silently wrong or stops with a bare assertion; through the facade the same call raises a
``ValueError`` naming the input and the fix, or is right (bf16 tolerance 0.0394).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = (
    pytest.mark.slow
)  # one TE-on-CPU subprocess, about a minute of CPU: make test runs it, test-fast not


@pytest.fixture(scope="module")
def report():
    env = {k: v for k, v in os.environ.items() if k not in ("TUTORIAL_TE_BACKEND", "XLA_FLAGS")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "scripts" / "placement_script.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("stripe", [1, 2])
def test_unplaced_eager_call_is_wrong_alone_and_refused_by_the_facade(report, stripe):
    rows = report["placement"]
    alone = rows[f"stripe {stripe}, eager, plain arrays, te_alone"]
    assert alone["max_error"] > 1.0, alone  # TE alone: a wrong output and no error
    refused = rows[f"stripe {stripe}, eager, plain arrays, facade"]["error"]
    assert refused.startswith("ValueError: q has sharding SingleDeviceSharding"), refused
    assert (
        "over the context-parallel axis 'cp'" in refused
        and "jax.device_put(x, NamedSharding(mesh, P(None, 'cp')))" in refused
    )


@pytest.mark.parametrize("stripe", [2])
def test_placed_eager_call_is_wrong_alone_and_right_through_the_facade(report, stripe):
    rows, tol = report["placement"], report["tolerance"]
    assert rows[f"stripe {stripe}, eager, placed on the mesh, te_alone"]["max_error"] > 1.0
    assert rows[f"stripe {stripe}, eager, placed on the mesh, facade"]["max_error"] < tol


@pytest.mark.parametrize("stripe", [2])
def test_jit_without_shardings_gets_a_clear_error_instead_of_a_bare_assertion(report, stripe):
    rows = report["placement"]
    assert rows[f"stripe {stripe}, jit without shardings, te_alone"]["error"].startswith(
        "JaxRuntimeError: AssertionError: cp is not a axis of the given mesh"
    )
    ours = rows[f"stripe {stripe}, jit without shardings, facade"]["error"]
    assert (
        "ValueError: q is not placed for context parallelism" in ours
        and "To fix, place it with" in ours
    ), ours


@pytest.mark.parametrize("cp", [4, 8])
def test_training_step_with_non_uniform_loss_is_right_through_the_facade(report, cp):
    """AllGather stripe 2, reorder inside the jitted step, loss = sum(out * w): dO differs per
    token."""
    rows, tol = report["dout"], report["tolerance"]
    alone = rows[f"cp {cp}, stripe 2, te_alone"]
    # TE alone: wrong gradients at cp 4, a bare explode_superdims assertion at cp 8
    assert alone.get("max_grad_error", 0) > 1.0 or alone.get("error", "").startswith(
        "JaxRuntimeError: AssertionError"
    ), alone
    ours = rows[f"cp {cp}, stripe 2, facade"]
    assert ours["max_grad_error"] < tol * max(1.0, ours["grad_scale"]), ours
