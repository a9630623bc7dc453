"""``check``'s one-device comparisons: TE's ``fused_attn`` and the reference, each against a truth.

* TE (through the facade ``tutorial_utils.te``: real TE, TE's code on CPU, or the reference
  backend as a plumbing self-test) against the fp32 reference, forward and backward, on small
  THD and BSHD configurations and on the seed shape (a subset of its query rows), at TE's bf16
  tolerance, padded query rows ~0.
* The reference (dense and blockwise) against ``jax.nn.dot_product_attention`` (XLA), fp32.

Imports TE's facade at its top, so it is imported only once ``check`` has set up its devices
(``check.py`` imports it through ``check_suite``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tutorial_utils.cli.attention_compare import (
    highest_precision,
    reference_fwd_bwd,
    te_attention_loss,
    tolerance,
)
from tutorial_utils.cli.check_report import CheckFailed, compare_outputs
from tutorial_utils.inputs import (
    fixed_slot_segments,
    pack_segments,
    random_qkv,
    random_segment_lengths,
)
from tutorial_utils.perfmodel.workload import get_workload, workload_segments
from tutorial_utils.reference import MaskSpec, visibility
from tutorial_utils.te import attention

__all__ = [
    "packed_segments",
    "te_vs_reference",
    "te_configs",
    "seed_shape_case",
    "oracle_case",
    "oracle_configs",
]


def packed_segments(rng, batch, seq, max_segments, align=1):
    """Random packed documents: ``(ids, pos)``, each ``[batch, seq]``.

    Args:
        rng: A NumPy random generator.
        batch: Rows.
        seq: Tokens per row.
        max_segments: The most documents a row holds.
        align: Each document's length is a multiple of this.

    Returns:
        Segment ids (0 = padding) and positions within each document.
    """
    lengths = random_segment_lengths(rng, batch, seq, max_segments, align=align, min_len=2)
    return pack_segments(lengths, seq, align=align)


def _kernel_available(**kw) -> bool:
    """``is_fused_attn_kernel_available`` by keyword; drops the 2.20.2-only keywords on older TE."""
    try:
        return bool(attention.is_fused_attn_kernel_available(**kw))
    except TypeError:
        for key in ("batch_size", "max_segments_per_seq", "return_max_logit"):
            kw.pop(key, None)
        return bool(attention.is_fused_attn_kernel_available(**kw))


def _require_kernel(*, layout_t, mask_t, b, s, hq, hkv, d, window, max_segments, dtype, names):
    ok = _kernel_available(
        is_training=True,
        batch_size=b,
        q_dtype=dtype,
        kv_dtype=dtype,
        qkv_layout=layout_t,
        attn_bias_type=attention.AttnBiasType.NO_BIAS,
        attn_mask_type=mask_t,
        softmax_type=attention.AttnSoftmaxType.VANILLA_SOFTMAX,
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
        raise CheckFailed(
            f"no fused kernel available for {names}/window={window} on this GPU and"
            " cuDNN (THD needs sm90+, THD GQA/SWA need cuDNN >= 9.6; 9.10.0 and 9.10.1 are"
            " excluded)"
        )


def te_vs_reference(
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
    """TE's ``fused_attn`` forward and backward against the reference at TE's bf16 tolerance.

    Args:
        layout: TE's ``QKVLayout`` member name (``THD_THD_THD`` or ``BSHD_BSHD_BSHD``).
        mask: TE's ``AttnMaskType`` member name.
        b, s, hq, hkv, d: Batch, sequence, query heads, key/value heads, head dimension.
        window: TE's ``(left, right)`` window, or ``None``.
        ids, pos: ``[b, s]`` NumPy segment ids and positions for the reference (for BSHD they
            encode the valid lengths).
        seqlens: BSHD's per-row valid lengths (default: all ``s``).
        seed: The inputs' random seed.
        cols: Restrict the loss (and the reference) to these query rows.
        dense: The dense reference (else blockwise).
        block: The blockwise reference's block size.
        check_available: Ask TE first whether a fused kernel exists for the configuration.

    Returns:
        The numbers of ``out``/``dq``/``dk``/``dv``, ``padded_rows`` and, with ``cols``,
        ``dq_outside_loss_rows``.

    Raises:
        CheckFailed: No kernel, a tensor beyond tolerance, padded rows not ~0, or ``dq`` not ~0
            on rows outside the loss.
    """
    dtype = jnp.bfloat16
    q, k, v, dout = random_qkv(seed, b, s, hq, hkv, d, dtype)
    thd = layout.startswith("THD")
    max_segments = int(ids.max()) if thd else 1
    if thd:
        desc = attention.SequenceDescriptor.from_segment_ids_and_pos(
            jnp.asarray(ids), jnp.asarray(pos)
        )
    else:
        lens = jnp.asarray(seqlens if seqlens is not None else np.full((b,), s), jnp.int32)
        desc = attention.SequenceDescriptor.from_seqlens((lens, lens))
    mask_t = getattr(attention.AttnMaskType, mask)
    layout_t = getattr(attention.QKVLayout, layout)
    if check_available:
        _require_kernel(
            layout_t=layout_t,
            mask_t=mask_t,
            b=b,
            s=s,
            hq=hq,
            hkv=hkv,
            d=d,
            window=window,
            max_segments=max_segments,
            dtype=dtype,
            names=f"{layout}/{mask}",
        )
    cols_j = None if cols is None else jnp.asarray(cols)
    rows = slice(None) if cols is None else cols_j  # the query rows the loss sees
    # The loss only sees the ``cols`` rows: dO is zero elsewhere (same gradients as slicing, no
    # gather).
    if cols is None:
        dout_loss = dout
    else:
        row_mask = np.zeros((1, s, 1, 1), bool)
        row_mask[0, np.asarray(cols)] = True
        dout_loss = jnp.where(jnp.asarray(row_mask), dout, jnp.zeros_like(dout))
    loss = te_attention_loss(
        attention,
        scaling_factor=d**-0.5,
        max_segments_per_seq=max_segments,
        window_size=window,
        attn_mask_type=mask_t,
        qkv_layout=layout_t,
    )
    (_, out_te), grads_te = jax.jit(jax.value_and_grad(loss, has_aux=True))(
        (q, k, v), desc, dout_loss
    )
    jax.block_until_ready((out_te, grads_te))
    if cols_j is not None:
        out_te = out_te[:, cols_j]
    ids_j, pos_j = jnp.asarray(ids), jnp.asarray(pos)
    ref_out, ref_grads = reference_fwd_bwd(
        q[:, rows],
        k,
        v,
        dout[:, rows],
        ids_j[:, rows],
        ids_j,
        pos_j[:, rows],
        pos_j,
        scale=d**-0.5,
        window=window,
        dense=dense,
        block=block,
    )
    if cols is None:
        dq_te = grads_te[0]
        off_rows = None
    else:
        dq_te = grads_te[0][:, cols_j]
        keep = np.ones(s, bool)
        keep[np.asarray(cols)] = False
        off_rows = np.asarray(grads_te[0], np.float32)[:, keep]
    tol = tolerance(dtype)
    metrics = compare_outputs(out_te, (dq_te, *grads_te[1:]), ref_out, ref_grads, tol)
    # Padded query rows: output ~0 (TE zero-fills them); the reference is exactly 0 there.
    ids_used = ids if cols is None else ids[:, np.asarray(cols)]
    pad = np.asarray(ids_used) == 0
    pad_max = float(np.abs(np.asarray(out_te, np.float32)[pad]).max()) if pad.any() else 0.0
    metrics["padded_rows"] = {"count": int(pad.sum()), "max_abs_out": pad_max}
    if pad_max > tol:
        raise CheckFailed(
            f"padded query rows are not ~0: max|out| = {pad_max:.3g} > {tol:.3g}", metrics
        )
    if off_rows is not None:
        off = float(np.abs(off_rows).max()) if off_rows.size else 0.0
        metrics["dq_outside_loss_rows"] = off
        if off > tol:
            raise CheckFailed(
                f"dq is not ~0 on query rows outside the loss: max {off:.3g}", metrics
            )
    return metrics


def te_configs(quick: bool) -> list[dict]:
    """The TE comparison cases: small THD and BSHD ones, and the seed shape unless ``quick``.

    Args:
        quick: Fewer cases, no seed shape.

    Returns:
        One dict per case: ``name`` and :func:`te_vs_reference`'s keywords, or ``seed_shape``.
    """
    rng = np.random.default_rng(7)
    ids_slot, pos_slot = fixed_slot_segments(2, 512, 4, 96)
    ids_rand, pos_rand = packed_segments(rng, 2, 512, 4)
    lens = np.array([200, 256])
    ar = np.arange(256)
    ids_bshd = (ar[None, :] < lens[:, None]).astype(np.int32)
    pos_bshd = np.tile(ar[None, :], (2, 1)).astype(np.int32)
    thd = dict(layout="THD_THD_THD", mask="PADDING_CAUSAL_MASK", b=2, s=512, hq=8, hkv=2, d=64)
    bshd = dict(layout="BSHD_BSHD_BSHD", b=2, s=256, d=64, window=None, pos=pos_bshd)
    cfgs = [
        dict(name="thd-gqa-causal", **thd, window=None, ids=ids_slot, pos=pos_slot),
        dict(name="thd-gqa-swa", **thd, window=(48, 0), ids=ids_rand, pos=pos_rand),
        dict(
            name="bshd-padding-causal",
            **bshd,
            mask="PADDING_CAUSAL_MASK",
            hq=4,
            hkv=4,
            ids=ids_bshd,
            seqlens=lens,
        ),
    ]
    if not quick:
        cfgs.append(
            dict(
                name="bshd-causal-gqa",
                **bshd,
                mask="CAUSAL_MASK",
                hq=8,
                hkv=2,
                ids=np.ones((2, 256), np.int32),
            )
        )
        cfgs.append(dict(name="thd-seed-shape", seed_shape=True))
    return cfgs


def seed_shape_case(plumbing: bool):
    """TE's 4-GPU example shape on ONE device, the loss on a subset of query rows.

    Args:
        plumbing: The facade's reference backend runs: a CPU-sized shape of the same structure
            (the plumbing self-test must not allocate the seed shape).

    Returns:
        ``(metrics, workload)``: :func:`te_vs_reference`'s numbers on the rows at each segment's
        start, around the window's edge, at the end of its valid tokens and in its padding.
    """
    wl = get_workload("seed")
    if plumbing:
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
    n = 64 if not plumbing else 16
    cols = []
    for sidx in range(wl.segments_per_row):
        base = sidx * slot
        edge = base + min(w, valid - n)
        cols += list(range(base, base + n))  # segment start (window not yet full)
        cols += list(range(edge, edge + n))  # around the window edge
        cols += list(range(base + valid - n, base + valid))  # end of the valid tokens
        cols += list(range(base + valid, base + valid + n // 2))  # padding
    cols = np.array(sorted(set(cols)))
    metrics = te_vs_reference(
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
    )
    return metrics, wl


def oracle_case(cfg: dict) -> dict:
    """The reference, dense and blockwise, against ``jax.nn.dot_product_attention`` (XLA), fp32.

    Args:
        cfg: One of :func:`oracle_configs`'s cases.

    Returns:
        ``{"dense": numbers, "blockwise": numbers}`` of ``out``/``dq``/``dk``/``dv``.

    Raises:
        CheckFailed: A tensor beyond fp32's tolerance, or a query row that sees no key not
            exactly 0.
    """
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
    with highest_precision():
        o_out, o_vjp = jax.vjp(jax.jit(oracle), q, k, v)
        o_grads = o_vjp(dout)
    metrics = {}
    for kind in ("dense", "blockwise"):
        out, grads = reference_fwd_bwd(
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
        m = compare_outputs(out, grads, o_out, o_grads, tol)
        empty = ~np.asarray(row_ok)
        if empty.any() and float(np.abs(np.asarray(out)[empty]).max()) != 0.0:
            raise CheckFailed(f"{kind}: query rows with no visible key are not exactly 0", m)
        metrics[kind] = m
    return metrics


def oracle_configs(quick: bool) -> list[dict]:
    """The reference-vs-oracle cases: packed THD with and without a window, BSHD, window 0.

    Args:
        quick: Only the two THD cases.

    Returns:
        One dict per case, for :func:`oracle_case`.
    """
    rng = np.random.default_rng(3)
    ids_r, pos_r = packed_segments(rng, 2, 128, 4)
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
