"""The compiled stand-in kernel (te_on_cpu/kernel.py + cpu_attention_kernel.cc) against the JAX one.

te_on_cpu puts a kernel where cuDNN's would be. The JAX kernel (reference.blockwise_attention in
bounds mode) is checked against oracles elsewhere (tests/core/test_reference.py,
test_nan_semantics.py); here the compiled kernel must give the same forward (output, LSE, max logit)
and backward (dQ, dK, dV, dsink) on ragged key ranges, empty rows, GQA, a sink, and NaN/Inf inputs
in and out of what rows see. Tolerance: float32 rounding only, 2e-5 relative and absolute; NaN
positions must match exactly, and rows that see no key must give exact zeros. One documented
difference: the max logit of a row with a NaN logit is NaN here, while the JAX kernel's follows
XLA's max reduction (which may skip the NaN); the NaN test compares the max logit on the other rows
only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tutorial_utils.reference import MaskSpec, blockwise_attention, blockwise_backward
from tutorial_utils.te_on_cpu import kernel as cpu_kernel

TOL = dict(rtol=2e-5, atol=2e-5)

pytestmark = pytest.mark.skipif(
    not cpu_kernel.load()[0], reason=f"no compiled kernel: {cpu_kernel.load()[1]}"
)


def _problem(seed, b=2, sq=40, skv=56, hq=4, hkv=2, d=8, dv=6):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, sq, hq, d)).astype(np.float32)
    k = rng.normal(size=(b, skv, hkv, d)).astype(np.float32)
    v = rng.normal(size=(b, skv, hkv, dv)).astype(np.float32)
    dout = rng.normal(size=(b, sq, hq, dv)).astype(np.float32)
    lo = rng.integers(-5, skv, size=(b, sq)).astype(np.int32)
    hi = (lo + rng.integers(-3, 30, size=(b, sq))).astype(
        np.int32
    )  # some rows empty (hi < lo), some past the end
    hi[:, :3] = lo[:, :3] - 1  # three empty rows per batch for certain
    return q, k, v, dout, lo, hi


def _jax_kernel(q, k, v, dout, lo, hi, sink, scale):
    rows = jnp.broadcast_to(jnp.arange(k.shape[1], dtype=jnp.int32), (k.shape[0], k.shape[1]))
    ranges = (jnp.asarray(lo), rows, jnp.asarray(hi), rows)
    spec = MaskSpec(bounds=True)
    out, lse, mx = blockwise_attention(
        q, k, v, *ranges, scale=scale, spec=spec, sink=sink, return_max_logit=True
    )
    grads = blockwise_backward(q, k, v, *ranges, out, lse, dout, scale=scale, spec=spec, sink=sink)
    return [np.asarray(x) for x in (out, lse, mx, *grads)]


def _compiled(q, k, v, dout, lo, hi, sink, scale):
    out, lse, mx = jax.jit(lambda *a: cpu_kernel.attention_fwd(*a, scale=scale))(
        q, k, v, lo, hi, sink
    )
    grads = jax.jit(lambda *a: cpu_kernel.attention_bwd(*a, scale=scale))(
        q, k, v, lo, hi, out, lse, dout, sink
    )
    return [np.asarray(x) for x in (out, lse, mx, *grads)]


NAMES = ("out", "lse", "max_logit", "dq", "dk", "dv", "dsink")


def _mismatches(got, want, skip_max_logit_of=None):
    """Names of the results that differ: NaN positions or values beyond TOL."""
    bad = []
    for name, g, w in zip(NAMES, got, want):
        if name == "max_logit" and skip_max_logit_of is not None:
            g, w = g[~skip_max_logit_of], w[~skip_max_logit_of]
        if name == "dsink" and not np.any(w):  # no sink: the JAX kernel returns zeros, so must we
            ok = not np.any(g)
        else:
            ok = np.array_equal(np.isnan(g), np.isnan(w)) and np.allclose(
                np.nan_to_num(g), np.nan_to_num(w), **TOL
            )
        if not ok:
            bad.append(name)
    return bad


@pytest.mark.parametrize("sink", [None, "learned"])
@pytest.mark.parametrize("seed", [0, 1])
def test_compiled_kernel_matches_the_jax_kernel(seed, sink):
    q, k, v, dout, lo, hi = _problem(seed)
    s = (
        None
        if sink is None
        else jnp.asarray(np.random.default_rng(seed + 9).normal(size=q.shape[2]), jnp.float32)
    )
    got, want = (
        _compiled(q, k, v, dout, lo, hi, s, 0.35),
        _jax_kernel(q, k, v, dout, lo, hi, s, 0.35),
    )
    assert _mismatches(got, want) == []
    empty = lo > hi
    out, lse = got[0], got[1]
    assert np.all(out[empty] == 0.0) and np.all(lse.transpose(0, 2, 1)[empty] == -1.0e30)
    assert np.all(got[3][empty] == 0.0), "rows that see no key get exactly zero dQ"


def test_non_finite_inputs_reach_exactly_the_rows_that_see_them():
    q, k, v, dout, lo, hi = _problem(3, sq=24, skv=24)
    lo[:] = np.arange(24) - 4  # a sliding window of 5 keys per row, rows see different keys
    hi[:] = np.arange(24)
    k[0, 10, 1, 2] = (
        np.nan
    )  # a visible logit goes NaN for the rows 10..14 of KV head 1's query heads
    v[1, 5, 0, 0] = np.inf  # a visible value: rows 5..9 of batch 1
    dout[0, 20, 3, 1] = np.nan  # a row's dO: dV of keys 16..20 goes NaN
    q[1, 0, 2, :] = np.nan  # row 0 of batch 1 sees key 0 only: its logit is NaN
    got, want = (
        _compiled(q, k, v, dout, lo, hi, None, 0.5),
        _jax_kernel(q, k, v, dout, lo, hi, None, 0.5),
    )
    nan_logit = np.isnan(got[2])  # [b, hq, sq]: rows with a NaN logit
    assert nan_logit[0, 2:, 10:15].all() and nan_logit[1, 2, 0] and nan_logit.sum() == 2 * 5 + 1
    assert _mismatches(got, want, skip_max_logit_of=nan_logit) == []
    assert np.isnan(got[0][0, 12, 2]).all() and not np.isnan(got[0][0, 16]).any()
    assert np.isnan(got[0][1, 7, 0]).all() and not np.isnan(got[0][1, 11]).any()


def test_the_comparison_fails_on_a_deliberately_broken_kernel_input():
    """The parity check can fail: widening every range by one key changes results it notices."""
    q, k, v, dout, lo, hi = _problem(5)
    want = _jax_kernel(q, k, v, dout, lo, hi, None, 0.35)
    assert set(_mismatches(_compiled(q, k, v, dout, lo, hi + 1, None, 0.35), want)) >= {
        "out",
        "lse",
        "dq",
    }
    flipped = dout.copy()
    flipped[0, 5] *= -1
    assert "dq" in _mismatches(_compiled(q, k, v, flipped, lo, hi, None, 0.35), want)


def test_te_on_cpu_lowers_to_one_custom_call_unless_told_to_use_jax(monkeypatch):
    from tutorial_utils import te_on_cpu

    A = te_on_cpu.install().attention
    q = jnp.zeros((1, 16, 2, 8), jnp.bfloat16)

    def f(q):
        return A.fused_attn(
            (q, q, q),
            None,
            None,
            None,
            A.AttnBiasType.NO_BIAS,
            A.AttnMaskType.CAUSAL_MASK,
            A.QKVLayout.BSHD_BSHD_BSHD,
            A.AttnSoftmaxType.VANILLA_SOFTMAX,
            0.3,
            0.0,
            True,
        )

    text = jax.jit(f).lower(q).as_text()
    assert cpu_kernel.FWD_TARGET in text
    monkeypatch.setenv("TUTORIAL_CPU_KERNEL", "jax")
    assert cpu_kernel.FWD_TARGET not in jax.jit(lambda q: f(q) * 1).lower(q).as_text()


def test_kernel_choice_is_checked_and_a_missing_compiler_is_explained(monkeypatch):
    monkeypatch.setenv("TUTORIAL_CPU_KERNEL", "fast")
    with pytest.raises(
        ValueError, match=r"TUTORIAL_CPU_KERNEL='fast' must be one of auto, cpp, jax"
    ):
        cpu_kernel.use_compiled()
    monkeypatch.setattr(cpu_kernel, "_state", {"loaded": None, "why_not": None})
    monkeypatch.setattr(cpu_kernel, "_compiler", lambda: None)
    monkeypatch.setenv("TUTORIAL_CPU_KERNEL", "auto")
    assert cpu_kernel.use_compiled() is False
    assert "no C++ compiler found" in cpu_kernel.status()
    monkeypatch.setenv("TUTORIAL_CPU_KERNEL", "cpp")
    with pytest.raises(
        RuntimeError, match=r"TUTORIAL_CPU_KERNEL=cpp but the compiled kernel is unavailable"
    ):
        cpu_kernel.use_compiled()


def test_bad_shapes_are_refused_naming_the_argument():
    q, k, v, dout, lo, hi = _problem(0)
    with pytest.raises(
        ValueError, match=r"lo.shape=\(2, 39\) must be q's \[batch, seq\] = \(2, 40\)"
    ):
        cpu_kernel.attention_fwd(q, k, v, lo[:, 1:], hi, None, scale=0.3)
    with pytest.raises(
        ValueError, match=r"q has 4 heads and k 3: query heads must be a multiple of KV heads"
    ):
        cpu_kernel.attention_fwd(
            q,
            np.zeros((2, 56, 3, 8), np.float32),
            np.zeros((2, 56, 3, 6), np.float32),
            lo,
            hi,
            None,
            scale=0.3,
        )
    with pytest.raises(
        ValueError, match=r"k.shape=\(56, 2, 8\) must be \[batch, seq, heads, head_dim\]"
    ):
        cpu_kernel.attention_bwd(q, k[0], v, lo, hi, q, lo, dout, None, scale=0.3)


@pytest.mark.parametrize("locked", [True, False])
def test_builders_that_start_together_build_the_library_once(locked, tmp_path, monkeypatch):
    """Two builders of the same library (two workers, or a worker and the site build): one compiles,
    the other waits.

    Without the lock both compile, which is what the test run's processes did before it.
    """
    import contextlib
    import threading
    import time

    monkeypatch.setenv("TUTORIAL_CPU_KERNEL_CACHE", str(tmp_path))
    if not locked:
        monkeypatch.setattr(cpu_kernel, "_build_lock", lambda path: contextlib.nullcontext())
    compiles = []

    def fake_compile(cxx, include, target, folder):
        compiles.append(target.name)
        time.sleep(0.3)  # long enough for the other builder to arrive while this one works
        target.write_bytes(b"library")
        return target

    monkeypatch.setattr(cpu_kernel, "_compile", fake_compile)
    built = []
    threads = [
        threading.Thread(target=lambda: built.append(cpu_kernel._build("true", str(tmp_path))))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 2 and built[0] == built[1] and built[0].read_bytes() == b"library"
    assert len(compiles) == (1 if locked else 2), compiles
