"""The functions ``python -m tutorial_utils.cli.bench`` times, and their timing.

Each case is timed the way TE's CP tutorial does: ``jax.jit(jax.value_and_grad(loss))`` of the
loss ``vdot(out, dout)`` with explicit shardings, warm-up, compile excluded, every call wrapped
in ``block_until_ready`` (:func:`tutorial_utils.perfmodel.timing.time_fn`). Three kinds:

* :func:`time_single`: TE's THD ``fused_attn`` on one device;
* :func:`time_cp`: a real CP run over ``cp`` devices (Ring and AllGather through TE's own CP
  arguments, Ulysses through :func:`tutorial_utils.context_parallel.context_parallel_attention`);
* :func:`time_emulated`: each rank's sub-problem one at a time on one device
  (:mod:`tutorial_utils.cli.bench_subproblems`), with the reference kernel or with TE's ragged
  THD calls.

TE's attention goes through the ``tutorial_utils.te`` facade (real TE on a GPU, TE's code on
CPU, else the reference), which the CLI imports only after it has set up the devices.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tutorial_utils import rules, te
from tutorial_utils.cli.bench_cases import Case
from tutorial_utils.cli.bench_emulation import (
    REFERENCE_KERNEL_XLA_OPTIONS,
    block_size,
    take_tokens,
    te_descriptor,
)
from tutorial_utils.cli.bench_subproblems import (
    allgather_ragged_calls,
    rank_subproblems,
    ring_ragged_calls,
)
from tutorial_utils.context_parallel import context_parallel_attention
from tutorial_utils.perfmodel.timing import time_fn
from tutorial_utils.reference import MaskSpec, blockwise_attention
from tutorial_utils.te import attention
from tutorial_utils.te.fused_call import call_fused_attn

__all__ = ["thd_fused_attn", "time_single", "time_cp", "emulated_step", "time_emulated"]


def thd_fused_attn(
    q, k, v, sequence_descriptor, *, wl, window, max_segments, mask=None, cp_options=None
):
    """The facade's THD ``fused_attn`` on ``(q, k, v)`` (padding-causal unless ``mask``).

    Args:
        q: Queries, ``[batch, seq, q_heads, head_dim]``.
        k: Keys.
        v: Values.
        sequence_descriptor: TE's ``SequenceDescriptor``.
        wl: The workload (its ``scaling_factor``).
        window: The window, as :func:`tutorial_utils.rules.te_window_size` takes it.
        max_segments: TE's ``max_segments_per_seq``.
        mask: TE's ``AttnMaskType``, default ``PADDING_CAUSAL_MASK``.
        cp_options: TE's ``context_parallel_*`` keywords and ``stripe_size``, if any.

    Returns:
        The attention output, shaped like ``q``.
    """
    options = dict(cp_options or {})
    if mask is not None:
        options["attn_mask_type"] = mask
    return call_fused_attn(
        attention,
        (q, k, v),
        sequence_descriptor,
        scaling_factor=wl.scaling_factor,
        max_segments_per_seq=max_segments,
        window_size=rules.te_window_size(window),
        **options,
    )


def _loss(out, dout):
    return jnp.vdot(out.astype(jnp.float32), dout.astype(jnp.float32))


def time_single(wl, data, window, warmup, iters) -> dict:
    """Time TE's THD attention, forward and backward, on one device.

    Args:
        wl: The workload.
        data: ``(q, k, v, dout, segment_ids, segment_pos)``.
        window: TE's ``(left, right)`` window.
        warmup: Untimed calls after the first.
        iters: Timed calls.

    Returns:
        :func:`tutorial_utils.perfmodel.timing.time_fn`'s timings.
    """
    q, k, v, dout, ids, pos = data
    desc = attention.SequenceDescriptor.from_segment_ids_and_pos(ids, pos)

    def loss_fn(qkv, desc_arg, dout_arg):
        return _loss(
            thd_fused_attn(
                *qkv, desc_arg, wl=wl, window=window, max_segments=wl.max_segments_per_seq
            ),
            dout_arg,
        )

    return time_fn(
        jax.jit(jax.value_and_grad(loss_fn)), (q, k, v), desc, dout, warmup=warmup, iters=iters
    )


def time_cp(wl, data, case: Case, cp: int, warmup, iters) -> dict:
    """TE tutorial pattern: reorder, shard, jit with explicit shardings, run under set_mesh +
    autocast.

    Args:
        wl: The workload.
        data: ``(q, k, v, dout, segment_ids, segment_pos)`` in original token order.
        case: The strategy (``ring``, ``allgather`` or ``ulysses``), stripe and window.
        cp: Devices in the CP mesh (the first ``cp`` of ``jax.devices()``).
        warmup: Untimed calls after the first.
        iters: Timed calls.

    Returns:
        :func:`tutorial_utils.perfmodel.timing.time_fn`'s timings.
    """
    q, k, v, dout, ids, pos = data
    mesh = Mesh(np.asarray(jax.devices()[:cp]), axis_names=("cp",))
    stripe = case.stripe
    reorder = functools.partial(
        attention.reorder_causal_load_balancing,
        strategy=attention.ReorderStrategy.Striped,
        cp_size=cp,
        seq_dim=1,
        stripe_size=stripe,
    )
    x_sh = NamedSharding(mesh, P(None, "cp", None, None))
    t_sh = NamedSharding(mesh, P(None, "cp"))
    qkv = tuple(jax.device_put(reorder(x), x_sh) for x in (q, k, v))
    dout_r = jax.device_put(reorder(dout), x_sh)
    ids_r, pos_r = jax.device_put(reorder(ids), t_sh), jax.device_put(reorder(pos), t_sh)

    if case.strategy == "ulysses":

        def te_kernel(
            qq, kk, vv, iq, ik, pq, pk
        ):  # per-rank full-sequence attention on a head slice
            d = attention.SequenceDescriptor.from_segment_ids_and_pos((iq, ik), (pq, pk))
            return (
                thd_fused_attn(
                    qq,
                    kk,
                    vv,
                    d,
                    wl=wl,
                    window=case.window,
                    max_segments=wl.max_segments_per_seq,
                ),
                None,
            )

        kernel = te_kernel if te.using_real_te() else None

        def loss_fn(qkv_arg, ids_arg, pos_arg, dout_arg):
            out = context_parallel_attention(
                *qkv_arg,
                ids_arg,
                pos_arg,
                mesh=mesh,
                axis_name="cp",
                strategy="ulysses",
                stripe_size=stripe,
                window_size=case.window if case.window[0] >= 0 else (-1, 0),
                scaling_factor=wl.scaling_factor,
                kernel=kernel,
            )
            return _loss(out, dout_arg)

        qkv_sh = tuple(x.sharding for x in qkv)
        fn = jax.jit(
            jax.value_and_grad(loss_fn),
            in_shardings=(qkv_sh, t_sh, t_sh, x_sh),
            out_shardings=(None, qkv_sh),
        )
        # The per-rank kernel must not see a CP axis: an empty MeshResource (real TE reads it
        # whenever a mesh is active).
        with jax.set_mesh(mesh), te.autocast(mesh_resource=te.MeshResource()):
            return time_fn(fn, qkv, ids_r, pos_r, dout_r, warmup=warmup, iters=iters)

    strategy = (
        attention.CPStrategy.RING if case.strategy == "ring" else attention.CPStrategy.ALL_GATHER
    )
    desc = jax.tree.map(
        lambda x: jax.device_put(x, NamedSharding(mesh, P(None) if x.ndim == 1 else P(None, "cp"))),
        attention.SequenceDescriptor.from_segment_ids_and_pos(ids_r, pos_r),
    )
    cp_options = dict(
        context_parallel_strategy=strategy,
        context_parallel_causal_load_balanced=True,
        context_parallel_axis="cp",
        stripe_size=stripe,
    )

    def loss_fn(qkv_arg, desc_arg, dout_arg):
        out = thd_fused_attn(
            *qkv_arg,
            desc_arg,
            wl=wl,
            window=case.window,
            max_segments=wl.max_segments_per_seq,
            cp_options=cp_options,
        )
        return _loss(out, dout_arg)

    qkv_sh = tuple(x.sharding for x in qkv)
    desc_sh = jax.tree.map(lambda x: x.sharding, desc)
    fn = jax.jit(
        jax.value_and_grad(loss_fn),
        in_shardings=(qkv_sh, desc_sh, x_sh),
        out_shardings=(None, qkv_sh),
    )
    with jax.set_mesh(mesh), te.autocast(mesh_resource=te.MeshResource(cp_resource="cp")):
        return time_fn(fn, qkv, desc, dout_r, warmup=warmup, iters=iters)


def emulated_step(kernel: str, wl, window):
    """The jitted forward+backward of one emulated sub-problem.

    Args:
        kernel: ``reference`` (the pure-JAX blockwise kernel, with the per-token mask) or
            ``te`` (the facade's ``fused_attn`` on ragged THD calls).
        wl: The workload.
        window: TE's ``(left, right)`` window.

    Returns:
        ``fn``: for ``reference``, ``fn((q, k, v), ids_q, ids_kv, pos_q, pos_kv, dout)``; for
        ``te``, ``fn((q, k, v), descriptors, dout, max_segments, (bottom_right, window) per
        descriptor)``, the last two static.
    """
    spec = MaskSpec(padding=True, causal=True, window=(-1, 0) if window[0] < 0 else window)

    if kernel == "reference":

        def loss_fn(qkv, iq, ik, pq, pk, dout):
            qq, kk, vv = qkv
            out, _ = blockwise_attention(
                qq,
                kk,
                vv,
                iq,
                ik,
                pq,
                pk,
                scale=wl.scaling_factor,
                spec=spec,
                block_q=block_size(qq.shape[1], 128),
                block_kv=block_size(kk.shape[1], 128),
            )
            return _loss(out, dout)

        return jax.jit(jax.value_and_grad(loss_fn), compiler_options=REFERENCE_KERNEL_XLA_OPTIONS)

    def loss_fn(qkv, calls, dout, max_segments, bottom_right_windows):
        total = 0.0
        for desc, (bottom_right, win) in zip(calls, bottom_right_windows):
            mask = (
                attention.AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK
                if bottom_right
                else attention.AttnMaskType.PADDING_CAUSAL_MASK
            )
            out = thd_fused_attn(
                *qkv,
                desc,
                wl=wl,
                window=win if win is not None else (-1, -1),
                max_segments=max_segments,
                mask=mask,
            )
            total = total + _loss(out, dout)
        return total

    return jax.jit(jax.value_and_grad(loss_fn), static_argnums=(3, 4))


def time_emulated(wl, data, case: Case, cp: int, kernel: str, warmup: int, iters: int):
    """Time every sub-problem of ``case`` on one device; return per-rank (or per rank-step) timings
    in ms.

    Args:
        wl: The workload.
        data: ``(q, k, v, dout, segment_ids, segment_pos)`` in original token order.
        case: The strategy, stripe and window.
        cp: The number of ranks emulated.
        kernel: ``reference`` or ``te`` (see :func:`emulated_step`).
        warmup: Untimed calls after the first, per sub-problem.
        iters: Timed calls, per sub-problem.

    Returns:
        ``(times, first_call_ms)``: mean ms per rank (``[cp, cp]`` rank by step for Ring), and
        the slowest first call.
    """
    q, k, v, dout, ids, pos = data
    ids_np, pos_np = np.asarray(ids), np.asarray(pos)
    subs = rank_subproblems(
        case.strategy,
        wl.seq_len,
        cp,
        case.stripe or 1,
        num_q_heads=wl.num_q_heads,
        num_kv_heads=wl.num_kv_heads,
    )
    fn = emulated_step(kernel, wl, case.window)
    first_call = []

    def gather(sub):
        qi, ki = sub.q_index, sub.kv_index
        hs = slice(*sub.heads) if sub.heads else slice(None)
        ks = slice(*sub.kv_heads) if sub.kv_heads else slice(None)
        qq = take_tokens(q, qi, 1)[:, :, hs]
        kk, vv = take_tokens(k, ki, 1)[:, :, ks], take_tokens(v, ki, 1)[:, :, ks]
        do = take_tokens(dout, qi, 1)[:, :, hs]
        return qq, kk, vv, do, qi, ki

    ragged = {}
    if kernel == "te":
        win = case.window if case.window[0] >= 0 else (-1, 0)
        for sub in subs:
            if case.strategy == "allgather":
                ragged[(sub.rank, sub.step)] = allgather_ragged_calls(
                    ids_np, pos_np, sub.q_index, win
                )
            elif case.strategy == "ring":
                ragged[(sub.rank, sub.step)] = ring_ragged_calls(
                    ids_np, pos_np, sub.q_index, sub.kv_index, cp, win
                )
        kmax = max((c.max_segments for calls in ragged.values() for c in calls), default=1)
        ragged = {key: [c.padded(kmax) for c in calls] for key, calls in ragged.items()}

    times = {}
    for sub in subs:
        qq, kk, vv, do, qi, ki = gather(sub)
        if kernel == "reference":
            args = (
                (qq, kk, vv),
                jnp.asarray(ids_np[:, qi]),
                jnp.asarray(ids_np[:, ki]),
                jnp.asarray(pos_np[:, qi]),
                jnp.asarray(pos_np[:, ki]),
                do,
            )
        elif case.strategy in ("allgather", "ring"):
            calls = ragged[(sub.rank, sub.step)]
            if (
                not calls
            ):  # nothing visible in this ring step: TE skips no step, but the kernel has no work
                times[(sub.rank, sub.step)] = 0.0
                continue
            descs = tuple(te_descriptor(attention, c) for c in calls)
            args = (
                (qq, kk, vv),
                descs,
                do,
                calls[0].max_segments,
                tuple((c.bottom_right, c.window) for c in calls),
            )
        else:  # single / ulysses with TE: the plain THD call on the (head-sliced) full sequence
            desc = attention.SequenceDescriptor.from_segment_ids_and_pos(
                jnp.asarray(ids_np), jnp.asarray(pos_np)
            )
            args = (
                (qq, kk, vv),
                (desc,),
                do,
                wl.max_segments_per_seq,
                ((False, rules.te_window_size(case.window)),),
            )
        timing = time_fn(fn, *args, warmup=warmup, iters=iters)
        first_call.append(timing["first_call_ms"])
        times[(sub.rank, sub.step)] = timing["mean_ms"]
    if case.strategy == "ring":
        grid = np.zeros((cp, cp))
        for (r, t), ms in times.items():
            grid[r, t] = ms
        return grid, max(first_call) if first_call else 0.0
    return np.array([times[(sub.rank, sub.step)] for sub in subs]), (
        max(first_call) if first_call else 0.0
    )
