"""``check``'s CP comparisons: each strategy, sharded or split rank by rank, against one device.

* TE's AllGather and Ring CP (through the facade, as in TE's tutorial) on the devices present.
* The ragged sub-problems ``bench --emulate-ranks`` times, each through TE's ``fused_attn``.
* The tutorial's AllGather, Ring and Ulysses on the devices present, and the same strategies
  split into 4 ranks computed one at a time and merged.
* The emulation's ragged descriptors against the per-token masks they stand for (pure NumPy).

The truth is the fp32 reference on one device, at the tolerance of the inputs' dtype. Imports
TE's facade at its top, so it is imported only once ``check`` has set up its devices
(``check.py`` imports it through ``check_suite``).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tutorial_utils import te
from tutorial_utils.cli import bench
from tutorial_utils.cli.attention_compare import (
    cp_attention_loss,
    cp_mesh,
    cp_workload_for,
    highest_precision,
    reference_fwd_bwd,
    self_attention_reference,
    te_attention_loss,
    te_cp_options,
    tolerance,
)
from tutorial_utils.cli.check_one_device import packed_segments
from tutorial_utils.cli.check_report import CheckFailed, compare_outputs
from tutorial_utils.inputs import fixed_slot_segments, random_qkv
from tutorial_utils.perfmodel.workload import make_qkv, workload_segments
from tutorial_utils.reorder import (
    ReorderStrategy,
    inverse_reorder_causal_load_balancing,
    reorder_causal_load_balancing,
)
from tutorial_utils.te import attention
from tutorial_utils.te.fused_call import call_fused_attn

__all__ = ["te_cp_case", "te_emulated_case", "cp_case", "cp_emulated_case", "descriptor_case"]


def te_cp_case(strategy: str, devices: Sequence) -> dict:
    """TE's CP (through the facade, as in TE's tutorial) on ``devices`` against one device.

    Args:
        strategy: ``"allgather"`` or ``"ring"``.
        devices: The devices of the CP group (``cp = len(devices)``).

    Returns:
        The numbers of ``out``/``dq``/``dk``/``dv`` and the ``config``.

    Raises:
        CheckFailed: A tensor beyond TE's bf16 tolerance.
    """
    cp = len(devices)
    stripe = 1 if strategy == "ring" else 4
    slot = 16 * cp * 4  # a multiple of cp * stripe, so slots stay aligned (TE's safe layout)
    b, s, hq, hkv, d = 2, 4 * slot, 8, 2, 64
    window = (slot // 2, 0)
    ids, pos = fixed_slot_segments(b, s, 4, 3 * slot // 4)
    q, k, v, dout = random_qkv(11, b, s, hq, hkv, d, jnp.bfloat16)
    mesh, x_sh, _ = cp_mesh(devices)
    striped = dict(
        strategy=attention.ReorderStrategy.Striped, cp_size=cp, seq_dim=1, stripe_size=stripe
    )
    qkv = tuple(
        jax.device_put(attention.reorder_causal_load_balancing(x, **striped), x_sh)
        for x in (q, k, v)
    )
    dout_r = jax.device_put(attention.reorder_causal_load_balancing(dout, **striped), x_sh)
    desc = attention.SequenceDescriptor.from_segment_ids_and_pos(
        attention.reorder_causal_load_balancing(jnp.asarray(ids), **striped),
        attention.reorder_causal_load_balancing(jnp.asarray(pos), **striped),
    )
    desc = jax.tree.map(
        lambda x: jax.device_put(x, NamedSharding(mesh, P(None) if x.ndim == 1 else P(None, "cp"))),
        desc,
    )
    loss = te_attention_loss(
        attention,
        scaling_factor=d**-0.5,
        max_segments_per_seq=4,
        window_size=window,
        **te_cp_options(attention, strategy, stripe),
    )
    qkv_sh = tuple(x.sharding for x in qkv)
    desc_sh = jax.tree.map(lambda x: x.sharding, desc)
    fn = jax.jit(
        jax.value_and_grad(loss, has_aux=True),
        in_shardings=(qkv_sh, desc_sh, x_sh),
        out_shardings=((None, x_sh), qkv_sh),
    )
    with jax.set_mesh(mesh), te.autocast(mesh_resource=te.MeshResource(cp_resource="cp")):
        (_, out_r), grads_r = fn(qkv, desc, dout_r)
    out, *grads = (
        attention.inverse_reorder_causal_load_balancing(x, **striped) for x in (out_r, *grads_r)
    )
    ref_out, ref_grads = self_attention_reference(
        q, k, v, dout, ids, pos, scale=d**-0.5, window=window
    )
    metrics = compare_outputs(out, grads, ref_out, ref_grads, tolerance(jnp.bfloat16))
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


def _ragged_loss(qkv, descs, do, meta, scale):
    """``vdot(out, do)`` of ragged THD calls on ``qkv`` (``meta``: each call's
    ``(bottom_right, window, max_segments)``), and ``out``, their sum: they cover disjoint
    query rows."""
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
                scaling_factor=scale,
                max_segments_per_seq=max_segments,
                window_size=win,
                attn_mask_type=mask,
            )
        )
    out = sum(o.astype(jnp.float32) for o in outs)
    return jnp.vdot(out, do.astype(jnp.float32)), out


#: ``((loss, out), (dq, dk, dv))`` of :func:`_ragged_loss`, ``meta`` and ``scale`` static
ragged_fwd_bwd = jax.jit(jax.value_and_grad(_ragged_loss, has_aux=True), static_argnums=(3, 4))


def te_emulated_case(strategies: Sequence[str]) -> dict:
    """The ragged sub-problems ``bench --emulate-ranks`` times, through ``fused_attn``.

    Args:
        strategies: ``"allgather"`` and/or ``"ring"``.

    Returns:
        ``{"<strategy>/rank<r>[/step<i>]": worst error / tolerance}`` per sub-problem.

    Raises:
        CheckFailed: A sub-problem beyond TE's bf16 tolerance against its per-token reference.
    """
    cp, b, s, hq, hkv, d = 4, 2, 512, 8, 2, 64
    window = (40, 0)
    ids, pos = fixed_slot_segments(b, s, 4, 96)
    q, k, v, dout = random_qkv(5, b, s, hq, hkv, d, jnp.bfloat16)
    tol = tolerance(jnp.bfloat16)
    metrics = {}
    ids_j, pos_j = jnp.asarray(ids), jnp.asarray(pos)
    for strategy in strategies:
        stripe = 4 if strategy == "allgather" else 1
        subs = bench.rank_subproblems(strategy, s, cp, stripe)
        all_calls = [_ragged_calls(strategy, ids, pos, sub, cp, window) for sub in subs]
        kmax = max(
            (c.max_segments for calls in all_calls for c in calls), default=1
        )  # one compiled shape for all ranks
        for sub, calls in zip(subs, all_calls):
            if not calls:
                continue
            calls = [c.padded(kmax) for c in calls]
            qi, ki = jnp.asarray(sub.q_index), jnp.asarray(sub.kv_index)
            qq, kk, vv, do = q[:, qi], k[:, ki], v[:, ki], dout[:, qi]
            descs = tuple(bench.te_descriptor(attention, c) for c in calls)
            meta = tuple((c.bottom_right, c.window, c.max_segments) for c in calls)
            (_, out), grads = ragged_fwd_bwd((qq, kk, vv), descs, do, meta, d**-0.5)
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
            key = f"{strategy}/rank{sub.rank}" + (f"/step{sub.step}" if strategy == "ring" else "")
            m = compare_outputs(out, grads, ref_out, ref_grads, tol)
            metrics[key] = max(x["worst_ratio"] for x in m.values())
    return metrics


def _ragged_calls(strategy: str, ids, pos, sub, cp: int, window):
    """The ragged calls of one emulated sub-problem (``bench``'s, looked up at each call)."""
    if strategy == "allgather":
        return bench.allgather_ragged_calls(ids, pos, sub.q_index, window)
    return bench.ring_ragged_calls(ids, pos, sub.q_index, sub.kv_index, cp, window)


def _single_device(q, k, v, dout, ids, pos, wl):
    """The fp32 blockwise reference of ``wl``'s inputs on one device."""
    return self_attention_reference(
        q,
        k,
        v,
        dout,
        ids,
        pos,
        scale=wl.scaling_factor,
        window=wl.window,
        dense=False,
        block=64,
    )


def cp_case(strategy: str, devices: Sequence) -> dict:
    """The tutorial's CP ``strategy`` on ``devices`` against one device.

    Args:
        strategy: ``"allgather"``, ``"ring"`` or ``"ulysses"``.
        devices: The devices of the CP group (``cp = len(devices)``).

    Returns:
        The numbers of ``out``/``dq``/``dk``/``dv`` and the ``config``.

    Raises:
        CheckFailed: A tensor beyond the tolerance of the workload's dtype.
    """
    n = len(devices)
    wl = cp_workload_for(n)
    q, k, v, dout = make_qkv(wl, seed=21)
    ids, pos = workload_segments(wl)
    stripe = wl.stripe_for(strategy)
    mesh, x_sh, t_sh = cp_mesh(devices)
    fwd = lambda x: reorder_causal_load_balancing(x, ReorderStrategy.Striped, n, 1, stripe)  # noqa: E731
    inv = lambda x: inverse_reorder_causal_load_balancing(x, ReorderStrategy.Striped, n, 1, stripe)  # noqa: E731
    qkv = tuple(jax.device_put(fwd(x), x_sh) for x in (q, k, v))
    ids_r, pos_r = (
        jax.device_put(fwd(jnp.asarray(ids)), t_sh),
        jax.device_put(fwd(jnp.asarray(pos)), t_sh),
    )
    dout_r = jax.device_put(fwd(dout), x_sh)
    loss = cp_attention_loss(mesh, wl, strategy=strategy, stripe_size=stripe)
    with highest_precision():
        (_, out_r), grads_r = jax.jit(jax.value_and_grad(loss, has_aux=True))(
            qkv, ids_r, pos_r, dout_r
        )
        ref_out, ref_grads = _single_device(q, k, v, dout, ids, pos, wl)
    out, grads = inv(out_r), tuple(inv(g) for g in grads_r)
    metrics = compare_outputs(out, grads, ref_out, ref_grads, tolerance(wl.dtype))
    metrics["config"] = {
        "cp": n,
        "stripe": stripe,
        "seq": wl.seq_len,
        "heads": [wl.num_q_heads, wl.num_kv_heads],
        "window": list(wl.window),
        "dtype": wl.dtype,
    }
    return metrics


def cp_emulated_case(strategy: str, ranks: int = 4) -> dict:
    """``strategy`` split into ``ranks`` ranks computed one at a time, merged, against one device.

    Args:
        strategy: ``"allgather"``, ``"ring"`` or ``"ulysses"``.
        ranks: How many ranks to emulate.

    Returns:
        The numbers of ``out``/``dq``/``dk``/``dv`` and the ``config``.

    Raises:
        CheckFailed: A tensor beyond the tolerance of the workload's dtype.
    """
    wl = cp_workload_for(ranks)
    q, k, v, dout = make_qkv(wl, seed=23)
    ids, pos = workload_segments(wl)
    with highest_precision():
        out, grads = bench.emulate_strategy_reference(
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
    metrics = compare_outputs(out, grads, ref_out, ref_grads, tolerance(wl.dtype))
    metrics["config"] = {"ranks": ranks, "stripe": wl.stripe_for(strategy), "seq": wl.seq_len}
    return metrics


def descriptor_case(quick: bool) -> dict:
    """The emulation's ragged descriptors induce exactly the per-token masks (pure NumPy).

    Args:
        quick: CP sizes 2 and 4 only (else also 8).

    Returns:
        ``{"subproblems_checked": n}``.

    Raises:
        CheckFailed: A sub-problem whose ragged runs see other (query, key) pairs than its mask.
    """
    rng = np.random.default_rng(1)
    layouts = [
        ("slots", *fixed_slot_segments(2, 256, 4, 48)),
        ("packed", *packed_segments(rng, 2, 256, 5)),
    ]
    checked = 0
    for name, ids, pos in layouts:
        for cp in (2, 4) if quick else (2, 4, 8):
            for left in (-1, 0, 3, 17, 1000):
                window = (left, 0)
                for strategy, stripes in (("allgather", (1, 4)), ("ring", (1,))):
                    for stripe in stripes:
                        for sub in bench.rank_subproblems(strategy, 256, cp, stripe):
                            calls = _ragged_calls(strategy, ids, pos, sub, cp, window)
                            shape = (ids.shape[0], len(sub.q_index), len(sub.kv_index))
                            got = np.zeros(shape, bool)
                            for c in calls:
                                got |= bench.ragged_visibility(c, *shape[1:])
                            want = bench.subproblem_visibility(ids, pos, sub, window)
                            checked += 1
                            if not np.array_equal(got, want):
                                raise CheckFailed(
                                    f"{name} cp={cp} window={window} {strategy} stripe={stripe} "
                                    f"rank={sub.rank} step={sub.step}:"
                                    f" ragged runs give {int(got.sum())} pairs, per-token mask"
                                    f" {int(want.sum())}"
                                )
    return {"subproblems_checked": checked}
