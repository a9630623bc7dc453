"""Context-parallel attention strategies on a JAX mesh: AllGather, Ring and Ulysses.

Why: CP splits the *sequence* across devices, but every query may need keys held by
another device. The three strategies move different things:

* **AllGather** (TE's default for THD): all-gather K, V (and their segment ids and
  positions); each rank attends its local queries to the full sequence. Backward:
  reduce-scatter of dK, dV. One collective, not overlapped with compute.
* **Ring**: ``cp`` steps; at each step a rank attends its queries to the K/V block it
  holds, merges the partial result with a log-sum-exp merge in fp32, and passes the block
  (with its ids and positions) to the next rank with ``ppermute``. Transfers can overlap
  the next step's compute.
* **Ulysses** (all-to-all; not a TE strategy, shown for comparison): swap the sharded
  axis from sequence to heads, run ordinary attention on whole sequences for
  ``heads/cp`` heads, and swap back. Needs head counts divisible by ``cp``.

All three are exact re-arrangements of the single-device computation in
:mod:`tutorial_utils.reference` (TE's semantics); the tests check outputs *and* gradients.
Inputs are in the load-balanced (reordered) layout when ``load_balanced`` is true, as TE
expects; the mask only ever looks at segment ids and positions, never at raw indices.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from . import rules
from .reference import MaskSpec, blockwise_attention
from .reorder import ReorderStrategy, load_balancing_permutation

# re-exported: the strategy names and their normaliser live in tutorial_utils.rules
from .rules import STRATEGIES, normalize_strategy
from .validation import check_qkv, check_scaling_factor, check_window

__all__ = [
    "STRATEGIES",
    "context_parallel_attention",
    "allgather_attention_shard",
    "ring_attention_shard",
    "ulysses_attention_shard",
    "merge_partial",
    "normalize_strategy",
]


def merge_partial(out, lse, out_s, lse_s):
    """Combine two partial attention results over disjoint key sets (fp32, NaN-free).

    Rows empty in one part have ``lse == LSE_EMPTY`` and get weight 0 there.

    Args:
        out: One part's output ``[b, s, h, d]``.
        lse: Its log-sum-exp ``[b, h, s]``.
        out_s: The other part's output.
        lse_s: Its log-sum-exp.

    Returns:
        ``(out, lse)`` over both parts, the output in float32.
    """
    lse_new = jnp.logaddexp(lse, lse_s)
    w = jnp.exp(lse - lse_new).transpose(0, 2, 1)[..., None]
    w_s = jnp.exp(lse_s - lse_new).transpose(0, 2, 1)[..., None]
    return w * out.astype(jnp.float32) + w_s * out_s.astype(jnp.float32), lse_new


def _default_kernel(spec: MaskSpec, scale: float, block_q: int, block_kv: int):
    def kernel(q, k, v, ids_q, ids_kv, pos_q, pos_kv):
        return blockwise_attention(
            q,
            k,
            v,
            ids_q,
            ids_kv,
            pos_q,
            pos_kv,
            scale=scale,
            spec=spec,
            block_q=block_q,
            block_kv=block_kv,
        )

    return kernel


def _unpermute(x, perm_inverse: np.ndarray | None):
    return x if perm_inverse is None else jnp.take(x, jnp.asarray(perm_inverse), axis=1)


def allgather_attention_shard(
    q,
    k,
    v,
    ids,
    pos,
    ids_kv,
    pos_kv,
    *,
    axis_name: str,
    kernel: Callable,
    inverse_perm: np.ndarray | None = None,
):
    """Per-shard AllGather body (inside ``shard_map``): local Q against gathered K/V.

    Args:
        q: The local queries ``[b, s/cp, hq, d]``.
        k: The local keys.
        v: The local values.
        ids: The local queries' segment ids ``[b, s/cp]``.
        pos: Their positions.
        ids_kv: The local keys' segment ids.
        pos_kv: Their positions.
        axis_name: The CP mesh axis.
        kernel: ``kernel(q, k, v, ids_q, ids_kv, pos_q, pos_kv) -> (out, lse)``.
        inverse_perm: Undoes the load-balancing reorder on the gathered sequence, or
            ``None``.

    Returns:
        The local output, ``[b, s/cp, hq, d]``.
    """
    gather = functools.partial(lax.all_gather, axis_name=axis_name, axis=1, tiled=True)
    k_all, v_all, ids_all, pos_all = (
        _unpermute(gather(x), inverse_perm) for x in (k, v, ids_kv, pos_kv)
    )
    out, _ = kernel(q, k_all, v_all, ids, ids_all, pos, pos_all)
    return out


def ring_attention_shard(
    q, k, v, ids, pos, ids_kv, pos_kv, *, axis_name: str, cp_size: int, kernel: Callable
):
    """Per-shard Ring body: ``cp_size`` steps of attend, LSE merge, ``ppermute``.

    Args:
        q: The local queries ``[b, s/cp, hq, d]``.
        k: The local keys.
        v: The local values.
        ids: The local queries' segment ids ``[b, s/cp]``.
        pos: Their positions.
        ids_kv: The local keys' segment ids.
        pos_kv: Their positions.
        axis_name: The CP mesh axis.
        cp_size: Its size.
        kernel: ``kernel(q, k, v, ids_q, ids_kv, pos_q, pos_kv) -> (out, lse)``.

    Returns:
        The local output in ``q``'s dtype.
    """
    perm = [(i, (i + 1) % cp_size) for i in range(cp_size)]
    block = (k, v, ids_kv, pos_kv)
    out = lse = None
    for step in range(cp_size):
        k_s, v_s, ids_s, pos_s = block
        out_s, lse_s = kernel(q, k_s, v_s, ids, ids_s, pos, pos_s)
        if out is None:
            out, lse = out_s.astype(jnp.float32), lse_s
        else:
            out, lse = merge_partial(out, lse, out_s, lse_s)
        if step < cp_size - 1:
            block = tuple(lax.ppermute(x, axis_name, perm) for x in block)
    return out.astype(q.dtype)


def ulysses_attention_shard(
    q,
    k,
    v,
    ids,
    pos,
    ids_kv,
    pos_kv,
    *,
    axis_name: str,
    kernel: Callable,
    inverse_perm: np.ndarray | None = None,
    forward_perm: np.ndarray | None = None,
):
    """Per-shard Ulysses body: all-to-all sequence->heads, attention, heads->sequence.

    Args:
        q: The local queries ``[b, s/cp, hq, d]``.
        k: The local keys.
        v: The local values.
        ids: The local queries' segment ids ``[b, s/cp]``.
        pos: Their positions.
        ids_kv: The local keys' segment ids.
        pos_kv: Their positions.
        axis_name: The CP mesh axis.
        kernel: ``kernel(q, k, v, ids_q, ids_kv, pos_q, pos_kv) -> (out, lse)``.
        inverse_perm: Undoes the load-balancing reorder, or ``None``.
        forward_perm: Redoes it on the output, or ``None``.

    Returns:
        The local output, ``[b, s/cp, hq, d]``.
    """
    to_heads = functools.partial(
        lax.all_to_all, axis_name=axis_name, split_axis=2, concat_axis=1, tiled=True
    )
    to_seq = functools.partial(
        lax.all_to_all, axis_name=axis_name, split_axis=1, concat_axis=2, tiled=True
    )
    gather = functools.partial(lax.all_gather, axis_name=axis_name, axis=1, tiled=True)
    qh, kh, vh = (_unpermute(to_heads(x), inverse_perm) for x in (q, k, v))
    ids_q, pos_q, ids_k, pos_k = (
        _unpermute(gather(x), inverse_perm) for x in (ids, pos, ids_kv, pos_kv)
    )
    out, _ = kernel(qh, kh, vh, ids_q, ids_k, pos_q, pos_k)
    return to_seq(_unpermute(out, forward_perm))


def _mesh_axis_size(mesh, axis_name: str) -> int:
    names = tuple(mesh.axis_names)
    if axis_name not in names:
        raise ValueError(
            f"axis_name={axis_name!r} is not an axis of the mesh (axes {names}); "
            "pass the name of the CP axis, e.g. 'cp'."
        )
    return (
        int(dict(zip(names, mesh.axis_sizes))[axis_name])
        if hasattr(mesh, "axis_sizes")
        else int(mesh.shape[axis_name])
    )


def context_parallel_attention(
    q,
    k,
    v,
    segment_ids,
    segment_pos,
    *,
    mesh=None,
    axis_name: str = "cp",
    strategy="allgather",
    stripe_size: int | None = 1,
    load_balanced: bool = True,
    reorder_strategy: ReorderStrategy = ReorderStrategy.Striped,
    window_size=(-1, 0),
    scaling_factor: float | None = None,
    causal: bool = True,
    padding: bool = True,
    batch_axis: str | None = None,
    block_q: int = 128,
    block_kv: int = 128,
    kernel: Callable | None = None,
    kv_segment_ids=None,
    kv_segment_pos=None,
):
    """Attention over a sequence sharded on mesh axis ``axis_name`` with the chosen strategy.

    The inputs are global arrays, already reordered with ``reorder_causal_load_balancing``
    when ``load_balanced``.

    Args:
        q: Queries ``[b, s, hq, d]``.
        k: Keys ``[b, s, hkv, d]``.
        v: Values ``[b, s, hkv, d]``.
        segment_ids: ``[b, s]`` segment ids (0 = padding).
        segment_pos: ``[b, s]`` positions inside each segment.
        mesh: The mesh; ``None`` uses the one set with ``jax.set_mesh``.
        axis_name: The CP mesh axis.
        strategy: ``'allgather'``, ``'ring'``, ``'ulysses'`` or a ``CPStrategy``.
        stripe_size: The striped reorder's stripe.
        load_balanced: Whether the inputs are reordered.
        reorder_strategy: The reorder used (``Striped`` or ``DualChunkSwap``).
        window_size: ``(left, right)`` sliding window; ``-1`` for an unbounded side.
        scaling_factor: The softmax scale; ``None`` for ``head_dim ** -0.5``.
        causal: Causal mask.
        padding: The padding rule: a query sees only keys of its own segment, and padding
            (id 0) sees nothing.
        batch_axis: A mesh axis the batch is sharded on, or ``None``.
        block_q: The default kernel's query block.
        block_kv: The default kernel's key block.
        kernel: ``kernel(q, k, v, ids_q, ids_kv, pos_q, pos_kv) -> (out, lse)``; default
            the blockwise reference kernel.
        kv_segment_ids: The keys' segment ids; default ``segment_ids`` (self-attention).
        kv_segment_pos: The keys' positions; default ``segment_pos``.

    Returns:
        ``[b, s, hq, d]`` in the same (reordered) layout, sharded like ``q``.

    Raises:
        ValueError: If no mesh is given or active, ``axis_name`` is not one of its axes, the
            shapes or settings are invalid, or a strategy's rule refuses them.
    """
    strat = normalize_strategy(strategy)
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
        if mesh is None or not mesh.axis_names:
            raise ValueError(
                "mesh=None but no mesh is active; pass mesh=... or call inside "
                "`with jax.set_mesh(mesh):`."
            )
    cp = _mesh_axis_size(mesh, axis_name)
    window = check_window(window_size)
    check_qkv(q, k, v)
    b, s, hq, _ = q.shape
    hkv = k.shape[2]
    if k.shape[1] != s:
        raise ValueError(
            f"k.shape[1]={k.shape[1]} but q.shape[1]={s}: context-parallel "
            "self-attention shards one "
            "sequence axis, so q, k and v need the same length."
        )
    st = rules.check_stripe_size(stripe_size)
    striped = load_balanced and reorder_strategy == ReorderStrategy.Striped
    rules.check_divisible_seq(s, cp, st if striped else 1, name="q.shape[1]")
    if segment_ids.shape != (b, s) or segment_pos.shape != (b, s):
        raise ValueError(
            f"segment_ids/segment_pos must have shape {(b, s)} (batch, seq), got "
            f"{segment_ids.shape}/{segment_pos.shape}."
        )
    if strat == "ring" and cp > 1 and striped:
        rules.check_ring_stripe(st)  # TE's rule, kept so a reference run is a TE-valid run
    if strat == "ulysses":
        rules.check_ulysses_heads(hq, hkv, cp)
    scale = q.shape[-1] ** -0.5 if scaling_factor is None else check_scaling_factor(scaling_factor)
    spec = MaskSpec(padding=padding, causal=causal, window=window)
    kern = kernel or _default_kernel(spec, scale, block_q, block_kv)

    perm = None
    if load_balanced and cp > 1:
        perm = load_balancing_permutation(
            s,
            reorder_strategy,
            cp,
            stripe_size if reorder_strategy == ReorderStrategy.Striped else None,
        )
    inv = None if perm is None else np.argsort(perm)

    if strat == "allgather":
        body = functools.partial(
            allgather_attention_shard,
            axis_name=axis_name,
            kernel=kern,
            inverse_perm=inv,
        )
    elif strat == "ring":
        body = functools.partial(ring_attention_shard, axis_name=axis_name, cp_size=cp, kernel=kern)
    else:
        body = functools.partial(
            ulysses_attention_shard,
            axis_name=axis_name,
            kernel=kern,
            inverse_perm=inv,
            forward_perm=perm,
        )

    tok = P(batch_axis, axis_name)
    x4 = P(batch_axis, axis_name, None, None)
    kv_ids = segment_ids if kv_segment_ids is None else kv_segment_ids
    kv_pos = segment_pos if kv_segment_pos is None else kv_segment_pos
    fn = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(x4, x4, x4, tok, tok, tok, tok),
        out_specs=x4,
        check_vma=False,
    )
    i32 = functools.partial(jnp.asarray, dtype=jnp.int32)
    # Under jax.jit, not bare: called outside jit, shard_map runs its body one operation at a
    # time on every device, and Ring's cp steps of blockwise attention took 45 s at cp = 8 on
    # CPU where the compiled program takes seconds. Inside a caller's jit this is inlined.
    return jax.jit(fn)(q, k, v, i32(segment_ids), i32(segment_pos), i32(kv_ids), i32(kv_pos))
