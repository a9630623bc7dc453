"""NaN means NaN, and poisons nothing needlessly.

The rule (stated in the FAQ): a query row whose own logits or visible values hold a NaN/Inf
comes out NaN, never 0; every other row is exactly what it would be without the bad entries,
padding rows stay exactly 0, and a NaN never reaches a segment that cannot see it. Checked
against a float64 NumPy oracle for the blockwise reference kernel (single device and the
Ring / AllGather strategies of ``context_parallel_attention``) and for TE's own code on CPU
(single device, AllGather and Ring), forward and backward.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import np_attention, np_visible
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tutorial_utils import te_on_cpu
from tutorial_utils.context_parallel import context_parallel_attention
from tutorial_utils.reference import MaskSpec, blockwise_attention
from tutorial_utils.reorder import (
    ReorderStrategy,
    inverse_reorder_causal_load_balancing,
    reorder_causal_load_balancing,
)

S, CP = 32, 4
IDS = np.array([[1] * 10 + [0] * 2 + [2] * 12 + [0] * 8], np.int32)
POS = np.array([list(range(12)) + list(range(20))], np.int32)  # padding positions keep counting
VIS = np.asarray(np_visible(IDS, IDS, POS, POS, causal=True, window=(-1, -1)))[0]  # [S, S]

# (name, tensor, token, value): one bad entry each
CASES = [
    ("nan-v-padding", "v", 11, np.nan),  # nobody sees it: nothing changes
    ("nan-v-segment1", "v", 3, np.nan),  # rows 3..9 of segment 1 see it; segment 2 must not change
    ("inf-v-segment2", "v", 14, np.inf),
    ("nan-k-padding", "k", 30, np.nan),
    ("nan-k-segment2", "k", 20, np.nan),
    ("nan-q-segment1", "q", 5, np.nan),  # only row 5 is affected
    ("nan-q-padding", "q", 26, np.nan),
]


def _inputs(case):
    _, tensor, token, value = case
    ks = jax.random.split(jax.random.PRNGKey(7), 4)
    q, k, v, dout = (
        np.array(jax.random.normal(key, (1, S, h, 8)), np.float32)
        for key, h in zip(ks, (2, 1, 1, 2))
    )
    arrays = {"q": q, "k": k, "v": v}
    arrays[tensor][0, token, 0, 0] = value
    return arrays["q"], arrays["k"], arrays["v"], dout


def _expected(case):
    """(rows that must be NaN, keys whose dK/dV may be NaN, float64 output of every other row)."""
    _, tensor, token, _ = case
    if tensor == "q":
        bad_rows = {token} if VIS[token].any() else set()
    else:
        bad_rows = set(np.nonzero(VIS[:, token])[0].tolist())
    may_keys = set(np.nonzero(VIS[sorted(bad_rows)].any(axis=0))[0].tolist()) if bad_rows else set()
    q, k, v, _ = _inputs(case)
    clean = [np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0) for x in (q, k, v)]
    want, _ = np_attention(*clean, VIS[None], 0.5)
    return bad_rows, may_keys, want


def _check(case, out, grads, what):
    bad_rows, may_keys, want = _expected(case)
    out = np.asarray(out, np.float32)[0]
    nan_rows = set(np.nonzero(np.isnan(out).any(axis=(1, 2)))[0].tolist())
    assert nan_rows == bad_rows, f"{what}: NaN rows {sorted(nan_rows)}, expected {sorted(bad_rows)}"
    ok = [i for i in range(S) if i not in bad_rows]
    np.testing.assert_allclose(
        out[ok], want[0][ok], atol=2e-5, rtol=2e-5, err_msg=f"{what}: unaffected rows"
    )
    assert np.all(out[IDS[0] == 0] == 0.0), f"{what}: padding rows must stay exactly 0"
    dq, dk, dv = (np.asarray(g, np.float32)[0] for g in grads)
    dq_nan = set(np.nonzero(np.isnan(dq).any(axis=(1, 2)))[0].tolist())
    assert dq_nan == bad_rows, f"{what}: dQ NaN rows {sorted(dq_nan)}, expected {sorted(bad_rows)}"
    for name, g in (("dK", dk), ("dV", dv)):
        nan_keys = set(np.nonzero(np.isnan(g).any(axis=(1, 2)))[0].tolist())
        assert nan_keys <= may_keys, (
            f"{what}: {name} NaN at keys {sorted(nan_keys - may_keys)} no NaN row sees"
        )
    assert (
        np.all(dq[IDS[0] == 0] == 0)
        and np.all(dk[IDS[0] == 0] == 0)
        and np.all(dv[IDS[0] == 0] == 0)
    )


def _fwd_bwd(fn, q, k, v, dout, valid=IDS > 0):
    """Outputs and gradients of ``sum(out * dout)`` over valid (non-padding) rows, in ``valid``'s
    order."""

    def loss(q, k, v):
        out = fn(q, k, v)
        return jnp.sum(jnp.where(jnp.asarray(valid)[..., None, None], out * dout, 0.0)), out

    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return out, grads


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_blockwise_single_device(case):
    q, k, v, dout = _inputs(case)
    ids, pos = jnp.asarray(IDS), jnp.asarray(POS)

    def fn(q, k, v):
        return blockwise_attention(
            q, k, v, ids, ids, pos, pos, scale=0.5, spec=MaskSpec(), block_q=8, block_kv=8
        )[0]

    _check(case, *_fwd_bwd(fn, q, k, v, dout), "blockwise")


def _striped(x, cp=CP, stripe=1, inverse=False):
    fn = inverse_reorder_causal_load_balancing if inverse else reorder_causal_load_balancing
    return fn(x, ReorderStrategy.Striped, cp, 1, stripe)


@functools.cache
def _reference_cp_step(strategy):
    mesh = Mesh(np.array(jax.devices()[:CP]), ("cp",))
    ids, pos = _striped(jnp.asarray(IDS)), _striped(jnp.asarray(POS))

    def fn(q, k, v):
        return context_parallel_attention(
            q,
            k,
            v,
            ids,
            pos,
            mesh=mesh,
            strategy=strategy,
            stripe_size=1,
            load_balanced=True,
            scaling_factor=0.5,
        )

    valid = _striped(jnp.asarray(IDS > 0))
    return jax.jit(lambda q, k, v, dout: _fwd_bwd(fn, q, k, v, dout, valid=valid))


@pytest.mark.parametrize("strategy", ["ring", "allgather"])
@pytest.mark.parametrize("case", CASES[1:6], ids=[c[0] for c in CASES[1:6]])
def test_reference_context_parallel(case, strategy):
    out, grads = _reference_cp_step(strategy)(*(_striped(jnp.asarray(x)) for x in _inputs(case)))
    _check(
        case,
        _striped(out, inverse=True),
        tuple(_striped(g, inverse=True) for g in grads),
        f"reference {strategy}",
    )


TE = te_on_cpu.install()
from transformer_engine.jax import attention as A  # noqa: E402
from transformer_engine.jax.sharding import MeshResource  # noqa: E402


def _te_fn(cp, strategy):
    kw = {}
    if cp > 1:
        kw = dict(
            context_parallel_strategy=(
                A.CPStrategy.RING if strategy == "ring" else A.CPStrategy.ALL_GATHER
            ),
            context_parallel_causal_load_balanced=True,
            context_parallel_axis="cp",
            stripe_size=1,
        )

    def fn(q, k, v, ids, pos):
        return A.fused_attn(
            (q, k, v),
            None,
            A.SequenceDescriptor.from_segment_ids_and_pos(ids, pos),
            None,
            A.AttnBiasType.NO_BIAS,
            A.AttnMaskType.PADDING_CAUSAL_MASK,
            A.QKVLayout.THD_THD_THD,
            A.AttnSoftmaxType.VANILLA_SOFTMAX,
            0.5,
            0.0,
            True,
            max_segments_per_seq=2,
            **kw,
        )

    return fn


@functools.cache
def _te_step(cp, strategy):
    fn = _te_fn(cp, strategy)
    if cp == 1:
        ids, pos = jnp.asarray(IDS), jnp.asarray(POS)
        step = jax.jit(
            lambda q, k, v, dout: _fwd_bwd(lambda a, b, c: fn(a, b, c, ids, pos), q, k, v, dout)
        )
        return lambda *arrays: step(*(jnp.asarray(x) for x in arrays))
    mesh = Mesh(np.array(jax.devices()[:cp]), ("cp",))
    sh = NamedSharding(mesh, P(None, "cp"))
    valid = _striped(jnp.asarray(IDS > 0))
    step = jax.jit(
        lambda q, k, v, dout, ids, pos: _fwd_bwd(
            lambda a, b, c: fn(a, b, c, ids, pos), q, k, v, dout, valid=valid
        ),
        in_shardings=(sh,) * 6,
    )

    def call(q, k, v, dout):
        args = [jax.device_put(_striped(jnp.asarray(x)), sh) for x in (q, k, v, dout, IDS, POS)]
        with jax.set_mesh(mesh), TE.autocast(mesh_resource=MeshResource(cp_resource="cp")):
            out, grads = step(*args)
        return _striped(out, inverse=True), tuple(_striped(g, inverse=True) for g in grads)

    return call


@pytest.mark.parametrize("cp, strategy", [(1, None), (CP, "allgather"), (CP, "ring")])
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[4], CASES[5]], ids=lambda c: c[0])
def test_te_on_cpu(case, cp, strategy):
    with te_on_cpu.allow_fp32():
        out, grads = _te_step(cp, strategy)(*_inputs(case))
    _check(case, out, grads, f"TE-on-CPU cp={cp} {strategy or 'single'}")
