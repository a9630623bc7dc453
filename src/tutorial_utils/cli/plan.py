"""CP advisor: ``python -m tutorial_utils.cli.plan`` predicts Ring, AllGather and Ulysses for a
workload.

Why: before booking GPUs, a user wants to know which strategy and stripe size to try
first and what speedup to expect. This prints the cost model's table (time, speedup,
bytes each rank sends, peak attention memory per rank against the GPU's HBM, where the gap
to the ideal goes) and one recommendation with its reason. Every time is a *model
prediction* (see :mod:`tutorial_utils.perfmodel.costmodel` for what was fitted on which published
measurement); memory is counted, not fitted. Configurations that do not fit in HBM are
marked and never recommended.

Shape flags keep the preset's slot structure: a new ``--seq-len`` (or ``--segments``)
without ``--valid`` keeps the preset's slots per row and its fill, so
``valid_per_slot = round(fill * slot_len)`` (the seed preset at ``--seq-len 1048576``: 4
slots of 262,144 tokens, 196,608 valid). The result carries this as a note, and a warning
whenever more than half of a row is padding.

Examples::

    python -m tutorial_utils.cli.plan --preset seed --hardware GB200
    python -m tutorial_utils.cli.plan --preset seed --hardware H200 --window 1024 0 --json
    python -m tutorial_utils.cli.plan --batch 1 --seq-len 131072 --q-heads 64 --kv-heads 8
    --head-dim 128 \\
        --segments 8 --valid 16384 --window -1 0 --cp 8
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence

from tutorial_utils import rules
from tutorial_utils.perfmodel.costmodel import (
    CP_LOSS_FORMS,
    break_even_window,
    fit_calibration,
    predict,
    predict_all,
    predict_single,
)
from tutorial_utils.perfmodel.hardware import PROFILES, get_hardware
from tutorial_utils.perfmodel.memory import memory_bytes
from tutorial_utils.perfmodel.workload import PRESETS, Workload, get_workload

__all__ = [
    "plan",
    "format_table",
    "main",
    "DEFAULT_STRIPES",
    "build_workload",
    "PADDING_WARN_FRACTION",
    "break_even_table",
]

DEFAULT_STRIPES = (1, 64, 128, 256, 512, 1024)

#: warn when more than this fraction of every row is padding
PADDING_WARN_FRACTION = 0.5

_FIELD_FOR_ARG = {
    "batch": "batch",
    "seq_len": "seq_len",
    "q_heads": "num_q_heads",
    "kv_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "segments": "segments_per_row",
    "valid": "valid_per_slot",
    "cp": "cp_size",
    "dtype": "dtype",
}


def _flag(field: str) -> str:
    for arg, f in _FIELD_FOR_ARG.items():
        if f == field:
            return "--" + arg.replace("_", "-")
    return field


def _check_relations(values: dict) -> None:
    """Name the CLI flags (not the dataclass fields) when a combination cannot work."""
    for field, v in values.items():
        if field not in ("dtype", "window") and (
            isinstance(v, bool) or not isinstance(v, int) or v < 1
        ):
            raise ValueError(f"{_flag(field)}={v!r} must be a positive integer.")
    rules.check_gqa_heads(
        values["num_q_heads"], values["num_kv_heads"], "--kv-heads", q_name="--q-heads"
    )
    seq, seg = values["seq_len"], values["segments_per_row"]
    if seq % seg:
        raise ValueError(
            f"--seq-len={seq} is not divisible by --segments={seg}; pick a slot count that divides"
            " the row."
        )
    if values["valid_per_slot"] > seq // seg:
        raise ValueError(
            f"--valid={values['valid_per_slot']} exceeds the slot length"
            f" --seq-len/--segments={seq // seg}; pass --valid {seq // seg} or less."
        )
    rules.check_divisible_seq(seq, values["cp_size"], None, name="--seq-len", cp_name="--cp")


def _scaled_valid(fill: float, slot_len: int) -> int:
    """Valid tokens per slot at the preset's fill (round half up, at least 1, at most the slot)."""
    return max(1, min(slot_len, int(fill * slot_len + 0.5)))


def build_workload(preset: str, overrides: dict):
    """The preset with CLI overrides applied, and notes on what was derived: ``(workload, notes)``.

    Why: ``--seq-len 1048576`` alone should describe a longer row *of the same kind*, not
    the preset's few valid tokens lost in a row of padding. When the slot length changes
    (``seq_len`` or ``segments_per_row``) and ``valid_per_slot`` is not given, the preset's
    fill ``valid_per_slot / slot_len`` is kept. Keys are Workload field names (``None`` =
    not given) plus ``window``.
    """
    base = get_workload(preset)
    changes = {k: v for k, v in overrides.items() if v is not None}
    merged = {f: changes.get(f, getattr(base, f)) for f in _FIELD_FOR_ARG.values()}
    notes = []
    slot_changed = "seq_len" in changes or "segments_per_row" in changes
    seq, seg = merged["seq_len"], merged["segments_per_row"]
    if (
        slot_changed
        and "valid_per_slot" not in changes
        and isinstance(seq, int)
        and isinstance(seg, int)
        and seq > 0
        and seg > 0
        and seq % seg == 0
        and seq // seg != base.slot_len
    ):
        fill = base.valid_per_slot / base.slot_len
        valid = _scaled_valid(fill, seq // seg)
        changes["valid_per_slot"] = merged["valid_per_slot"] = valid
        notes.append(
            f"slot structure scaled: {seg} slots of {seq // seg:,} tokens per row at the '{preset}'"
            f" preset's fill {fill:.1%}, so --valid {valid} (= round({fill:g} x {seq // seg:,}));"
            " pass --valid to choose another; the window"
            f" {tuple(changes.get('window') or base.window)} is unchanged."
        )
    _check_relations(merged)
    if "window" in changes:
        changes["window"] = tuple(changes["window"])
    if changes:
        # stripe fields only constrain the benchmark presets; the advisor sweeps stripes itself
        changes.setdefault("stripe_size", 1)
        changes.setdefault("ring_stripe_size", 1)
        changes["name"] = f"{preset}+custom"
    return (base.replace(**changes) if changes else base), notes


def _check_stripes(stripes: Sequence) -> list[int]:
    out = []
    for s in stripes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ValueError(
                f"--stripes value {s!r} is not a positive integer; pass e.g. --stripes 1 128 512."
            )
        out.append(int(s))
    if not out:
        raise ValueError("--stripes is empty; pass at least one stripe size such as --stripes 128.")
    return out


def _gb(x: float) -> str:
    return f"{x / 1e9:,.1f} GB"


def _padding_warning(wl: Workload) -> str | None:
    pad = 1.0 - wl.valid_per_slot / wl.slot_len
    if pad <= PADDING_WARN_FRACTION:
        return None
    return (
        f"{pad:.1%} of every row is padding ({wl.segments_per_row} slots x"
        f" {wl.valid_per_slot:,} valid of {wl.slot_len:,} tokens): memory and bytes moved count"
        " every token, attention work only the valid ones, so the times and speedups describe"
        " mostly empty rows. If that is not the workload you mean, set --valid (valid tokens per"
        " slot) or --segments."
    )


#: Host memory the advisor itself needs per token (measured with tracemalloc: 332-340 bytes at
#: 64k-1M tokens per row for the seed preset), rounded up.
PLAN_BYTES_PER_TOKEN = 400
#: The default ceiling on that memory; ``--max-memory-gib`` raises it.
PLAN_MAX_MEMORY_BYTES = 4 * 2**30


def planner_memory_bytes(workload: Workload) -> int:
    """Host memory :func:`plan` needs for ``workload``: it counts visible pairs token by token."""
    return PLAN_BYTES_PER_TOKEN * workload.batch * workload.seq_len


def plan(
    workload,
    *,
    hardware="GB200",
    stripes: Sequence[int] = DEFAULT_STRIPES,
    notes: Sequence[str] = (),
    max_memory_bytes: int = PLAN_MAX_MEMORY_BYTES,
) -> dict:
    """The advisor's result as one JSON-ready dict: ``single_ms``, ``rows``, ``skipped``,
    ``recommendation``.

    Why: the CLI, the notebook and the tests all need the same table; building it once
    keeps them consistent. ``rows`` holds applicable configurations only; ``skipped`` says
    why the others cannot run (e.g. Ring with stripe > 1). Each row and the single device
    carry the peak attention memory per rank and whether it fits the GPU's HBM; the
    recommendation only picks rows that fit. ``notes`` (passed through, e.g. how the CLI
    derived the shape) and ``warnings`` (padding-dominated rows, memory) say what to check.
    """
    wl = get_workload(workload) if isinstance(workload, str) else workload
    if not isinstance(wl, Workload):
        raise ValueError(
            f"workload={workload!r} must be a Workload or a preset name in {sorted(PRESETS)}."
        )
    need = planner_memory_bytes(wl)
    if need > max_memory_bytes:
        raise ValueError(
            f"max_memory_bytes: this plan needs about {need / 2**30:,.1f} GiB of host memory for"
            f" {wl.batch} x {wl.seq_len:,} tokens ({PLAN_BYTES_PER_TOKEN} bytes each), over the"
            f" limit of {max_memory_bytes / 2**30:,.1f} GiB; raise the limit (--max-memory-gib) or"
            " plan a smaller batch (the per-row shape sets the answer)."
        )
    hw = get_hardware(hardware)
    cal = fit_calibration()
    stripes = _check_stripes(stripes)
    single = predict_single(wl, hw, cal)
    preds = predict_all(wl, hardware=hw, stripes=stripes, calibration=cal)
    hbm = hw.hbm_bytes
    rows, skipped = [], []
    for p in preds:
        if not p.applicable:
            skipped.append(
                {"strategy": p.strategy, "stripe_size": p.stripe_size, "reason": p.reason}
            )
            continue
        mem = memory_bytes(wl, p.strategy, cp_size=p.cp_size)
        rows.append(
            {
                "strategy": p.strategy,
                "stripe_size": p.stripe_size,
                "cp_size": p.cp_size,
                "predicted_ms": p.predicted_ms,
                "speedup": p.speedup,
                "bytes_per_rank": p.bytes_per_rank,
                "memory_bytes_per_rank": mem["peak_bytes"],
                "memory_peak_phase": mem["peak_phase"],
                "fits_hbm": mem["peak_bytes"] <= hbm,
                "memory_breakdown": {"fwd": mem["fwd"], "bwd": mem["bwd"]},
                "imbalance": p.imbalance,
                "tile_efficiency": p.tile_efficiency,
                "breakdown": p.breakdown,
                "fitted_point": p.measured,
                "note": p.reason,
            }
        )
    single_mem = single["memory_bytes"]
    single_fits = single_mem <= hbm
    warnings = [w for w in (_padding_warning(wl),) if w]
    if not single_fits:
        warnings.append(
            f"one {hw.name} cannot hold this workload's attention tensors ({_gb(single_mem)} > "
            f"{_gb(hbm)} HBM): the one-GPU time and every speedup are against a hypothetical GPU "
            "with enough memory."
        )
    over = [r for r in rows if not r["fits_hbm"]]
    if over:
        warnings.append(
            f"{len(over)} of {len(rows)} CP configurations need more than the {_gb(hbm)} of HBM per"
            f" rank ({', '.join(sorted({r['strategy'] for r in over}))}); they are marked '>HBM'"
            " and not recommended."
        )
    return {
        "kind": "model prediction",
        "workload": wl.as_dict(),
        "hardware": hw.name,
        "hardware_profile": hw.as_dict(),
        "single_ms": single["predicted_ms"],
        "single_tflops_per_s": single["tflops_per_s"],
        "single_memory_bytes": single_mem,
        "single_fits_hbm": single_fits,
        "hbm_bytes": hbm,
        "rows": rows,
        "skipped": skipped,
        "recommendation": _recommend(
            rows,
            single["predicted_ms"],
            cal,
            single_fits=single_fits,
            single_mem=single_mem,
            hbm=hbm,
        ),
        "notes": list(notes),
        "warnings": warnings,
        "calibration": cal.as_dict(),
    }


#: How the break-even table names the two readings of TE's times
#: (:func:`~.costmodel.fit_calibration`).
FIT_NAMES = {"proportional": "CP loss a fraction of compute", "constant": "CP loss a constant (ms)"}
# The fits' names in a table column
FIT_SHORT = {"proportional": "fraction", "constant": "constant"}


def break_even_table(workload, cases, *, windows, hardware="GB200") -> str:
    """Markdown: per strategy and per fit, the break-even window and the speedups at the ends.

    Why: TE's three published times fit two readings equally well (the CP loss a fraction of
    the compute, or a constant in ms), which part at narrow windows. A break-even from one
    of them alone claims more than the times support; the table gives both, one row each.
    Only the ``windows`` are tested: CP winning at the narrowest reads "≤ w (all tested)".
    Each cell holds one value, so no number is split over two lines in a narrow column. The
    speedups are at the narrowest window, the workload's own window and the widest. A model
    prediction.
    """
    windows = sorted(int(w) for w in windows)
    if not windows:
        raise ValueError("windows is empty; pass the windows to test, e.g. [16, 32, ..., 16384].")
    wl = get_workload(workload) if isinstance(workload, str) else workload
    fits = {form: fit_calibration(cp_loss=form) for form in CP_LOSS_FORMS}
    own = min((w for w in windows if w >= wl.window[0]), default=windows[-1])
    ends = sorted({windows[0], own, windows[-1]})

    def speedup(w, strategy, stripe, cal):
        return predict(
            wl.replace(window=(w, 0)),
            strategy,
            stripe_size=stripe,
            hardware=hardware,
            calibration=cal,
        ).speedup

    def found(strategy, stripe, cal):
        w = break_even_window(
            wl,
            strategy,
            stripe_size=stripe,
            hardware=hardware,
            calibration=cal,
            min_window=windows[0],
        )
        if w is None:
            return "never"
        # a no-break space: "≤ 16" stays on one line
        return f"≤\u00a0{windows[0]:,} (all tested)" if w == windows[0] else f"{w:,}"

    rows = []
    for strategy, stripe in cases:
        name = strategy + ("" if stripe is None else f" stripe {stripe}")
        for i, (form, cal) in enumerate(fits.items()):
            cells = [name if i == 0 else "", FIT_SHORT[form], found(strategy, stripe, cal)]
            cells += [f"{speedup(w, strategy, stripe, cal):.2f}x" for w in ends]
            rows.append("| " + " | ".join(cells) + " |")
    hw = hardware if isinstance(hardware, str) else get_hardware(hardware).name
    heads = ["strategy", "CP loss", "beats one GPU from"] + [f"at {w:,}" for w in ends]
    return (
        f"**Model prediction** ({wl.name} shape, {wl.cp_size} x {hw}): the window from which CP"
        " beats one GPU, and the speedup over one GPU at the narrowest window, at the"
        f" workload's own ({own:,}) and at the widest, under each reading of TE's times: the"
        " CP loss "
        + " or ".join(f"*a {FIT_NAMES[form].split(' a ')[-1]}*" for form in fits)
        + ".\n\n"
        + "| "
        + " | ".join(heads)
        + " |\n"
        + "|"
        + "---|" * len(heads)
        + "\n"
        + "\n".join(rows)
    )


def _ms(x: float) -> str:
    """Milliseconds with sensible precision from microseconds to seconds."""
    return f"{x:,.0f} ms" if x >= 1000 else (f"{x:.1f} ms" if x >= 1 else f"{x:.3g} ms")


_TINY_MS = 1.0


def _gap_driver(row: dict) -> str:
    b = row["breakdown"]
    parts = {
        k: b[k] for k in ("fragmentation_ms", "imbalance_ms", "cp_overhead_ms", "comm_exposed_ms")
    }
    name = max(parts, key=parts.get)
    labels = {
        "fragmentation_ms": "tile fragmentation",
        "imbalance_ms": "load imbalance",
        "cp_overhead_ms": "the fitted CP overhead",
        "comm_exposed_ms": "exposed communication",
    }
    return f"{labels[name]} ({_ms(parts[name])})"


def _tiny_note(single_ms: float) -> str:
    if single_ms >= _TINY_MS:
        return ""
    return (
        f" Caution: at {_ms(single_ms)} per step, launch and collective latencies that the model"
        " ignores dominate, so these predictions say little."
    )


def _label(row: dict) -> str:
    return row["strategy"] + (
        f" stripe {row['stripe_size']}" if row["stripe_size"] is not None else ""
    )


def _recommend(
    rows: list,
    single_ms: float,
    cal,
    *,
    single_fits: bool = True,
    single_mem: float = 0.0,
    hbm: float = float("inf"),
) -> dict:
    fitting = [r for r in rows if r.get("fits_hbm", True)]
    single = {"strategy": "single", "stripe_size": None, "predicted_ms": single_ms, "speedup": 1.0}
    none = {"strategy": "none", "stripe_size": None, "predicted_ms": None, "speedup": None}
    if not fitting:
        why = (
            "no CP configuration is applicable to this workload (see 'skipped')"
            if not rows
            else (
                f"no applicable CP configuration fits in {_gb(hbm)} of HBM per rank (smallest needs"
                f" {_gb(min(r['memory_bytes_per_rank'] for r in rows))})"
            )
        )
        if single_fits:
            return dict(single, reason=f"{why}; run on one GPU.")
        return dict(
            none,
            reason=(
                f"{why}, and one GPU needs {_gb(single_mem)}: nothing fits. Use more GPUs "
                "(--cp), a smaller batch, or shorter rows."
            ),
        )
    ranked = sorted(fitting, key=lambda r: r["predicted_ms"])
    tol = cal.cross_strategy_error
    fastest = best = ranked[0]
    # A prediction that beats a measured configuration by less than the model's stated error
    # (predicted / measured - 1, as the shared-factor fit misses) is no reason to leave the
    # measurement: recommend the measured one and say why.
    near = [
        r
        for r in ranked[1:]
        if r.get("fitted_point")
        and not fastest.get("fitted_point")
        and 1.0 - fastest["predicted_ms"] / r["predicted_ms"] < tol
    ]
    if near:
        best = near[0]
    label = _label(best)
    faster_over = [
        r for r in rows if not r.get("fits_hbm", True) and r["predicted_ms"] < best["predicted_ms"]
    ]
    over_note = ""
    if faster_over:
        f = min(faster_over, key=lambda r: r["predicted_ms"])
        over_note = (
            f" Faster but over HBM: {_label(f)} ({_ms(f['predicted_ms'])}, needs "
            f"{_gb(f['memory_bytes_per_rank'])} per rank > {_gb(hbm)})."
        )
    hypothetical = ""
    if not single_fits:
        hypothetical = (
            f" The one-GPU baseline is hypothetical: it needs {_gb(single_mem)} > {_gb(hbm)} of"
            " HBM, so CP is needed to fit, and the speedup only compares compute."
        )
    if best["speedup"] < 1.0 and single_fits:
        return dict(
            single,
            reason=(
                f"CP does not pay off: the best CP configuration that fits ({label}, "
                f"{_ms(best['predicted_ms'])}) is predicted slower than one GPU "
                f"({_ms(single_ms)}); its largest loss is {_gap_driver(best)}."
                + over_note
                + _tiny_note(single_ms)
            ),
        )
    reason = (
        f"fastest predicted that fits in HBM: {_ms(best['predicted_ms'])}, {best['speedup']:.2f}x"
        f" over one GPU ({_ms(single_ms)}), {_gb(best['memory_bytes_per_rank'])} per rank; the"
        f" largest loss against the ideal {_ms(best['breakdown']['ideal_ms'])} is"
        f" {_gap_driver(best)}."
    )
    if best is not fastest:
        gap = 1.0 - fastest["predicted_ms"] / best["predicted_ms"]
        reason = (
            "measured: TE's published time on this shape (the model reproduces it), "
            + reason.split(": ", 1)[1]
            + " Preferred over the predicted-fastest"
            f" {_label(fastest)} ({_ms(fastest['predicted_ms'])}, {100 * gap:.1f}% less time),"
            f" because that margin is within the model's stated error ({100 * tol:.1f}%,"
            f" shared-factor fit) and {_label(fastest)} is unmeasured: measure it before"
            " switching."
        )
    elif len(ranked) > 1:
        second = ranked[1]
        margin = second["predicted_ms"] / best["predicted_ms"] - 1.0
        reason += (
            f" Runner-up: {_label(second)} ({_ms(second['predicted_ms'])}, +{100 * margin:.1f}%)."
        )
        if margin < tol:
            reason += (
                f" The margin is below the model's cross-strategy error ({100 * tol:.1f}%,"
                " shared-factor fit), so measure both."
            )
    reason += over_note + hypothetical
    if best["strategy"] == "ulysses":
        reason += " Ulysses is unmeasured here (its CP factor is borrowed); confirm on hardware."
    reason += _tiny_note(single_ms)
    return {
        "strategy": best["strategy"],
        "stripe_size": best["stripe_size"],
        "predicted_ms": best["predicted_ms"],
        "speedup": best["speedup"],
        "measured": bool(best.get("fitted_point")),
        "predicted_fastest": {
            "strategy": fastest["strategy"],
            "stripe_size": fastest["stripe_size"],
            "predicted_ms": fastest["predicted_ms"],
        },
        "reason": reason,
    }


def _compact_table(result: dict) -> str:
    """The deciding columns and the recommendation, wrapped to fit an 88-character page."""
    wl = result["workload"]
    rows = [
        f"CP advisor (model prediction): {wl['cp_size']} x {result['hardware']}",
        (
            f"  one GPU: {_ms(result['single_ms'])} fwd+bwd,"
            f" {_gb(result['single_memory_bytes'])} attention memory"
        ),
        "",
        (
            f"  {'strategy':<10}{'stripe':>7}{'ms':>10}{'speedup':>9}{'MiB/rank':>10}"
            f"{'GB/rank':>9}{'HBM':>6}{'tile eff':>9}"
        ),
    ]
    for r in result["rows"]:
        stripe = "-" if r["stripe_size"] is None else str(r["stripe_size"])
        mark = (
            "  fitted"
            if r["fitted_point"]
            else ("  unmeasured" if r["strategy"] == "ulysses" else "")
        )
        rows.append(
            f"  {r['strategy']:<10}{stripe:>7}{_ms(r['predicted_ms'])[:-3]:>10}"
            f"{r['speedup']:>8.2f}x"
            f"{r['bytes_per_rank'] / 2**20:>10.0f}{r['memory_bytes_per_rank'] / 1e9:>9.1f}"
            f"{'fits' if r['fits_hbm'] else '>HBM':>6}{r['tile_efficiency']:>9.3f}{mark}"
        )
    rows += [
        f"  {s['strategy']} stripe {s['stripe_size']}: not applicable: {s['reason']}"
        for s in result["skipped"]
    ]
    rec = result["recommendation"]
    stripe = "" if rec["stripe_size"] is None else f" stripe {rec['stripe_size']}"
    prose = [f"Note: {n}" for n in result.get("notes", ())] + [
        f"Warning: {w}" for w in result.get("warnings", ())
    ]
    prose.append(f"Recommendation: {rec['strategy']}{stripe}. {rec['reason']}")
    for text in prose:
        rows += [""] + textwrap.wrap(text, 88, subsequent_indent="  ")
    return "\n".join(rows)


def format_table(result: dict, *, compact: bool = False) -> str:
    """Human-readable advisor output (what the CLI prints without ``--json``).

    ``compact=True`` keeps the columns that decide (time, speedup, bytes and memory per
    rank, tile efficiency) and the recommendation, wrapped at 88 characters: what a page
    or a narrow terminal can show. The full table adds the breakdown of the gap.
    """
    if compact:
        return _compact_table(result)
    wl = result["workload"]
    cal = result["calibration"]
    peak = result["hardware_profile"]["bf16_dense_tflops"]
    lines = [
        (
            f"CP advisor (model prediction) - {wl['cp_size']} x {result['hardware']}, workload"
            f" '{wl['name']}'"
        ),
        (
            f"  batch {wl['batch']} x {wl['seq_len']:,} tokens, {wl['segments_per_row']} slots x"
            f" {wl['valid_per_slot']:,} valid, heads {wl['num_q_heads']}q/{wl['num_kv_heads']}kv x"
            f" {wl['head_dim']}, window {tuple(wl['window'])}, {wl['dtype']}"
        ),
        (
            f"  one GPU: {_ms(result['single_ms'])} fwd+bwd"
            f" ({result['single_tflops_per_s']:.0f} TFLOP/s useful,"
            f" {100 * result['single_tflops_per_s'] / peak:.1f}% of {peak:,.0f} dense peak);"
            f" attention memory {_gb(result['single_memory_bytes'])} of"
            f" {_gb(result['hbm_bytes'])} HBM"
            + ("" if result["single_fits_hbm"] else " - does NOT fit, the baseline is hypothetical")
        ),
        "",
        (
            f"  {'strategy':<10}{'stripe':>7}{'ms':>10}{'speedup':>9}{'MiB/rank':>10}"
            f"{'GB/rank':>9}{'HBM':>6}{'imbal.':>8}"
            f"{'tile eff':>9}{'frag ms':>9}{'imb ms':>8}{'CP ovh ms':>10}{'comm exp/hid ms':>17}"
        ),
    ]
    for r in result["rows"]:
        b = r["breakdown"]
        stripe = "-" if r["stripe_size"] is None else str(r["stripe_size"])
        mark = (
            "  *fitted point"
            if r["fitted_point"]
            else ("  (unmeasured)" if r["strategy"] == "ulysses" else "")
        )
        fits = "fits" if r["fits_hbm"] else ">HBM"
        lines.append(
            f"  {r['strategy']:<10}{stripe:>7}{_ms(r['predicted_ms'])[:-3]:>10}"
            f"{r['speedup']:>8.2f}x{r['bytes_per_rank'] / 2**20:>10.0f}"
            f"{r['memory_bytes_per_rank'] / 1e9:>9.1f}{fits:>6}"
            f"{r['imbalance']:>8.3f}{r['tile_efficiency']:>9.3f}{b['fragmentation_ms']:>9.1f}"
            f"{b['imbalance_ms']:>8.1f}"
            f"{b['cp_overhead_ms']:>10.1f}{b['comm_exposed_ms']:>8.2f}/{b['comm_hidden_ms']:<8.2f}{mark}"
        )
    for s in result["skipped"]:
        stripe = "-" if s["stripe_size"] is None else s["stripe_size"]
        lines.append(f"  {s['strategy']:<10}{stripe:>7}  not applicable: {s['reason']}")
    lines += [
        "",
        (
            "  GB/rank: peak attention memory per rank (Q,K,V,O, their gradients, fp32 LSE, ids/pos"
            " and the strategy's buffers; the rest of the model comes on top), against the HBM of"
            " one GPU."
        ),
    ]
    lines += [f"Note: {n}" for n in result.get("notes", ())]
    lines += [f"Warning: {w}" for w in result.get("warnings", ())]
    rec = result["recommendation"]
    stripe = "" if rec["stripe_size"] is None else f" stripe {rec['stripe_size']}"
    lines += ["", f"Recommendation: {rec['strategy']}{stripe}. {rec['reason']}", ""]
    k = cal["cp_factor"]
    factors = ", ".join(
        f"CP efficiency factor {s}={k[s]:.3f}" for s in ("ring", "allgather", "ulysses")
    )
    lines.append(
        f"Calibration: eta={cal['eta']:.3f} of peak, fitted on TE's single-GB200 time; {factors}"
        + ". Three parameters for TE's three published 4xGB200 times reproduce them by construction"
        " (Ulysses "
        + "borrows); the stated error is the miss of one shared efficiency factor: "
        + ", ".join(f"{s} {100 * v:+.1f}%" for s, v in cal["shared_residuals"].items())
        + ". Other GPUs reuse these fractions of peak; the model has no fixed per-step cost, so it"
        " is optimistic " + "about CP where steps are short."
    )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tutorial_utils.cli.plan",
        description=(
            "Predict fwd+bwd time, speedup and per-rank memory of CP attention strategies (cost"
            " model)."
        ),
        epilog=(
            "Shape flags override the preset. If --seq-len or --segments changes the slot length"
            " and --valid is not given, the preset's slots per row and fill are kept: valid per"
            " slot = round(fill x slot length) (seed: 12,288 of 16,384 = 75%; --seq-len 1048576"
            " gives 4 slots x 196,608 valid of 262,144). Pass --valid to set it yourself. A warning"
            " is printed (and listed under 'warnings' in --json) when more than half of every row"
            " is padding, when one GPU cannot hold the workload, and when a CP configuration"
            " exceeds the GPU's HBM; such rows are marked '>HBM' and never recommended."
        ),
    )
    p.add_argument(
        "--preset", default="seed", choices=sorted(PRESETS), help="base workload (default: seed)"
    )
    p.add_argument("--batch", type=int)
    p.add_argument(
        "--seq-len",
        type=int,
        help="tokens per row (keeps the preset's fill unless --valid is given)",
    )
    p.add_argument("--q-heads", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--head-dim", type=int)
    p.add_argument(
        "--segments",
        type=int,
        help="segment slots per row (keeps the preset's fill unless --valid is given)",
    )
    p.add_argument(
        "--valid",
        type=int,
        help="valid tokens per slot (rest is padding; default: the preset's fill)",
    )
    p.add_argument(
        "--window",
        type=int,
        nargs=2,
        metavar=("LEFT", "RIGHT"),
        help="sliding window, -1 = unbounded",
    )
    p.add_argument("--cp", type=int, help="number of GPUs on the CP axis")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--hardware", default="GB200", type=str.upper, choices=sorted(PROFILES))
    p.add_argument(
        "--stripes",
        type=int,
        nargs="+",
        default=list(DEFAULT_STRIPES),
        help="AllGather stripe sizes",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument(
        "--compact",
        action="store_true",
        help="print only the deciding columns and the recommendation, wrapped at 88 characters",
    )
    p.add_argument(
        "--max-memory-gib",
        type=float,
        default=PLAN_MAX_MEMORY_BYTES / 2**30,
        help="refuse plans whose own host memory would exceed this (default: 4)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; bad values exit with an argparse error naming the parameter and the fix."""
    parser = _parser()
    args = parser.parse_args(argv)
    overrides = {field: getattr(args, arg) for arg, field in _FIELD_FOR_ARG.items()}
    overrides["window"] = args.window
    try:
        wl, notes = build_workload(args.preset, overrides)
        if not args.max_memory_gib > 0:
            raise ValueError(f"--max-memory-gib={args.max_memory_gib} must be > 0.")
        result = plan(
            wl,
            hardware=args.hardware,
            stripes=args.stripes,
            notes=notes,
            max_memory_bytes=int(args.max_memory_gib * 2**30),
        )
    except ValueError as err:
        message = str(err).replace("max_memory_bytes:", "--max-memory-gib:")
        for arg, field in list(_FIELD_FOR_ARG.items()) + [("window", "window")]:
            message = message.replace(
                f"Workload.{field}", f"--{arg.replace('_', '-')} (Workload.{field})"
            )
        parser.error(message)
    if args.json:
        json.dump(result, sys.stdout)
        sys.stdout.write("\n")
        for w in result["warnings"]:
            print(f"warning: {w}", file=sys.stderr)
    else:
        print(format_table(result, compact=args.compact))
    return 0


if __name__ == "__main__":
    sys.exit(main())
