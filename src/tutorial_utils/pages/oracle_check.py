"""Chapter 3's check of TE's attention against an independent oracle: the shapes and the table.

The chapter shows the oracle itself, because that is the check a reader should copy; the
bookkeeping around it (a workload the dense oracle can hold, the tolerance table) lives here.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from tutorial_utils.perfmodel.workload import get_workload

__all__ = ["MAX_SCORES", "oracle_workload", "ToleranceTable", "tolerance_table", "float32_errors"]

#: The largest ``batch * heads * seq * seq`` score tensor the oracle builds (2**31 fp32 = 8 GiB).
MAX_SCORES = 2**31


def oracle_workload(workload, max_scores: int = MAX_SCORES):
    """``workload`` when a dense ``[batch, heads, seq, seq]`` score tensor of it has at most
    ``max_scores`` entries; otherwise the ``cpu`` preset in ``workload``'s dtype.

    Why: ``jax.nn.dot_product_attention(implementation="xla")`` computes every score. TE's
    published shape (the ``seed`` preset: 2 rows x 128 heads x 65536**2) would need about
    10**12 of them. The ``cpu`` preset has the same structure (padded slots, GQA, a window of
    half a slot), so checking TE on it checks the same code path at a size the oracle can hold.
    """
    if not isinstance(max_scores, int) or max_scores < 1:
        raise ValueError(f"max_scores={max_scores!r} must be a positive int.")
    if workload.batch * workload.num_q_heads * workload.seq_len**2 <= max_scores:
        return workload
    return get_workload("cpu", dtype=workload.dtype)


@dataclasses.dataclass(frozen=True)
class ToleranceTable:
    """Rows ``(tensor, max abs error, max error / allowed)`` at one tolerance.

    ``error / allowed`` is the largest ``|got - ref| / (tol + tol * |ref|)``; the comparison
    passes when it is at most 1 for every tensor (and every value is finite).
    """

    rows: tuple[tuple[str, float, float], ...]
    tolerance: float

    @property
    def worst_ratio(self) -> float:
        return max(ratio for _, _, ratio in self.rows)

    @property
    def ok(self) -> bool:
        return all(math.isfinite(ratio) and ratio <= 1.0 for _, _, ratio in self.rows)

    def __str__(self) -> str:
        width = max(len(name) for name, _, _ in self.rows)
        return "\n".join(
            f"{name:{width}s}  max |error| = {err:.3e}   max error/allowed = {ratio:.3f}"
            for name, err, ratio in self.rows
        )


@functools.cache
def float32_errors():
    """``(max |got - ref|, max |got - ref| / (tol + tol |ref|))`` in float32, as one jitted program.

    Shared by :func:`tolerance_table` and :func:`tutorial_utils.pages.cp_runs.max_abs_diff`, so a
    shape compiles once for both. Why jitted: called eagerly, these eight element-wise ops and
    two reductions are each compiled on their own for every new shape (op-by-op dispatch); one
    program per shape is a fraction of that. Built on first use so that importing this module
    does not import JAX.
    """

    @jax.jit
    def errors(got, ref, tol):
        got, ref = got.astype(jnp.float32), ref.astype(jnp.float32)
        err = jnp.abs(got - ref)
        return jnp.max(err), jnp.max(err / (tol + tol * jnp.abs(ref)))

    return errors


def tolerance_table(pairs: Mapping[str, tuple], tol: float) -> ToleranceTable:
    """Compare each ``name: (got, ref)`` pair at ``rtol = atol = tol``.

    Why: the chapter asserts one thing (every tensor within tolerance) but should print the
    numbers behind it, so a reader sees how much room is left. Shapes must match.
    """
    if not pairs:
        raise ValueError("pairs is empty: pass {name: (got, ref)} for at least one tensor.")
    if not (isinstance(tol, (int, float)) and tol > 0):
        raise ValueError(f"tol={tol!r} must be a positive number.")
    rows = []
    for name, pair in pairs.items():
        if len(pair) != 2:
            raise ValueError(f"pairs[{name!r}] must be a (got, ref) pair.")
        got, ref = pair
        if tuple(got.shape) != tuple(ref.shape):
            raise ValueError(
                f"pairs[{name!r}]: got has shape {tuple(got.shape)}, ref {tuple(ref.shape)}."
            )
        # on the devices: nothing as large as the seed workload's gradients is copied to the host
        worst, ratio = float32_errors()(jnp.asarray(got), jnp.asarray(ref), jnp.float32(tol))
        rows.append((name, float(worst), float(ratio)))
    return ToleranceTable(tuple(rows), float(tol))
