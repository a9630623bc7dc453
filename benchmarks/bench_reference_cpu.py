"""CPU benchmark: blockwise vs dense reference attention vs ``jax.nn.dot_product_attention``.

Run with ``make bench-cpu`` (or ``python benchmarks/bench_reference_cpu.py``). Not a test.

Workload (defaults): one packed row of 16,384 tokens holding 4 segments, 4 query heads sharing
1 KV head, head dim 64, causal sliding window (512, 0), float32; forward + backward of
``sum(out * dout)`` with respect to q, k and v.

Variants, each measured in a fresh subprocess so peak memory is its own:

* ``blockwise`` - :func:`tutorial_utils.reference.blockwise_attention` (flash-style, skips
  blocks the mask empties);
* ``dense``     - :func:`tutorial_utils.reference.dense_attention` (materialises [S, S]);
* ``oracle``    - ``jax.nn.dot_product_attention(..., mask=<explicit bool [S, S]>,
  implementation="xla")``, the mask built from the same segment ids / positions.

Per variant: median of 3 timed calls after 1 warm-up (``tutorial_utils.perfmodel.timing.time_fn``;
compilation excluded), XLA's compiled memory analysis (temp + argument + output bytes), and
the growth of the process's peak RSS (``ru_maxrss``) over its baseline after imports and
input creation. A variant whose XLA estimate exceeds ``--limit-gib`` (default 12 GiB, or 60% of
the memory available now) is not run at the full length: it runs at ``--fallback-seq`` and its
time and memory are extrapolated quadratically, labelled "extrapolated" everywhere.

Output: a markdown table on stdout and a ``cp-bench/1`` record in
``results/reference-cpu-blockwise-vs-dense.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GIB = 1024**3
RESULT_TAG = "BENCH_RESULT "
VARIANTS = ("blockwise", "dense", "oracle")


# ----------------------------------------------------------------------------- worker (one variant,


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _worker(args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tutorial_utils.inputs import fixed_slot_segments
    from tutorial_utils.perfmodel.timing import time_fn
    from tutorial_utils.reference import (
        MaskSpec,
        block_needed,
        blockwise_attention,
        dense_attention,
    )

    seq, hq, hkv, d = args.seq, args.q_heads, args.kv_heads, args.head_dim
    window = (args.window, 0)
    scale = d**-0.5
    spec = MaskSpec(padding=True, causal=True, window=window)
    ids_np, pos_np = fixed_slot_segments(1, seq, args.segments, seq // args.segments)
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(ks[0], (1, seq, hq, d), jnp.float32)
    k = jax.random.normal(ks[1], (1, seq, hkv, d), jnp.float32)
    v = jax.random.normal(ks[2], (1, seq, hkv, d), jnp.float32)
    dout = jax.random.normal(ks[3], (1, seq, hq, d), jnp.float32)
    ids, pos = jnp.asarray(ids_np), jnp.asarray(pos_np)
    jax.block_until_ready((q, k, v, dout, ids, pos))

    if args.variant == "blockwise":

        def attn(q, k, v, ids, pos):
            return blockwise_attention(
                q,
                k,
                v,
                ids,
                ids,
                pos,
                pos,
                scale=scale,
                spec=spec,
                block_q=args.block,
                block_kv=args.block,
            )[0]

    elif args.variant == "dense":

        def attn(q, k, v, ids, pos):
            return dense_attention(q, k, v, ids, ids, pos, pos, scale=scale, spec=spec)[0]

    else:

        def attn(q, k, v, ids, pos):
            pq, pk = pos[:, :, None], pos[:, None, :]
            mask = (
                (ids[:, :, None] == ids[:, None, :])
                & (ids[:, :, None] != 0)
                & (pk <= pq)
                & (pk >= pq - window[0])
            )
            return jax.nn.dot_product_attention(
                q, k, v, mask=mask[:, None], scale=scale, implementation="xla"
            )

    def step(q, k, v, ids, pos, dout):
        def loss(q, k, v):
            out = attn(q, k, v, ids, pos)
            return jnp.sum(out * dout), out

        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
        return out, grads

    call_args = (q, k, v, ids, pos, dout)
    base_rss = _rss_bytes()
    t0 = time.perf_counter()
    compiled = jax.jit(step).lower(*call_args).compile()
    compile_s = time.perf_counter() - t0
    mem = {}
    try:
        ma = compiled.memory_analysis()
        for key in (
            "temp_size_in_bytes",
            "argument_size_in_bytes",
            "output_size_in_bytes",
            "generated_code_size_in_bytes",
        ):
            mem[key] = int(getattr(ma, key))
    except Exception as err:  # noqa: BLE001 - backend-dependent
        mem["error"] = repr(err)
    result = {"variant": args.variant, "seq_len": seq, "compile_s": compile_s, "xla": mem}
    if args.analyze_only:
        return result
    timing = time_fn(compiled, *call_args, warmup=args.warmup, iters=args.iters)
    result["timing"] = timing
    result["peak_rss_growth_bytes"] = _rss_bytes() - base_rss
    out, (dq, dk, dv) = compiled(*call_args)
    if args.save:
        np.savez(
            args.save, out=np.asarray(out), dq=np.asarray(dq), dk=np.asarray(dk), dv=np.asarray(dv)
        )
    if args.variant == "blockwise":
        nb = -(-seq // args.block)
        need = np.asarray(block_needed(ids, ids, pos, pos, spec, args.block, args.block))
        result["blocks"] = {"needed": int(need.sum()), "total": nb * nb, "block": args.block}
    return result


# ----------------------------------------------------------------------------- driver


def _mem_available_bytes():
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _run_worker(args, variant, seq, analyze_only=False, save=None):
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        variant,
        "--seq",
        str(seq),
        "--segments",
        str(args.segments),
        "--q-heads",
        str(args.q_heads),
        "--kv-heads",
        str(args.kv_heads),
        "--head-dim",
        str(args.head_dim),
        "--window",
        str(args.window),
        "--block",
        str(args.block),
        "--warmup",
        str(args.warmup),
        "--iters",
        str(args.iters),
    ]
    if analyze_only:
        cmd.append("--analyze-only")
    if save:
        cmd += ["--save", save]
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
    return {
        "variant": variant,
        "seq_len": seq,
        "error": f"worker exited with {proc.returncode}: {tail}",
    }


def _xla_total(res):
    x = res.get("xla", {})
    return sum(
        x.get(key, 0)
        for key in ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes")
    )


def _fmt_bytes(n):
    return (
        "n/a" if n is None else (f"{n / GIB:.2f} GiB" if n >= GIB / 4 else f"{n / 1024**2:.0f} MiB")
    )


def add_workload_arguments(p):
    """The workload both CPU kernel benchmarks share (this one and bench_cpu_kernel.py)."""
    p.add_argument("--seq", type=int, default=16384)
    p.add_argument("--segments", type=int, default=4)
    p.add_argument("--q-heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--window", type=int, default=512)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_arguments(p)
    p.add_argument(
        "--block", type=int, default=128, help="block_q = block_kv of the blockwise variant"
    )
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--fallback-seq", type=int, default=8192)
    p.add_argument("--limit-gib", type=float, default=12.0)
    p.add_argument("--results-dir", default=os.path.join(ROOT, "results"))
    p.add_argument("--no-record", action="store_true", help="print the table only")
    p.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--analyze-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--save", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        args.variant = args.worker
        print(RESULT_TAG + json.dumps(_worker(args)), flush=True)
        return 0

    avail = _mem_available_bytes()
    limit = args.limit_gib * GIB if avail is None else min(args.limit_gib * GIB, 0.6 * avail)
    scratch = tempfile.TemporaryDirectory(
        prefix="bench-ref-"
    )  # the workers' outputs; removed at exit
    tmp = scratch.name
    rows = []  # dicts with the measured / extrapolated figures
    full = args.seq
    for variant in VARIANTS:
        est = _run_worker(args, variant, full, analyze_only=True)
        fits = "error" not in est and _xla_total(est) <= limit
        print(
            f"[{variant}] XLA estimate at S={full}: {_fmt_bytes(_xla_total(est))} "
            f"({'runs' if fits else f'too big: extrapolating from S={args.fallback_seq}'})",
            file=sys.stderr,
        )
        if fits:
            res = _run_worker(args, variant, full, save=os.path.join(tmp, f"{variant}-{full}.npz"))
            res["extrapolated"] = False
            rows.append(res)
        else:
            res = _run_worker(
                args,
                variant,
                args.fallback_seq,
                save=os.path.join(tmp, f"{variant}-{args.fallback_seq}.npz"),
            )
            res["extrapolated_from"] = dict(res)
            res["extrapolated"] = True
            res["xla_estimate_full"] = est.get("xla")
            rows.append(res)
        if args.fallback_seq != full and variant == "blockwise":
            # like-for-like point at the fallback length, to compare against the measured
            # dense/oracle there
            small = _run_worker(
                args,
                variant,
                args.fallback_seq,
                save=os.path.join(tmp, f"{variant}-{args.fallback_seq}.npz"),
            )
            small["extrapolated"] = False
            rows.append(small)
        if any(r.get("error") for r in rows):
            print(json.dumps(rows[-1], indent=1), file=sys.stderr)

    import numpy as np

    def err_vs_blockwise(variant, seq):
        a, b = os.path.join(tmp, f"{variant}-{seq}.npz"), os.path.join(tmp, f"blockwise-{seq}.npz")
        if variant == "blockwise" or not (os.path.exists(a) and os.path.exists(b)):
            return None
        x, y = np.load(a), np.load(b)
        return float(max(np.max(np.abs(x[n] - y[n])) for n in ("out", "dq", "dk", "dv")))

    # one table row per (variant, length actually run) plus an extrapolated row where needed
    table = []
    for r in rows:
        if r.get("error"):
            table.append({"variant": r["variant"], "seq_len": r["seq_len"], "error": r["error"]})
            continue
        base = {
            "variant": r["variant"],
            "seq_len": r["seq_len"],
            "median_ms": r["timing"]["median_ms"],
            "mean_ms": r["timing"]["mean_ms"],
            "std_ms": r["timing"]["std_ms"],
            "min_ms": r["timing"]["min_ms"],
            "compile_s": r["compile_s"],
            "rss_growth": r["peak_rss_growth_bytes"],
            "xla_temp": r["xla"].get("temp_size_in_bytes"),
            "xla_total": _xla_total(r),
            "max_abs_err_vs_blockwise": err_vs_blockwise(r["variant"], r["seq_len"]),
            "how": "measured",
            "blocks": r.get("blocks"),
        }
        table.append(base)
        if r.get("extrapolated"):
            f = (full / r["seq_len"]) ** 2
            table.append(
                {
                    **base,
                    "seq_len": full,
                    "median_ms": base["median_ms"] * f,
                    "mean_ms": base["mean_ms"] * f,
                    "std_ms": None,
                    "min_ms": base["min_ms"] * f,
                    "compile_s": None,
                    "rss_growth": base["rss_growth"] * f,
                    "xla_temp": (r.get("xla_estimate_full") or {}).get("temp_size_in_bytes"),
                    "xla_total": base["xla_total"] * f,
                    "max_abs_err_vs_blockwise": None,
                    "how": (
                        f"extrapolated (x{f:g} from S={r['seq_len']}; XLA temp is the compile-time"
                        f" estimate at S={full})"
                    ),
                }
            )

    def pick(variant, seq):
        for t in table:
            if t["variant"] == variant and t["seq_len"] == seq and "error" not in t:
                return t
        return None

    print()
    print(
        f"Reference attention on CPU: batch 1, S={full} ({args.segments} segments),"
        f" {args.q_heads} q / {args.kv_heads} kv heads, d={args.head_dim}, window ({args.window},"
        f" 0), float32, forward+backward; median of {args.iters} after {args.warmup} warm-up;"
        " compile excluded."
    )
    print()
    print(
        "| variant | S | how | median ms | speed-up of blockwise | XLA temp | peak RSS growth |"
        " memory ratio (RSS) | max abs err vs blockwise |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for t in table:
        if "error" in t:
            print(f"| {t['variant']} | {t['seq_len']} | failed | | | | | | |")
            continue
        bw = pick("blockwise", t["seq_len"])
        speed = (
            f"{t['median_ms'] / bw['median_ms']:.1f}x" if bw and t["variant"] != "blockwise" else ""
        )
        memr = (
            f"{t['rss_growth'] / bw['rss_growth']:.1f}x"
            if bw and t["variant"] != "blockwise" and bw["rss_growth"] > 0
            else ""
        )
        err = (
            "" if t["max_abs_err_vs_blockwise"] is None else f"{t['max_abs_err_vs_blockwise']:.2e}"
        )
        how = "measured" if t["how"] == "measured" else "**extrapolated** (quadratic)"
        print(
            f"| {t['variant']} | {t['seq_len']} | {how} | {t['median_ms']:.0f} | {speed} |"
            f" {_fmt_bytes(t['xla_temp'])} | {_fmt_bytes(t['rss_growth'])} | {memr} | {err} |"
        )
    bw = pick("blockwise", full)
    if bw and bw.get("blocks"):
        b = bw["blocks"]
        print(
            f"\nblockwise computed {b['needed']} of {b['total']} {b['block']}x{b['block']} blocks "
            f"({100 * b['needed'] / b['total']:.1f}%)."
        )
    dense_full = pick("dense", full)
    verdict = {}
    if bw and dense_full:
        verdict = {
            "speedup_vs_dense": dense_full["median_ms"] / bw["median_ms"],
            "memory_ratio_vs_dense_rss": dense_full["rss_growth"] / max(bw["rss_growth"], 1),
            "memory_ratio_vs_dense_xla_temp": (
                (dense_full["xla_temp"] or 0) / max(bw["xla_temp"] or 1, 1)
            ),
            "dense_extrapolated": dense_full["how"] != "measured",
        }
        ok = verdict["speedup_vs_dense"] >= 10 and verdict["memory_ratio_vs_dense_rss"] >= 10
        print(
            f"\ntarget (blockwise >= 10x faster and >= 10x less memory than dense at S={full}): "
            f"{'met' if ok else 'NOT met'} - speed-up {verdict['speedup_vs_dense']:.1f}x, "
            f"memory {verdict['memory_ratio_vs_dense_rss']:.1f}x (RSS), "
            f"{verdict['memory_ratio_vs_dense_xla_temp']:.1f}x (XLA temp)"
            f"{' [dense extrapolated]' if verdict['dense_extrapolated'] else ''}."
        )

    if args.no_record:
        return 0
    sys.path.insert(0, os.path.join(ROOT, "src"))
    from tutorial_utils.perfmodel.records import write_record
    from tutorial_utils.perfmodel.timing import make_record

    results = []
    for t in table:
        if "error" in t:
            continue
        row = {
            "strategy": f"single-{t['variant']}",
            "variant": t["variant"],
            "stripe_size": None,
            "seq_len": t["seq_len"],
            "mean_ms": t["mean_ms"],
            "median_ms": t["median_ms"],
            "min_ms": t["min_ms"],
            "measurement": t["how"],
            "extrapolated": t["how"] != "measured",
            "peak_rss_growth_bytes": int(t["rss_growth"]),
            "xla_temp_bytes": t["xla_temp"],
            "xla_total_bytes": int(t["xla_total"]) if t["xla_total"] else None,
            "compile_s": t["compile_s"],
        }
        if t["std_ms"] is not None:
            row["std_ms"] = t["std_ms"]
        if t["max_abs_err_vs_blockwise"] is not None:
            row["max_abs_err"] = t["max_abs_err_vs_blockwise"]
        if t.get("blocks"):
            row["blocks"] = t["blocks"]
        results.append(row)
    config = {
        "batch": 1,
        "seq_len": full,
        "num_q_heads": args.q_heads,
        "num_kv_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "dtype": "float32",
        "cp_size": 1,
        "window": [args.window, 0],
        "segments_per_row": args.segments,
        "block_q": args.block,
        "block_kv": args.block,
        "pass": "forward+backward",
        "fallback_seq_len": args.fallback_seq,
        "memory_limit_bytes": int(limit),
    }
    rec = make_record(
        label="reference CPU: blockwise vs dense vs jax.nn oracle",
        source="cpu-reference",
        config=config,
        results=results,
        warmup=args.warmup,
        iters=args.iters,
        notes=(
            "Single device, no CP. Rows marked extrapolated were run at fallback_seq_len and scaled"
            " quadratically in time and memory because XLA's compile-time estimate exceeded"
            " memory_limit_bytes. Memory: peak RSS growth over the post-import baseline (fresh"
            " process per variant; includes compilation) and XLA's memory analysis. "
        )
        + (json.dumps(verdict) if verdict else ""),
        # the reference's kernels are called directly, whatever TE backend the process has
        backend=("this project's pure-JAX reference kernels, called directly; no TE", "reference"),
    )
    path = write_record(rec, directory=args.results_dir, name="reference-cpu-blockwise-vs-dense")
    print(f"\nrecord written to {os.path.relpath(path, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
