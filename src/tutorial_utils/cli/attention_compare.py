"""Attention runs set against the reference: what ``check`` and ``launch --demo`` share.

TE's test tolerance and the ``allclose`` comparison, the fp32 reference forward and backward,
the small CP workload sized for any device count, the mesh over axis ``cp`` with its two
shardings, and the losses (``vdot(out, dout)``) both tools differentiate: through TE's
``fused_attn`` (:func:`te_attention_loss`) and through the tutorial's CP attention
(:func:`cp_attention_loss`).

Nothing here starts JAX's backend, and the caller passes TE's attention module in, so ``check``
may import this module before it sets up its devices. The one import inside a function is
:func:`~tutorial_utils.te.fused_call.call_fused_attn`'s, when a TE loss is built: importing the
``tutorial_utils.te`` package picks TE's backend and loads TE's code, which ``check`` does only
after that set-up.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tutorial_utils.context_parallel import context_parallel_attention
from tutorial_utils.perfmodel.workload import get_workload
from tutorial_utils.reference import MaskSpec, blockwise_attention, dense_attention

__all__ = [
    "tolerance",
    "compare",
    "highest_precision",
    "reference_fwd_bwd",
    "self_attention_reference",
    "cp_workload_for",
    "cp_mesh",
    "te_cp_options",
    "te_attention_loss",
    "cp_attention_loss",
]


def tolerance(dtype) -> float:
    """TE's test tolerance for ``dtype``: ``rtol = atol = eps**(2/3)``.

    Args:
        dtype: A JAX or NumPy dtype (or its name).

    Returns:
        The tolerance: bf16 0.0394, fp16 0.0098, fp32 2.4e-5.
    """
    eps = float(jnp.finfo(jnp.dtype(dtype)).eps)
    return max(eps, eps ** (2.0 / 3.0))


def compare(actual, expected, tol: float) -> dict:
    """``|a - e| <= tol + tol * |e|`` everywhere (``assert_allclose`` semantics).

    Args:
        actual: The array under test.
        expected: The array it must match.
        tol: Both the relative and the absolute tolerance.

    Returns:
        ``{"ok", "max_abs_err", "worst_ratio"}`` (the largest error over its bound), plus
        ``"shape"`` when the shapes differ or ``"nonfinite"`` when ``actual`` holds NaN or inf.
    """
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


def highest_precision():
    """A context in which JAX's matmuls run at full fp32 precision (the reference's setting)."""
    return jax.default_matmul_precision("highest")


@functools.partial(jax.jit, static_argnames=("scale", "window", "dense", "block_q", "block_kv"))
def _reference_vjp(
    q, k, v, dout, ids_q, ids_kv, pos_q, pos_kv, *, scale, window, dense, block_q, block_kv
):
    spec = MaskSpec(padding=True, causal=True, window=window)

    def attend(qq, kk, vv):
        if dense:
            out, _ = dense_attention(
                qq, kk, vv, ids_q, ids_kv, pos_q, pos_kv, scale=scale, spec=spec
            )
            return out
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
    out, vjp = jax.vjp(attend, f32(q), f32(k), f32(v))
    return out, vjp(f32(dout))


def reference_fwd_bwd(
    q, k, v, dout, ids_q, ids_kv, pos_q, pos_kv, *, scale, window, dense=True, block=128
):
    """Reference output and ``(dq, dk, dv)`` of ``vdot(out, dout)``, fp32 at full matmul precision.

    Args:
        q, k, v, dout: ``[b, s, h, d]`` inputs and the output's cotangent (any float dtype).
        ids_q, ids_kv, pos_q, pos_kv: ``[b, s]`` segment ids (0 = padding) and positions.
        scale: The softmax scale.
        window: TE's ``(left, right)`` window, or ``None`` for causal without a window.
        dense: The dense reference (else the blockwise one, for long sequences).
        block: The blockwise reference's block size (capped at the sequence lengths).

    Returns:
        ``(out, (dq, dk, dv))`` in fp32.
    """
    window = (-1, 0) if window is None else tuple(int(w) for w in window)
    with highest_precision():
        return _reference_vjp(
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


def self_attention_reference(q, k, v, dout, ids, pos, *, scale, window, dense=True, block=128):
    """:func:`reference_fwd_bwd` with the same tokens on the query and the key side.

    Args:
        q, k, v, dout: ``[b, s, h, d]`` inputs and the output's cotangent.
        ids, pos: ``[b, s]`` segment ids and positions (NumPy or JAX) of both sides.
        scale: The softmax scale.
        window: TE's ``(left, right)`` window, or ``None``.
        dense: The dense reference (else the blockwise one).
        block: The blockwise reference's block size.

    Returns:
        ``(out, (dq, dk, dv))`` in fp32.
    """
    ids, pos = jnp.asarray(ids), jnp.asarray(pos)
    return reference_fwd_bwd(
        q, k, v, dout, ids, ids, pos, pos, scale=scale, window=window, dense=dense, block=block
    )


def cp_workload_for(n: int):
    """The tiny preset resized so that ``cp = n`` fits.

    Args:
        n: The CP size (number of devices).

    Returns:
        A :class:`~tutorial_utils.perfmodel.workload.Workload` whose slots are a multiple of
        ``n * stripe`` and whose heads divide by ``n`` (for Ulysses).
    """
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


def cp_mesh(devices: Sequence) -> tuple[Mesh, NamedSharding, NamedSharding]:
    """A one-axis mesh ``cp`` over ``devices`` and its sequence shardings.

    Args:
        devices: The devices, in rank order.

    Returns:
        ``(mesh, tensors, tokens)``: the mesh, the sharding of ``[b, s, h, d]`` tensors and that
        of ``[b, s]`` token arrays, both split along the sequence.
    """
    mesh = Mesh(np.asarray(devices), ("cp",))
    return (
        mesh,
        NamedSharding(mesh, P(None, "cp", None, None)),
        NamedSharding(mesh, P(None, "cp")),
    )


def te_cp_options(attention: ModuleType, strategy: str, stripe: int) -> dict:
    """TE's ``context_parallel_*`` keywords for CP over mesh axis ``cp``, load-balanced.

    Args:
        attention: TE's attention module (or the facade's).
        strategy: ``"ring"`` or ``"allgather"``.
        stripe: TE's ``stripe_size``.

    Returns:
        The keywords to add to a ``fused_attn`` call.
    """
    return {
        "context_parallel_strategy": (
            attention.CPStrategy.RING if strategy == "ring" else attention.CPStrategy.ALL_GATHER
        ),
        "context_parallel_causal_load_balanced": True,
        "context_parallel_axis": "cp",
        "stripe_size": stripe,
    }


def _vdot(out, dout):
    return jnp.vdot(out.astype(jnp.float32), dout.astype(jnp.float32))


def te_attention_loss(
    attention: ModuleType,
    *,
    scaling_factor: float,
    max_segments_per_seq: int,
    window_size,
    **options,
) -> Callable:
    """``loss(qkv, descriptor, dout) -> (vdot(out, dout), out)`` through TE's ``fused_attn``.

    Args:
        attention: TE's attention module (or the facade's); looked up at each call.
        scaling_factor: The softmax scale.
        max_segments_per_seq: TE's bound on documents per row.
        window_size: TE's ``(left, right)`` window, or ``None``.
        **options: Further ``fused_attn`` keywords (mask, layout, :func:`te_cp_options`).

    Returns:
        The loss, for ``jax.value_and_grad(..., has_aux=True)``.
    """
    from tutorial_utils.te.fused_call import call_fused_attn

    def loss(qkv, descriptor, dout):
        out = call_fused_attn(
            attention,
            qkv,
            descriptor,
            scaling_factor=scaling_factor,
            max_segments_per_seq=max_segments_per_seq,
            window_size=window_size,
            **options,
        )
        return _vdot(out, dout), out

    return loss


def cp_attention_loss(mesh: Mesh, workload, *, strategy: str, stripe_size: int) -> Callable:
    """``loss(qkv, ids, pos, dout) -> (vdot(out, dout), out)`` through the tutorial's CP attention.

    Args:
        mesh: The mesh with axis ``cp``.
        workload: The workload whose window and softmax scale the attention uses.
        strategy: ``"allgather"``, ``"ring"`` or ``"ulysses"``.
        stripe_size: The stripe the inputs were reordered with.

    Returns:
        The loss (64-token blocks), for ``jax.value_and_grad(..., has_aux=True)``.
    """

    def loss(qkv, ids, pos, dout):
        out = context_parallel_attention(
            *qkv,
            ids,
            pos,
            mesh=mesh,
            axis_name="cp",
            strategy=strategy,
            stripe_size=stripe_size,
            window_size=workload.window,
            scaling_factor=workload.scaling_factor,
            block_q=64,
            block_kv=64,
        )
        return _vdot(out, dout), out

    return loss
