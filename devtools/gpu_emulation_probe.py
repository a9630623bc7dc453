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

import jax
import jax.numpy as jnp
import numpy as np

from tutorial_utils.cli import bench
from tutorial_utils.cli.attention_compare import reference_fwd_bwd, tolerance
from tutorial_utils.cli.bench_subproblems import ragged_visibility as B_vis
from tutorial_utils.cli.check_cp import _ragged_calls
from tutorial_utils.inputs import fixed_slot_segments, random_qkv
from tutorial_utils.te import attention
from tutorial_utils.te.fused_call import call_fused_attn


def main() -> int:
    cp, b, s, hq, hkv, d = 4, 2, 512, 8, 2, 64
    window = (40, 0)
    ids, pos = fixed_slot_segments(b, s, 4, 96)
    q, k, v, dout = random_qkv(5, b, s, hq, hkv, d, jnp.bfloat16)
    tol = tolerance(jnp.bfloat16)

    def loss(qkv, descs, do, meta):
        outs = []
        for desc, (bottom_right, win, max_segments) in zip(descs, meta):
            mask = (
                attention.AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK
                if bottom_right
                else attention.AttnMaskType.PADDING_CAUSAL_MASK
            )
            outs.append(
                call_fused_attn(
                    attention,
                    qkv,
                    desc,
                    scaling_factor=d**-0.5,
                    max_segments_per_seq=max_segments,
                    window_size=win,
                    attn_mask_type=mask,
                )
            )
        out = sum(o.astype(jnp.float32) for o in outs)
        return jnp.vdot(out, do.astype(jnp.float32)), out

    fwd_bwd = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=(3,))
    ids_j, pos_j = jnp.asarray(ids), jnp.asarray(pos)
    rows = []
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
            cover = np.zeros((b, len(sub.kv_index)), np.int32)
            for c in calls:
                for row in range(b):
                    for n in range(c.kv_seqlens.shape[1]):
                        if c.kv_seqlens[row, n] > 0:
                            o = c.kv_offsets[row, n]
                            cover[row, o : o + c.kv_seqlens[row, n]] += 1
            for variant, cs in (("as-is", calls),):  # one layout: bench's calls
                descs = tuple(bench.te_descriptor(attention, c) for c in cs)
                meta = tuple((c.bottom_right, c.window, c.max_segments) for c in cs)
                (_, out), grads = fwd_bwd((qq, kk, vv), descs, do, meta)
                row = {
                    "strategy": strategy,
                    "rank": sub.rank,
                    "step": getattr(sub, "step", None),
                    "variant": variant,
                    "calls": len(cs),
                    "max_runs": max(c.max_segments for c in cs),
                    "max_cover": int(cover.max()),
                }
                for name, x, r in zip(
                    ("out", "dq", "dk", "dv"), (out, *grads), (ref_out, *ref_grads)
                ):
                    err = np.abs(np.asarray(x, np.float32) - np.asarray(r, np.float32))
                    row[name] = float(err.max() / tol)
                    if name == "dv":
                        vis = sum(
                            B_vis(c, len(sub.q_index), len(sub.kv_index)) for c in cs
                        )  # [b, q, k] queries seeing each key
                        per = err.max(axis=(2, 3))
                        bb, kk_ = np.unravel_index(per.argmax(), per.shape)
                        refv = np.asarray(r, np.float32)[bb, kk_]
                        row["dv_worst_key"] = [int(bb), int(kk_)]
                        row["dv_worst_seen_by"] = int(vis[bb, :, kk_].sum())
                        row["dv_worst_ref_absmax"] = float(np.abs(refv).max())
                        row["dv_worst_err"] = float(per.max())
                    if name in ("dk", "dv"):
                        per_tok = err.max(axis=(2, 3))
                        for lab, m in (("c0", cover == 0), ("c1", cover == 1), ("c2+", cover >= 2)):
                            row[f"{name}_{lab}"] = (
                                float(per_tok[m].max() / tol) if m.any() else None
                            )
                rows.append(row)
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
