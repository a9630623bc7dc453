"""CP advisor: ``python -m tutorial_utils.plan`` predicts Ring, AllGather and Ulysses for a workload.

Why: before booking GPUs, a user wants to know which strategy and stripe size to try
first and what speedup to expect. This prints the cost model's table (time, speedup,
bytes each rank sends, where the gap to the ideal goes) and one recommendation with its
reason. Every number is a *model prediction* (see :mod:`tutorial_utils.costmodel` for
what was fitted on which published measurement).

Examples::

    python -m tutorial_utils.plan --preset seed --hardware GB200
    python -m tutorial_utils.plan --preset seed --hardware H200 --window 1024 0 --json
    python -m tutorial_utils.plan --batch 1 --seq-len 131072 --q-heads 64 --kv-heads 8 --head-dim 128 \\
        --segments 8 --valid 16384 --window -1 0 --cp 8
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional, Sequence

from .costmodel import fit_calibration, predict_all, predict_single
from .hardware import PROFILES, get_hardware
from .workload import PRESETS, Workload, get_workload

__all__ = ["plan", "format_table", "main", "DEFAULT_STRIPES"]

DEFAULT_STRIPES = (1, 64, 128, 256, 512, 1024)

_FIELD_FOR_ARG = {
    "batch": "batch", "seq_len": "seq_len", "q_heads": "num_q_heads", "kv_heads": "num_kv_heads",
    "head_dim": "head_dim", "segments": "segments_per_row", "valid": "valid_per_slot", "cp": "cp_size",
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
        if field not in ("dtype", "window") and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{_flag(field)}={v!r} must be a positive integer.")
    q, kv = values["num_q_heads"], values["num_kv_heads"]
    if q % kv:
        divisors = [d for d in range(1, q + 1) if q % d == 0]
        raise ValueError(f"--kv-heads={kv} does not divide --q-heads={q}; GQA needs a KV head count among {divisors}.")
    seq, seg = values["seq_len"], values["segments_per_row"]
    if seq % seg:
        raise ValueError(f"--seq-len={seq} is not divisible by --segments={seg}; pick a slot count that divides the row.")
    if values["valid_per_slot"] > seq // seg:
        raise ValueError(f"--valid={values['valid_per_slot']} exceeds the slot length --seq-len/--segments={seq // seg}; "
                         f"pass --valid {seq // seg} or less.")
    if seq % values["cp_size"]:
        raise ValueError(f"--seq-len={seq} is not divisible by --cp={values['cp_size']}; pad rows to a multiple of the CP size.")


def _build_workload(preset: str, overrides: dict) -> Workload:
    base = get_workload(preset)
    changes = {k: v for k, v in overrides.items() if v is not None}
    merged = {f: changes.get(f, getattr(base, f)) for f in _FIELD_FOR_ARG.values()}
    _check_relations(merged)
    if "window" in changes:
        changes["window"] = tuple(changes["window"])
    if changes:
        # stripe fields only constrain the benchmark presets; the advisor sweeps stripes itself
        changes.setdefault("stripe_size", 1)
        changes.setdefault("ring_stripe_size", 1)
        changes["name"] = f"{preset}+custom"
    return base.replace(**changes) if changes else base


def _check_stripes(stripes: Sequence) -> List[int]:
    out = []
    for s in stripes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ValueError(f"--stripes value {s!r} is not a positive integer; pass e.g. --stripes 1 128 512.")
        out.append(int(s))
    if not out:
        raise ValueError("--stripes is empty; pass at least one stripe size such as --stripes 128.")
    return out


def plan(workload, *, hardware="GB200", stripes: Sequence[int] = DEFAULT_STRIPES, form: str = "scale") -> dict:
    """The advisor's result as one JSON-ready dict: ``single_ms``, ``rows``, ``skipped``, ``recommendation``.

    Why: the CLI, the notebook and the tests all need the same table; building it once
    keeps them consistent. ``rows`` holds applicable configurations only; ``skipped`` says
    why the others cannot run (e.g. Ring with stripe > 1).
    """
    wl = get_workload(workload) if isinstance(workload, str) else workload
    if not isinstance(wl, Workload):
        raise ValueError(f"workload={workload!r} must be a Workload or a preset name in {sorted(PRESETS)}.")
    hw = get_hardware(hardware)
    cal = fit_calibration(form)
    stripes = _check_stripes(stripes)
    single = predict_single(wl, hw, cal)
    preds = predict_all(wl, hardware=hw, stripes=stripes, calibration=cal)
    rows, skipped = [], []
    for p in preds:
        if not p.applicable:
            skipped.append({"strategy": p.strategy, "stripe_size": p.stripe_size, "reason": p.reason})
            continue
        rows.append({
            "strategy": p.strategy, "stripe_size": p.stripe_size, "cp_size": p.cp_size,
            "predicted_ms": p.predicted_ms, "speedup": p.speedup, "bytes_per_rank": p.bytes_per_rank,
            "imbalance": p.imbalance, "tile_efficiency": p.tile_efficiency, "breakdown": p.breakdown,
            "fitted_point": p.measured, "note": p.reason,
        })
    return {
        "kind": "model prediction",
        "workload": wl.as_dict(),
        "hardware": hw.name,
        "hardware_profile": hw.as_dict(),
        "single_ms": single["predicted_ms"],
        "single_tflops_per_s": single["tflops_per_s"],
        "rows": rows,
        "skipped": skipped,
        "recommendation": _recommend(rows, single["predicted_ms"], cal),
        "calibration": cal.as_dict(),
    }


def _ms(x: float) -> str:
    """Milliseconds with sensible precision from microseconds to seconds."""
    return f"{x:,.0f} ms" if x >= 1000 else (f"{x:.1f} ms" if x >= 1 else f"{x:.3g} ms")


_TINY_MS = 1.0


def _gap_driver(row: dict) -> str:
    b = row["breakdown"]
    parts = {k: b[k] for k in ("fragmentation_ms", "imbalance_ms", "cp_overhead_ms", "comm_exposed_ms")}
    name = max(parts, key=parts.get)
    labels = {"fragmentation_ms": "tile fragmentation", "imbalance_ms": "load imbalance",
              "cp_overhead_ms": "the fitted CP overhead", "comm_exposed_ms": "exposed communication"}
    return f"{labels[name]} ({_ms(parts[name])})"


def _tiny_note(single_ms: float) -> str:
    if single_ms >= _TINY_MS:
        return ""
    return (f" Caution: at {_ms(single_ms)} per step, launch and collective latencies that the model ignores "
            "dominate, so these predictions say little.")


def _recommend(rows: list, single_ms: float, cal) -> dict:
    if not rows:
        return {"strategy": "single", "stripe_size": None, "predicted_ms": single_ms, "speedup": 1.0,
                "reason": "no CP configuration is applicable to this workload (see 'skipped'); run on one GPU."}
    ranked = sorted(rows, key=lambda r: r["predicted_ms"])
    best = ranked[0]
    label = f"{best['strategy']}" + (f" stripe {best['stripe_size']}" if best["stripe_size"] is not None else "")
    if best["speedup"] < 1.0:
        return {"strategy": "single", "stripe_size": None, "predicted_ms": single_ms, "speedup": 1.0,
                "reason": (f"CP does not pay off: the best CP configuration ({label}, {_ms(best['predicted_ms'])}) is "
                           f"predicted slower than one GPU ({_ms(single_ms)}); its largest loss is {_gap_driver(best)}."
                           + _tiny_note(single_ms))}
    reason = (f"fastest predicted: {_ms(best['predicted_ms'])}, {best['speedup']:.2f}x over one GPU "
              f"({_ms(single_ms)}); the largest loss against the ideal {_ms(best['breakdown']['ideal_ms'])} "
              f"is {_gap_driver(best)}.")
    if len(ranked) > 1:
        second = ranked[1]
        margin = second["predicted_ms"] / best["predicted_ms"] - 1.0
        tol = max(abs(v) for v in cal.shared_residuals.values())
        label2 = f"{second['strategy']}" + (f" stripe {second['stripe_size']}" if second["stripe_size"] is not None else "")
        reason += f" Runner-up: {label2} ({_ms(second['predicted_ms'])}, +{100 * margin:.1f}%)."
        if margin < tol:
            reason += (f" The margin is below the model's cross-strategy error ({100 * tol:.1f}%, shared-factor fit), "
                       "so measure both.")
    if best["strategy"] == "ulysses":
        reason += " Ulysses is unmeasured here (its CP factor is borrowed); confirm on hardware."
    reason += _tiny_note(single_ms)
    return {"strategy": best["strategy"], "stripe_size": best["stripe_size"], "predicted_ms": best["predicted_ms"],
            "speedup": best["speedup"], "reason": reason}


def format_table(result: dict) -> str:
    """Human-readable advisor output (what the CLI prints without ``--json``)."""
    wl = result["workload"]
    cal = result["calibration"]
    peak = result["hardware_profile"]["bf16_dense_tflops"]
    lines = [
        f"CP advisor (model prediction) - {wl['cp_size']} x {result['hardware']}, workload '{wl['name']}'",
        (f"  batch {wl['batch']} x {wl['seq_len']:,} tokens, {wl['segments_per_row']} slots x {wl['valid_per_slot']:,} valid, "
         f"heads {wl['num_q_heads']}q/{wl['num_kv_heads']}kv x {wl['head_dim']}, window {tuple(wl['window'])}, {wl['dtype']}"),
        (f"  one GPU: {_ms(result['single_ms'])} fwd+bwd ({result['single_tflops_per_s']:.0f} TFLOP/s useful, "
         f"{100 * result['single_tflops_per_s'] / peak:.1f}% of {peak:,.0f} dense peak)"),
        "",
        f"  {'strategy':<10}{'stripe':>7}{'ms':>10}{'speedup':>9}{'MiB/rank':>10}{'imbal.':>8}{'tile eff':>9}"
        f"{'frag ms':>9}{'imb ms':>8}{'CP ovh ms':>10}{'comm exp/hid ms':>17}",
    ]
    for r in result["rows"]:
        b = r["breakdown"]
        stripe = "-" if r["stripe_size"] is None else str(r["stripe_size"])
        mark = "  *fitted point" if r["fitted_point"] else ("  (unmeasured)" if r["strategy"] == "ulysses" else "")
        lines.append(
            f"  {r['strategy']:<10}{stripe:>7}{_ms(r['predicted_ms'])[:-3]:>10}{r['speedup']:>8.2f}x{r['bytes_per_rank'] / 2**20:>10.0f}"
            f"{r['imbalance']:>8.3f}{r['tile_efficiency']:>9.3f}{b['fragmentation_ms']:>9.1f}{b['imbalance_ms']:>8.1f}"
            f"{b['cp_overhead_ms']:>10.1f}{b['comm_exposed_ms']:>8.2f}/{b['comm_hidden_ms']:<8.2f}{mark}"
        )
    for s in result["skipped"]:
        stripe = "-" if s["stripe_size"] is None else s["stripe_size"]
        lines.append(f"  {s['strategy']:<10}{stripe:>7}  not applicable: {s['reason']}")
    rec = result["recommendation"]
    stripe = "" if rec["stripe_size"] is None else f" stripe {rec['stripe_size']}"
    lines += ["", f"Recommendation: {rec['strategy']}{stripe}. {rec['reason']}", ""]
    k = cal["cp_factor"]
    if cal["form"] == "scale":
        factors = ", ".join(f"CP efficiency factor {s}={k[s]:.3f}" for s in ("ring", "allgather", "ulysses"))
    else:
        factors = ", ".join(f"CP overhead {s}={k[s]:.1f} ms on GB200" for s in ("ring", "allgather", "ulysses"))
    lines.append(
        f"Calibration ({cal['form']}): eta={cal['eta']:.3f} of peak, fitted on TE's single-GB200 time; {factors}"
        + ". The Ring and AllGather terms fit TE's published 4xGB200 times exactly (Ulysses borrows); one shared "
        + "efficiency factor would miss them by "
        + ", ".join(f"{s} {100 * v:+.1f}%" for s, v in cal["shared_residuals"].items())
        + ". Other GPUs reuse these fractions of peak."
    )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tutorial_utils.plan",
                                description="Predict fwd+bwd time and speedup of CP attention strategies (cost model).")
    p.add_argument("--preset", default="seed", choices=sorted(PRESETS), help="base workload (default: seed)")
    p.add_argument("--batch", type=int)
    p.add_argument("--seq-len", type=int, help="tokens per row")
    p.add_argument("--q-heads", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--head-dim", type=int)
    p.add_argument("--segments", type=int, help="segment slots per row")
    p.add_argument("--valid", type=int, help="valid tokens per slot (rest is padding)")
    p.add_argument("--window", type=int, nargs=2, metavar=("LEFT", "RIGHT"), help="sliding window, -1 = unbounded")
    p.add_argument("--cp", type=int, help="number of GPUs on the CP axis")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--hardware", default="GB200", type=str.upper, choices=sorted(PROFILES))
    p.add_argument("--stripes", type=int, nargs="+", default=list(DEFAULT_STRIPES), help="AllGather stripe sizes")
    p.add_argument("--form", default="scale", choices=("scale", "fixed"), help="CP overhead model (default: scale)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI entry point; bad values exit with an argparse error naming the parameter and the fix."""
    parser = _parser()
    args = parser.parse_args(argv)
    overrides = {field: getattr(args, arg) for arg, field in _FIELD_FOR_ARG.items()}
    overrides["window"] = args.window
    try:
        wl = _build_workload(args.preset, overrides)
        result = plan(wl, hardware=args.hardware, stripes=args.stripes, form=args.form)
    except ValueError as err:
        message = str(err)
        for arg, field in list(_FIELD_FOR_ARG.items()) + [("window", "window")]:
            message = message.replace(f"Workload.{field}", f"--{arg.replace('_', '-')} (Workload.{field})")
        parser.error(message)
    if args.json:
        json.dump(result, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
