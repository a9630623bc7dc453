"""Pure-JAX reference attention with TransformerEngine's ``fused_attn`` semantics.

TE's fused kernels need CUDA, but the tutorial must run (and be checked) anywhere: this module
defines the maths once, for packed ``[batch, seq, heads, dim]`` inputs described per token by
a segment id (0 = padding) and a position inside the segment.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from .validation import check_qkv, check_window

__all__ = [
    "MaskSpec",
    "LSE_EMPTY",
    "visibility",
    "dense_attention",
    "blockwise_attention",
    "blockwise_backward",
    "bottom_right_positions",
]

#: log-sum-exp of a row that sees no key. Finite (unlike -inf) so that CP merges never
#: produce NaN; ``exp(LSE_EMPTY - x) == 0`` for any real ``x``. TE uses -5.965e29.
LSE_EMPTY = -1.0e30
_BIG = 2**30


@dataclasses.dataclass(frozen=True)
class MaskSpec:
    """Static description of the mask: which rules apply and the window.

    Hashable and frozen, so it can be a static argument of a jitted function; the rules
    themselves are applied by :func:`visibility`.

    Attributes:
        padding: Apply the padding rule: a query sees only keys of its own segment, and
            padding (id 0) sees nothing.
        causal: Apply the causal rule ``pos_kv <= pos_q``.
        window: ``(left, right)`` sliding window in positions, inclusive; ``-1`` is unbounded.
        bounds: Kernel mode, used by the cuDNN-contract kernel in
            :mod:`tutorial_utils.te_on_cpu`: ``ids_q``/``pos_q`` hold each query row's
            inclusive ``[lo, hi]`` range of key rows and ``pos_kv`` holds each key's row index
            (``ids_kv`` is ignored but for block padding). A row with ``lo > hi`` sees
            nothing; ``padding``, ``causal`` and ``window`` are then ignored.

    Raises:
        ValueError: If ``window`` is not a valid ``(left, right)`` pair.
    """

    padding: bool = True
    causal: bool = True
    window: tuple[int, int] = (-1, -1)
    # Kernel mode (see the class docstring's ``bounds``).
    bounds: bool = False

    def __post_init__(self):
        object.__setattr__(self, "window", check_window(self.window))


def visibility(ids_q, ids_kv, pos_q, pos_kv, spec: MaskSpec):
    """Whether each query may attend each key: TE's mask rules written out.

    Key ``j`` is visible to query ``i`` iff (padding) ``ids_q[i] == ids_kv[j] != 0``,
    (causal) ``pos_kv[j] <= pos_q[i]``, and (window ``(left, right)``, inclusive, ``-1`` =
    unbounded) ``pos_q[i] - left <= pos_kv[j] <= pos_q[i] + right``, each rule only when
    ``spec`` enables it. Negative ids mark block padding added internally and see nothing.

    Args:
        ids_q: ``[b, sq]`` segment ids of the queries (0 = padding).
        ids_kv: ``[b, skv]`` segment ids of the keys.
        pos_q: ``[b, sq]`` positions of the queries inside their segments.
        pos_kv: ``[b, skv]`` positions of the keys.
        spec: Which rules apply (see :class:`MaskSpec`, including its ``bounds`` mode).

    Returns:
        ``[b, sq, skv]`` boolean array, true where query ``i`` may attend key ``j``.
    """
    iq, ik = ids_q[:, :, None], ids_kv[:, None, :]
    pq, pk = pos_q[:, :, None], pos_kv[:, None, :]
    if spec.bounds:
        return (ik >= 0) & (pk >= iq) & (pk <= pq)
    vis = (iq >= 0) & (ik >= 0)  # negative ids mark block padding added internally
    if spec.padding:
        vis = vis & (iq == ik) & (iq > 0)
    left, right = spec.window
    if spec.causal:
        vis = vis & (pk <= pq)
    if right >= 0:
        vis = vis & (pk <= pq + right)
    if left >= 0:
        vis = vis & (pk >= pq - left)
    return vis


def bottom_right_positions(ids_q, ids_kv, pos_q, max_segments: int):
    """Query positions shifted so causal/window masks align bottom-right per segment.

    TE's ``*_BOTTOM_RIGHT`` masks allow ``pos_kv <= pos_q + (len_kv - len_q)`` where the
    lengths are those of the segment's query and key runs; shifting the query positions lets
    :func:`visibility` apply them with its top-left rules unchanged.

    Args:
        ids_q: ``[b, sq]`` segment ids of the queries.
        ids_kv: ``[b, skv]`` segment ids of the keys.
        pos_q: ``[b, sq]`` positions of the queries.
        max_segments: Largest segment id that occurs (ids above it are clipped to it).

    Returns:
        ``[b, sq]`` query positions, each shifted by its segment's ``len_kv - len_q``.
    """

    def counts(ids):
        return jax.vmap(
            lambda row: jnp.bincount(jnp.clip(row, 0, max_segments), length=max_segments + 1)
        )(ids)

    shift = counts(ids_kv) - counts(ids_q)  # [b, M+1]
    return pos_q + jnp.take_along_axis(shift, jnp.clip(ids_q, 0, max_segments), axis=1)


def _split_gqa(x, hkv):
    b, s, h, d = x.shape
    return x.reshape(b, s, hkv, h // hkv, d)


def _finalize(m, l, acc, seen):
    """Output and LSE of rows that saw a key (``seen``); the others give 0 and ``LSE_EMPTY``.

    A NaN/Inf logit makes ``m`` or ``l`` NaN, and the NaN flows through to the row's output
    and LSE: divergence is never turned into zeros.
    """
    l_safe = jnp.where(seen, l, 1.0)
    m_fin = jnp.where(jnp.isfinite(m), m, 0.0)
    lse = jnp.where(seen, m_fin + jnp.log(l_safe), LSE_EMPTY)
    out = jnp.where(seen[..., None], acc / l_safe[..., None], 0.0)
    return out, lse


def _clean_values(v):
    """``(v with non-finite entries set to 0, [b, s, h] bool: the entry had a NaN/Inf)``.

    Why: a masked key has probability exactly 0, but ``0 * NaN = NaN``. Multiplying clean
    values and marking, per query row, whether a *visible* key's value was bad keeps a NaN
    where it belongs (rows that attend to it) and nowhere else.
    """
    finite = jnp.isfinite(v)
    return jnp.where(finite, v, 0.0), ~jnp.all(finite, axis=-1)


def _sees_bad(vis, bad):
    """``[b, h, 1, q]``: does the row attend to a key whose value (for KV head h) is NaN/Inf."""
    return jnp.any(vis & jnp.transpose(bad, (0, 2, 1))[:, :, None, None, :], axis=-1)


def dense_attention(
    q,
    k,
    v,
    ids_q,
    ids_kv,
    pos_q,
    pos_kv,
    *,
    scale: float,
    spec: MaskSpec = MaskSpec(),
    sink=None,
    bias=None,
):
    """Reference attention that materialises the full mask.

    Reads like the formula (O(S^2) memory), which is why the tests hold it against an
    independent oracle. Logits ``scale * q.k`` are computed in fp32 and softmaxed over the
    visible keys; with GQA, query head ``h`` reads KV head ``h // (hq / hkv)``. A query row
    with no visible key (e.g. padding) outputs exactly 0, gets exactly 0 gradient and has
    log-sum-exp :data:`LSE_EMPTY`, so that CP merges give it zero weight. Non-finite inputs
    propagate as NaN only to the rows that see them.

    Args:
        q: ``[b, sq, hq, d]`` queries.
        k: ``[b, skv, hkv, d]`` keys.
        v: ``[b, skv, hkv, dv]`` values.
        ids_q: ``[b, sq]`` segment ids of the queries (0 = padding).
        ids_kv: ``[b, skv]`` segment ids of the keys.
        pos_q: ``[b, sq]`` positions of the queries inside their segments.
        pos_kv: ``[b, skv]`` positions of the keys.
        scale: Factor applied to ``q.k``, usually ``d ** -0.5``.
        spec: The mask rules (:class:`MaskSpec`).
        sink: Optional ``[hq]`` float32 sink logits: ``exp(sink)`` is added to every softmax
            denominator (off-by-one softmax: zeros; learnable softmax: a parameter).
        bias: Optional bias added to the scaled logits, broadcastable to
            ``[b, hq, sq, skv]``.

    Returns:
        ``(out, lse)``: ``out`` is ``[b, sq, hq, dv]`` in ``q.dtype``; ``lse`` is
        ``[b, hq, sq]`` float32.

    Raises:
        ValueError: If ``q``, ``k`` and ``v`` do not have compatible shapes.
    """
    q, k, v = (jnp.asarray(x) for x in (q, k, v))
    check_qkv(q, k, v)
    b, sq, hq, _ = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    qf = _split_gqa(q.astype(jnp.float32), hkv)
    s = jnp.einsum("bqhgd,bkhd->bhgqk", qf, k.astype(jnp.float32)) * scale
    if bias is not None:
        s = s + jnp.broadcast_to(bias.astype(jnp.float32), (b, hq) + s.shape[-2:]).reshape(s.shape)
    vis = visibility(ids_q, ids_kv, pos_q, pos_kv, spec)[:, None, None]
    s = jnp.where(vis, s, -jnp.inf)
    m = lax.stop_gradient(jnp.max(s, axis=-1))
    if sink is not None:
        sink_b = jnp.broadcast_to(sink.astype(jnp.float32).reshape(1, hkv, g, 1), m.shape)
        m = jnp.maximum(m, lax.stop_gradient(sink_b))
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m_safe[..., None])
    l = jnp.sum(p, axis=-1)
    if sink is not None:
        l = l + jnp.exp(sink_b - m_safe)
    v_clean, bad = _clean_values(v.astype(jnp.float32))
    acc = jnp.einsum("bhgqk,bkhd->bhgqd", p, v_clean)
    out, lse = _finalize(m, l, acc, jnp.any(vis, axis=-1))
    poison = lax.stop_gradient(
        jnp.where(_sees_bad(vis, bad), jnp.nan, 0.0)
    )  # NaN values seen: NaN out
    out, lse = out + poison[..., None], lse + poison
    out = out.transpose(0, 3, 1, 2, 4).reshape(b, sq, hq, -1).astype(q.dtype)
    return out, lse.reshape(b, hq, sq)


# ----------------------------------------------------------------------------- blockwise


def _pad_seq(x, target, value):
    pad = target - x.shape[1]
    if pad == 0:
        return x
    widths = [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, widths, constant_values=value)


def _block_stats(ids, pos, nblocks, block, padding):
    b = ids.shape[0]
    ids_r = ids.reshape(b, nblocks, block)
    pos_r = pos.reshape(b, nblocks, block)
    real = ids_r > 0 if padding else ids_r >= 0
    axes = (0, 2)
    return (
        jnp.any(real, axis=axes),
        jnp.min(jnp.where(real, ids_r, _BIG), axis=axes),
        jnp.max(jnp.where(real, ids_r, -_BIG), axis=axes),
        jnp.min(jnp.where(real, pos_r, _BIG), axis=axes),
        jnp.max(jnp.where(real, pos_r, -_BIG), axis=axes),
    )


def block_needed(ids_q, ids_kv, pos_q, pos_kv, spec: MaskSpec, block_q: int, block_kv: int):
    """Which (query block, key block) pairs may hold a visible pair.

    Lets :func:`blockwise_attention` skip blocks the mask empties, so sliding-window cost
    grows with the window, not with ``seq ** 2``. Conservative: a block pair marked needed may
    still turn out empty, but one marked not needed never holds a visible pair.

    Args:
        ids_q: ``[b, sq]`` query segment ids, ``sq`` a multiple of ``block_q``.
        ids_kv: ``[b, skv]`` key segment ids, ``skv`` a multiple of ``block_kv``.
        pos_q: ``[b, sq]`` query positions.
        pos_kv: ``[b, skv]`` key positions.
        spec: The mask rules (:class:`MaskSpec`).
        block_q: Queries per block.
        block_kv: Keys per block.

    Returns:
        ``[sq / block_q, skv / block_kv]`` boolean array (the same for every batch row).
    """
    nq, nk = ids_q.shape[1] // block_q, ids_kv.shape[1] // block_kv
    if spec.bounds:
        real_q = (ids_q <= pos_q).reshape(ids_q.shape[0], nq, block_q)
        lo = jnp.min(jnp.where(real_q, ids_q.reshape(real_q.shape), _BIG), axis=(0, 2))
        hi = jnp.max(jnp.where(real_q, pos_q.reshape(real_q.shape), -_BIG), axis=(0, 2))
        ka, _, _, kpmin, kpmax = _block_stats(ids_kv, pos_kv, nk, block_kv, False)
        return ka[None, :] & (lo[:, None] <= kpmax[None, :]) & (hi[:, None] >= kpmin[None, :])
    qa, qimin, qimax, qpmin, qpmax = _block_stats(ids_q, pos_q, nq, block_q, spec.padding)
    ka, kimin, kimax, kpmin, kpmax = _block_stats(ids_kv, pos_kv, nk, block_kv, spec.padding)
    need = qa[:, None] & ka[None, :]
    if spec.padding:
        need &= (qimin[:, None] <= kimax[None, :]) & (kimin[None, :] <= qimax[:, None])
    left, right = spec.window
    if spec.causal:
        need &= kpmin[None, :] <= qpmax[:, None]
    if right >= 0:
        need &= kpmin[None, :] <= qpmax[:, None] + right
    if left >= 0:
        need &= kpmax[None, :] >= qpmin[:, None] - left
    return need


def _needed_range(row):
    """``[lo, hi)`` spanning the needed blocks of one row of ``need`` (empty when none)."""
    n = row.shape[0]
    idx = jnp.arange(n)
    lo = jnp.min(jnp.where(row, idx, n))
    hi = jnp.max(jnp.where(row, idx + 1, 0))
    return lo, jnp.maximum(hi, lo)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(cfg, q, k, v, sink, ids_q, ids_kv, pos_q, pos_kv, need):
    out, lse, mx, _ = _flash_fwd_impl(cfg, q, k, v, sink, ids_q, ids_kv, pos_q, pos_kv, need)
    return out, lse, mx


def _blocks(x, nb, block):
    return x.reshape((x.shape[0], nb, block) + x.shape[2:])


def _flash_fwd_impl(cfg, q, k, v, sink, ids_q, ids_kv, pos_q, pos_kv, need):
    spec, scale, bq, bk, use_sink = cfg
    b, sq, hkv, g, d = q.shape
    dv = v.shape[-1]
    nq, nk = sq // bq, k.shape[1] // bk
    v_clean, bad = _clean_values(v.astype(jnp.float32))
    any_bad = jnp.any(bad)  # the usual case has none: skip the per-tile bookkeeping then
    kb, vb, badb = _blocks(k, nk, bk), _blocks(v_clean, nk, bk), _blocks(bad, nk, bk)
    ikb, pkb = _blocks(ids_kv, nk, bk), _blocks(pos_kv, nk, bk)

    def q_block(i):
        qi = lax.dynamic_slice_in_dim(q, i * bq, bq, axis=1).astype(jnp.float32)
        iq = lax.dynamic_slice_in_dim(ids_q, i * bq, bq, axis=1)
        pq = lax.dynamic_slice_in_dim(pos_q, i * bq, bq, axis=1)
        shape = (b, hkv, g, bq)
        if use_sink:
            m0 = jnp.broadcast_to(sink.reshape(1, hkv, g, 1), shape).astype(jnp.float32)
            l0 = jnp.ones(shape, jnp.float32)
        else:
            m0 = jnp.full(shape, -jnp.inf, jnp.float32)
            l0 = jnp.zeros(shape, jnp.float32)
        flags = jnp.zeros((b, hkv, 1, bq), bool)
        carry0 = (
            m0,
            l0,
            jnp.zeros(shape + (dv,), jnp.float32),
            jnp.full(shape, -jnp.inf, jnp.float32),
            flags,
            flags,
        )

        def kv_step(j, carry):
            def compute(carry):
                m, l, acc, mx, seen, poisoned = carry
                s = jnp.einsum("bqhgd,bkhd->bhgqk", qi, kb[:, j].astype(jnp.float32)) * scale
                vis = visibility(iq, ikb[:, j], pq, pkb[:, j], spec)[:, None, None]
                s = jnp.where(vis, s, -jnp.inf)  # NaN logits of masked pairs are dropped here
                s_max = jnp.max(s, axis=-1)
                m_new = jnp.maximum(m, s_max)
                m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
                alpha = jnp.exp(m - m_safe)
                p = jnp.exp(s - m_safe[..., None])
                l = l * alpha + jnp.sum(p, axis=-1)
                acc = acc * alpha[..., None] + jnp.einsum("bhgqk,bkhd->bhgqd", p, vb[:, j])
                poisoned = lax.cond(
                    any_bad, lambda: poisoned | _sees_bad(vis, badb[:, j]), lambda: poisoned
                )
                return m_new, l, acc, jnp.maximum(mx, s_max), seen | jnp.any(vis, axis=-1), poisoned

            return lax.cond(need[i, j], compute, lambda c: c, carry)

        lo, hi = _needed_range(need[i])
        m, l, acc, mx, seen, poisoned = lax.fori_loop(lo, hi, kv_step, carry0)
        row_real = (iq <= pq) if spec.bounds else (iq > 0) if spec.padding else (iq >= 0)
        seen = jnp.broadcast_to(seen & row_real[:, None, None, :], shape)
        out, lse = _finalize(m, l, acc, seen)
        poison = jnp.where(poisoned & seen, jnp.nan, 0.0)
        return out + poison[..., None], lse + poison, mx

    outs, lses, mxs = lax.map(q_block, jnp.arange(nq))
    # [nq, b, hkv, g, bq, ...] -> [b, sq, hkv, g, ...]
    out = outs.transpose(1, 0, 4, 2, 3, 5).reshape(b, sq, hkv, g, dv)
    lse = lses.transpose(1, 2, 3, 0, 4).reshape(b, hkv, g, sq)
    mx = mxs.transpose(1, 2, 3, 0, 4).reshape(b, hkv, g, sq)
    return out.astype(q.dtype), lse, mx, out


def _flash_fwd(cfg, q, k, v, sink, ids_q, ids_kv, pos_q, pos_kv, need):
    out, lse, mx, out_f32 = _flash_fwd_impl(cfg, q, k, v, sink, ids_q, ids_kv, pos_q, pos_kv, need)
    return (out, lse, mx), (q, k, v, sink, ids_q, ids_kv, pos_q, pos_kv, need, out_f32, lse)


def _flash_bwd(cfg, res, cts):
    spec, scale, bq, bk, use_sink = cfg
    q, k, v, sink, ids_q, ids_kv, pos_q, pos_kv, need, out, lse = res
    g_out, g_lse, _ = cts
    b, sq, hkv, g, d = q.shape
    skv = k.shape[1]
    nq, nk = sq // bq, skv // bk
    g_out = g_out.astype(jnp.float32)
    g_lse = jnp.zeros_like(lse) if g_lse is None else g_lse.astype(jnp.float32)
    # D_i = dO_i . O_i  (rowsum), [b, hkv, g, sq]
    delta = jnp.einsum("bqhgd,bqhgd->bhgq", g_out, out)
    dterm = g_lse - delta  # ds = p * (dp + dterm)

    def clean(x):
        return jnp.where(jnp.isfinite(x), x, 0.0)

    # Non-finite inputs are zeroed once, here, for the products below (see tile()).
    bad_do = ~jnp.all(jnp.isfinite(g_out), axis=-1)  # [b, sq, hkv, g]: this row's dO has a NaN/Inf
    any_bad_do = jnp.any(bad_do)
    dtypes = (q.dtype, k.dtype, v.dtype)  # gradients come back in the inputs' dtypes
    q, k, v, g_out = (clean(x.astype(jnp.float32)) for x in (q, k, v, g_out))

    def tile(i, j):
        # Non-finite inputs are zeroed inside the products and come back through the forward's
        # LSE instead: a row that saw a NaN has a NaN LSE, so its probabilities, dQ and the
        # dK/dV of the keys it sees are NaN; masked pairs stay exactly 0.
        iq = lax.dynamic_slice_in_dim(ids_q, i * bq, bq, axis=1)
        pq = lax.dynamic_slice_in_dim(pos_q, i * bq, bq, axis=1)
        ik = lax.dynamic_slice_in_dim(ids_kv, j * bk, bk, axis=1)
        pk = lax.dynamic_slice_in_dim(pos_kv, j * bk, bk, axis=1)
        vis = visibility(iq, ik, pq, pk, spec)[:, None, None]
        qi = lax.dynamic_slice_in_dim(q, i * bq, bq, axis=1)
        kj = lax.dynamic_slice_in_dim(k, j * bk, bk, axis=1)
        vj = lax.dynamic_slice_in_dim(v, j * bk, bk, axis=1)
        doi = lax.dynamic_slice_in_dim(g_out, i * bq, bq, axis=1)
        bad_i = jnp.transpose(lax.dynamic_slice_in_dim(bad_do, i * bq, bq, axis=1), (0, 2, 3, 1))[
            ..., None
        ]
        # dV of a key is NaN exactly when a row that sees it has a non-finite dO: [b, hkv, bk]
        dv_poison = lax.cond(
            any_bad_do,
            lambda: jnp.any(vis & bad_i, axis=(2, 3)),
            lambda: jnp.zeros((b, hkv, bk), bool),
        )
        lse_i = lax.dynamic_slice_in_dim(lse, i * bq, bq, axis=3)
        dt_i = lax.dynamic_slice_in_dim(dterm, i * bq, bq, axis=3)
        s = jnp.einsum("bqhgd,bkhd->bhgqk", qi, kj) * scale
        p = jnp.where(vis, jnp.exp(jnp.where(vis, s, 0.0) - lse_i[..., None]), 0.0)
        dp = jnp.einsum("bqhgd,bkhd->bhgqk", doi, vj)
        ds = jnp.where(vis, p * (dp + dt_i[..., None]), 0.0)
        return qi, kj, doi, p, ds, dv_poison

    def dq_block(i):
        def step(j, acc):
            def compute(acc):
                _, kj, _, _, ds, _ = tile(i, j)
                return acc + scale * jnp.einsum("bhgqk,bkhd->bqhgd", ds, kj)

            return lax.cond(need[i, j], compute, lambda a: a, acc)

        lo, hi = _needed_range(need[i])
        return lax.fori_loop(lo, hi, step, jnp.zeros((b, bq, hkv, g, d), jnp.float32))

    def dkv_block(j):
        def step(i, acc):
            def compute(acc):
                dk, dv = acc
                qi, _, doi, p, ds, dv_poison = tile(i, j)
                dv = dv + jnp.einsum("bhgqk,bqhgd->bkhd", p, doi)
                dv = jnp.where(jnp.transpose(dv_poison, (0, 2, 1))[..., None], jnp.nan, dv)
                dk = dk + scale * jnp.einsum("bhgqk,bqhgd->bkhd", ds, qi)
                return dk, dv

            return lax.cond(need[i, j], compute, lambda a: a, acc)

        zeros = (
            jnp.zeros((b, bk, hkv, d), jnp.float32),
            jnp.zeros((b, bk, hkv, v.shape[-1]), jnp.float32),
        )
        lo, hi = _needed_range(need[:, j])
        return lax.fori_loop(lo, hi, step, zeros)

    dq = lax.map(dq_block, jnp.arange(nq)).transpose(1, 0, 2, 3, 4, 5).reshape(q.shape)
    dk, dv = lax.map(dkv_block, jnp.arange(nk))
    dk = dk.transpose(1, 0, 2, 3, 4).reshape(k.shape)
    dv = dv.transpose(1, 0, 2, 3, 4).reshape(v.shape)
    if use_sink:
        alive = lse > LSE_EMPTY / 2
        p_sink = jnp.where(
            alive, jnp.exp(jnp.where(alive, sink.reshape(1, hkv, g, 1) - lse, 0.0)), 0.0
        )
        dsink = jnp.sum(p_sink * dterm, axis=(0, 3)).reshape(sink.shape).astype(sink.dtype)
    else:
        dsink = jnp.zeros_like(sink)
    none_int = [None] * 5
    return (dq.astype(dtypes[0]), dk.astype(dtypes[1]), dv.astype(dtypes[2]), dsink, *none_int)


_flash.defvjp(_flash_fwd, _flash_bwd)


def _round_block(block: int, length: int) -> int:
    return max(1, min(block, length))


def _padded_inputs(q, k, v, ids_q, ids_kv, pos_q, pos_kv, spec, block_q, block_kv):
    """Pad the sequence axes to whole blocks and compute which block pairs are needed."""
    # NumPy inputs behave as under jit (indexing them with a traced block index would fail)
    q, k, v, ids_q, ids_kv, pos_q, pos_kv = (
        jnp.asarray(x) for x in (q, k, v, ids_q, ids_kv, pos_q, pos_kv)
    )
    for name, blk in (("block_q", block_q), ("block_kv", block_kv)):
        if not isinstance(blk, int) or blk < 1:
            raise ValueError(f"{name} must be a positive int, got {name}={blk!r}.")
    check_qkv(q, k, v)
    sq, skv, hkv = q.shape[1], k.shape[1], k.shape[2]
    bq, bk = _round_block(block_q, sq), _round_block(block_kv, skv)
    sq_p, skv_p = -(-sq // bq) * bq, -(-skv // bk) * bk
    qp = _pad_seq(_split_gqa(q, hkv), sq_p, 0)
    kp, vp = _pad_seq(k, skv_p, 0), _pad_seq(v, skv_p, 0)
    iq, ik = (
        _pad_seq(ids_q.astype(jnp.int32), sq_p, -1),
        _pad_seq(ids_kv.astype(jnp.int32), skv_p, -1),
    )
    # padded query rows see nothing: ids -1 (segments), or the empty range [-1, -1 - 1] (bounds)
    pq = _pad_seq(pos_q.astype(jnp.int32), sq_p, -2 if spec.bounds else 0)
    pk = _pad_seq(pos_kv.astype(jnp.int32), skv_p, 0)
    need = lax.stop_gradient(block_needed(iq, ik, pq, pk, spec, bq, bk))
    return (qp, kp, vp, iq, ik, pq, pk, need), (bq, bk)


def _sink_array(sink, hq):
    return jnp.zeros((hq,), jnp.float32) if sink is None else sink.astype(jnp.float32).reshape(hq)


def blockwise_attention(
    q,
    k,
    v,
    ids_q,
    ids_kv,
    pos_q,
    pos_kv,
    *,
    scale: float,
    spec: MaskSpec = MaskSpec(),
    sink=None,
    block_q: int = 128,
    block_kv: int = 128,
    return_max_logit: bool = False,
):
    """Flash-style reference attention with the results of :func:`dense_attention`.

    Online softmax over KV blocks, with a hand-written backward that recomputes the
    probabilities. Blocks whose (segment, position) ranges cannot meet under the mask are
    skipped in the forward and in both backward passes, so sliding-window cost grows with the
    window, not with ``seq ** 2``.

    Args:
        q: ``[b, sq, hq, d]`` queries.
        k: ``[b, skv, hkv, d]`` keys.
        v: ``[b, skv, hkv, dv]`` values.
        ids_q: ``[b, sq]`` segment ids of the queries (0 = padding).
        ids_kv: ``[b, skv]`` segment ids of the keys.
        pos_q: ``[b, sq]`` positions of the queries inside their segments.
        pos_kv: ``[b, skv]`` positions of the keys.
        scale: Factor applied to ``q.k``.
        spec: The mask rules (:class:`MaskSpec`).
        sink: Optional ``[hq]`` float32 sink logits, as in :func:`dense_attention`.
        block_q: Queries per block (capped at ``sq``; the sequence is padded to whole blocks).
        block_kv: Keys per block (capped at ``skv``).
        return_max_logit: Also return the per-row maximum visible logit.

    Returns:
        ``(out, lse)`` as :func:`dense_attention`; with ``return_max_logit``,
        ``(out, lse, max_logit)`` where ``max_logit`` is ``[b, hq, sq]`` float32 and not
        differentiated.

    Raises:
        ValueError: If a block size is not a positive int, or ``q``, ``k`` and ``v`` do not
            have compatible shapes.
    """
    b, sq, hq, _ = q.shape
    (qp, kp, vp, iq, ik, pq, pk, need), (bq, bk) = _padded_inputs(
        q, k, v, ids_q, ids_kv, pos_q, pos_kv, spec, block_q, block_kv
    )
    cfg = (spec, float(scale), bq, bk, sink is not None)
    out, lse, mx = _flash(cfg, qp, kp, vp, _sink_array(sink, hq), iq, ik, pq, pk, need)
    out = out[:, :sq].reshape(b, sq, hq, -1)
    lse = lse[..., :sq].reshape(b, hq, sq)
    if return_max_logit:
        return out, lse, lax.stop_gradient(mx[..., :sq].reshape(b, hq, sq))
    return out, lse


def blockwise_backward(
    q,
    k,
    v,
    ids_q,
    ids_kv,
    pos_q,
    pos_kv,
    out,
    lse,
    dout,
    *,
    scale: float,
    spec: MaskSpec = MaskSpec(),
    sink=None,
    block_q: int = 128,
    block_kv: int = 128,
):
    """Gradients of :func:`blockwise_attention` from a *given* output and LSE.

    A flash kernel's backward does not recompute the softmax normaliser; it takes the
    forward's ``out`` and ``lse`` (``P = exp(S - lse)``, ``D = rowsum(dO * O)``). Ring
    attention relies on that: every step's backward is handed the *merged* output and LSE.

    Args:
        q: ``[b, sq, hq, d]`` queries.
        k: ``[b, skv, hkv, d]`` keys.
        v: ``[b, skv, hkv, dv]`` values.
        ids_q: ``[b, sq]`` segment ids of the queries.
        ids_kv: ``[b, skv]`` segment ids of the keys.
        pos_q: ``[b, sq]`` positions of the queries.
        pos_kv: ``[b, skv]`` positions of the keys.
        out: ``[b, sq, hq, dv]`` forward output to differentiate at.
        lse: ``[b, hq, sq]`` forward log-sum-exp.
        dout: ``[b, sq, hq, dv]`` gradient of the output.
        scale: Factor applied to ``q.k``.
        spec: The mask rules (:class:`MaskSpec`).
        sink: Optional ``[hq]`` float32 sink logits.
        block_q: Queries per block.
        block_kv: Keys per block.

    Returns:
        ``(dq, dk, dv, dsink)``: ``dq``, ``dk``, ``dv`` in the dtypes of ``q``, ``k``, ``v``;
        ``dsink`` is ``[hq]`` float32 (zeros without a sink).

    Raises:
        ValueError: If a block size is not a positive int, or ``q``, ``k`` and ``v`` do not
            have compatible shapes.
    """
    b, sq, hq, _ = q.shape
    hkv = k.shape[2]
    (qp, kp, vp, iq, ik, pq, pk, need), (bq, bk) = _padded_inputs(
        q, k, v, ids_q, ids_kv, pos_q, pos_kv, spec, block_q, block_kv
    )
    sq_p = qp.shape[1]
    cfg = (spec, float(scale), bq, bk, sink is not None)
    out_p = _pad_seq(_split_gqa(out.astype(jnp.float32), hkv), sq_p, 0.0)
    dout_p = _pad_seq(_split_gqa(dout.astype(jnp.float32), hkv), sq_p, 0.0)
    lse_p = jnp.pad(
        lse.astype(jnp.float32).reshape(b, hkv, hq // hkv, sq),
        [(0, 0)] * 3 + [(0, sq_p - sq)],
        constant_values=LSE_EMPTY,
    )
    sink_arr = _sink_array(sink, hq)
    res = (qp, kp, vp, sink_arr, iq, ik, pq, pk, need, out_p, lse_p)
    dq, dk, dv, dsink, *_ = _flash_bwd(cfg, res, (dout_p, None, None))
    return (
        dq[:, :sq].reshape(q.shape).astype(q.dtype),
        dk[:, : k.shape[1]].astype(k.dtype),
        dv[:, : v.shape[1]].astype(v.dtype),
        dsink,
    )
