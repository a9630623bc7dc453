"""CPU benchmark: the compiled stand-in kernel against the pure-JAX one, on ``bench-cpu``'s
workload.

Run with ``make bench-kernel`` (or ``python benchmarks/bench_cpu_kernel.py``). Not a test.

Workload (``make bench-cpu``'s defaults): one packed row of 16,384 tokens holding 4 segments,
4 query heads sharing 1 KV head, head dim 64, causal sliding window (512, 0), float32; forward
plus backward (dQ, dK, dV). Variants, in this one process:

* ``jax-blockwise`` - :func:`tutorial_utils.reference.blockwise_attention` and its hand-written
  backward, the kernel ``bench-cpu`` measures (segment ids and positions);
* ``jax-bounds``    - the same JAX kernel in bounds mode, which is what te_on_cpu lowered to
  before the compiled kernel (each row's key range);
* ``compiled``      - :mod:`tutorial_utils.te_on_cpu.kernel` (C++ behind one XLA custom call),
  what te_on_cpu uses now, on the same key ranges.

Each: compile time, then the median of ``--iters`` timed calls after ``--warmup`` (compile
excluded, ``block_until_ready``); the largest difference from ``jax-blockwise``; and the useful
work rate: 2 multiply-adds per visible (query, key) pair per head and dimension for each of the
forward's 2 products and the backward's 5, divided by the median time, next to this machine's
float32 matmul rate (a 2048 x 2048 ``jnp.dot``, measured here). Output: a markdown table and a
``cp-bench/1`` record in ``results/cpu-kernel-compiled-vs-jax.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_reference_cpu import add_workload_arguments  # noqa: E402


def _ranges(ids, pos, window):
    """Each row's inclusive key range under padding + causal + window (left, 0) masks."""
    import numpy as np

    t = np.arange(ids.shape[1])
    start = t - pos  # the row where this token's segment starts
    lo = np.maximum(start, t - window)
    hi = np.where(ids > 0, t, lo - 1)  # padding rows see nothing
    return lo.astype(np.int32), hi.astype(np.int32)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_arguments(p)  # bench-cpu's workload, the same defaults
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--results-dir", default=os.path.join(ROOT, "results"))
    p.add_argument("--no-record", action="store_true", help="print the table only")
    args = p.parse_args(argv)
    for name in ("seq", "segments", "q_heads", "kv_heads", "head_dim", "window", "iters"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")

    import jax
    import jax.numpy as jnp
    import numpy as np

    from tutorial_utils.inputs import fixed_slot_segments
    from tutorial_utils.perfmodel.records import write_record
    from tutorial_utils.perfmodel.timing import make_record, time_fn
    from tutorial_utils.reference import MaskSpec, blockwise_attention, blockwise_backward
    from tutorial_utils.te_on_cpu import kernel as cpu_kernel

    if not cpu_kernel.use_compiled():
        print(f"bench_cpu_kernel: {cpu_kernel.status()}", file=sys.stderr)
        return 1
    seq, hq, hkv, d, window = args.seq, args.q_heads, args.kv_heads, args.head_dim, args.window
    scale = d**-0.5
    ids_np, pos_np = fixed_slot_segments(1, seq, args.segments, seq // args.segments)
    lo_np, hi_np = _ranges(ids_np, pos_np, window)
    pairs = int(np.maximum(hi_np - lo_np + 1, 0).sum())
    useful_gflop = 2 * pairs * hq * d * (2 + 5) / 1e9
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(ks[0], (1, seq, hq, d), jnp.float32)
    k = jax.random.normal(ks[1], (1, seq, hkv, d), jnp.float32)
    v = jax.random.normal(ks[2], (1, seq, hkv, d), jnp.float32)
    dout = jax.random.normal(ks[3], (1, seq, hq, d), jnp.float32)
    ids, pos, lo, hi = (jnp.asarray(x) for x in (ids_np, pos_np, lo_np, hi_np))
    rows = jnp.arange(seq, dtype=jnp.int32)[None]

    def jax_segments(q, k, v, dout):
        spec = MaskSpec(padding=True, causal=True, window=(window, 0))
        out, lse = blockwise_attention(q, k, v, ids, ids, pos, pos, scale=scale, spec=spec)
        return (
            out,
            *blockwise_backward(
                q, k, v, ids, ids, pos, pos, out, lse, dout, scale=scale, spec=spec
            )[:3],
        )

    def jax_bounds(q, k, v, dout):
        spec = MaskSpec(bounds=True)
        out, lse = blockwise_attention(q, k, v, lo, rows, hi, rows, scale=scale, spec=spec)
        return (
            out,
            *blockwise_backward(
                q, k, v, lo, rows, hi, rows, out, lse, dout, scale=scale, spec=spec
            )[:3],
        )

    def compiled(q, k, v, dout):
        out, lse, _ = cpu_kernel.attention_fwd(q, k, v, lo, hi, None, scale=scale)
        return (
            out,
            *cpu_kernel.attention_bwd(q, k, v, lo, hi, out, lse, dout, None, scale=scale)[:3],
        )

    a = jax.random.normal(ks[0], (2048, 2048), jnp.float32)
    matmul = time_fn(jax.jit(lambda a: a @ a), a, warmup=args.warmup, iters=args.iters)
    matmul_gflops = 2 * 2048**3 / 1e9 / (matmul["median_ms"] / 1e3)

    results, reference = [], None
    for name, fn in (
        ("jax-blockwise", jax_segments),
        ("jax-bounds", jax_bounds),
        ("compiled", compiled),
    ):
        t0 = time.perf_counter()
        step = jax.jit(fn).lower(q, k, v, dout).compile()
        compile_s = time.perf_counter() - t0
        timing = time_fn(step, q, k, v, dout, warmup=args.warmup, iters=args.iters)
        got = [np.asarray(x) for x in step(q, k, v, dout)]
        reference = reference or got
        err = max(float(np.max(np.abs(x - y))) for x, y in zip(got, reference))
        rate = useful_gflop / (timing["median_ms"] / 1e3)
        results.append(
            {
                "strategy": f"single-{name}",
                "variant": name,
                "stripe_size": None,
                "seq_len": seq,
                "median_ms": timing["median_ms"],
                "mean_ms": timing["mean_ms"],
                "std_ms": timing["std_ms"],
                "min_ms": timing["min_ms"],
                "compile_s": compile_s,
                "measurement": "measured",
                "extrapolated": False,
                "max_abs_err_vs_jax_blockwise": err,
                "useful_gflop_per_s": rate,
                "fraction_of_matmul_rate": rate / matmul_gflops,
            }
        )

    base = results[0]["median_ms"]
    print(
        f"Stand-in kernel on CPU: batch 1, S={seq} ({args.segments} segments), {hq} q / {hkv} kv"
        f" heads, d={d}, window ({window}, 0), float32, forward+backward; {pairs:,} visible pairs"
        f" ({useful_gflop:.1f} GFLOP of useful work); median of {args.iters} after"
        f" {args.warmup} warm-up; compile excluded. This machine's 2048^2 float32 matmul:"
        f" {matmul_gflops:.0f} GFLOP/s.\n"
    )
    print(
        "| variant | compile s | median ms | speed-up vs jax-blockwise | useful GFLOP/s | of matmul"
        " rate | max abs diff |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['variant']} | {r['compile_s']:.2f} | {r['median_ms']:.0f} |"
            f" {base / r['median_ms']:.1f}x | {r['useful_gflop_per_s']:.1f} |"
            f" {100 * r['fraction_of_matmul_rate']:.0f}% |"
            f" {r['max_abs_err_vs_jax_blockwise']:.1e} |"
        )
    if args.no_record:
        return 0
    config = {
        "batch": 1,
        "seq_len": seq,
        "num_q_heads": hq,
        "num_kv_heads": hkv,
        "head_dim": d,
        "dtype": "float32",
        "cp_size": 1,
        "window": [window, 0],
        "segments_per_row": args.segments,
        "pass": "forward+backward",
        "visible_pairs": pairs,
        "useful_gflop": useful_gflop,
        "matmul_2048_gflop_per_s": matmul_gflops,
        "matmul_2048_median_ms": matmul["median_ms"],
        "kernel_threads": os.environ.get("TUTORIAL_CPU_KERNEL_THREADS", "all cores"),
    }
    rec = make_record(
        label="CPU stand-in kernel: compiled (C++ custom call) vs pure JAX",
        source="cpu-kernel",
        config=config,
        results=results,
        warmup=args.warmup,
        iters=args.iters,
        notes=(
            "Single device, no CP, one process. Useful work counts 7 matrix products (2 forward, 5 "
            "backward) over the visible (query, key) pairs only; the fraction is of this machine's "
            "2048^2 float32 matmul rate, measured in the same run."
        ),
        # no TE call runs here: the kernels are called directly, whatever backend the process has
        backend=(
            "this project's CPU stand-in kernels (pure JAX and C++), called directly; no TE",
            "kernel",
        ),
    )
    path = write_record(rec, directory=args.results_dir, name="cpu-kernel-compiled-vs-jax")
    print(f"\nrecord written to {os.path.relpath(path, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
