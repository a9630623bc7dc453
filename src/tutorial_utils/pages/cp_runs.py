"""Plumbing for the pages that run context parallelism (chapters 5a and 5b, TE's CP rules).

A chapter page should show only the code a reader copies into a model (the reorder, the mesh
and shardings, the ``fused_attn`` call, the compiled step); the bookkeeping around it (the
comparison with one device, the Ulysses step, timing records) lives here, written once and
tested.

TE's own ``transformer_engine.jax.attention`` is imported inside :func:`thd_attention`, and only
for ``checks=False``: on the reference backend TE's code is not loaded, and that path refuses.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import tutorial_utils
from tutorial_utils import rules, te
from tutorial_utils.cli.check import tolerance
from tutorial_utils.context_parallel import context_parallel_attention
from tutorial_utils.pages.oracle_check import float32_errors, tolerance_table
from tutorial_utils.perfmodel.records import read_records, source_for, write_record
from tutorial_utils.perfmodel.timing import make_record
from tutorial_utils.te import attention
from tutorial_utils.te.fused_call import call_fused_attn

__all__ = [
    "thd_attention",
    "te_tolerance",
    "max_abs_diff",
    "ErrorTable",
    "error_table",
    "ulysses_step",
    "striped",
    "shard_inputs",
    "te_cp_step",
    "repo_root",
    "records_dir",
    "timing_results",
    "save_timing_record",
    "published_results",
]

TENSORS = ("output", "dQ", "dK", "dV")


def thd_attention(workload, *, is_training: bool = True, checks: bool = True):
    """Chapter 3's ``fused_attn`` call for ``workload``: ``attention(qkv, seq_desc, **cp_kwargs)``.

    Packed THD Q, K and V, no bias, no dropout, ``PADDING_CAUSAL_MASK`` with the workload's
    window, vanilla softmax, ``scaling_factor = head_dim ** -0.5``. The keyword arguments
    (``context_parallel_strategy``, ``context_parallel_causal_load_balanced``,
    ``context_parallel_axis``, ``stripe_size``) go to ``fused_attn`` unchanged.

    ``checks=False`` calls TE's own ``transformer_engine.jax.attention.fused_attn`` without
    this project's refusals in front of it, so that a page can show what TE computes for an
    input the facade refuses; it needs TE's code (real TE, or TE-on-CPU).
    """
    attention_module = attention
    if not checks:
        if not te.using_te_code():
            raise ValueError(
                f"checks=False runs TE's own fused_attn, but the backend is {te.backend_name()!r};"
                " unset TUTORIAL_TE_BACKEND (or set it to 'te-cpu') to run TE's code."
            )
        from transformer_engine.jax import attention as te_attention

        attention_module = te_attention

    def attend(qkv, seq_desc, **cp_kwargs):
        return call_fused_attn(
            attention_module,
            qkv,
            seq_desc,
            scaling_factor=workload.head_dim**-0.5,
            max_segments_per_seq=workload.max_segments_per_seq,
            # (-1, 0) becomes None, the spelling every strategy gets right; unchecked, the
            # window goes to TE as written
            window_size=rules.te_window_size(workload.window) if checks else workload.window,
            is_training=is_training,
            **cp_kwargs,
        )

    return attend


te_tolerance = tolerance  # TE's test tolerance for a dtype (cli.check.tolerance)


def max_abs_diff(a, b) -> float:
    """``max |a - b|``, computed in float32 (on the devices; nothing is copied to the host).

    :func:`tolerance_table`'s jitted program: one compile per shape, shared with the error table.
    """
    worst, _ = float32_errors()(jnp.asarray(a), jnp.asarray(b), jnp.float32(1.0))
    return float(worst)


@dataclasses.dataclass(frozen=True)
class ErrorTable:
    """CP results against one device: one row ``(run, tensor, max abs error, error / allowed)``.

    ``error / allowed`` is the largest ``|cp - single| / (atol + rtol * |single|)``; a value
    up to 1 is within TE's tolerance. Shown in a notebook as a Markdown table with two lines
    per run (the error, then the error over the allowed one) and a column per tensor: half
    the height of one line per tensor, and one number per cell.
    """

    rows: tuple[tuple[str, str, float, float], ...]
    tolerance: float
    label: str = "strategy"

    @property
    def worst_ratio(self) -> float:
        """The largest error relative to the allowed one, over every run and tensor."""
        return max(ratio for *_, ratio in self.rows)

    @property
    def max_errors(self) -> dict[str, float]:
        """The largest absolute error of each run, over its output and gradients."""
        out: dict[str, float] = {}
        for run, _, err, _ in self.rows:
            out[run] = max(out.get(run, 0.0), err)
        return out

    def failures(self) -> list[str]:
        """``'run tensor'`` for every row beyond the tolerance."""
        return [f"{run} {tensor}" for run, tensor, _, ratio in self.rows if not ratio <= 1.0]

    def markdown(self) -> str:
        tensors = list(dict.fromkeys(tensor for _, tensor, _, _ in self.rows))
        runs = list(dict.fromkeys(run for run, _, _, _ in self.rows))
        cell = {(run, tensor): (err, ratio) for run, tensor, err, ratio in self.rows}
        lines = [
            f"tolerance: rtol = atol = {self.tolerance:.3g}\n",
            f"| {self.label} | | " + " | ".join(tensors) + " |",
            "|---|---|" + "---|" * len(tensors),
        ]
        for run in runs:
            for i, (what, fmt) in enumerate((("max abs error", "{:.1e}"), ("/ allowed", "{:.2f}"))):
                values = [fmt.format(cell[run, t][i]) if (run, t) in cell else "" for t in tensors]
                lines.append(f"| {run if i == 0 else ''} | {what} | " + " | ".join(values) + " |")
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        return self.markdown()


def error_table(
    runs: Mapping[str, Sequence],
    single: Sequence,
    *,
    tolerance: float | None = None,
    label: str = "strategy",
) -> ErrorTable:
    """Compare each run's ``(output, dQ, dK, dV)`` with the single-device ``single``.

    All arrays must be in the original token order (inverse-reordered). The tolerance is
    TE's for the dtype of the single-device output unless given.
    """
    if len(single) != len(TENSORS):
        raise ValueError(f"single must be (output, dQ, dK, dV); got {len(single)} array(s).")
    tol = te_tolerance(single[0].dtype) if tolerance is None else float(tolerance)
    if not tol > 0:
        raise ValueError(f"tolerance={tolerance!r} must be a positive number.")
    rows = []
    for run, arrays in runs.items():
        if len(arrays) != len(TENSORS):
            raise ValueError(
                f"runs[{run!r}] must be (output, dQ, dK, dV); got {len(arrays)} array(s)."
            )
        try:
            table = tolerance_table(dict(zip(TENSORS, zip(arrays, single))), tol)
        except ValueError as err:
            raise ValueError(f"runs[{run!r}]: {err}") from None
        rows += [(run, *row) for row in table.rows]
    if not rows:
        raise ValueError("runs is empty: pass {name: (output, dQ, dK, dV)} for at least one run.")
    return ErrorTable(tuple(rows), tol, label)


def ulysses_step(
    workload, mesh, stripe_size: int, *, batch_axis: str | None = None, axis_name: str = "cp"
):
    """Compiled forward+backward of Ulysses, ``step(qkv, segment_ids, segment_pos, dout)``.

    Runs :func:`tutorial_utils.context_parallel.context_parallel_attention` with
    ``strategy='ulysses'`` on inputs striped with ``stripe_size`` (which it undoes), and
    returns ``((loss, output), (dQ, dK, dV))`` like the chapter's TE step, with the output
    and gradients sharded like Q.
    """
    x4 = NamedSharding(mesh, P(batch_axis, axis_name, None, None))
    tok = NamedSharding(mesh, P(batch_axis, axis_name))

    def loss(qkv, segment_ids, segment_pos, dout):
        out = context_parallel_attention(
            *qkv,
            segment_ids,
            segment_pos,
            mesh=mesh,
            axis_name=axis_name,
            strategy="ulysses",
            stripe_size=stripe_size,
            load_balanced=True,
            window_size=workload.window,
            scaling_factor=workload.head_dim**-0.5,
            batch_axis=batch_axis,
        )
        return jnp.vdot(out.astype(jnp.float32), dout.astype(jnp.float32)), out

    return jax.jit(
        jax.value_and_grad(loss, has_aux=True),
        in_shardings=((x4, x4, x4), tok, tok, x4),
        out_shardings=((None, x4), (x4, x4, x4)),
    )


def striped(x, stripe_size: int, cp_size: int, *, inverse: bool = False):
    """TE's striped reorder of a ``[batch, seq, ...]`` array (or its inverse), jitted once per
    shape: ``reorder_causal_load_balancing`` with ``ReorderStrategy.Striped``, ``seq_dim=1``."""
    return _striped(x, stripe_size, cp_size, inverse)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _striped(x, stripe_size, cp_size, inverse):
    reorder = (
        attention.inverse_reorder_causal_load_balancing
        if inverse
        else attention.reorder_causal_load_balancing
    )
    return reorder(
        x,
        strategy=attention.ReorderStrategy.Striped,
        cp_size=cp_size,
        seq_dim=1,
        stripe_size=stripe_size,
    )


def shard_inputs(
    arrays, mesh, stripe_size: int, *, batch_axis: str | None = None, axis_name: str = "cp"
):
    """``((q, k, v), segment_ids, segment_pos, dout)`` in natural order, striped for the mesh's
    CP size and placed: Q, K, V, dO ``P(batch_axis, axis_name, None, None)``, the ids and
    positions ``P(batch_axis, axis_name)`` (chapter 5b's placement)."""
    cp_size = mesh.shape[axis_name]
    x4 = NamedSharding(mesh, P(batch_axis, axis_name, None, None))
    tok = NamedSharding(mesh, P(batch_axis, axis_name))

    def put(x, where):
        return jax.device_put(striped(x, stripe_size, cp_size), where)

    qkv, ids, pos, dout = arrays
    return tuple(put(x, x4) for x in qkv), put(ids, tok), put(pos, tok), put(dout, x4)


def te_cp_step(
    workload,
    strategy,
    stripe_size: int,
    args,
    *,
    axis_name: str = "cp",
    checks: bool = True,
    backward: bool = True,
):
    """Compiled forward+backward of TE's CP ``fused_attn`` (chapter 5b's step), called as
    ``step(*args)`` on :func:`shard_inputs`' output; returns ``((loss, output), (dQ, dK, dV))``
    with the output and gradients sharded like Q. Run it inside ``jax.set_mesh`` and
    ``te.autocast(mesh_resource=...)``. ``checks=False``: TE's call alone
    (:func:`thd_attention`). ``backward=False``: the forward pass only, which compiles in
    about half the time, returning ``(loss, output)``."""
    attend = thd_attention(workload, checks=checks, is_training=backward)

    def loss(qkv, segment_ids, segment_pos, dout):
        desc = attention.SequenceDescriptor.from_segment_ids_and_pos(segment_ids, segment_pos)
        out = attend(
            qkv,
            desc,
            context_parallel_strategy=strategy,
            context_parallel_causal_load_balanced=True,
            context_parallel_axis=axis_name,
            stripe_size=stripe_size,
        )
        return jnp.vdot(out.astype(jnp.float32), dout.astype(jnp.float32)), out

    x4 = args[0][0].sharding
    shardings = jax.tree.map(lambda x: x.sharding, args)
    if not backward:
        return jax.jit(loss, in_shardings=shardings, out_shardings=(None, x4))
    return jax.jit(
        jax.value_and_grad(loss, has_aux=True),
        in_shardings=shardings,
        out_shardings=((None, x4), (x4, x4, x4)),
    )


def repo_root(start: Path | None = None) -> Path:
    """The repository: the first folder with a ``pyproject.toml`` at or above ``start``.

    ``start`` defaults to the working directory (a notebook runs in ``notebooks/`` or the
    repository root); the package's own folder is tried next.
    """
    starts = [Path.cwd() if start is None else Path(start), Path(tutorial_utils.__file__).parent]
    for here in starts:
        here = here.resolve()
        for folder in (here, *here.parents):
            if (folder / "pyproject.toml").is_file():
                return folder
    raise FileNotFoundError(
        "no pyproject.toml above the working directory or the package; run inside the repository."
    )


def records_dir(root: Path | None = None) -> Path:
    """Where a chapter writes its live timing record (created if missing).

    ``$CP_TUTORIAL_RECORDS_DIR`` when set (a relative path counts from the repository
    root), else ``_build/records/`` (ignored by git), so building the site changes no
    tracked file. To keep a GPU run, set ``CP_TUTORIAL_RECORDS_DIR=results`` and commit it.
    """
    root = repo_root() if root is None else Path(root)
    env = os.environ.get("CP_TUTORIAL_RECORDS_DIR", "").strip()
    folder = (
        root / env if env else root / "_build" / "records"
    )  # an absolute env path stays as it is
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def timing_results(
    timings: Mapping[str, dict],
    stripes: Mapping[str, int | None],
    max_errors: Mapping[str, float] | None = None,
) -> list[dict]:
    """``cp-bench/1`` result rows from :func:`~tutorial_utils.perfmodel.timing.time_fn` timings.

    ``timings`` must hold a ``'single'`` entry; ``stripes`` gives each other run's stripe
    size (``None`` for Ulysses, which has no stripe of its own); ``max_errors`` (e.g.
    :attr:`ErrorTable.max_errors`) adds each run's largest error against one device.
    """
    if "single" not in timings:
        raise ValueError(
            "timings needs a 'single' entry (the single-device run the speed-ups refer to)."
        )
    base = timings["single"]["mean_ms"]
    rows = []
    for name, t in timings.items():
        row = {
            "strategy": name,
            "stripe_size": None if name in ("single", "ulysses") else stripes[name],
            "mean_ms": t["mean_ms"],
            "std_ms": t["std_ms"],
            "min_ms": t["min_ms"],
            "median_ms": t["median_ms"],
            "speedup": base / t["mean_ms"],
            "first_call_ms": t["first_call_ms"],
        }
        if max_errors is not None and name in max_errors:
            row["max_abs_err"] = float(max_errors[name])
        rows.append(row)
    return rows


def save_timing_record(
    workload,
    results: Sequence[dict],
    *,
    warmup: int,
    iters: int,
    chapter="5b",
    directory: Path | None = None,
) -> Path:
    """Write chapter timings as a ``cp-bench/1`` record saying where they came from; return its
    path.

    ``chapter`` is the chapter's number, e.g. ``5`` or ``"5b"`` (the file is named ``ch05b-...``).
    The path is relative to the repository root when it lies inside it.
    """
    number = str(chapter)
    digits = number.rstrip("abcdefghijklmnopqrstuvwxyz")
    if not digits.isdigit():
        raise ValueError(f"chapter={chapter!r} must be a chapter number such as 5 or '5b'.")
    tag = f"ch{int(digits):02d}{number[len(digits) :]}"
    source = source_for(jax.default_backend(), te.backend_kind())
    notes = (
        "Ulysses runs the pure-JAX reference implementation on every backend (TE has no Ulysses"
        " strategy); its inputs use the AllGather stripe layout."
    )
    if not te.using_real_te():
        notes += (
            " CPU timings on simulated devices (CPU reference kernel); they say nothing about GPUs."
        )
    record = make_record(
        f"Chapter {chapter} forward+backward, {workload.name} preset, {te.backend_name()}",
        source,
        workload.as_dict(),
        results,
        warmup=warmup,
        iters=iters,
        notes=notes,
    )
    root = repo_root()
    path = write_record(
        record,
        directory=records_dir(root) if directory is None else directory,
        name=f"{tag}-{workload.name}-{source}",
    ).resolve()
    return path.relative_to(root) if path.is_relative_to(root) else path


def published_results(directory: Path | None = None, gpu: str = "GB200") -> list[dict] | None:
    """The result rows of TE's published record for ``gpu`` in ``results/``, or ``None``.

    Invalid records are skipped (the Benchmarks page reports them).
    """
    folder = repo_root() / "results" if directory is None else Path(directory)
    if not folder.is_dir():
        return None
    records, _ = read_records(folder)
    for rec in records:
        if rec["source"] == "published" and gpu in str(rec.get("hardware", {}).get("gpu", "")):
            return rec["results"]
    return None
