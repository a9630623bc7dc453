"""``python -m tutorial_utils.cli.check``: is this installation right, on the devices present?

A GPU node has many ways to be subtly wrong (no fused THD kernel on this GPU, a cuDNN without
GQA/SWA support, a JAX that cannot see every device); this answers "does what runs here agree
with the reference semantics?" before any chapter or benchmark is trusted.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import functools
import inspect
import json
import math
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from tutorial_utils.cli.argtypes import positive_int
from tutorial_utils.inputs import random_qkv

__all__ = [
    "CheckResult",
    "tolerance",
    "compare",
    "run_checks",
    "build_parser",
    "main",
    "cp_workload_for",
    "FUSED_ATTN_PARAMS",
    "KERNEL_AVAILABLE_PARAMS",
    "MESH_RESOURCE_FIELDS",
]

VERDICTS = ("PASS", "FAIL", "SKIP")
NOT_ACTIVE = "TE's code not active (TUTORIAL_TE_BACKEND=reference)"

#: TE 2.20.2 ``transformer_engine.jax.attention.fused_attn`` parameters, in order.
FUSED_ATTN_PARAMS = (
    "qkv",
    "bias",
    "sequence_descriptor",
    "seed",
    "attn_bias_type",
    "attn_mask_type",
    "qkv_layout",
    "softmax_type",
    "scaling_factor",
    "dropout_probability",
    "is_training",
    "max_segments_per_seq",
    "window_size",
    "context_parallel_strategy",
    "context_parallel_causal_load_balanced",
    "context_parallel_axis",
    "context_checkpoint_name",
    "softmax_offset",
    "stripe_size",
    "score_mod",
    "score_mod_bprop",
    "score_mod_tensors",
    "score_mod_bprop_tensors",
    "return_max_logit",
)
#: TE 2.20.2 ``is_fused_attn_kernel_available`` parameters (``batch_size`` is second in 2.20.2).
KERNEL_AVAILABLE_PARAMS = (
    "is_training",
    "batch_size",
    "q_dtype",
    "kv_dtype",
    "qkv_layout",
    "attn_bias_type",
    "attn_mask_type",
    "softmax_type",
    "dropout_probability",
    "q_num_heads",
    "kv_num_heads",
    "q_max_seqlen",
    "kv_max_seqlen",
    "head_dim_qk",
    "head_dim_v",
    "window_size",
    "return_max_logit",
    "bottom_right_diagonal",
    "bias_batch",
    "bias_heads",
    "bias_seqlen_q",
    "bias_seqlen_kv",
    "max_segments_per_seq",
)
#: ``MeshResource`` dataclass fields in TE's order (positional use maps by this order).
MESH_RESOURCE_FIELDS = (
    "dp_resource",
    "tp_resource",
    "tpsp_resource",
    "fsdp_resource",
    "pp_resource",
    "cp_resource",
    "ep_resource",
)
REORDER_PARAMS = ("tensor", "strategy", "cp_size", "seq_dim", "stripe_size")
CP_STRATEGY_MEMBERS = ("DEFAULT", "ALL_GATHER", "RING")


@dataclasses.dataclass
class CheckResult:
    name: str
    verdict: str
    detail: str
    metrics: dict = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    def line(self) -> str:
        return f"{self.verdict} {self.name}: {self.detail}"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class _Skip(Exception):
    pass


class _Fail(Exception):
    def __init__(self, detail: str, metrics: dict | None = None):
        super().__init__(detail)
        self.metrics = metrics or {}


# ============================================================================ comparisons


def tolerance(dtype) -> float:
    """TE's test tolerance for ``dtype``: ``rtol = atol = eps**(2/3)`` (bf16 0.0394, fp16 0.0098,
    fp32 2.4e-5)."""
    import jax.numpy as jnp

    eps = float(jnp.finfo(jnp.dtype(dtype)).eps)
    return max(eps, eps ** (2.0 / 3.0))


def compare(actual, expected, tol: float) -> dict:
    """``|a - e| <= tol + tol * |e|`` everywhere (``assert_allclose`` semantics); returns the
    numbers."""
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    if a.shape != e.shape:
        return {
            "ok": False,
            "max_abs_err": math.inf,
            "worst_ratio": math.inf,
            "shape": [list(a.shape), list(e.shape)],
        }
    if not np.all(np.isfinite(a)):
        return {
            "ok": False,
            "max_abs_err": math.inf,
            "worst_ratio": math.inf,
            "nonfinite": int((~np.isfinite(a)).sum()),
        }
    err = np.abs(a - e)
    bound = tol + tol * np.abs(e)
    ratio = float(np.max(err / bound)) if err.size else 0.0
    return {
        "ok": bool(ratio <= 1.0),
        "max_abs_err": float(err.max()) if err.size else 0.0,
        "worst_ratio": ratio,
    }


def _compare_all(pairs: dict[str, tuple], tol: float) -> dict:
    """Compare named (actual, expected) pairs; raise :class:`_Fail` naming the worst offender."""
    metrics, bad = {}, []
    for name, (a, e) in pairs.items():
        m = compare(a, e, tol)
        metrics[name] = {k: v for k, v in m.items() if k != "ok"}
        if not m["ok"]:
            bad.append(f"{name} max|err|={m['max_abs_err']:.3g} ({m['worst_ratio']:.2f}x tol)")
    if bad:
        raise _Fail(f"beyond tol {tol:.3g}: " + "; ".join(bad), metrics)
    return metrics


def _worst(metrics: dict) -> str:
    worst = max(metrics.values(), key=lambda m: m.get("worst_ratio", 0.0))
    return (
        f"max|err| {max(m['max_abs_err'] for m in metrics.values()):.2e}, worst"
        f" {worst['worst_ratio']:.2f}x tol"
    )


def _highest():
    import jax

    return jax.default_matmul_precision("highest")


# ============================================================================ inputs


def _packed(rng, batch, seq, max_segments, align=1):
    from tutorial_utils.inputs import pack_segments, random_segment_lengths

    lengths = random_segment_lengths(rng, batch, seq, max_segments, align=align, min_len=2)
    ids, pos = pack_segments(lengths, seq, align=align)
    return ids, pos


@functools.cache
def _reference_vjp_fn():
    import jax
    import jax.numpy as jnp

    from tutorial_utils.reference import MaskSpec, blockwise_attention, dense_attention

    @functools.partial(jax.jit, static_argnames=("scale", "window", "dense", "block_q", "block_kv"))
    def fwd_bwd(
        q, k, v, dout, ids_q, ids_kv, pos_q, pos_kv, *, scale, window, dense, block_q, block_kv
    ):
        spec = MaskSpec(padding=True, causal=True, window=window)

        def f(qq, kk, vv):
            if dense:
                return dense_attention(
                    qq, kk, vv, ids_q, ids_kv, pos_q, pos_kv, scale=scale, spec=spec
                )[0]
            return blockwise_attention(
                qq,
                kk,
                vv,
                ids_q,
                ids_kv,
                pos_q,
                pos_kv,
                scale=scale,
                spec=spec,
                block_q=block_q,
                block_kv=block_kv,
            )[0]

        f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
        out, vjp = jax.vjp(f, f32(q), f32(k), f32(v))
        return out, vjp(f32(dout))

    return fwd_bwd


def _reference_fwd_bwd(
    q, k, v, dout, ids_q, ids_kv, pos_q, pos_kv, *, scale, window, dense=True, block=128
):
    """Reference out and (dq, dk, dv) for ``vdot(out, dout)`` in fp32 at full matmul precision."""
    window = (-1, 0) if window is None else tuple(int(w) for w in window)
    with _highest():
        return _reference_vjp_fn()(
            q,
            k,
            v,
            dout,
            ids_q,
            ids_kv,
            pos_q,
            pos_kv,
            scale=float(scale),
            window=window,
            dense=bool(dense),
            block_q=min(block, q.shape[1]),
            block_kv=min(block, k.shape[1]),
        )


# ============================================================================ (a) TE vs reference


def _enum(ta, cls, name):
    return getattr(getattr(ta, cls), name)


def _kernel_available(ta, **kw) -> bool:
    """``is_fused_attn_kernel_available`` by keyword; drops the 2.20.2-only keywords on older TE."""
    try:
        return bool(ta.is_fused_attn_kernel_available(**kw))
    except TypeError:
        for key in ("batch_size", "max_segments_per_seq", "return_max_logit"):
            kw.pop(key, None)
        return bool(ta.is_fused_attn_kernel_available(**kw))


def _te_vs_reference(
    ta,
    *,
    layout: str,
    mask: str,
    b,
    s,
    hq,
    hkv,
    d,
    window,
    ids,
    pos,
    seqlens=None,
    seed=0,
    cols=None,
    dense=True,
    block=128,
    check_available=True,
) -> dict:
    """TE ``fused_attn`` forward+backward against the reference at TE's bf16 tolerance.

    ``ids``/``pos`` ``[b, s]`` numpy describe the tokens for the reference (for BSHD they encode
    the valid lengths). ``cols`` restricts the loss (and the reference) to those query columns.
    """
    import jax
    import jax.numpy as jnp

    dtype = jnp.bfloat16
    q, k, v, dout = random_qkv(seed, b, s, hq, hkv, d, dtype)
    thd = layout.startswith("THD")
    max_segments = int(ids.max()) if thd else 1
    if thd:
        desc = ta.SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids), jnp.asarray(pos))
    else:
        lens = jnp.asarray(seqlens if seqlens is not None else np.full((b,), s), jnp.int32)
        desc = ta.SequenceDescriptor.from_seqlens((lens, lens))
    mask_t = _enum(ta, "AttnMaskType", mask)
    layout_t = _enum(ta, "QKVLayout", layout)
    if check_available:
        ok = _kernel_available(
            ta,
            is_training=True,
            batch_size=b,
            q_dtype=dtype,
            kv_dtype=dtype,
            qkv_layout=layout_t,
            attn_bias_type=ta.AttnBiasType.NO_BIAS,
            attn_mask_type=mask_t,
            softmax_type=ta.AttnSoftmaxType.VANILLA_SOFTMAX,
            dropout_probability=0.0,
            q_num_heads=hq,
            kv_num_heads=hkv,
            q_max_seqlen=s,
            kv_max_seqlen=s,
            head_dim_qk=d,
            head_dim_v=d,
            window_size=window,
            max_segments_per_seq=max_segments,
        )
        if not ok:
            raise _Fail(
                f"no fused kernel available for {layout}/{mask}/window={window} on this GPU and"
                " cuDNN (THD needs sm90+, THD GQA/SWA need cuDNN >= 9.6; 9.10.0 and 9.10.1 are"
                " excluded)"
            )
    cols_j = None if cols is None else jnp.asarray(cols)
    dout_used = dout if cols is None else dout[:, cols_j]
    # The loss only sees the ``cols`` rows: dO is zero elsewhere (same gradients as slicing, no
    # gather).
    if cols is None:
        dout_loss = dout
    else:
        row_mask = np.zeros((1, s, 1, 1), bool)
        row_mask[0, np.asarray(cols)] = True
        dout_loss = jnp.where(jnp.asarray(row_mask), dout, jnp.zeros_like(dout))

    def loss(qkv, desc_arg, dout_arg):
        out = ta.fused_attn(
            qkv,
            None,
            desc_arg,
            None,
            attn_bias_type=ta.AttnBiasType.NO_BIAS,
            attn_mask_type=mask_t,
            qkv_layout=layout_t,
            softmax_type=ta.AttnSoftmaxType.VANILLA_SOFTMAX,
            scaling_factor=d**-0.5,
            dropout_probability=0.0,
            is_training=True,
            max_segments_per_seq=max_segments,
            window_size=window,
        )
        return jnp.vdot(out.astype(jnp.float32), dout_arg.astype(jnp.float32)), out

    (_, out_te), grads_te = jax.jit(jax.value_and_grad(loss, has_aux=True))(
        (q, k, v), desc, dout_loss
    )
    jax.block_until_ready((out_te, grads_te))
    if cols_j is not None:
        out_te = out_te[:, cols_j]
    ids_j, pos_j = jnp.asarray(ids), jnp.asarray(pos)
    if cols is None:
        ref_out, ref_grads = _reference_fwd_bwd(
            q,
            k,
            v,
            dout,
            ids_j,
            ids_j,
            pos_j,
            pos_j,
            scale=d**-0.5,
            window=window,
            dense=dense,
            block=block,
        )
        dq_te = grads_te[0]
        off_rows = None
    else:
        ref_out, ref_grads = _reference_fwd_bwd(
            q[:, cols_j],
            k,
            v,
            dout_used,
            ids_j[:, cols_j],
            ids_j,
            pos_j[:, cols_j],
            pos_j,
            scale=d**-0.5,
            window=window,
            dense=dense,
            block=block,
        )
        dq_te = grads_te[0][:, cols_j]
        keep = np.ones(s, bool)
        keep[np.asarray(cols)] = False
        off_rows = np.asarray(grads_te[0], np.float32)[:, keep]
    tol = tolerance(dtype)
    pairs = {
        "out": (out_te, ref_out),
        "dq": (dq_te, ref_grads[0]),
        "dk": (grads_te[1], ref_grads[1]),
        "dv": (grads_te[2], ref_grads[2]),
    }
    metrics = _compare_all(pairs, tol)
    # Padded query rows: output ~0 (TE zero-fills them); the reference is exactly 0 there.
    ids_used = ids if cols is None else ids[:, np.asarray(cols)]
    pad = np.asarray(ids_used) == 0
    pad_max = float(np.abs(np.asarray(out_te, np.float32)[pad]).max()) if pad.any() else 0.0
    metrics["padded_rows"] = {"count": int(pad.sum()), "max_abs_out": pad_max}
    if pad_max > tol:
        raise _Fail(f"padded query rows are not ~0: max|out| = {pad_max:.3g} > {tol:.3g}", metrics)
    if off_rows is not None:
        off = float(np.abs(off_rows).max()) if off_rows.size else 0.0
        metrics["dq_outside_loss_rows"] = off
        if off > tol:
            raise _Fail(f"dq is not ~0 on query rows outside the loss: max {off:.3g}", metrics)
    return metrics


def _te_configs(quick: bool) -> list[dict]:
    """Small TE comparison cases (and the seed shape unless quick)."""
    rng = np.random.default_rng(7)
    from tutorial_utils.inputs import fixed_slot_segments

    ids_slot, pos_slot = fixed_slot_segments(2, 512, 4, 96)
    ids_rand, pos_rand = _packed(rng, 2, 512, 4)
    lens = np.array([200, 256])
    ar = np.arange(256)
    ids_bshd = (ar[None, :] < lens[:, None]).astype(np.int32)
    pos_bshd = np.tile(ar[None, :], (2, 1)).astype(np.int32)
    cfgs = [
        dict(
            name="thd-gqa-causal",
            layout="THD_THD_THD",
            mask="PADDING_CAUSAL_MASK",
            b=2,
            s=512,
            hq=8,
            hkv=2,
            d=64,
            window=None,
            ids=ids_slot,
            pos=pos_slot,
        ),
        dict(
            name="thd-gqa-swa",
            layout="THD_THD_THD",
            mask="PADDING_CAUSAL_MASK",
            b=2,
            s=512,
            hq=8,
            hkv=2,
            d=64,
            window=(48, 0),
            ids=ids_rand,
            pos=pos_rand,
        ),
        dict(
            name="bshd-padding-causal",
            layout="BSHD_BSHD_BSHD",
            mask="PADDING_CAUSAL_MASK",
            b=2,
            s=256,
            hq=4,
            hkv=4,
            d=64,
            window=None,
            ids=ids_bshd,
            pos=pos_bshd,
            seqlens=lens,
        ),
    ]
    if not quick:
        cfgs.append(
            dict(
                name="bshd-causal-gqa",
                layout="BSHD_BSHD_BSHD",
                mask="CAUSAL_MASK",
                b=2,
                s=256,
                hq=8,
                hkv=2,
                d=64,
                window=None,
                ids=np.ones((2, 256), np.int32),
                pos=pos_bshd,
            )
        )
        cfgs.append(dict(name="thd-seed-shape", seed_shape=True))
    return cfgs


def _seed_shape_case(ta, plumbing: bool):
    """TE's 4-GPU example shape on ONE device, loss on a subset of query rows (reference on that
    subset)."""
    from tutorial_utils.perfmodel.workload import get_workload, workload_segments

    wl = get_workload("seed")
    if (
        plumbing
    ):  # same structure, CPU-sized: the plumbing self-test must not allocate the seed shape
        wl = wl.replace(
            seq_len=1024,
            valid_per_slot=192,
            num_q_heads=16,
            num_kv_heads=2,
            head_dim=64,
            window=(128, 0),
            stripe_size=4,
        )
    ids, pos = workload_segments(wl)
    slot, valid, w = wl.slot_len, wl.valid_per_slot, wl.window[0]
    cols = []
    for sidx in range(wl.segments_per_row):
        base = sidx * slot
        n = 64 if not plumbing else 16
        cols += list(range(base, base + n))  # segment start (window not yet full)
        cols += list(
            range(base + min(w, valid - n), base + min(w, valid - n) + n)
        )  # around the window edge
        cols += list(range(base + valid - n, base + valid))  # end of the valid tokens
        cols += list(range(base + valid, base + valid + n // 2))  # padding
    cols = np.array(sorted(set(cols)))
    return (
        _te_vs_reference(
            ta,
            layout="THD_THD_THD",
            mask="PADDING_CAUSAL_MASK",
            b=wl.batch,
            s=wl.seq_len,
            hq=wl.num_q_heads,
            hkv=wl.num_kv_heads,
            d=wl.head_dim,
            window=wl.window,
            ids=ids,
            pos=pos,
            cols=cols,
            dense=False,
            block=512 if not plumbing else 128,
        ),
        wl,
    )


def _te_cp_case(ta, te, strategy: str, devices) -> dict:
    """TE's CP (via the facade, as in TE's tutorial) on all ``devices`` vs the single-device
    reference."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from tutorial_utils.inputs import fixed_slot_segments

    cp = len(devices)
    stripe = 1 if strategy == "ring" else 4
    slot = 16 * cp * 4  # a multiple of cp * stripe, so slots stay aligned (TE's safe layout)
    b, s, hq, hkv, d = 2, 4 * slot, 8, 2, 64
    window = (slot // 2, 0)
    ids, pos = fixed_slot_segments(b, s, 4, 3 * slot // 4)
    q, k, v, dout = random_qkv(11, b, s, hq, hkv, d, jnp.bfloat16)
    mesh = Mesh(np.asarray(devices), ("cp",))
    reorder = lambda x: ta.reorder_causal_load_balancing(
        x,
        strategy=ta.ReorderStrategy.Striped,
        cp_size=cp,
        seq_dim=1,  # noqa: E731
        stripe_size=stripe,
    )
    inverse = lambda x: ta.inverse_reorder_causal_load_balancing(
        x,
        strategy=ta.ReorderStrategy.Striped,
        cp_size=cp,  # noqa: E731
        seq_dim=1,
        stripe_size=stripe,
    )
    x_sh = NamedSharding(mesh, P(None, "cp", None, None))
    qkv = tuple(jax.device_put(reorder(x), x_sh) for x in (q, k, v))
    dout_r = jax.device_put(reorder(dout), x_sh)
    desc = ta.SequenceDescriptor.from_segment_ids_and_pos(
        reorder(jnp.asarray(ids)), reorder(jnp.asarray(pos))
    )
    desc = jax.tree.map(
        lambda x: jax.device_put(x, NamedSharding(mesh, P(None) if x.ndim == 1 else P(None, "cp"))),
        desc,
    )
    strat = ta.CPStrategy.RING if strategy == "ring" else ta.CPStrategy.ALL_GATHER

    def loss(qkv_arg, desc_arg, dout_arg):
        out = ta.fused_attn(
            qkv_arg,
            None,
            desc_arg,
            None,
            attn_bias_type=ta.AttnBiasType.NO_BIAS,
            attn_mask_type=ta.AttnMaskType.PADDING_CAUSAL_MASK,
            qkv_layout=ta.QKVLayout.THD_THD_THD,
            softmax_type=ta.AttnSoftmaxType.VANILLA_SOFTMAX,
            scaling_factor=d**-0.5,
            dropout_probability=0.0,
            is_training=True,
            max_segments_per_seq=4,
            window_size=window,
            context_parallel_strategy=strat,
            context_parallel_causal_load_balanced=True,
            context_parallel_axis="cp",
            stripe_size=stripe,
        )
        return jnp.vdot(out.astype(jnp.float32), dout_arg.astype(jnp.float32)), out

    qkv_sh = tuple(x.sharding for x in qkv)
    desc_sh = jax.tree.map(lambda x: x.sharding, desc)
    fn = jax.jit(
        jax.value_and_grad(loss, has_aux=True),
        in_shardings=(qkv_sh, desc_sh, x_sh),
        out_shardings=((None, x_sh), qkv_sh),
    )
    with jax.set_mesh(mesh), te.autocast(mesh_resource=te.MeshResource(cp_resource="cp")):
        (_, out_r), grads_r = fn(qkv, desc, dout_r)
    out = inverse(out_r)
    grads = tuple(inverse(g) for g in grads_r)
    ids_j, pos_j = jnp.asarray(ids), jnp.asarray(pos)
    ref_out, ref_grads = _reference_fwd_bwd(
        q, k, v, dout, ids_j, ids_j, pos_j, pos_j, scale=d**-0.5, window=window
    )
    metrics = _compare_all(
        {
            "out": (out, ref_out),
            "dq": (grads[0], ref_grads[0]),
            "dk": (grads[1], ref_grads[1]),
            "dv": (grads[2], ref_grads[2]),
        },
        tolerance(jnp.bfloat16),
    )
    metrics["config"] = {
        "cp": cp,
        "stripe": stripe,
        "batch": b,
        "seq": s,
        "heads": [hq, hkv],
        "head_dim": d,
        "window": list(window),
    }
    return metrics


def _te_emulated_case(ta, strategies: Sequence[str], plumbing: bool) -> dict:
    """The ragged sub-problems ``bench --emulate-ranks`` times, through ``fused_attn``, vs per-token
    references."""
    import jax
    import jax.numpy as jnp

    from tutorial_utils.cli.bench import (
        allgather_ragged_calls,
        rank_subproblems,
        ring_ragged_calls,
        te_descriptor,
    )
    from tutorial_utils.inputs import fixed_slot_segments

    cp, b, s, hq, hkv, d = 4, 2, 512, 8, 2, 64
    window = (40, 0)
    ids, pos = fixed_slot_segments(b, s, 4, 96)
    q, k, v, dout = random_qkv(5, b, s, hq, hkv, d, jnp.bfloat16)
    tol = tolerance(jnp.bfloat16)
    metrics = {}

    def loss(qkv, descs, do, meta):
        outs = []
        for desc, (bottom_right, win, max_segments) in zip(descs, meta):
            mask = (
                ta.AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK
                if bottom_right
                else ta.AttnMaskType.PADDING_CAUSAL_MASK
            )
            outs.append(
                ta.fused_attn(
                    qkv,
                    None,
                    desc,
                    None,
                    attn_bias_type=ta.AttnBiasType.NO_BIAS,
                    attn_mask_type=mask,
                    qkv_layout=ta.QKVLayout.THD_THD_THD,
                    softmax_type=ta.AttnSoftmaxType.VANILLA_SOFTMAX,
                    scaling_factor=d**-0.5,
                    dropout_probability=0.0,
                    is_training=True,
                    max_segments_per_seq=max_segments,
                    window_size=win,
                )
            )
        out = sum(o.astype(jnp.float32) for o in outs)  # the calls cover disjoint query rows
        return jnp.vdot(out, do.astype(jnp.float32)), out

    fwd_bwd = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=(3,))
    ids_j, pos_j = jnp.asarray(ids), jnp.asarray(pos)
    for strategy in strategies:
        stripe = 4 if strategy == "allgather" else 1
        subs = rank_subproblems(strategy, s, cp, stripe)
        all_calls = [
            (
                allgather_ragged_calls(ids, pos, sub.q_index, window)
                if strategy == "allgather"
                else ring_ragged_calls(ids, pos, sub.q_index, sub.kv_index, cp, window)
            )
            for sub in subs
        ]
        kmax = max(
            (c.max_segments for calls in all_calls for c in calls), default=1
        )  # one compiled shape for all ranks
        for sub, calls in zip(subs, all_calls):
            if not calls:
                continue
            calls = [c.padded(kmax) for c in calls]
            qi, ki = jnp.asarray(sub.q_index), jnp.asarray(sub.kv_index)
            qq, kk, vv, do = q[:, qi], k[:, ki], v[:, ki], dout[:, qi]
            descs = tuple(te_descriptor(ta, c) for c in calls)
            meta = tuple((c.bottom_right, c.window, c.max_segments) for c in calls)
            (_, out), grads = fwd_bwd((qq, kk, vv), descs, do, meta)
            ref_out, ref_grads = _reference_fwd_bwd(
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
            key = f"{strategy}/rank{sub.rank}" + (f"/step{sub.step}" if strategy == "ring" else "")
            m = _compare_all(
                {
                    "out": (out, ref_out),
                    "dq": (grads[0], ref_grads[0]),
                    "dk": (grads[1], ref_grads[1]),
                    "dv": (grads[2], ref_grads[2]),
                },
                tol,
            )
            metrics[key] = max(x["worst_ratio"] for x in m.values())
    return metrics


# ============================================================================ (b) reference vs orac


def _oracle_case(cfg: dict) -> dict:
    import jax
    import jax.numpy as jnp

    from tutorial_utils.reference import MaskSpec, visibility

    b, s, hq, hkv, d, window = cfg["b"], cfg["s"], cfg["hq"], cfg["hkv"], cfg["d"], cfg["window"]
    ids, pos = jnp.asarray(cfg["ids"]), jnp.asarray(cfg["pos"])
    q, k, v, dout = random_qkv(cfg.get("seed", 3), b, s, hq, hkv, d, jnp.float32)
    scale = d**-0.5
    spec = MaskSpec(padding=True, causal=True, window=(-1, 0) if window is None else window)
    vis = visibility(ids, ids, pos, pos, spec)  # [b, s, s]
    row_ok = jnp.any(vis, axis=-1)  # [b, s]

    def oracle(qq, kk, vv):
        out = jax.nn.dot_product_attention(
            qq, kk, vv, mask=vis[:, None], scale=scale, implementation="xla"
        )
        return jnp.where(row_ok[:, :, None, None], out, 0.0)

    tol = tolerance(jnp.float32)
    with _highest():
        o_out, o_vjp = jax.vjp(jax.jit(oracle), q, k, v)
        o_grads = o_vjp(dout)
    metrics = {}
    for kind in ("dense", "blockwise"):
        out, grads = _reference_fwd_bwd(
            q,
            k,
            v,
            dout,
            ids,
            ids,
            pos,
            pos,
            scale=scale,
            window=window,
            dense=kind == "dense",
            block=32,
        )
        m = _compare_all(
            {
                "out": (out, o_out),
                "dq": (grads[0], o_grads[0]),
                "dk": (grads[1], o_grads[1]),
                "dv": (grads[2], o_grads[2]),
            },
            tol,
        )
        empty = ~np.asarray(row_ok)
        if empty.any() and float(np.abs(np.asarray(out)[empty]).max()) != 0.0:
            raise _Fail(f"{kind}: query rows with no visible key are not exactly 0", m)
        metrics[kind] = m
    return metrics


def _oracle_configs(quick: bool) -> list[dict]:
    from tutorial_utils.inputs import fixed_slot_segments

    rng = np.random.default_rng(3)
    ids_r, pos_r = _packed(rng, 2, 128, 4)
    ids_s, pos_s = fixed_slot_segments(2, 128, 2, 48)
    cfgs = [
        dict(
            name="thd-gqa-swa", b=2, s=128, hq=4, hkv=2, d=16, window=(16, 0), ids=ids_r, pos=pos_r
        ),
        dict(
            name="thd-mha-causal", b=2, s=128, hq=2, hkv=2, d=16, window=None, ids=ids_s, pos=pos_s
        ),
    ]
    if not quick:
        ar = np.arange(96)
        ids_b = (ar[None, :] < np.array([[70], [96]])).astype(np.int32)
        cfgs.append(
            dict(
                name="bshd-padding-gqa",
                b=2,
                s=96,
                hq=8,
                hkv=2,
                d=32,
                window=None,
                ids=ids_b,
                pos=np.tile(ar[None, :], (2, 1)).astype(np.int32),
            )
        )
        cfgs.append(
            dict(
                name="thd-window-0",
                b=1,
                s=64,
                hq=2,
                hkv=1,
                d=8,
                window=(0, 0),
                ids=ids_r[:1, :64],
                pos=pos_r[:1, :64],
            )
        )
    return cfgs


# ============================================================================ (c) CP strategies


def cp_workload_for(n: int):
    """The tiny preset resized so ``cp = n`` fits: slots a multiple of ``n * stripe``, heads
    divisible for Ulysses."""
    from tutorial_utils.perfmodel.workload import get_workload

    base = get_workload("tiny")
    stripe = base.stripe_size
    slot = math.lcm(base.slot_len, n * stripe)
    hkv = math.lcm(base.num_kv_heads, n)
    return base.replace(
        seq_len=slot * base.segments_per_row,
        valid_per_slot=3 * slot // 4,
        window=(slot // 2, 0),
        num_kv_heads=hkv,
        num_q_heads=2 * hkv,
        cp_size=n,
        stripe_size=stripe,
    )


def _single_device(q, k, v, dout, ids, pos, wl):
    import jax.numpy as jnp

    ids_j, pos_j = jnp.asarray(ids), jnp.asarray(pos)
    return _reference_fwd_bwd(
        q,
        k,
        v,
        dout,
        ids_j,
        ids_j,
        pos_j,
        pos_j,
        scale=wl.scaling_factor,
        window=wl.window,
        dense=False,
        block=64,
    )


def _cp_case(strategy: str, devices) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from tutorial_utils.context_parallel import context_parallel_attention
    from tutorial_utils.perfmodel.workload import make_qkv, workload_segments
    from tutorial_utils.reorder import (
        ReorderStrategy,
        inverse_reorder_causal_load_balancing,
        reorder_causal_load_balancing,
    )

    n = len(devices)
    wl = cp_workload_for(n)
    q, k, v, dout = make_qkv(wl, seed=21)
    ids, pos = workload_segments(wl)
    stripe = wl.stripe_for(strategy)
    mesh = Mesh(np.asarray(devices), ("cp",))
    fwd = lambda x: reorder_causal_load_balancing(x, ReorderStrategy.Striped, n, 1, stripe)  # noqa: E731
    inv = lambda x: inverse_reorder_causal_load_balancing(x, ReorderStrategy.Striped, n, 1, stripe)  # noqa: E731
    x_sh = NamedSharding(mesh, P(None, "cp", None, None))
    t_sh = NamedSharding(mesh, P(None, "cp"))
    qkv = tuple(jax.device_put(fwd(x), x_sh) for x in (q, k, v))
    ids_r, pos_r = (
        jax.device_put(fwd(jnp.asarray(ids)), t_sh),
        jax.device_put(fwd(jnp.asarray(pos)), t_sh),
    )
    dout_r = jax.device_put(fwd(dout), x_sh)

    def loss(qkv_arg, ids_arg, pos_arg, dout_arg):
        out = context_parallel_attention(
            *qkv_arg,
            ids_arg,
            pos_arg,
            mesh=mesh,
            axis_name="cp",
            strategy=strategy,
            stripe_size=stripe,
            window_size=wl.window,
            scaling_factor=wl.scaling_factor,
            block_q=64,
            block_kv=64,
        )
        return jnp.vdot(out.astype(jnp.float32), dout_arg.astype(jnp.float32)), out

    with _highest():
        (_, out_r), grads_r = jax.jit(jax.value_and_grad(loss, has_aux=True))(
            qkv, ids_r, pos_r, dout_r
        )
        ref_out, ref_grads = _single_device(q, k, v, dout, ids, pos, wl)
    out, grads = inv(out_r), tuple(inv(g) for g in grads_r)
    metrics = _compare_all(
        {
            "out": (out, ref_out),
            "dq": (grads[0], ref_grads[0]),
            "dk": (grads[1], ref_grads[1]),
            "dv": (grads[2], ref_grads[2]),
        },
        tolerance(wl.dtype),
    )
    metrics["config"] = {
        "cp": n,
        "stripe": stripe,
        "seq": wl.seq_len,
        "heads": [wl.num_q_heads, wl.num_kv_heads],
        "window": list(wl.window),
        "dtype": wl.dtype,
    }
    return metrics


def _cp_emulated_case(strategy: str, ranks: int = 4) -> dict:
    from tutorial_utils.cli.bench import emulate_strategy_reference
    from tutorial_utils.perfmodel.workload import make_qkv, workload_segments

    wl = cp_workload_for(ranks)
    q, k, v, dout = make_qkv(wl, seed=23)
    ids, pos = workload_segments(wl)
    with _highest():
        out, grads = emulate_strategy_reference(
            strategy,
            q,
            k,
            v,
            dout,
            ids,
            pos,
            cp_size=ranks,
            stripe_size=wl.stripe_for(strategy),
            window=wl.window,
            scale=wl.scaling_factor,
            block=64,
        )
        ref_out, ref_grads = _single_device(q, k, v, dout, ids, pos, wl)
    metrics = _compare_all(
        {
            "out": (out, ref_out),
            "dq": (grads[0], ref_grads[0]),
            "dk": (grads[1], ref_grads[1]),
            "dv": (grads[2], ref_grads[2]),
        },
        tolerance(wl.dtype),
    )
    metrics["config"] = {"ranks": ranks, "stripe": wl.stripe_for(strategy), "seq": wl.seq_len}
    return metrics


def _descriptor_case(quick: bool) -> dict:
    from tutorial_utils.cli.bench import (
        allgather_ragged_calls,
        ragged_visibility,
        rank_subproblems,
        ring_ragged_calls,
        subproblem_visibility,
    )
    from tutorial_utils.inputs import fixed_slot_segments

    rng = np.random.default_rng(1)
    layouts = [("slots", *fixed_slot_segments(2, 256, 4, 48)), ("packed", *_packed(rng, 2, 256, 5))]
    checked = 0
    for name, ids, pos in layouts:
        for cp in (2, 4) if quick else (2, 4, 8):
            for left in (-1, 0, 3, 17, 1000):
                window = (left, 0)
                for strategy, stripes in (("allgather", (1, 4)), ("ring", (1,))):
                    for stripe in stripes:
                        for sub in rank_subproblems(strategy, 256, cp, stripe):
                            calls = (
                                allgather_ragged_calls(ids, pos, sub.q_index, window)
                                if strategy == "allgather"
                                else ring_ragged_calls(
                                    ids, pos, sub.q_index, sub.kv_index, cp, window
                                )
                            )
                            got = np.zeros(
                                (ids.shape[0], len(sub.q_index), len(sub.kv_index)), bool
                            )
                            for c in calls:
                                got |= ragged_visibility(c, len(sub.q_index), len(sub.kv_index))
                            want = subproblem_visibility(ids, pos, sub, window)
                            checked += 1
                            if not np.array_equal(got, want):
                                raise _Fail(
                                    f"{name} cp={cp} window={window} {strategy} stripe={stripe} "
                                    f"rank={sub.rank} step={sub.step}:"
                                    f" ragged runs give {int(got.sum())} pairs, per-token mask"
                                    f" {int(want.sum())}"
                                )
    return {"subproblems_checked": checked}


# ============================================================================ (d) facade signatures


def _param_names(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _signature_case() -> dict:
    import dataclasses as _dc

    from tutorial_utils import te
    from tutorial_utils.te import attention as ta

    problems, metrics = [], {}
    expected = {
        "fused_attn": FUSED_ATTN_PARAMS,
        "is_fused_attn_kernel_available": KERNEL_AVAILABLE_PARAMS,
        "reorder_causal_load_balancing": REORDER_PARAMS,
        "inverse_reorder_causal_load_balancing": REORDER_PARAMS,
    }
    for name, want in expected.items():
        got = _param_names(getattr(ta, name))
        metrics[name] = "same" if tuple(got) == tuple(want) else got
        if tuple(got) != tuple(want):
            problems.append(f"{name} parameters {got} != TE 2.20.2 {list(want)}")
    fields = tuple(f.name for f in _dc.fields(te.MeshResource))
    if fields != MESH_RESOURCE_FIELDS:
        problems.append(f"MeshResource fields {fields} != {MESH_RESOURCE_FIELDS}")
    members = tuple(m.name for m in ta.CPStrategy)
    if members != CP_STRATEGY_MEMBERS:
        problems.append(f"CPStrategy members {members} != {CP_STRATEGY_MEMBERS}")
    if te.using_te_code():  # the facade's wrapper must mirror the installed TE exactly
        import transformer_engine.jax.attention as real

        for name in ("fused_attn",):
            real_sig = inspect.signature(getattr(real, name))
            mine = inspect.signature(getattr(ta, name))
            real_view = [(p.name, repr(p.default)) for p in real_sig.parameters.values()]
            mine_view = [(p.name, repr(p.default)) for p in mine.parameters.values()]
            if real_view != mine_view:
                problems.append(
                    f"facade {name} differs from the installed TE: {mine_view} vs {real_view}"
                )
        try:
            from importlib.metadata import version

            metrics["installed_te"] = version("transformer-engine")
        except Exception:  # noqa: BLE001
            metrics["installed_te"] = "unknown"
    if problems:
        raise _Fail("; ".join(problems), metrics)
    return metrics


# ============================================================================ runner


def _run(
    name: str,
    fn: Callable[[], dict],
    detail_fn: Callable[[dict], str],
    out: list[CheckResult],
    echo,
) -> None:
    t0 = time.perf_counter()
    try:
        metrics = fn()
        res = CheckResult(name, "PASS", detail_fn(metrics), metrics)
    except _Skip as skip:
        res = CheckResult(name, "SKIP", str(skip))
    except _Fail as fail:
        res = CheckResult(name, "FAIL", str(fail), fail.metrics)
    except Exception as err:  # noqa: BLE001 - a crashing check is a failing check
        res = CheckResult(
            name,
            "FAIL",
            f"error: {type(err).__name__}: {str(err)[:500]}",
            {"traceback": traceback.format_exc()[-4000:]},
        )
    res.seconds = time.perf_counter() - t0
    out.append(res)
    echo(res.line())


def run_checks(
    *,
    quick: bool = False,
    devices=None,
    te_plumbing: bool = False,
    only: str | None = None,
    echo: Callable[[str], None] = print,
    list_only: bool = False,
) -> list[CheckResult]:
    """Run every check (names containing ``only`` when given) and return their results.

    ``list_only`` runs nothing and returns one SKIP result per check name. Each check prints
    one line ``PASS|FAIL|SKIP <name>: <detail>``; the CLI's ``--out`` stores them with the
    hardware and software facts as JSON, and its exit code is non-zero when any check fails.

    Checks:

    * ``te-*`` (TE's own code: real TE on a GPU node, TE-on-CPU elsewhere, each labelled; SKIP
      under ``TUTORIAL_TE_BACKEND=reference``): TE's ``fused_attn`` against the reference on
      small THD and BSHD configurations and on the seed shape (a subset of query rows),
      outputs and gradients within TE's bf16 tolerance
      (``rtol = atol = eps**(2/3) = 0.039``), padded rows ~0; TE's Ring and AllGather CP on the
      devices present; and the ragged sub-problems that ``bench --emulate-ranks`` times.
      ``--te-plumbing`` runs the same code against the facade's *reference* backend (a self-test
      of the check's own plumbing, not a TE check).
    * ``reference-vs-oracle:*``: the reference (dense and blockwise) against
      ``jax.nn.dot_product_attention(implementation="xla")``, fp32, outputs and gradients.
    * ``cp-*``: every CP strategy on the devices present (``cp = number of devices``) against the
      single-device result; ``cp-emulated-*`` runs a 4-rank split one rank at a time and merges.
      On a machine without a GPU the CLI first gives JAX simulated CPU devices, as the notebooks
      do (``--devices``, default 4), so these checks shard over ``cp > 1``. With one device a
      ``cp-<strategy>`` check is SKIP with the reason: at ``cp = 1`` nothing is sharded and the
      comparison could not fail.
    * ``emulation-descriptors``: the ragged descriptors of the emulated TE sub-problems induce
      exactly the per-token masks (pure numpy).
    * ``facade-signatures``: ``tutorial_utils.te`` has TE 2.20.2's parameter names and order (and,
      with real TE, the installed TE's).
    """
    import jax

    from tutorial_utils import te
    from tutorial_utils.te import attention as ta

    devices = list(jax.devices()) if devices is None else list(devices)
    results: list[CheckResult] = []
    real = te.using_real_te()  # real TE with cuDNN on a GPU
    te_code = te.using_te_code()  # real TE, or TE's JAX code on CPU
    te_mode = te_code or te_plumbing
    if real:
        suffix = ""
    elif te_code:
        suffix = " [TE-on-CPU: TE's JAX code, CPU reference kernel in place of cuDNN]"
    else:
        suffix = " [reference facade: plumbing self-test, not TE]"

    def want(name: str) -> bool:
        return only is None or only in name

    def add(name, fn, detail_fn):
        if list_only:
            results.append(CheckResult(name, "SKIP", "listed"))
        elif want(name):
            _run(name, fn, detail_fn, results, echo)

    def skip(name, why):
        if list_only:
            results.append(CheckResult(name, "SKIP", "listed"))
        elif want(name):
            res = CheckResult(name, "SKIP", why)
            results.append(res)
            echo(res.line())

    # (a) TE vs reference
    for cfg in _te_configs(quick):
        name = f"te-fused-attn:{cfg['name']}"
        if not te_mode:
            skip(name, NOT_ACTIVE)
        elif cfg.get("seed_shape"):

            def seed_fn():
                metrics, wl = _seed_shape_case(ta, plumbing=not real)
                metrics["shape"] = {
                    "batch": wl.batch,
                    "seq": wl.seq_len,
                    "heads": [wl.num_q_heads, wl.num_kv_heads],
                    "head_dim": wl.head_dim,
                    "window": list(wl.window),
                }
                return metrics

            add(
                name,
                seed_fn,
                lambda m: (
                    f"{_worst({k: v for k, v in m.items() if k in ('out', 'dq', 'dk', 'dv')})}, "
                    f"shape {m['shape']['batch']}x{m['shape']['seq']}{suffix}"
                ),
            )
        else:
            params = {k: v for k, v in cfg.items() if k != "name"}
            add(
                name,
                lambda params=params: _te_vs_reference(ta, **params),
                lambda m: (
                    "out/dq/dk/dv"
                    f" {_worst({k: v for k, v in m.items() if k in ('out', 'dq', 'dk', 'dv')})},"
                    f" padded rows max|out| {m['padded_rows']['max_abs_out']:.1e}{suffix}"
                ),
            )
    for strategy in ("allgather", "ring"):
        name = f"te-cp-{strategy}"
        if not te_mode:
            skip(name, NOT_ACTIVE)
        elif len(devices) < 2:
            skip(name, f"needs >= 2 devices, found {len(devices)}")
        else:
            add(
                name,
                lambda s=strategy: _te_cp_case(ta, te, s, devices),
                lambda m: (
                    f"cp={m['config']['cp']} stripe={m['config']['stripe']}: "
                    f"{_worst({k: m[k] for k in ('out', 'dq', 'dk', 'dv') if k in m})}{suffix}"
                ),
            )
    name = "te-emulated-subproblems"
    if not te_mode:
        skip(name, NOT_ACTIVE)
    else:
        strategies = ("allgather", "ring") if te_code else ("ring",)
        note = "" if te_code else " (allgather: overlapping key runs need TE's code)"
        add(
            name,
            lambda: _te_emulated_case(ta, strategies, plumbing=not real),
            lambda m: (
                f"{len(m)} sub-problems, worst {max(m.values()) if m else 0:.2f}x tol{note}{suffix}"
            ),
        )

    # (b) reference vs oracle
    for cfg in _oracle_configs(quick):
        add(
            f"reference-vs-oracle:{cfg['name']}",
            lambda cfg=cfg: _oracle_case(cfg),
            lambda m: "dense " + _worst(m["dense"]) + "; blockwise " + _worst(m["blockwise"]),
        )

    # (c) CP strategies on the devices present, and the per-rank emulation
    from tutorial_utils.validation import check_ulysses_heads

    n = len(devices)
    for strategy in ("allgather", "ring", "ulysses"):
        name = f"cp-{strategy} (cp={n}, {devices[0].platform})"
        if n < 2:
            skip(
                name,
                f"CP needs >= 2 devices, found {n}: at cp=1 nothing is sharded, so the comparison"
                " could not fail. On CPU run `python -m tutorial_utils.cli.check --devices 4`"
                " (simulated devices); on GPUs, expose more of them",
            )
            continue
        wl = cp_workload_for(n)
        try:
            if strategy == "ulysses":
                check_ulysses_heads(wl.num_q_heads, wl.num_kv_heads, n)
        except ValueError as err:
            skip(name, str(err))
            continue
        add(
            name,
            lambda s=strategy: _cp_case(s, devices),
            lambda m: (
                f"{_worst({k: v for k, v in m.items() if k in ('out', 'dq', 'dk', 'dv')})} vs"
                f" single device (seq {m['config']['seq']}, stripe {m['config']['stripe']})"
            ),
        )
    if n == 1 or not quick:
        for strategy in ("allgather", "ring", "ulysses"):
            add(
                f"cp-emulated-{strategy} (4 ranks, one at a time)",
                lambda s=strategy: _cp_emulated_case(s, 4),
                lambda m: (
                    "merged ranks vs single device: "
                    f"{_worst({k: v for k, v in m.items() if k in ('out', 'dq', 'dk', 'dv')})}"
                ),
            )
    add(
        "emulation-descriptors",
        lambda: _descriptor_case(quick),
        lambda m: f"ragged runs == per-token masks on {m['subproblems_checked']} sub-problems",
    )

    # (d) facade signatures
    add(
        "facade-signatures",
        _signature_case,
        lambda m: (
            "fused_attn, is_fused_attn_kernel_available, reorder functions, MeshResource,"
            " CPStrategy match TE 2.20.2"
            + (f" and the installed TE {m['installed_te']}" if "installed_te" in m else "")
        ),
    )
    return results


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tutorial_utils.cli.check",
        description=(
            "Check real TE (when active), the reference and every CP strategy on the devices "
            "present. Prints PASS|FAIL|SKIP lines; exit code 1 if any check fails."
        ),
    )
    p.add_argument(
        "--out",
        default=None,
        help="write the JSON report here (e.g. results/checks/gpu-check.json)",
    )
    p.add_argument(
        "--quick", action="store_true", help="fewer configurations; no seed-shape TE check"
    )
    p.add_argument(
        "--te-plumbing",
        action="store_true",
        help=(
            "without real TE, run the te-* checks against the facade's reference backend (self-test"
            " only)"
        ),
    )
    p.add_argument(
        "--only", default=None, metavar="TEXT", help="run only checks whose name contains TEXT"
    )
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument(
        "--devices",
        type=positive_int,
        default=None,
        metavar="N",
        help=(
            "without a GPU: N simulated CPU devices, set before JAX starts (default"
            f" {DEFAULT_CPU_DEVICES}, as the notebooks; an XLA_FLAGS device count already set is"
            " kept unless --devices is given; 1 = no CP: the cp-* checks SKIP)"
        ),
    )
    return p


DEFAULT_CPU_DEVICES = 4
_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def simulate_cpu_devices(requested: int | None) -> int | None:
    """Before JAX starts its backend, give it simulated CPU devices as the notebooks do; return the
    count set.

    No GPU: ``requested`` devices (replacing an inherited count), else an inherited
    ``XLA_FLAGS`` count is kept, else :data:`DEFAULT_CPU_DEVICES`. With a GPU nothing changes.
    """
    import os

    from tutorial_utils.pages.runtime import gpu_present, setup_devices

    if gpu_present():
        return None
    flags = os.environ.get("XLA_FLAGS", "")
    if requested is None and _DEVICE_COUNT_FLAG in flags:
        return None
    os.environ["XLA_FLAGS"] = " ".join(
        f for f in flags.split() if not f.startswith(_DEVICE_COUNT_FLAG)
    )
    count = requested or DEFAULT_CPU_DEVICES
    setup_devices(count)
    return count


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.out:
        from tutorial_utils.cli.argtypes import output_file

        try:  # before the checks run, so that their results are never lost
            output_file("--out", args.out, force=args.force)
        except ValueError as err:
            parser.error(str(err))
    try:
        simulate_cpu_devices(args.devices)
    except RuntimeError as err:  # JAX already started with fewer devices (main() called in-process)
        parser.error(f"argument --devices: {err}")
    import jax

    from tutorial_utils import te
    from tutorial_utils.cli.bench import _gpu_versions
    from tutorial_utils.pages.runtime import backend_line, environment_record

    def echo(line: str) -> None:
        print(line, flush=True)

    print("\n".join(f"# {line}" for line in backend_line().splitlines()), flush=True)
    t0 = time.perf_counter()
    results = run_checks(quick=args.quick, te_plumbing=args.te_plumbing, only=args.only, echo=echo)
    if args.only is not None and not results:
        names = [
            r.name
            for r in run_checks(quick=args.quick, te_plumbing=args.te_plumbing, list_only=True)
        ]
        parser.error(
            f"argument --only: {args.only!r} matches no check; names are: {', '.join(names)}"
        )
    summary = {v: sum(r.verdict == v for r in results) for v in VERDICTS}
    env = environment_record()
    env.update(_gpu_versions())
    report = {
        "schema": "cp-check/1",
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "ok": summary["FAIL"] == 0,
        "summary": summary,
        "te_backend": te.backend_name(),
        "real_te": te.using_real_te(),
        "te_backend_kind": te.backend_kind(),
        "devices": [str(d) for d in jax.devices()],
        "options": {
            "quick": args.quick,
            "te_plumbing": args.te_plumbing,
            "only": args.only,
            "devices": args.devices,
        },
        "environment": env,
        "seconds": time.perf_counter() - t0,
        "checks": [r.as_dict() for r in results],
    }
    tail = (
        f"check: {summary['PASS']} PASS, {summary['FAIL']} FAIL, {summary['SKIP']} SKIP in"
        f" {report['seconds']:.1f} s"
    )
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
        tail += f"; report: {path}"
    print(tail, flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
