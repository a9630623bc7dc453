"""Each emulated sub-problem of ``check``'s ``te-emulated-subproblems``, error by error (GPU).

For each strategy and sub-problem: the worst ``max|err| / tol`` of out/dq/dk/dv (an absolute
bound, stricter than ``check``'s), for dk/dv the same on key rows covered by 0, 1 or >= 2
runs of the sub-problem's calls, and where dv's worst error lies. Its records are
``results/gpu-run/emulation-probe-*.jsonl``: one JSON line per sub-problem on stdout.
Run: ``PYTHONPATH=src python devtools/gpu_emulation_probe.py > probe.jsonl``.
"""

from __future__ import annotations

import json
import sys

import jax.numpy as jnp
import numpy as np

from tutorial_utils.cli import bench
from tutorial_utils.cli.attention_compare import reference_fwd_bwd, tolerance
from tutorial_utils.cli.bench_subproblems import ragged_visibility as B_vis
from tutorial_utils.cli.check_cp import _ragged_calls, ragged_fwd_bwd
from tutorial_utils.inputs import fixed_slot_segments, random_qkv
from tutorial_utils.te import attention


def main() -> int:
    cp, b, s, hq, hkv, d = 4, 2, 512, 8, 2, 64
    window = (40, 0)
    ids, pos = fixed_slot_segments(b, s, 4, 96)
    q, k, v, dout = random_qkv(5, b, s, hq, hkv, d, jnp.bfloat16)
    tol = tolerance(jnp.bfloat16)
    ids_j, pos_j = jnp.asarray(ids), jnp.asarray(pos)
    for strategy in ("allgather", "ring"):
        stripe = 4 if strategy == "allgather" else 1
        for sub in bench.rank_subproblems(strategy, s, cp, stripe):
            calls = _ragged_calls(strategy, ids, pos, sub, cp, window)
            if not calls:
                continue
            qi, ki = jnp.asarray(sub.q_index), jnp.asarray(sub.kv_index)
            qq, kk, vv, do = q[:, qi], k[:, ki], v[:, ki], dout[:, qi]
            ref_out, ref_grads = reference_fwd_bwd(
                qq,
                kk,
                vv,
                do,
                ids_j[:, qi],
                ids_j[:, ki],
                pos_j[:, qi],
                pos_j[:, ki],
                scale=d**-0.5,
                window=window,
            )
            cover = np.zeros((b, len(sub.kv_index)), np.int32)  # runs holding each key row
            for c in calls:
                for row in range(b):
                    for n, o in zip(c.kv_seqlens[row], c.kv_offsets[row]):
                        cover[row, o : o + n] += n > 0
            descs = tuple(bench.te_descriptor(attention, c) for c in calls)
            meta = tuple((c.bottom_right, c.window, c.max_segments) for c in calls)
            (_, out), grads = ragged_fwd_bwd((qq, kk, vv), descs, do, meta, d**-0.5)
            row = {
                "strategy": strategy,
                "rank": sub.rank,
                "step": getattr(sub, "step", None),
                "variant": "as-is",
                "calls": len(calls),
                "max_runs": max(c.max_segments for c in calls),
                "max_cover": int(cover.max()),
            }
            for name, x, r in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref_out, *ref_grads)):
                err = np.abs(np.asarray(x, np.float32) - np.asarray(r, np.float32))
                row[name] = float(err.max() / tol)
                if name not in ("dk", "dv"):
                    continue
                per_key = err.max(axis=(2, 3))  # [b, key]
                if name == "dv":
                    seen = sum(B_vis(c, len(sub.q_index), len(sub.kv_index)) for c in calls)
                    bb, kk_ = np.unravel_index(per_key.argmax(), per_key.shape)
                    row["dv_worst_key"] = [int(bb), int(kk_)]
                    row["dv_worst_seen_by"] = int(seen[bb, :, kk_].sum())
                    row["dv_worst_ref_absmax"] = float(np.abs(np.asarray(r)[bb, kk_]).max())
                    row["dv_worst_err"] = float(per_key.max())
                for lab, m in (("c0", cover == 0), ("c1", cover == 1), ("c2+", cover >= 2)):
                    row[f"{name}_{lab}"] = float(per_key[m].max() / tol) if m.any() else None
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
