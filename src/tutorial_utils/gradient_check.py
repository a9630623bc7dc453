"""Is a context-parallel (CP) port right? Its gradients, against a higher-precision reference.

Why: a wrong CP step (a batch not reordered, a shift inside the model, a window spelled for one
device) raises nothing, and its loss can sit within a percent of the right one; its gradients
cannot. Comparing CP in bfloat16 directly with one device in bfloat16 and asking for no more
than one device's bfloat16-vs-float32 gap fails correct ports: the two runs round differently,
so they sit further apart than either sits from float32. :func:`check_cp_gradients` measures
both bfloat16 runs against one float32 reference instead, and lets CP be :data:`FACTOR` times
as far from it as one device is.

The factor and the floor come from ``benchmarks/gradient_check_matrix.py``: 18 correct bfloat16
runs (three models, Ring and AllGather, CP 2, 4 and 8) and 6 kinds of broken run, through TE's
own code on CPU (``results/gradient_check/matrix.json``). There, correct runs reached at most
1.08 times one device's error, and the nearest broken run (a window one token too wide in the
CP run only) 4.98 times. So 2.5 leaves the bound 2.31 times the largest correct error, and
the smallest broken error 1.99 times the bound. A bug smaller than bfloat16's own rounding is
beyond any such check.

Copy it on its own: it needs JAX and NumPy only.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "FACTOR",
    "FLOOR",
    "MAX_ERR_ONE",
    "CPGradientCheck",
    "gradients_rel_l2",
    "check_cp_gradients",
]

#: CP may be this many times as far from the reference as one device is (calibrated, above).
FACTOR = 2.5
#: The bound never goes below this: a float32 run is ~1e-7 from its reference, and CP's own
#: rounding then weighs more than ``FACTOR`` allows (1.3x in the matrix, 4.3e-7); a broken
#: float32 run was 0.57.
FLOOR = 1e-4
#: A one-device run farther than this from the reference is not rounding: the port or the
#: reference is wrong before CP (correct bfloat16 runs were at most 0.0104 in the matrix).
MAX_ERR_ONE = 0.1

LIKELY_CAUSES = (
    "the batch not reordered for this mesh (every per-token array, with the mesh's cp_size and"
    " stripe), a shift inside the model (shift in the pipeline, before the reorder), or the"
    " window's spelling (TE counts the tokens before the query: a 48-token window is (47, 0);"
    " under Ring pass window_size=None for no window, not (-1, 0), and a left window >="
    " cp_size - 1; Ring takes stripe_size=1 only)"
)


@jax.jit
def _squared_norms(ours, theirs):
    """Per leaf, ``||a - b||^2`` and ``||b||^2`` in float32: one compiled program per tree."""
    f32 = jnp.float32
    diffs = jnp.stack([jnp.sum((a.astype(f32) - b.astype(f32)) ** 2) for a, b in zip(ours, theirs)])
    return diffs, jnp.stack([jnp.sum(b.astype(f32) ** 2) for b in theirs])


def gradients_rel_l2(grads, reference) -> float:
    """One relative L2 error for all the gradients of a model together.

    One norm over the concatenation of every leaf, not a norm per leaf:
    ``sqrt(sum of ||g - r||^2 over leaves / sum of ||r||^2 over leaves)``. So each leaf
    weighs what it holds, and a small leaf (a bias, a norm's scale) cannot dominate.

    Args:
        grads: The gradients to check (any pytree of arrays, any float dtype).
        reference: The gradients to compare with, the same pytree.

    Returns:
        The relative L2 error, computed in float32.

    Raises:
        ValueError: The two trees differ in structure or in a leaf's shape, or the reference
            is all zeros.
    """
    ours, theirs = jax.tree.structure(grads), jax.tree.structure(reference)
    if ours != theirs:
        raise ValueError(
            f"grads has tree {ours}, reference has {theirs}: pass the gradients of the same "
            "parameters (e.g. both from jax.grad of one model's loss)."
        )
    leaves = list(zip(jax.tree.leaves(grads), jax.tree.leaves(reference)))
    bad = next(((a, b) for a, b in leaves if jnp.shape(a) != jnp.shape(b)), None)
    if bad is not None:
        raise ValueError(
            f"grads has a leaf of shape {jnp.shape(bad[0])} where reference has "
            f"{jnp.shape(bad[1])}: compare the gradients in the same layout (undo a reorder or "
            "a sharding first)."
        )
    diffs, norms = _squared_norms(*zip(*leaves))
    diff, norm = float(np.sum(np.float64(diffs))), float(np.sum(np.float64(norms)))
    if norm == 0.0:
        raise ValueError(
            "the reference gradients are all zero, so there is nothing to measure against: "
            "check that the loss depends on the parameters (and is not masked out entirely)."
        )
    return (diff / norm) ** 0.5


@dataclasses.dataclass(frozen=True)
class CPGradientCheck:
    """The verdict of :func:`check_cp_gradients`.

    Attributes:
        err_cp: Relative L2 of the CP gradients against the reference.
        err_one: Relative L2 of the one-device gradients against the reference.
        bound: ``max(factor * err_one, floor)``, the most ``err_cp`` may be.
        passed: Both errors finite, ``err_cp <= bound`` and ``err_one <= max_err_one``.
        summary: The verdict and its numbers in one line (at most 88 characters).
        max_err_one: The largest ``err_one`` taken for rounding.
    """

    err_cp: float
    err_one: float
    bound: float
    passed: bool
    summary: str
    max_err_one: float = MAX_ERR_ONE

    def raise_if_failed(self) -> CPGradientCheck:
        """Raise when the check failed; return the check otherwise.

        Returns:
            This check, so that ``check_cp_gradients(...).raise_if_failed()`` chains.

        Raises:
            AssertionError: The check failed; the message names the numbers and the likely
                causes.
        """
        if self.passed:
            return self
        if not (math.isfinite(self.err_cp) and math.isfinite(self.err_one)):
            raise AssertionError(f"{self.summary}: a gradient is NaN or inf.")
        if self.err_one > self.max_err_one:
            raise AssertionError(
                f"{self.summary}: the one-device run is {self.err_one:.3g} from the reference,"
                f" more than rounding (max_err_one={self.max_err_one:g}), so the port or the"
                " reference is wrong before CP. Compare the port with the model as written on"
                " one device first (in float32 they agree to ~1e-6), and take the reference in"
                " float32 from the same parameters and batch."
            )
        raise AssertionError(
            f"{self.summary}: CP is {self.err_cp / max(self.err_one, 1e-30):.3g} times as far"
            f" from the reference as one device. Likely causes: {LIKELY_CAUSES}."
        )


def _is_positive_number(value) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float, np.integer, np.floating))
        and math.isfinite(value)
        and value > 0
    )


def _summary(err_cp, err_one, bound, factor, floor, max_err_one) -> str:
    if not (math.isfinite(err_cp) and math.isfinite(err_one)):
        return f"CP check FAILED: err_cp {err_cp:.3g}, err_one {err_one:.3g}: not finite"
    if err_one > max_err_one:
        return f"CP check FAILED: err_one {err_one:.3g} > max_err_one {max_err_one:g}"
    verdict, sign = ("passed", "<=") if err_cp <= bound else ("FAILED", ">")
    how = f"{factor:g} x err_one" if factor * err_one >= floor else "the floor; err_one"
    return f"CP check {verdict}: err_cp {err_cp:.3g} {sign} bound {bound:.3g} ({how} {err_one:.3g})"


def check_cp_gradients(
    grads_cp,
    grads_one,
    grads_reference,
    *,
    factor: float = FACTOR,
    floor: float = FLOOR,
    max_err_one: float = MAX_ERR_ONE,
    strict: bool = False,
) -> CPGradientCheck:
    """Check a CP step's gradients against one device's, both measured from one reference.

    Take the gradients of the same loss, parameters and batch three times: with CP in the
    dtype you train in (e.g. bfloat16), on one device in that same dtype, and on one device in
    float32 as the reference: TE's layer under ``tutorial_utils.te_on_cpu.allow_fp32()`` on
    CPU, or the model's own attention as written before the port (which runs on a GPU too).
    Compute the one-device runs outside ``jax.set_mesh`` and ``te.autocast``. With ``err_cp``
    and ``err_one`` each run's :func:`gradients_rel_l2` from the reference, the check passes
    when ``err_cp <= max(factor * err_one, floor)`` and ``err_one <= max_err_one`` (a larger
    ``err_one`` would widen the bound for a port that is wrong on one device too).

    Args:
        grads_cp: Parameter gradients of the CP run (parameter gradients need no undoing of
            the reorder).
        grads_one: Parameter gradients of the one-device run, in the CP run's dtype.
        grads_reference: Parameter gradients of the float32 one-device run.
        factor: How many times ``err_one`` the CP run may reach (:data:`FACTOR`).
        floor: The smallest bound (:data:`FLOOR`), for runs whose ``err_one`` is ~0.
        max_err_one: The largest ``err_one`` taken for rounding (:data:`MAX_ERR_ONE`).
        strict: Raise ``AssertionError`` instead of returning a failed check.

    Returns:
        A frozen :class:`CPGradientCheck`: both errors, the bound, the verdict and a summary.

    Raises:
        ValueError: The trees differ in structure or leaf shapes, the reference is all zeros,
            or ``factor``, ``floor`` or ``max_err_one`` is not a positive finite number.
        AssertionError: ``strict=True`` and the check failed
            (:meth:`CPGradientCheck.raise_if_failed` names the numbers and the likely causes).
    """
    for name, value in (("factor", factor), ("floor", floor), ("max_err_one", max_err_one)):
        if not _is_positive_number(value):
            raise ValueError(
                f"{name}={value!r} must be a positive finite number (the defaults: factor="
                f"{FACTOR:g}, floor={FLOOR:g}, max_err_one={MAX_ERR_ONE:g})."
            )
    err_cp = gradients_rel_l2(grads_cp, grads_reference)
    err_one = gradients_rel_l2(grads_one, grads_reference)
    bound = max(factor * err_one, floor) if math.isfinite(err_one) else math.nan
    passed = (
        math.isfinite(err_cp)
        and math.isfinite(err_one)
        and err_cp <= bound
        and err_one <= max_err_one
    )
    summary = _summary(err_cp, err_one, bound, factor, floor, max_err_one)
    check = CPGradientCheck(err_cp, err_one, bound, bool(passed), summary, max_err_one)
    return check.raise_if_failed() if strict else check
