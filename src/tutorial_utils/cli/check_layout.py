"""Check your own packed batch: does TE's context-parallel attention compute it right?

``python -m tutorial_utils.cli.check_layout BATCH.npz --cp 4 --strategy allgather --stripe 128
[--window L[,L|none...]] [--model-window W[,W|none...]] [--max-segments M] [--json]``

Why: the tutorial proves its own layouts right; a reader's batches (their packing, their padding
positions, their stripe) get no such proof, and TE does not raise when its THD metadata tricks
misread a layout, it attends the wrong keys. This tool runs, for one ``.npz`` (two ``[batch,
seq]`` integer arrays ``segment_ids`` and ``segment_pos``, un-reordered) or a folder of them:

1. the exact validator (:func:`tutorial_utils.validation.validate_packed_inputs`);
2. TE 2.20.2's own CP code (:mod:`tutorial_utils.te_on_cpu`: TE's JAX code, a reference
   kernel in place of cuDNN, ``cp`` simulated CPU devices) on random q/k/v with **1 head and a
   small head_dim** at the real sequence length, with a padding-causal mask (and the window);
3. the same call on one device, and a reference computed from the segment ids and positions
   themselves (what the mask means), so "CP matches one device" and "both are right" are
   separate facts (TE's one-device path drops segments past ``max_segments_per_seq``).

Before anything is allocated the three programs are compiled from abstract shapes and XLA's
memory analysis gives the estimate; past ``--memory-limit-gb`` the tool refuses. The check is
of the *layout* (TE's metadata), so q/k/v are float32 (the stand-in is told to accept it; cuDNN
would not) and the tolerance is tight (``TOLERANCE``); a query that misses one key of a
8,192-token window moves by about 1e-4. Only the forward is run: the backward reads the same
metadata.

Several windows in one run (a model with local and global layers): ``--window`` takes TE's left
bound L of ``window_size=(L, 0)`` or ``none`` (a global layer), ``--model-window`` the model's own
window W (the keys a query sees, itself included, from array indices), checked as TE's ``(W-1,
0)``; both repeat or take comma lists. Each window gets its own TE run and verdict; the arrays,
the reorder diagnosis, q/k/v and their striped copies are shared, the compiled programs cached.

Arrays that are not a packed layout are also tried as already reordered for CP (the tool takes
them un-reordered and reorders them itself): if undoing a Striped or DualChunkSwap reorder makes
them one, the report names that reorder and gives its fix
(:func:`~tutorial_utils.cli.check_layout_input.looks_reordered`).

Verdicts: ``ok`` (validator accepts and TE's CP output is right), ``wrong`` (TE's CP output is
not), ``rejected`` (TE happened to be right on this batch but the validator rejects it, which it
is not expected to do: please report it). Exit status 0 when every verdict (every file and
window) is ok, 1 otherwise, 2 for bad input.

TE is imported inside :func:`_te` and :func:`_fused`, after ``te_on_cpu.install()``: the
stand-in extension must be in place before ``transformer_engine.jax`` (or ``tutorial_utils.te``,
whose import picks a backend and imports TE) is imported.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm import tqdm

from tutorial_utils import rules, te_on_cpu
from tutorial_utils.cli.check_layout_input import (
    REQUIRED_ARRAYS,
    Window,
    load_batches,
    looks_reordered,
    model_windows,
    reorder_fix,
    te_windows,
    unique_windows,
)
from tutorial_utils.cli.check_layout_report import GIB, TOLERANCE, Report, fix_of, summary
from tutorial_utils.reference import MaskSpec, blockwise_attention
from tutorial_utils.validation import first_violation

__all__ = [
    "Report",
    "Window",
    "load_batches",
    "check",
    "check_windows",
    "main",
    "TOLERANCE",
    "DEFAULT_HEAD_DIM",
    "REQUIRED_ARRAYS",
]

DEFAULT_HEAD_DIM = 8
STRATEGIES = ("allgather", "ring")


# ----------------------------------------------------------------------------- the three programs


def _check_args(cp, strategy, stripe, window, max_segments, head_dim) -> str:
    """Refuse bad arguments, naming the option; returns the strategy's canonical name."""
    for name, value in (("cp", cp), ("stripe", stripe), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"--{name.replace('_', '-')}={value!r} must be a positive int.")
    try:
        canonical = rules.normalize_strategy(strategy)
    except ValueError:
        canonical = None
    if canonical not in STRATEGIES:
        raise ValueError(
            f"--strategy={strategy!r} is not one of {STRATEGIES} (TE's THD CP strategies)."
        )
    if window is not None and (not isinstance(window, (int, np.integer)) or window < 0):
        raise ValueError(
            f"--window={window!r} must be an int >= 0: the left side of a causal sliding window "
            "(window_size=(L, 0)); leave it out for full causal attention."
        )
    if max_segments is not None:
        rules.check_max_segments(max_segments, name="--max-segments")
    return canonical


def _te():
    """TE's JAX package, with the stand-in kernel in place of cuDNN, and its attention module."""
    te_jax = te_on_cpu.install()
    from transformer_engine.jax import attention as te_attention

    return te_jax, te_attention


def _fused(
    te_attention, q, k, v, ids, pos, *, window, max_segments, cp_axis="", strategy=None, stripe=None
):
    from tutorial_utils.te.fused_call import call_fused_attn

    desc = te_attention.SequenceDescriptor.from_segment_ids_and_pos(ids, pos)
    return call_fused_attn(
        te_attention,
        (q, k, v),
        desc,
        scaling_factor=q.shape[-1] ** -0.5,
        max_segments_per_seq=max_segments,
        window_size=window,
        context_parallel_strategy=strategy
        if strategy is not None
        else te_attention.CPStrategy.DEFAULT,
        context_parallel_causal_load_balanced=bool(cp_axis),
        context_parallel_axis=cp_axis,
        stripe_size=stripe if cp_axis else None,
    )


def _abstract(batch, seq, head_dim, sharding=None):
    x = jax.ShapeDtypeStruct((batch, seq, 1, head_dim), np.float32, sharding=sharding)
    i = jax.ShapeDtypeStruct((batch, seq), np.int32, sharding=sharding)
    return x, x, x, i, i


def _memory(compiled, devices=1) -> int:
    try:
        m = compiled.memory_analysis()
        per = m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
    except Exception:  # noqa: BLE001 - no analysis on this backend: fall back to the caller's count
        return 0
    return int(per) * devices


@functools.cache
def _cp_mesh(cp):
    mesh = Mesh(np.array(jax.devices()[:cp]), ("cp",))
    return mesh, NamedSharding(mesh, P(None, "cp"))


def _striped_inputs(args, cp, stripe):
    """q, k, v, ids and pos striped for ``cp`` devices and sharded over them (every window's CP
    program takes these)."""
    _, te_attention = _te()
    _, sharding = _cp_mesh(cp)
    return tuple(
        jax.device_put(
            te_attention.reorder_causal_load_balancing(
                x, te_attention.ReorderStrategy.Striped, cp, 1, stripe
            ),
            sharding,
        )
        for x in args
    )


@functools.cache
def _cp_program(cp, strategy, stripe, window, max_segments, batch, seq, head_dim):
    te_jax, te_attention = _te()
    mesh, sharding = _cp_mesh(cp)
    strat = (
        te_attention.CPStrategy.RING if strategy == "ring" else te_attention.CPStrategy.ALL_GATHER
    )
    fn = functools.partial(
        _fused,
        te_attention,
        window=window,
        max_segments=max_segments,
        cp_axis="cp",
        strategy=strat,
        stripe=stripe,
    )
    with (
        te_on_cpu.allow_fp32(),
        jax.set_mesh(mesh),
        te_jax.autocast(mesh_resource=te_jax.MeshResource(cp_resource="cp")),
    ):
        compiled = (
            jax.jit(fn, in_shardings=(sharding,) * 5, out_shardings=sharding)
            .lower(*_abstract(batch, seq, head_dim, sharding))
            .compile()
        )

    def run(striped_inputs):
        out = compiled(*striped_inputs)
        return np.asarray(
            te_attention.inverse_reorder_causal_load_balancing(
                out, te_attention.ReorderStrategy.Striped, cp, 1, stripe
            )
        )

    return run, _memory(compiled, cp)


@functools.cache
def _one_device_program(window, max_segments, batch, seq, head_dim):
    _, te_attention = _te()
    with te_on_cpu.allow_fp32():
        compiled = (
            jax.jit(
                functools.partial(_fused, te_attention, window=window, max_segments=max_segments)
            )
            .lower(*_abstract(batch, seq, head_dim))
            .compile()
        )
    return (lambda *a: np.asarray(compiled(*a))), _memory(compiled)


@functools.cache
def _reference_program(window, batch, seq, head_dim):
    """Attention as the segment ids and positions define it (never through TE's metadata)."""
    spec = MaskSpec(padding=True, causal=True, window=window or (-1, -1))

    def ref(q, k, v, ids, pos):
        return blockwise_attention(q, k, v, ids, ids, pos, pos, scale=head_dim**-0.5, spec=spec)[0]

    compiled = jax.jit(ref).lower(*_abstract(batch, seq, head_dim)).compile()
    return (lambda *a: np.asarray(compiled(*a))), _memory(compiled)


# ----------------------------------------------------------------------------- the check


def _wrong_segments(wrong, ids):
    out = []
    for b, sid in sorted({(int(b), int(ids[b, t])) for b, t in zip(*np.nonzero(wrong))}):
        tokens = np.nonzero(wrong[b] & (ids[b] == sid))[0]
        out.append(
            {"row": b, "segment": sid, "tokens": int(tokens.size), "first_token": int(tokens[0])}
        )
    return out


def default_memory_limit() -> int:
    """16 GiB, or 80% of the memory this machine has available if that is less."""
    limit = 16 * GIB
    try:
        with open("/proc/meminfo") as fh:
            avail = next(
                int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:")
            )
        limit = min(limit, int(0.8 * avail))
    except (OSError, StopIteration, ValueError):
        pass
    return limit


def check(
    segment_ids,
    segment_pos,
    *,
    cp: int,
    strategy: str,
    stripe: int = 1,
    window: int | None = None,
    max_segments: int | None = None,
    head_dim: int = DEFAULT_HEAD_DIM,
    memory_limit: int | None = None,
    seed: int = 0,
    name: str = "<arrays>",
    progress=None,
) -> Report:
    """Run the validator and TE's CP code on one ``[batch, seq]`` layout; see the module docstring.

    Needs ``cp`` JAX devices (the command line simulates them). ``progress`` is called with a stage
    name after each stage. Raises ``ValueError`` for bad arguments or a memory estimate past the
    limit. One window (TE's left bound L, or ``None``); :func:`check_windows` takes several.
    """
    return check_windows(
        segment_ids,
        segment_pos,
        cp=cp,
        strategy=strategy,
        stripe=stripe,
        windows=[window],
        max_segments=max_segments,
        head_dim=head_dim,
        memory_limit=memory_limit,
        seed=seed,
        name=name,
        progress=progress,
    )[0]


def check_windows(
    segment_ids,
    segment_pos,
    *,
    cp: int,
    strategy: str,
    stripe: int = 1,
    windows=(None,),
    max_segments: int | None = None,
    head_dim: int = DEFAULT_HEAD_DIM,
    memory_limit: int | None = None,
    seed: int = 0,
    name: str = "<arrays>",
    progress=None,
) -> list[Report]:
    """:func:`check` for each of several windows, sharing what does not depend on the window.

    The argument checks, the reorder diagnosis, q/k/v and their striped, sharded copies are made
    once; the validator, the memory estimate's programs and the three runs are per window (TE's
    window rules and the compiled masks depend on it). Every window's programs are compiled and
    the memory estimated before anything is allocated.

    Args:
        segment_ids: ``[batch, seq]`` integer segment ids, un-reordered.
        segment_pos: ``[batch, seq]`` integer positions.
        cp: CP size; needs ``cp`` JAX devices (the command line simulates them).
        strategy: ``"allgather"`` or ``"ring"``.
        stripe: Stripe size of the striped reorder.
        windows: Each a TE left bound L (``window_size=(L, 0)``), ``None`` (full causal), or a
            :class:`~tutorial_utils.cli.check_layout_input.Window`.
        max_segments: ``max_segments_per_seq`` (default: the largest segment id).
        head_dim: Head dimension of the random q/k/v.
        memory_limit: Bytes past which the estimate refuses (default
            :func:`default_memory_limit`).
        seed: Seed of the random q/k/v.
        name: The batch's name in the reports.
        progress: Called with a stage name after each stage (five per window).

    Returns:
        One :class:`Report` per window, in order.

    Raises:
        ValueError: For bad arguments or a memory estimate past the limit.
    """
    t0 = time.perf_counter()
    step = progress or (lambda _stage: None)
    wins = [w if isinstance(w, Window) else Window(left=w) for w in windows]
    if not wins:
        raise ValueError("windows=[] holds no window; pass [None] for full causal attention.")
    for w in wins:
        canonical = _check_args(cp, strategy, stripe, w.left, max_segments, head_dim)
    strategy = canonical
    ids, pos = np.asarray(segment_ids), np.asarray(segment_pos)
    if (
        ids.ndim != 2
        or ids.shape != pos.shape
        or not all(np.issubdtype(x.dtype, np.integer) for x in (ids, pos))
    ):
        raise ValueError(
            f"segment_ids {ids.shape} {ids.dtype} and segment_pos {pos.shape} {pos.dtype} must be"
            " integer [batch, seq] arrays of the same shape."
        )
    ids, pos = ids.astype(np.int32), pos.astype(np.int32)
    batch, seq = ids.shape
    rules.check_divisible_seq(seq, cp, stripe, name="seq (segment_ids.shape[1])")
    if len(jax.devices()) < cp:
        raise ValueError(
            f"--cp={cp} needs {cp} JAX devices, this process has {len(jax.devices())}; run "
            "`python -m tutorial_utils.cli.check_layout`, which simulates them on CPU."
        )
    segs = max_segments if max_segments is not None else max(1, int(ids.max()))
    reordered = looks_reordered(ids, pos, cp=cp, stripe=stripe)
    seconds = [time.perf_counter() - t0] + [0.0] * (len(wins) - 1)  # shared work: the first's
    found, programs = [], []
    for i, w in enumerate(wins):
        t = time.perf_counter()
        found.append(
            first_violation(
                ids,
                pos,
                max_segments_per_seq=segs,
                cp_size=cp,
                stripe_size=stripe,
                strategy=strategy,
                window_size=w.size,
            )
        )
        step("validator")
        programs.append(
            (
                _cp_program(cp, strategy, stripe, w.size, segs, batch, seq, head_dim),
                _one_device_program(w.size, segs, batch, seq, head_dim),
                _reference_program(w.size, batch, seq, head_dim),
            )
        )
        step("compile")
        seconds[i] += time.perf_counter() - t
    t = time.perf_counter()
    # q/k/v/ids/pos, their reordered copies and the outputs (three more per extra window)
    inputs = batch * seq * ((3 * head_dim * 4 + 8) * 3 + (len(wins) - 1) * 3 * head_dim * 4)
    estimate = inputs + max(mem for progs in programs for _, mem in progs)
    limit = default_memory_limit() if memory_limit is None else memory_limit
    if estimate > limit:
        raise ValueError(
            f"memory estimate {estimate / GIB:.2f} GiB exceeds"
            f" --memory-limit-gb={limit / GIB:.2f} for {batch} x {seq:,} tokens; check fewer rows"
            " at a time (split the batch into several .npz files in a folder) or raise the limit."
        )
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    q, k, v = (jax.random.normal(kk, (batch, seq, 1, head_dim), jnp.float32) for kk in keys)
    args = (q, k, v, jnp.asarray(ids), jnp.asarray(pos))
    striped = _striped_inputs(args, cp, stripe)
    seconds[0] += time.perf_counter() - t
    reports = []
    for i, (w, rule, ((run_cp, _), (run_one, _), (run_ref, _))) in enumerate(
        zip(wins, found, programs)
    ):
        t = time.perf_counter()
        out_cp = run_cp(striped)
        step("TE CP")
        out_one = run_one(*args)
        step("TE one device")
        out_ref = run_ref(*args)
        step("reference")
        row_err = np.max(np.abs(out_cp - out_ref), axis=(2, 3))
        wrong = row_err > TOLERANCE
        right = not wrong.any()
        reports.append(
            Report(
                file=name,
                batch=batch,
                seq=seq,
                cp=cp,
                strategy=strategy,
                stripe=stripe,
                window=w.size,
                max_segments=segs,
                head_dim=head_dim,
                verdict=("ok" if rule is None else "rejected") if right else "wrong",
                validator=rule,
                fix=reorder_fix(reordered[0]) if reordered and rule else fix_of(rule),
                max_error_cp_vs_one_device=float(np.max(np.abs(out_cp - out_one))),
                max_error_cp_vs_reference=float(row_err.max()),
                max_error_one_device_vs_reference=float(np.max(np.abs(out_one - out_ref))),
                wrong_rows=int(wrong.sum()),
                wrong_segments=_wrong_segments(wrong, ids),
                memory_estimate_bytes=int(estimate),
                seconds=seconds[i] + time.perf_counter() - t,
                model_window=w.model,
                window_given=w.given,
                looks_reordered=reordered if rule else [],
                outputs={
                    "cp": out_cp,
                    "one_device": out_one,
                    "reference": out_ref,
                    "q": np.asarray(q),
                    "k": np.asarray(k),
                    "v": np.asarray(v),
                },
            )
        )
    return reports


# ----------------------------------------------------------------------------- command line

STAGES = ("validator", "compile", "TE CP", "TE one device", "reference")


def _argument_type(parse):
    """``parse`` for argparse: its ValueError becomes the parser's error, message kept."""

    def parse_or_refuse(text):
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse_or_refuse.__name__ = parse.__name__
    return parse_or_refuse


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m tutorial_utils.cli.check_layout",
        description=(
            "Check a packed batch (segment_ids/segment_pos [batch, seq], un-reordered) against TE's"
            " own CP code on CPU: the exact validator, then TE's CP call vs one device vs the"
            " segment-id reference."
        ),
    )
    p.add_argument(
        "batch",
        help=".npz file with segment_ids and segment_pos [batch, seq] integer arrays, or a folder",
    )
    p.add_argument(
        "--cp", type=int, required=True, help="context-parallel size (simulated CPU devices)"
    )
    p.add_argument("--strategy", required=True, choices=STRATEGIES)
    p.add_argument(
        "--stripe", type=int, default=1, help="stripe_size of the striped reorder (Ring: 1)"
    )
    p.add_argument(
        "--window",
        type=_argument_type(te_windows),
        action="append",
        dest="windows",
        metavar="L",
        help=(
            "TE's causal sliding window (L, 0), or 'none' for a global layer; several as a comma"
            " list or repeated flags, each checked (e.g. --window 63 --window none)"
        ),
    )
    p.add_argument(
        "--model-window",
        type=_argument_type(model_windows),
        action="append",
        dest="windows",
        metavar="W",
        help=(
            "the model's own window W (the keys a query sees, itself included, from array"
            " indices), checked as TE's (W-1, 0); 'none' for a global layer; repeatable"
        ),
    )
    p.add_argument(
        "--max-segments",
        type=int,
        default=None,
        metavar="M",
        help="max_segments_per_seq (default: the largest segment id in the batch)",
    )
    p.add_argument("--head-dim", type=int, default=DEFAULT_HEAD_DIM, help=argparse.SUPPRESS)
    p.add_argument(
        "--memory-limit-gb",
        type=float,
        default=None,
        help="refuse past this estimate (default 16, or 80%% of available memory if less)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (a list for a folder or several windows) instead of text",
    )
    p.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="progress bar on stderr (auto: when stderr is a terminal)",
    )
    return p


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.cp < 1:
        parser.error(f"--cp={args.cp} must be >= 1")
    te_on_cpu.simulate_cpu_devices(args.cp)
    try:
        windows = unique_windows(args.windows)
        batches = load_batches(args.batch)
        limit = None if args.memory_limit_gb is None else int(args.memory_limit_gb * GIB)
        reports = []
        with tqdm(
            total=len(batches) * len(windows) * len(STAGES),
            desc="check_layout",
            unit="stage",
            file=sys.stderr,
            disable={"auto": None, "on": False, "off": True}[args.progress],
        ) as bar:
            for name, ids, pos in batches:

                def progress(stage, bar=bar, name=name):
                    bar.set_postfix_str(f"{pathlib.Path(name).name}: {stage}")
                    bar.update(1)

                reports += check_windows(
                    ids,
                    pos,
                    cp=args.cp,
                    strategy=args.strategy,
                    stripe=args.stripe,
                    windows=windows,
                    max_segments=args.max_segments,
                    head_dim=args.head_dim,
                    memory_limit=limit,
                    name=name,
                    progress=progress,
                )
    except ValueError as err:
        print(f"check_layout: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        data = [r.to_json() for r in reports]
        print(
            json.dumps(
                data if len(data) > 1 or pathlib.Path(args.batch).is_dir() else data[0], indent=1
            )
        )
    else:
        print("\n".join(r.text() for r in reports))
        if len(windows) > 1:
            print(summary(reports))
    return 0 if all(r.verdict == "ok" for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
