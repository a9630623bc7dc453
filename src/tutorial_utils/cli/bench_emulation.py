"""The per-rank sub-problems run with JAX: TE's ragged descriptor for one, and a whole CP step
emulated rank by rank with the reference kernel.

:func:`emulate_strategy_reference` checks the decomposition that ``python -m
tutorial_utils.cli.bench --emulate-ranks N`` times (:mod:`tutorial_utils.cli.bench_subproblems`):
merged over its ranks, it must give the single-device result.
"""

from __future__ import annotations

from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np

from tutorial_utils.cli.bench_subproblems import RaggedCall, rank_subproblems
from tutorial_utils.context_parallel import merge_partial
from tutorial_utils.reference import MaskSpec, blockwise_attention

__all__ = [
    "REFERENCE_KERNEL_XLA_OPTIONS",
    "te_descriptor",
    "take_tokens",
    "block_size",
    "emulate_strategy_reference",
]

#: The pure-JAX reference kernel is code XLA generates, so its speed follows XLA's backend
#: optimisation level, while TE's path spends its time in cuDNN or the stand-in's compiled C++
#: kernel. Its emulated sub-problems are compiled at XLA's default CPU level whatever
#: ``XLA_FLAGS`` says: the test run's fast-compile flag (level 0) made them run 2 to 3 times
#: slower, which made the emulated prediction depend on a compile setting.
REFERENCE_KERNEL_XLA_OPTIONS = {"xla_backend_optimization_level": 3}


def te_descriptor(attention: ModuleType, call: RaggedCall):
    """``attention.SequenceDescriptor.from_seqlens_and_offsets`` for ``call``.

    Shapes follow TE's own tests: seqlens ``[batch, K]`` and offsets ``[batch, K + 1]`` (start
    offsets with one trailing -1), both padded with -1.

    Args:
        attention: TE's attention module (``transformer_engine.jax.attention``) or the
            facade's (``tutorial_utils.te.attention``).
        call: The ragged call.

    Returns:
        TE's ``SequenceDescriptor``.
    """
    offsets_q = np.pad(call.q_offsets, ((0, 0), (0, 1)), constant_values=-1)
    offsets_kv = np.pad(call.kv_offsets, ((0, 0), (0, 1)), constant_values=-1)
    return attention.SequenceDescriptor.from_seqlens_and_offsets(
        (jnp.asarray(call.q_seqlens, jnp.int32), jnp.asarray(call.kv_seqlens, jnp.int32)),
        (jnp.asarray(offsets_q, jnp.int32), jnp.asarray(offsets_kv, jnp.int32)),
    )


def take_tokens(x, index, axis):
    """``x`` at the token indices ``index`` along ``axis`` (a JAX array).

    Args:
        x: The array.
        index: Original token indices, in the order wanted.
        axis: The token axis.

    Returns:
        The gathered array.
    """
    return jnp.take(x, jnp.asarray(index), axis=axis)


def block_size(n: int, block: int) -> int:
    """The reference kernel's block for ``n`` rows: ``block``, at most ``n``, at least 1.

    Args:
        n: Rows (queries or keys) of the sub-problem.
        block: The block wanted.

    Returns:
        The block to use.
    """
    return max(1, min(block, n))


def emulate_strategy_reference(
    strategy: str,
    q,
    k,
    v,
    dout,
    segment_ids,
    segment_pos,
    *,
    cp_size: int,
    stripe_size: int = 1,
    window=(-1, 0),
    scale: float | None = None,
    block: int = 128,
):
    """Run ``strategy`` as ``cp_size`` ranks one after another on one device, and merge.

    Returns ``(out, (dq, dk, dv))`` in the original token order for the loss
    ``vdot(out, dout)``, computed rank by rank with the reference kernel: AllGather ranks see
    the full K/V (dK/dV summed as the reduce-scatter would), Ring ranks merge their ``cp_size``
    steps with the fp32 log-sum-exp merge, Ulysses ranks own whole heads. Comparing this with
    the single-device result checks the decomposition that ``--emulate-ranks`` times.

    Args:
        strategy: ``single``, ``ring``, ``allgather`` or ``ulysses``.
        q: ``[batch, seq, q_heads, head_dim]`` queries, in original token order.
        k: ``[batch, seq, kv_heads, head_dim]`` keys.
        v: Values, shaped like ``k``.
        dout: The loss's cotangent, shaped like ``q``.
        segment_ids: ``[batch, seq]`` segment ids, 0 for padding.
        segment_pos: ``[batch, seq]`` positions within each segment.
        cp_size: The number of ranks.
        stripe_size: TE's stripe for the striped layout.
        window: TE's ``(left, right)`` window; ``left = -1`` (or ``None``) for full causal.
        scale: The softmax scale (default ``head_dim ** -0.5``).
        block: The reference kernel's block size.

    Returns:
        ``(out, (dq, dk, dv))`` as float32 NumPy arrays.
    """
    b, s, hq, d = q.shape
    hkv = k.shape[2]
    scale = d**-0.5 if scale is None else float(scale)
    spec = MaskSpec(padding=True, causal=True, window=(-1, 0) if window is None else tuple(window))
    ids = jnp.asarray(segment_ids, jnp.int32)
    pos = jnp.asarray(segment_pos, jnp.int32)
    subs = rank_subproblems(strategy, s, cp_size, stripe_size, num_q_heads=hq, num_kv_heads=hkv)

    def attn(qq, kk, vv, iq, ik, pq, pk):
        return blockwise_attention(
            qq,
            kk,
            vv,
            iq,
            ik,
            pq,
            pk,
            scale=scale,
            spec=spec,
            block_q=block_size(qq.shape[1], block),
            block_kv=block_size(kk.shape[1], block),
        )

    out = np.zeros(q.shape, np.float32)
    dq = np.zeros(q.shape, np.float32)
    dk = np.zeros(k.shape, np.float32)
    dv = np.zeros(v.shape, np.float32)

    if strategy in ("single", "allgather", "ulysses"):

        @jax.jit
        def rank_step(qq, kk, vv, iq, ik, pq, pk, do):
            o, vjp = jax.vjp(lambda a, bb, c: attn(a, bb, c, iq, ik, pq, pk)[0], qq, kk, vv)
            return (o,) + vjp(do.astype(o.dtype))

        for sub in subs:
            if strategy == "ulysses":
                hs, ks = slice(*sub.heads), slice(*sub.kv_heads)
                o, gq, gk, gv = rank_step(
                    q[:, :, hs], k[:, :, ks], v[:, :, ks], ids, ids, pos, pos, dout[:, :, hs]
                )
                out[:, :, hs], dq[:, :, hs] = o, gq
                dk[:, :, ks] += np.asarray(gk, np.float32)
                dv[:, :, ks] += np.asarray(gv, np.float32)
            else:
                qi, ki = sub.q_index, sub.kv_index
                o, gq, gk, gv = rank_step(
                    take_tokens(q, qi, 1),
                    take_tokens(k, ki, 1),
                    take_tokens(v, ki, 1),
                    ids[:, qi],
                    ids[:, ki],
                    pos[:, qi],
                    pos[:, ki],
                    take_tokens(dout, qi, 1),
                )
                out[:, qi], dq[:, qi] = o, gq
                dk[:, ki] += np.asarray(gk, np.float32)
                dv[:, ki] += np.asarray(gv, np.float32)
    else:  # ring: one jitted function per rank (all ranks share its shapes): cp steps + merge
        cp = cp_size

        @jax.jit
        def rank_ring(qq, kb, vb, iq, ikb, pq, pkb, do):
            def f(qq, kb, vb):
                acc = lse = None
                for t in range(cp):
                    o_s, l_s = attn(qq, kb[t], vb[t], iq, ikb[t], pq, pkb[t])
                    if acc is None:
                        acc, lse = o_s.astype(jnp.float32), l_s
                    else:
                        acc, lse = merge_partial(acc, lse, o_s, l_s)
                return acc.astype(qq.dtype)

            o, vjp = jax.vjp(f, qq, kb, vb)
            return (o,) + vjp(do.astype(o.dtype))

        for r in range(cp):
            steps = [sub for sub in subs if sub.rank == r]
            qi = steps[0].q_index
            kis = np.stack([sub.kv_index for sub in steps])  # [cp, n_loc], step order
            kb = jnp.stack([take_tokens(k, ki, 1) for ki in kis])
            vb = jnp.stack([take_tokens(v, ki, 1) for ki in kis])
            o, gq, gkb, gvb = rank_ring(
                take_tokens(q, qi, 1),
                kb,
                vb,
                ids[:, qi],
                jnp.stack([ids[:, ki] for ki in kis]),
                pos[:, qi],
                jnp.stack([pos[:, ki] for ki in kis]),
                take_tokens(dout, qi, 1),
            )
            out[:, qi], dq[:, qi] = o, gq
            for t, ki in enumerate(kis):
                dk[:, ki] += np.asarray(gkb[t], np.float32)
                dv[:, ki] += np.asarray(gvb[t], np.float32)
    return out, (dq, dk, dv)
