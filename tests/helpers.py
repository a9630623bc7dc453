"""What several test files and test scripts share: independent oracles and input builders.

* NumPy oracles: TE's mask stated on its own (:func:`np_visible`) and a float64 softmax over the
  visible keys (:func:`np_attention`); :func:`oracle_fn` is ``jax.nn.dot_product_attention``
  (XLA) with its gradients, jitted once per scale.
* Packed layouts: :func:`random_layout` (NumPy's random generator) and :func:`packed_rows`
  (a Hypothesis strategy).
* :func:`run_script`: a script through the ``python -m tutorial_utils.te_on_cpu`` runner.

``tests/conftest.py`` puts ``tests/`` on the path of the test run and of its subprocesses, so
``import helpers`` works in every test folder and in ``tests/scripts/``.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- packed layouts


def random_layout(rng, batch, seq, max_segments=4, empty_last_row=False):
    """Packed rows: segments with ids 1..n in order, pos 0.. inside each, padding (id 0) around
    them.

    Args:
        rng: a ``numpy.random.Generator``.
        batch: the number of rows.
        seq: the row length.
        max_segments: the most segments in a row.
        empty_last_row: the last row holds padding only.

    Returns:
        ``(ids, pos)``, int32 arrays of shape ``[batch, seq]``.
    """
    ids = np.zeros((batch, seq), np.int32)
    pos = np.zeros((batch, seq), np.int32)
    for r in range(batch):
        if empty_last_row and r == batch - 1:
            pos[r] = np.arange(seq)
            continue
        n = int(rng.integers(1, max_segments + 1))
        cuts = sorted(rng.choice(np.arange(1, seq), n - 1, replace=False).tolist()) if n > 1 else []
        bounds = [0, *cuts, seq]
        for sid, (a, e) in enumerate(zip(bounds[:-1], bounds[1:]), start=1):
            lead = int(rng.integers(0, 2)) if e - a > 1 else 0
            valid = int(rng.integers(1, e - a - lead + 1))
            ids[r, a + lead : a + lead + valid] = sid
            pos[r, a : a + lead] = np.arange(lead)
            pos[r, a + lead : e] = np.arange(
                e - a - lead
            )  # padding after the segment keeps counting
    return ids, pos


@st.composite
def packed_rows(draw, batch, seq, cp, stripe, max_segments=6):
    """Well-formed rows: ids 1..N in order, contiguous, pos from 0; padding anywhere with any
    positions.

    Args:
        draw: Hypothesis's draw function (given by ``st.composite``).
        batch: the number of rows.
        seq: the row length.
        cp: the CP size (segment starts may align to ``cp * stripe``).
        stripe: the stripe size.
        max_segments: the most segments in a row.

    Returns:
        A strategy of ``(ids, pos)``, int32 arrays of shape ``[batch, seq]``.
    """
    ids = np.zeros((batch, seq), np.int32)
    pos = np.zeros((batch, seq), np.int32)
    align = draw(st.sampled_from([1, cp * stripe, 3]))
    restart = draw(st.booleans())
    for b in range(batch):
        t, sid = 0, 1
        while t < seq and sid <= max_segments:
            t += (-t) % align
            if t >= seq:
                break
            n = min(draw(st.integers(1, seq // 2)), seq - t)
            ids[b, t : t + n] = sid
            pos[b, t : t + n] = np.arange(n)
            pad = min(draw(st.integers(0, 5)), seq - t - n)
            pos[b, t + n : t + n + pad] = np.arange(pad) if restart else np.arange(n, n + pad)
            t, sid = t + n + pad, sid + 1
    return ids, pos


# ----------------------------------------------------------------------------- independent oracles


def np_visible(ids_q, ids_kv, pos_q, pos_kv, *, causal, window, padding=True):
    """Independent statement of TE's mask (§0 of the semantics notes), numpy, [b, sq, skv].

    Args:
        ids_q: query segment ids, ``[b, sq]``.
        ids_kv: key segment ids, ``[b, skv]``.
        pos_q: query positions, ``[b, sq]``.
        pos_kv: key positions, ``[b, skv]``.
        causal: keys after the query are hidden.
        window: ``(left, right)``; -1 is unbounded.
        padding: id 0 is padding and a query sees keys of its own segment only.

    Returns:
        A boolean array ``[b, sq, skv]``: which keys each query sees.
    """
    iq, ik = ids_q[:, :, None], ids_kv[:, None, :]
    pq, pk = pos_q[:, :, None], pos_kv[:, None, :]
    vis = np.ones(iq.shape[:2] + ik.shape[2:], bool)
    if padding:
        vis &= (iq == ik) & (iq != 0)
    if causal:
        vis &= pk <= pq
    left, right = window
    if left >= 0:
        vis &= pk >= pq - left
    if right >= 0:
        vis &= pk <= pq + right
    return vis


def np_attention(q, k, v, mask, scale, sink=None):
    """float64 ``softmax`` over visible keys, with ``exp(sink_h)`` added to the denominator.

    Args:
        q: queries ``[b, sq, hq, d]``.
        k: keys ``[b, skv, hkv, d]`` (GQA: query head h reads kv head ``h // (hq // hkv)``).
        v: values, shaped as ``k``.
        mask: visible keys, ``[b, sq, skv]`` (:func:`np_visible`).
        scale: the logits' scale.
        sink: per-head sink logits ``[hq]``, or None.

    Returns:
        ``(out, logits)``: ``out`` ``[b, sq, hq, d]`` (0 where a query sees no key) and the
        scaled logits ``[b, hq, sq, skv]``, float64.
    """
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)  # head h reads kv head h // g
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    e = np.where(mask[:, None], np.exp(s), 0.0)
    den = e.sum(-1)
    if sink is not None:
        den = den + np.exp(np.asarray(sink, np.float64))[None, :, None]
    num = np.einsum("bhqk,bkhd->bhqd", e, v)
    out = np.where(den[..., None] > 0, num / np.where(den > 0, den, 1.0)[..., None], 0.0)
    return out.transpose(0, 2, 1, 3), s


@functools.cache
def oracle_fn(scale):
    """``jax.nn.dot_product_attention(implementation="xla")`` and its gradients, jitted.

    Args:
        scale: the logits' scale.

    Returns:
        ``run(q, k, v, mask, dout) -> (out, (dq, dk, dv))`` for the loss ``sum(out * dout)``;
        ``mask`` is ``[b, sq, skv]``.
    """

    def run(q, k, v, mask, dout):
        def loss(q, k, v):
            out = jax.nn.dot_product_attention(
                q, k, v, mask=mask[:, None], scale=scale, implementation="xla"
            )
            return jnp.sum(out * dout), out

        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
        return out, grads

    return jax.jit(run)


# ----------------------------------------------------------------------------- the runner


def run_script(script, devices, *args, timeout=900):
    """Run ``script`` through ``python -m tutorial_utils.te_on_cpu --devices N``.

    Args:
        script: the script's path.
        devices: the number of simulated CPU devices.
        *args: the script's own arguments.
        timeout: seconds before the run is stopped.

    Returns:
        The finished ``subprocess.CompletedProcess`` (text output captured).
    """
    env = {
        k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "TUTORIAL_TE_ON_CPU_RUNNER")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tutorial_utils.te_on_cpu",
            "--devices",
            str(devices),
            str(script),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )
