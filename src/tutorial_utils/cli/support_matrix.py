"""What TE 2.20.2's ``fused_attn`` does with each configuration, computed by running TE's code.

The FAQ and chapters state what TE accepts from reading its source; this table is computed
instead, by TE's own ``fused_attn`` on :mod:`tutorial_utils.te_on_cpu`'s kernel, against an
independent dense formula. ``make support-matrix`` writes
``results/support_matrix/te-2.20.2-cpu.json``, rendered by ``docs/support_matrix.md``.

TE is imported inside :func:`_te` and :func:`compute_cell`, after ``te_on_cpu.install()``: the
stand-in extension must be in place before ``transformer_engine.jax`` (or ``tutorial_utils.te``,
whose import picks a backend and imports TE) is imported. The site's support-matrix page imports
this module for its constants only, and so loads no TE.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import sys
from importlib.metadata import version
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tutorial_utils import te_on_cpu

SCHEMA = "te-support-matrix/1"
DEFAULT_OUT = (
    Path(__file__).resolve().parents[3] / "results" / "support_matrix" / "te-2.20.2-cpu.json"
)
TOL = 0.0394  # TE's dtype_tols for bf16
CP = 4
SEQ = 64
D = 8
SCALE = 0.3

#: column id -> (strategy, stripe_size) ; None strategy = one device
COLUMNS = {
    "single": (None, None),
    "allgather-stripe1": ("ALL_GATHER", 1),
    "allgather-stripe4": ("ALL_GATHER", 4),
    "ring-stripe1": ("RING", 1),
}
COLUMN_LABELS = {
    "single": "one device",
    "allgather-stripe1": "AllGather, stripe 1",
    "allgather-stripe4": "AllGather, stripe 4",
    "ring-stripe1": "Ring, stripe 1",
}

_BASE = dict(
    mask="PADDING_CAUSAL_MASK",
    bias=False,
    dropout=0.0,
    window=None,
    hq=2,
    hkv=2,
    softmax="VANILLA_SOFTMAX",
    packing=None,
)
#: packing -> TE's THD layout: K and V in one array (T2HD) or Q, K and V in one (T3HD)
THD_LAYOUTS = {None: "THD_THD_THD", "kv": "THD_T2HD", "qkv": "T3HD"}


def _row(row_id, label, layout, **kw):
    return {"id": row_id, "label": label, "layout": layout, **{**_BASE, **kw}}


_MASKS = [
    "NO_MASK",
    "PADDING_MASK",
    "CAUSAL_MASK",
    "PADDING_CAUSAL_MASK",
    "CAUSAL_BOTTOM_RIGHT_MASK",
    "PADDING_CAUSAL_BOTTOM_RIGHT_MASK",
]
ROWS: list[dict] = [
    _row(
        f"{lay.lower()}-{m.lower().replace('_mask', '').replace('_', '-')}",
        f"{lay}, {m}",
        lay,
        mask=m,
    )
    for lay in ("THD", "BSHD")
    for m in _MASKS
] + [
    _row("thd-window", "THD, PADDING_CAUSAL_MASK, window (8, 0)", "THD", window=(8, 0)),
    # "causal, no window" spelled (-1, 0): TE's striped Ring reads the -1 as a bound
    _row("thd-window-none", "THD, PADDING_CAUSAL_MASK, window (-1, 0)", "THD", window=(-1, 0)),
    _row("thd-gqa", "THD, PADDING_CAUSAL_MASK, GQA 4:1", "THD", hq=4, hkv=1),
    # the packed layouts (TE names the QKV one T3HD): the arrays are stacked inside the
    # differentiated step, so TE gets one KV (or QKV) tensor and the gradients come back per
    # q, k and v as for the other rows
    _row("thd-t2hd", "THD_T2HD, PADDING_CAUSAL_MASK", "THD", packing="kv"),
    _row("thd-t3hd", "T3HD, PADDING_CAUSAL_MASK", "THD", packing="qkv"),
    _row(
        "thd-off-by-one",
        "THD, PADDING_CAUSAL_MASK, OFF_BY_ONE_SOFTMAX",
        "THD",
        softmax="OFF_BY_ONE_SOFTMAX",
    ),
    _row(
        "thd-learnable",
        "THD, PADDING_CAUSAL_MASK, LEARNABLE_SOFTMAX",
        "THD",
        softmax="LEARNABLE_SOFTMAX",
    ),
    _row("thd-bias", "THD, PADDING_CAUSAL_MASK, POST_SCALE_BIAS", "THD", bias=True),
    _row("thd-dropout", "THD, PADDING_CAUSAL_MASK, dropout 0.1 (training)", "THD", dropout=0.1),
    _row(
        "bshd-window", "BSHD, CAUSAL_MASK, window (8, 0)", "BSHD", mask="CAUSAL_MASK", window=(8, 0)
    ),
    _row("bshd-gqa", "BSHD, CAUSAL_MASK, GQA 4:1", "BSHD", mask="CAUSAL_MASK", hq=4, hkv=1),
    _row("bshd-bias", "BSHD, CAUSAL_MASK, POST_SCALE_BIAS", "BSHD", mask="CAUSAL_MASK", bias=True),
    _row(
        "bshd-learnable",
        "BSHD, CAUSAL_MASK, LEARNABLE_SOFTMAX",
        "BSHD",
        mask="CAUSAL_MASK",
        softmax="LEARNABLE_SOFTMAX",
    ),
]

#: where each kind of refusal is explained (pattern in the message -> page#anchor)
RULES = [
    (r"dropout|bias needs a BSHD layout|CPU kernel|stand-in", "faq.md#stand-in-reading"),
    (r"[Cc]ontext parallel", "faq.md#cp-options"),
    (r"", "faq.md#how-do-i-know-a-fused-kernel-exists-for-my-configuration"),
]


def rule_for(message: str) -> str:
    for pattern, target in RULES:
        if re.search(pattern, message):
            return target
    return RULES[-1][1]


def _layout_ids(fills, seq=SEQ, slot=16):
    """Slot-aligned segments (aligned to cp*stripe for every column): TE's documented safe
    layout."""
    ids = np.zeros((1, seq), np.int32)
    pos = np.tile(np.arange(slot, dtype=np.int32), seq // slot)[None]
    for j, fill in enumerate(fills):
        ids[0, j * slot : j * slot + fill] = j + 1
    return ids, pos


def _inputs(row):
    """q/k/v/dO (bf16), ids/pos for q and kv, the boolean visibility mask, sink and bias."""
    rng = np.random.default_rng(sum(map(ord, row["id"])))
    bf = lambda a: np.asarray(a, np.float32)  # noqa: E731

    def draw(shape):
        return np.asarray(jnp.asarray(rng.normal(size=shape), jnp.bfloat16).astype(jnp.float32))

    q, k, v, do = (
        draw((1, SEQ, row["hq"], D)),
        draw((1, SEQ, row["hkv"], D)),
        draw((1, SEQ, row["hkv"], D)),
        draw((1, SEQ, row["hq"], D)),
    )
    mask = row["mask"]
    padding, causal, br = "PADDING" in mask, "CAUSAL" in mask, "BOTTOM_RIGHT" in mask
    if row["layout"] == "THD":
        ids_q, pos_q = _layout_ids((13, 10, 16, 7) if br else (13, 16, 9, 12))
        ids_kv, pos_kv = _layout_ids((15, 13, 16, 11)) if br else (ids_q, pos_q)
        lens_q = lens_kv = None
    else:
        lens_q = np.array([50 if padding else SEQ], np.int32)
        lens_kv = np.array([58 if (padding and br) else (50 if padding else SEQ)], np.int32)
        ar = np.arange(SEQ)[None]
        ids_q, ids_kv = (
            (ar < lens_q[:, None]).astype(np.int32),
            (ar < lens_kv[:, None]).astype(np.int32),
        )
        pos_q = pos_kv = ar.astype(np.int32)
    vis = _visible(
        ids_q,
        ids_kv,
        pos_q,
        pos_kv,
        padding=padding or row["layout"] == "THD",
        causal=causal,
        bottom_right=br,
        window=row["window"] or (-1, -1),
    )
    sink = {
        "VANILLA_SOFTMAX": None,
        "OFF_BY_ONE_SOFTMAX": np.zeros(row["hq"], np.float32),
        "LEARNABLE_SOFTMAX": bf(rng.normal(size=row["hq"])),
    }[row["softmax"]]
    bias = draw((1, row["hq"], SEQ, SEQ)) if row["bias"] else None
    return dict(
        q=q,
        k=k,
        v=v,
        do=do,
        ids=(ids_q, ids_kv),
        pos=(pos_q, pos_kv),
        lens=(lens_q, lens_kv),
        vis=vis,
        sink=sink,
        bias=bias,
    )


def _visible(ids_q, ids_kv, pos_q, pos_kv, *, padding, causal, bottom_right, window):
    """TE's mask in numpy: same nonzero segment, then causal / window on (shifted) positions."""
    iq, ik = ids_q[:, :, None], ids_kv[:, None, :]
    pq = pos_q.astype(np.int64).copy()
    if bottom_right:  # shift each query by (kv run length - q run length) of its segment
        for sid in np.unique(ids_q[ids_q > 0]):
            pq[ids_q == sid] += (ids_kv == sid).sum() - (ids_q == sid).sum()
    pq, pk = pq[:, :, None], pos_kv[:, None, :]
    vis = np.ones(iq.shape[:2] + ik.shape[2:], bool)
    if padding:
        vis &= (iq == ik) & (iq != 0)
    if causal:
        vis &= pk <= pq
    left, right = window
    if left >= 0:
        vis &= pk >= pq - left
    if right >= 0:
        vis &= pk <= pq + right
    return vis


def _oracle(x):
    """Output and dQ/dK/dV of dense softmax attention (float32 JAX autodiff of a formula written
    here)."""
    vis, sink, bias = jnp.asarray(x["vis"]), x["sink"], x["bias"]

    def attn(q, k, v):
        g = q.shape[2] // k.shape[2]
        k2, v2 = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k2) * SCALE
        if bias is not None:
            s = s + bias
        s = jnp.where(vis[:, None], s, -jnp.inf)
        m = jnp.max(s, axis=-1, keepdims=True)
        if sink is not None:
            m = jnp.maximum(m, jnp.asarray(sink)[None, :, None, None])
        m = jnp.where(jnp.isfinite(m), m, 0.0)
        e = jnp.exp(s - m)
        den = e.sum(-1, keepdims=True)
        if sink is not None:
            den = den + jnp.exp(jnp.asarray(sink)[None, :, None, None] - m)
        p = jnp.where(den > 0, e / jnp.where(den > 0, den, 1.0), 0.0)
        return jnp.einsum("bhqk,bkhd->bqhd", p, v2)

    def loss(q, k, v):
        out = attn(q, k, v)
        return jnp.sum(out * x["do"]), out

    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(
        x["q"], x["k"], x["v"]
    )
    return np.asarray(out), [np.asarray(g) for g in grads]


def _shorten(message: str) -> str:
    text = str(message)
    for marker in (
        "Unsupported backend:",
        "ValueError:",
        "AssertionError:",
        "NotImplementedError:",
    ):
        if marker in text:
            text = text[text.index(marker) :]
            break
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= 160 else line[:157] + "..."


def _te():
    """TE's JAX package, with the stand-in kernel in place of cuDNN, and its attention module."""
    te_jax = te_on_cpu.install()
    from transformer_engine.jax import attention as te_attention

    return te_jax, te_attention


@functools.cache
def _reorders(strategy, stripe):
    """TE's reorder and its inverse for ``CP`` ranks, jitted once per (strategy, stripe) for every
    cell.

    Called eagerly, each compiled a few ops per new shape; jitted inside each cell, each cell
    would compile them again.
    """
    _, te_attention = _te()
    placement = dict(strategy=strategy, cp_size=CP, seq_dim=1, stripe_size=stripe)
    return (
        jax.jit(lambda a: te_attention.reorder_causal_load_balancing(a, **placement)),
        jax.jit(lambda a: te_attention.inverse_reorder_causal_load_balancing(a, **placement)),
    )


def packed(q, k, v, packing: str | None) -> tuple:
    """The ``qkv`` tuple TE's layout takes: ``(q, k, v)``, ``(q, kv)`` or ``(qkv,)``, stacked on
    a new axis before the heads (``[b, t, 2, h, d]``, ``[b, t, 3, h, d]``).

    Args:
        q: Queries ``[b, t, h, d]``.
        k: Keys ``[b, t, h_kv, d]``.
        v: Values, shaped like ``k``.
        packing: ``None``, ``"kv"`` or ``"qkv"`` (a row's ``packing``).

    Returns:
        The tuple for ``fused_attn``'s first argument.
    """
    if packing == "kv":
        return (q, jnp.stack([k, v], axis=2))
    if packing == "qkv":
        return (jnp.stack([q, k, v], axis=2),)
    return (q, k, v)


def compute_cell(row: dict, column: str) -> dict:
    """Run TE's own ``fused_attn`` (forward + backward) for one cell; return its verdict.

    TE is called directly (no facade, no checks of ours) with :mod:`tutorial_utils.te_on_cpu`'s
    kernel in place of cuDNN, in bf16 at tiny shapes and cp = 4, and output and dQ/dK/dV are
    compared with a dense float32 formula written here. The verdict is one of

    * ``right``: every value within TE's bf16 tolerance (``atol = rtol = 0.0394``), with the
      max error;
    * ``refused``: TE (or the stand-in's answer to TE's backend query) raised; the message,
      shortened;
    * ``wrong``: TE returned values outside the tolerance, with the max error.

    ``stand_in`` marks cells whose verdict rests on the stand-in's reading of cuDNN's contract:
    a refusal that comes from the stand-in's backend answer, or rows inside a segment that see
    no key (what cuDNN writes there is not known here).
    """
    te_jax, te_attention = _te()
    from tutorial_utils.te.fused_call import call_fused_attn

    strategy, stripe = COLUMNS[column]
    thd = row["layout"] == "THD"
    if strategy is not None and not thd and column == "allgather-stripe4":
        return {
            "verdict": "n/a",
            "note": "BSHD load-balances with DualChunkSwap; stripe_size applies to THD only",
        }
    x = _inputs(row)
    layout = te_attention.QKVLayout[THD_LAYOUTS[row["packing"]] if thd else "BSHD_BSHD_BSHD"]
    kw = dict(
        attn_bias_type=te_attention.AttnBiasType.POST_SCALE_BIAS
        if row["bias"]
        else te_attention.AttnBiasType.NO_BIAS,
        attn_mask_type=te_attention.AttnMaskType[row["mask"]],
        qkv_layout=layout,
        softmax_type=te_attention.AttnSoftmaxType[row["softmax"]],
        scaling_factor=SCALE,
        dropout_probability=row["dropout"],
        max_segments_per_seq=5 if thd else 1,
        window_size=row["window"],
    )
    offset = (
        None
        if row["softmax"] != "LEARNABLE_SOFTMAX"
        else jnp.asarray(x["sink"]).reshape(1, -1, 1, 1)
    )
    bias = None if x["bias"] is None else jnp.asarray(x["bias"], jnp.bfloat16)
    seed = jax.random.PRNGKey(0) if row["dropout"] else None
    q, k, v, do = (jnp.asarray(x[n], jnp.bfloat16) for n in ("q", "k", "v", "do"))
    ids, pos = (jnp.asarray(a) for a in x["ids"]), (jnp.asarray(a) for a in x["pos"])
    ids, pos = tuple(ids), tuple(pos)

    def make_run(call_kw):
        def run(q, k, v, do, ids_q, ids_kv, pos_q, pos_kv):
            desc = (
                te_attention.SequenceDescriptor.from_segment_ids_and_pos(
                    (ids_q, ids_kv), (pos_q, pos_kv)
                )
                if thd
                else te_attention.SequenceDescriptor.from_seqlens(
                    tuple(jnp.asarray(n) for n in x["lens"])
                )
            )

            def loss(q, k, v):
                out = call_fused_attn(
                    te_attention,
                    packed(q, k, v, row["packing"]),
                    desc,
                    bias=bias,
                    seed=seed,
                    softmax_offset=offset,
                    **call_kw,
                )
                return jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32)), out

            (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
            return out, grads

        return run

    try:
        if strategy is None:
            out, grads = jax.jit(make_run(kw))(q, k, v, do, *ids, *pos)
        else:
            mesh = Mesh(np.array(jax.devices()[:CP]), ("cp",))
            sharding = NamedSharding(mesh, P(None, "cp"))
            reorder = (
                te_attention.ReorderStrategy.Striped
                if thd
                else te_attention.ReorderStrategy.DualChunkSwap
            )
            st = stripe if thd else None
            ro, back = _reorders(reorder, st)
            cp_kw = dict(
                kw,
                context_parallel_strategy=te_attention.CPStrategy[strategy],
                context_parallel_causal_load_balanced=True,
                context_parallel_axis="cp",
                stripe_size=st,
            )
            with (
                jax.set_mesh(mesh),
                te_jax.autocast(mesh_resource=te_jax.MeshResource(cp_resource="cp")),
            ):
                args = [jax.device_put(ro(a), sharding) for a in (q, k, v, do, *ids, *pos)]
                out, grads = jax.jit(make_run(cp_kw), in_shardings=(sharding,) * 8)(*args)
                out, grads = back(out), tuple(back(g) for g in grads)
    except Exception as err:  # noqa: BLE001 - a refusal is a verdict
        message = _shorten(err)
        from_standin = (
            "stand-in" in message or "CPU kernel" in message or "Unsupported backend" in message
        )
        return {
            "verdict": "refused",
            "message": message,
            "rule": rule_for(message),
            "stand_in": from_standin,
        }
    want_out, want_grads = _oracle(x)
    got = [np.asarray(out.astype(jnp.float32))] + [np.asarray(g.astype(jnp.float32)) for g in grads]
    want = [want_out] + want_grads
    ok, err = judge(got, want)
    valid = x["ids"][0] > 0
    empty_in_segment = bool(np.any(valid & ~x["vis"].any(-1)))
    cell = {"verdict": "right" if ok else "wrong", "max_error": err, "stand_in": empty_in_segment}
    if empty_in_segment:
        cell["note"] = (
            "some rows inside a segment see no key: their output is the stand-in's assumption"
        )
    return cell


def judge(got, want):
    """``(within tolerance, max abs error)`` over output and gradients, as ``assert_allclose`` reads
    it."""
    err = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want))
    ok = all(bool(np.all(np.abs(g - w) <= TOL + TOL * np.abs(w))) for g, w in zip(got, want))
    return ok, err


def counts(record: dict) -> dict[str, dict[str, int]]:
    """Per column: how many cells are right / refused / wrong (n/a not counted)."""
    out = {c: {"right": 0, "refused": 0, "wrong": 0} for c in COLUMNS}
    for row in record["rows"]:
        for col, cell in row["cells"].items():
            if cell["verdict"] in out[col]:
                out[col][cell["verdict"]] += 1
    return out


def compute(
    rows: list[dict] | None = None, columns: list[str] | None = None, progress=None
) -> dict:
    rows = ROWS if rows is None else rows
    columns = list(COLUMNS) if columns is None else columns
    out_rows = []
    for row in rows:
        cells = {}
        for col in columns:
            cells[col] = compute_cell(row, col)
            if progress:
                progress(f"{row['id']:<32} {col:<20} {cells[col]['verdict']}")
        out_rows.append({**{k: row[k] for k in ("id", "label")}, "cells": cells})
    record = {
        "schema": SCHEMA,
        "label": (
            "What TE 2.20.2's fused_attn does per configuration (TE's JAX code, CPU reference"
            " kernel)"
        ),
        "versions": {
            "transformer_engine": version("transformer-engine"),
            "jax": jax.__version__,
            "python": platform.python_version(),
        },
        "hardware": {
            "platform": "cpu",
            "device_count": jax.device_count(),
            "cp_size": CP,
            "backend": "TE-on-CPU: TE's JAX code with tutorial_utils.te_on_cpu's kernel",
        },
        "config": {
            "seq_len": SEQ,
            "head_dim": D,
            "dtype": "bfloat16",
            "scaling_factor": SCALE,
            "tolerance": TOL,
            "compared": "output and dQ/dK/dV against a dense float32 formula",
        },
        "columns": {c: COLUMN_LABELS[c] for c in columns},
        "rows": out_rows,
    }
    record["counts"] = counts(record)
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON record"
    )
    parser.add_argument(
        "--only", nargs="*", help="row ids to recompute in the stored record (default: all rows)"
    )
    args = parser.parse_args(argv)
    rows = ROWS if not args.only else [r for r in ROWS if r["id"] in args.only]
    if args.only and not rows:
        parser.error(f"--only: none of {args.only} is a row id; ids are {[r['id'] for r in ROWS]}")
    record = compute(rows, progress=lambda line: print(line, flush=True))
    if (
        args.only and args.out.is_file()
    ):  # recompute some rows of the stored record, keep the others
        stored = json.loads(args.out.read_text(encoding="utf-8"))
        fresh = {r["id"]: r for r in record["rows"]}
        kept = {r["id"]: r for r in stored["rows"]}
        stored["rows"] = [
            fresh.get(r["id"]) or kept[r["id"]] for r in ROWS if r["id"] in fresh or r["id"] in kept
        ]
        stored["counts"] = counts(stored)
        record = stored
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(record["counts"]))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
        ).strip()
    sys.exit(main())
