"""Calibrate ``tutorial_utils.gradient_check.check_cp_gradients`` on correct and broken CP runs.

Run with ``.venv/bin/python -m tutorial_utils.te_on_cpu --devices 8
benchmarks/gradient_check_matrix.py`` (or ``python benchmarks/gradient_check_matrix.py``,
which simulates 8 CPU devices itself). Not a test. TE's own JAX code runs on CPU with the
stand-in kernel, so whatever TE computes wrong on a GPU it computes wrong here too.

Each run gives three gradient pytrees of one model on one packed batch: CP in bfloat16, one
device in bfloat16, and a float32 reference on one device; ``check_cp_gradients`` judges them.
The models:

* ``ch9``: chapter 9's decoder ported to TE's Flax ``DotProductAttention`` (Ring through the
  layer; AllGather through ``fused_attn`` with ``stripe_size``, which the layer does not take);
  reference: the model as written, its einsum attention in float32 (which also runs on a GPU);
* ``ch7``: chapter 7's language model (``tutorial_utils.model``, through the ``te`` facade);
  reference: the same model in float32, TE's code under ``te_on_cpu.allow_fp32()``;
* ``gqa``: a grouped-query model (8 query heads, 2 KV heads) whose layers alternate a local
  sliding window and global attention (``window_size=None``), calling TE's ``fused_attn``;
  reference: its own einsum attention in float32.

Correct runs: each model with Ring (stripe 1) and AllGather (stripe 4), CP 2, 4 and 8. Broken
runs, Ring over 4 devices: the batch not reordered, a shift inside the model, a window one
token too wide in the CP run, ``(-1, 0)`` for "no window", a window narrower than ``cp - 1``,
and a batch striped with stripe 4. The facade refuses the last three with an error, so they
call TE's ``fused_attn`` directly (TE computes them without one), as their rows note. Two more
rows run chapter 9's decoder in float32 (TE's code under ``allow_fp32()``), correct and not
reordered: there one device is ~1e-7 from the reference, and the floor sets the bound.

Output: a table on stdout and ``results/gradient_check/matrix.json`` (the environment, the
settings, one row per run and the headroom both ways); exit status 1 when a verdict differs
from the expected one (a false alarm or a miss). ``--only ID ...`` runs some rows (``--list``
prints the ids); about 4 minutes for all on 2 cores.

TE's JAX package can be imported only after ``te_on_cpu.install()`` has put its stand-in
extension in place, so the imports of JAX, Flax and TE follow that call.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
os.environ["TUTORIAL_TE_BACKEND"] = "te-cpu"  # the facade (chapter 7's model) runs TE's code too
# every run compiles its own small program, and compiling is most of the time: XLA's lowest
# backend optimisation cuts it by about a third (read when JAX starts its CPU backend, below)
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
).strip()

from tutorial_utils import te_on_cpu  # noqa: E402

if not te_on_cpu.installed():  # run as a plain script, not through `-m tutorial_utils.te_on_cpu`
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        te_on_cpu.simulate_cpu_devices(8)
    te_on_cpu.install()

import flax  # noqa: E402
import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import transformer_engine.jax as te  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from transformer_engine.jax import attention as te_attention  # noqa: E402
from transformer_engine.jax.attention import (  # noqa: E402
    CPStrategy,
    ReorderStrategy,
    SequenceDescriptor,
    reorder_causal_load_balancing,
)
from transformer_engine.jax.flax import DotProductAttention  # noqa: E402
from transformer_engine.jax.sharding import MeshResource  # noqa: E402

from tutorial_utils import model, text_data  # noqa: E402
from tutorial_utils.gradient_check import (  # noqa: E402
    FACTOR,
    FLOOR,
    MAX_ERR_ONE,
    check_cp_gradients,
)
from tutorial_utils.pages.runtime import environment_record  # noqa: E402
from tutorial_utils.te.fused_call import call_fused_attn  # noqa: E402

OUT = os.path.join(ROOT, "results", "gradient_check", "matrix.json")
B, S, SEGS = 2, 128, 4
ALLGATHER_STRIPE = 4
STRATEGIES = {"ring": CPStrategy.RING, "allgather": CPStrategy.ALL_GATHER}


# ----------------------------------------------------------------------------- shared pieces


def packed_rows(rows):
    """Segment ids and positions for ``[B, S]`` rows of the given document lengths; padding
    positions keep counting, as chapter 9's pipeline writes them."""
    ids = np.zeros((B, S), np.int32)
    pos = np.tile(np.arange(S, dtype=np.int32), (B, 1))
    for row, lengths in enumerate(rows):
        start = 0
        for sid, length in enumerate(lengths, start=1):
            ids[row, start : start + length] = sid
            pos[row, start : start + length] = np.arange(length)
            start += length
        pos[row, start:] = np.arange(S - start) + lengths[-1]
    return ids, pos


def shift_right(tokens, segment_ids):
    """Each document's tokens one place right, 0 at its start (chapter 9's)."""
    shifted = jnp.pad(tokens, ((0, 0), (1, 0)))[:, :-1]
    starts = segment_ids != jnp.pad(segment_ids, ((0, 0), (1, 0)))[:, :-1]
    return jnp.where(starts, 0, shifted)


def token_batch(rows, vocab, seed):
    """Targets are random tokens; the inputs are the targets shifted right in the pipeline."""
    ids, pos = packed_rows(rows)
    targets = np.random.default_rng(seed).integers(1, vocab, (B, S)).astype(np.int32)
    targets = targets * (ids > 0)
    tokens = np.asarray(shift_right(jnp.asarray(targets), jnp.asarray(ids)))
    mask = (ids > 0).astype(np.int32)
    return dict(tokens=tokens, targets=targets, loss_mask=mask, segment_ids=ids, segment_pos=pos)


def einsum_attention(q, k, v, segment_ids, positions, left):
    """Attention as a model writes it before the port: einsum scores, a causal, same-document
    mask and, unless ``left`` is None, a window of ``left`` tokens before the query."""
    k, v = (jnp.repeat(t, q.shape[2] // k.shape[2], axis=2) for t in (k, v))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    back = positions[:, :, None] - positions[:, None, :]
    mask = same & (back >= 0) & (segment_ids[:, :, None] > 0)
    if left is not None:
        mask &= back <= left
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) * q.shape[-1] ** -0.5
    probs = jax.nn.softmax(jnp.where(mask[:, None], scores, -1e30), axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(q.dtype), v)
    return jnp.where((segment_ids > 0)[:, :, None, None], out, 0)


def cross_entropy(logits, b):
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    nll = -jnp.take_along_axis(logp, b["targets"][..., None], axis=-1)[..., 0]
    mask = b["loss_mask"].astype(jnp.float32)
    return jnp.sum(nll * mask) / jnp.sum(mask)


def cp_kwargs(strategy, stripe, axis="cp"):
    """TE's ``fused_attn`` CP arguments; ``strategy=None`` means one device."""
    if strategy is None:
        return {}
    return dict(
        context_parallel_strategy=STRATEGIES[strategy],
        context_parallel_causal_load_balanced=True,
        context_parallel_axis=axis,
        stripe_size=stripe,
    )


# ----------------------------------------------------------------------------- chapter 9's decoder

V9, E9, HQ9, HKV9, D9, WINDOW9 = 64, 32, 4, 2, 16, 48


class WrittenAttention(nn.Module):
    """Chapter 9's attention as written: einsum, float32, a 48-token window."""

    @nn.compact
    def __call__(self, x, segment_ids, positions):
        def dense(heads, name):
            return nn.DenseGeneral((heads, D9), dtype=jnp.float32, name=name)(x)

        q, k, v = dense(HQ9, "query"), dense(HKV9, "key"), dense(HKV9, "value")
        out = einsum_attention(q, k, v, segment_ids, positions, WINDOW9 - 1)
        return nn.DenseGeneral(E9, axis=(-2, -1), dtype=jnp.float32, name="out")(out)


class TEAttention(nn.Module):
    """Chapter 9's port: TE's ``DotProductAttention`` (Ring), or ``fused_attn`` for AllGather."""

    window: tuple = (WINDOW9 - 1, 0)
    strategy: str | None = None
    stripe: int = 1
    dtype: jnp.dtype = jnp.bfloat16

    @nn.compact
    def __call__(self, x, segment_ids, positions):
        def dense(heads, name):
            return nn.DenseGeneral((heads, D9), dtype=self.dtype, name=name)(x)

        q, k, v = dense(HQ9, "query"), dense(HKV9, "key"), dense(HKV9, "value")
        desc = SequenceDescriptor.from_segment_ids_and_pos(segment_ids, positions)
        if self.strategy == "allgather":  # the layer takes no stripe_size
            out = call_fused_attn(
                te_attention,
                (q, k, v),
                desc,
                scaling_factor=D9**-0.5,
                max_segments_per_seq=SEGS,
                window_size=self.window,
                **cp_kwargs(self.strategy, self.stripe),
            )
        else:
            attention = DotProductAttention(
                head_dim=D9,
                num_attention_heads=HQ9,
                num_gqa_groups=HKV9,
                attn_mask_type="padding_causal",
                qkv_layout="thd_thd_thd",
                transpose_batch_sequence=False,
                window_size=self.window,
                max_segments_per_seq=SEGS,
                context_parallel_strategy="ring",
                context_parallel_axis="cp" if self.strategy else "",
                context_parallel_causal_load_balanced=bool(self.strategy),
            )
            out = attention(q, k, v, desc, deterministic=False)
        return nn.DenseGeneral(E9, axis=(-2, -1), dtype=self.dtype, name="out")(out)


class Decoder(nn.Module):
    attention: nn.Module
    shift_inside: bool = False

    @nn.compact
    def __call__(self, tokens, segment_ids, positions):
        inputs = shift_right(tokens, segment_ids) if self.shift_inside else tokens
        h = nn.Embed(V9, E9, name="token_embed")(inputs)
        h = h + nn.Embed(S, E9, name="pos_embed")(positions)
        h = h + self.attention(nn.LayerNorm(name="ln_1")(h), segment_ids, positions)
        h = h + nn.Dense(E9, name="mlp")(nn.gelu(nn.Dense(2 * E9, name="mlp_in")(h)))
        return nn.Dense(V9, name="lm_head")(nn.LayerNorm(name="ln_f")(h))


class Chapter9:
    """Chapter 9's decoder and batch (40 + 56 + 20 and 64 + 50 tokens)."""

    name = "ch9 decoder (TE's Flax DotProductAttention)"
    reference_kind = "the model as written (einsum attention), float32"

    def __init__(self):
        self.batch = token_batch(([40, 56, 20], [64, 50]), V9, seed=0)
        b = self.batch
        init = jax.jit(Decoder(WrittenAttention()).init)
        self.params = init(jax.random.PRNGKey(0), b["tokens"], b["segment_ids"], b["segment_pos"])

    def batch_for(self, shift_inside=False, **_):
        # a model that shifts its own inputs is fed the unshifted tokens (the targets)
        return dict(self.batch, tokens=self.batch["targets"]) if shift_inside else self.batch

    def loss(self, params, b, *, dtype, reference=False, strategy=None, stripe=1, **knobs):
        if reference:
            attention = WrittenAttention()
        else:
            window = knobs.get("window", (WINDOW9 - 1, 0))
            attention = TEAttention(window, strategy, stripe, dtype)
        shift_inside = knobs.get("shift_inside", False)
        decoder = Decoder(attention, shift_inside)
        return cross_entropy(
            decoder.apply(params, b["tokens"], b["segment_ids"], b["segment_pos"]), b
        )


# ----------------------------------------------------------------------------- chapter 7's model


class Chapter7:
    """Chapter 7's language model (``tutorial_utils.model``) on packed documentation text."""

    name = "ch7 LM (tutorial_utils.model)"
    reference_kind = "the same model in float32 (TE's code, allow_fp32)"

    def __init__(self):
        self.config = dict(
            d_model=32,
            num_layers=2,
            num_q_heads=4,
            num_kv_heads=2,
            head_dim=8,
            mlp_dim=64,
            max_segments_per_seq=SEGS,
            window_size=(32, 0),
        )
        packed = text_data.pack_documents(
            text_data.load_documents(40),
            batch=B,
            seq_len=S,
            max_segments_per_seq=SEGS,
            segment_len=48,
            by_paragraph=True,
        )
        self.batch = dict(zip(text_data.FIELDS, packed.arrays()))
        self.params = model.init_params(model.ModelConfig(**self.config), jax.random.PRNGKey(0))

    def batch_for(self, **_):
        return self.batch

    def loss(self, params, b, *, dtype, reference=False, strategy=None, stripe=1):
        config = model.ModelConfig(**self.config, dtype=jnp.float32 if reference else dtype)
        attn = model.AttentionSharding(STRATEGIES[strategy], stripe) if strategy else model.NO_CP
        arrays = [b[name] for name in text_data.FIELDS]
        return model.loss_fn(params, *arrays, config, attn)


# ----------------------------------------------------------------------------- local/global GQA

VG, EG, HQG, HKVG, DG, LAYERS_G, LOCAL_G = 64, 32, 8, 2, 8, 2, (15, 0)


class LocalGlobalGQA:
    """Grouped-query attention (8 query heads, 2 KV heads), layers alternating a local sliding
    window and global attention (``window_size=None``), TE's ``fused_attn`` on THD."""

    name = "GQA, local/global layers (TE's fused_attn)"
    reference_kind = "its own einsum attention, float32"

    def __init__(self):
        self.batch = token_batch(([30, 70, 28], [90, 20]), VG, seed=1)
        shapes = dict(
            wq=(EG, HQG * DG),
            wk=(EG, HKVG * DG),
            wv=(EG, HKVG * DG),
            wo=(HQG * DG, EG),
            w_in=(EG, 2 * EG),
            w_out=(2 * EG, EG),
        )
        key, embed_key = jax.random.split(jax.random.PRNGKey(0))
        layers = []
        for layer_key in jax.random.split(key, LAYERS_G):
            keys = dict(zip(shapes, jax.random.split(layer_key, len(shapes))))
            layers.append(
                {n: jax.random.normal(keys[n], s) * s[0] ** -0.5 for n, s in shapes.items()}
            )
        embed = jax.random.normal(embed_key, (VG, EG)) * EG**-0.5
        self.params = dict(embed=embed, layers=layers)

    def batch_for(self, **_):
        return self.batch

    def loss(self, params, b, *, dtype, reference=False, strategy=None, stripe=1, **knobs):
        ids, pos = b["segment_ids"], b["segment_pos"]
        desc = SequenceDescriptor.from_segment_ids_and_pos(ids, pos)
        local, global_window = knobs.get("window", LOCAL_G), knobs.get("global_window")
        dtype = jnp.float32 if reference else dtype
        x = jnp.take(params["embed"], b["tokens"], axis=0)
        bsz, seq, _ = x.shape
        for i, p in enumerate(params["layers"]):
            layer_window = local if i % 2 == 0 else global_window
            h = model.rms_norm(x, jnp.ones(EG)).astype(dtype)
            q, k, v = (
                (h @ p[n].astype(dtype)).reshape(bsz, seq, heads, DG)
                for n, heads in (("wq", HQG), ("wk", HKVG), ("wv", HKVG))
            )
            q, k = model.rope(q, pos), model.rope(k, pos)
            if reference:
                left = None if layer_window in (None, (-1, 0), (-1, -1)) else layer_window[0]
                out = einsum_attention(q, k, v, ids, pos, left)
            else:
                out = call_fused_attn(
                    te_attention,
                    (q, k, v),
                    desc,
                    scaling_factor=DG**-0.5,
                    max_segments_per_seq=SEGS,
                    window_size=layer_window,
                    **cp_kwargs(strategy, stripe),
                )
            x = x + (out.reshape(bsz, seq, -1) @ p["wo"].astype(dtype)).astype(jnp.float32)
            h = model.rms_norm(x, jnp.ones(EG)).astype(dtype)
            mlp = jax.nn.gelu(h @ p["w_in"].astype(dtype)) @ p["w_out"].astype(dtype)
            x = x + mlp.astype(jnp.float32)
        logits = model.rms_norm(x, jnp.ones(EG)) @ params["embed"].T
        return cross_entropy(logits, b)


# ----------------------------------------------------------------------------- the runs

MODELS = {"ch9": Chapter9, "ch7": Chapter7, "gqa": LocalGlobalGQA}
FACADE_REFUSES = "the facade refuses it with an error; TE's fused_attn called directly"


@dataclasses.dataclass(frozen=True)
class Case:
    """One row of the matrix.

    ``knobs`` change the port in all its runs, CP and one device (the reference is the model
    as written); ``cp_knobs`` change the CP run only; ``reorder=False`` shards the
    natural-order batch over the mesh. ``dtype`` is the CP and one-device runs' dtype.
    """

    model: str
    strategy: str
    cp: int
    stripe: int
    expected: str = "pass"
    run: str = "correct"
    slug: str = ""
    knobs: tuple = ()
    cp_knobs: tuple = ()
    reorder: bool = True
    dtype: str = "bfloat16"
    note: str = ""

    @property
    def id(self) -> str:
        dtype = "" if self.dtype == "bfloat16" else f"-{self.dtype}"
        return f"{self.model}-{self.strategy}-cp{self.cp}{dtype}" + (
            f"-{self.slug}" if self.slug else ""
        )


def broken(model_name, run, slug, stripe=1, **fields):
    """A broken run: Ring, CP 4, expected to fail."""
    return Case(model_name, "ring", 4, stripe, "fail", run, slug, **fields)


def all_cases():
    correct = [
        Case(name, strategy, cp, 1 if strategy == "ring" else ALLGATHER_STRIPE)
        for name in MODELS
        for strategy in STRATEGIES
        for cp in (2, 4, 8)
    ]
    float32 = [  # float32 through TE's code (allow_fp32): the floor's case
        Case("ch9", "ring", 4, 1, dtype="float32", note="allow_fp32"),
        broken("ch9", "not reordered", "not-reordered", reorder=False, dtype="float32"),
    ]
    wrong = [
        broken("ch9", "not reordered", "not-reordered", reorder=False),
        broken("ch9", "shift inside the model", "shift-inside", knobs=(("shift_inside", True),)),
        broken(
            "ch9",
            "off-by-one window (48, 0) in the CP run",
            "off-by-one-window",
            cp_knobs=(("window", (WINDOW9, 0)),),
        ),
        broken(
            "gqa",
            "window (-1, 0) for the global layers",
            "window-minus-1",
            knobs=(("global_window", (-1, 0)),),
            note=FACADE_REFUSES,
        ),
        broken(
            "gqa",
            "local window (2, 0), narrower than cp - 1",
            "narrow-window",
            knobs=(("window", (2, 0)),),
            note=FACADE_REFUSES,
        ),
        broken("gqa", "Ring with stripe 4", "ring-stripe-4", ALLGATHER_STRIPE, note=FACADE_REFUSES),
    ]
    return correct + float32 + wrong


class Runner:
    """Runs the cases; the reference and one-device gradients are computed once per model,
    knobs and dtype, outside any mesh context."""

    def __init__(self):
        self.models, self.cache = {}, {}

    def model(self, name):
        if name not in self.models:
            self.models[name] = MODELS[name]()
        return self.models[name]

    def one_device(self, name, knobs, dtype, reference=False):
        key = (name, knobs, dtype, reference)
        if key not in self.cache:
            m, kw, dt = self.model(name), dict(knobs), jnp.dtype(dtype)
            grad = jax.grad(lambda p, b: m.loss(p, b, dtype=dt, reference=reference, **kw))
            with te_on_cpu.allow_fp32(reference or dt == jnp.float32):
                self.cache[key] = jax.device_get(jax.jit(grad)(m.params, m.batch_for(**kw)))
        return self.cache[key]

    def cp(self, case):
        m, kw = self.model(case.model), dict(case.knobs + case.cp_knobs)
        dtype = jnp.dtype(case.dtype)
        mesh = Mesh(np.array(jax.devices()[: case.cp]), ("cp",))
        seq, replicated = NamedSharding(mesh, P(None, "cp")), NamedSharding(mesh, P())

        def place(a):
            a = jnp.asarray(a)
            if case.reorder:
                a = reorder_causal_load_balancing(
                    a, ReorderStrategy.Striped, case.cp, 1, case.stripe
                )
            return jax.device_put(a, seq)

        batch = {name: place(a) for name, a in m.batch_for(**kw).items()}
        grad = jax.grad(
            lambda p, b: m.loss(p, b, dtype=dtype, strategy=case.strategy, stripe=case.stripe, **kw)
        )
        rules = MeshResource(cp_resource="cp")
        with te_on_cpu.allow_fp32(dtype == jnp.float32):
            with jax.set_mesh(mesh), te.autocast(mesh_resource=rules):
                grads = jax.jit(grad)(jax.device_put(m.params, replicated), batch)
        return jax.device_get(grads)

    def row(self, case):
        start = time.perf_counter()
        reference = self.one_device(case.model, case.knobs, "float32", reference=True)
        one = self.one_device(case.model, case.knobs, case.dtype)
        check = check_cp_gradients(self.cp(case), one, reference)
        return dict(
            id=case.id,
            model=case.model,
            strategy=case.strategy,
            cp=case.cp,
            stripe=case.stripe,
            dtype=case.dtype,
            run=case.run,
            err_cp=check.err_cp,
            err_one=check.err_one,
            bound=check.bound,
            verdict="pass" if check.passed else "fail",
            expected=case.expected,
            note=case.note,
            seconds=round(time.perf_counter() - start, 1),
        )


# ----------------------------------------------------------------------------- the record


def headroom(rows):
    """The wrong verdicts, and how far the right ones sit from the bound, both ways.

    ``bound_over_err_cp`` is the smallest margin of a correct run, ``err_cp_over_bound`` that of
    a broken one. ``err_cp_over_err_one`` is taken over the rows whose bound the factor sets
    (not the floor): any factor between its ``correct_max`` and ``broken_min`` gives the same
    verdicts there.
    """
    correct = [r for r in rows if r["expected"] == "pass"]
    broken = [r for r in rows if r["expected"] == "fail" and r["err_one"] <= MAX_ERR_ONE]
    out = {
        "false_alarms": [r["id"] for r in correct if r["verdict"] != "pass"],
        "misses": [r["id"] for r in rows if r["expected"] == "fail" and r["verdict"] != "fail"],
    }

    def least(group, ratio):
        worst = min(group, key=ratio, default=None)
        return None if worst is None else {"min": ratio(worst), "run": worst["id"]}

    out["bound_over_err_cp"] = least(correct, lambda r: r["bound"] / r["err_cp"])
    out["err_cp_over_bound"] = least(broken, lambda r: r["err_cp"] / r["bound"])
    by_factor = [r for r in rows if FACTOR * r["err_one"] >= FLOOR]
    ratios = {r["id"]: r["err_cp"] / r["err_one"] for r in by_factor}
    out["err_cp_over_err_one"] = {
        "correct_max": max((ratios[r["id"]] for r in correct if r["id"] in ratios), default=None),
        "broken_min": min((ratios[r["id"]] for r in broken if r["id"] in ratios), default=None),
    }
    out["correct_max_err_one"] = max((r["err_one"] for r in correct), default=None)
    return out


def table(rows) -> str:
    head = "| model | strategy | cp | stripe | dtype | run | err_cp | err_one | bound | verdict |"
    lines = [head + " expected |", "|---" * 11 + "|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['strategy']} | {r['cp']} | {r['stripe']} | {r['dtype']} |"
            f" {r['run']} |"
            f" {r['err_cp']:.3g} | {r['err_one']:.3g} | {r['bound']:.3g} | {r['verdict']} |"
            f" {r['expected']} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT, help=f"the JSON record (default {OUT})")
    parser.add_argument(
        "--only", nargs="+", metavar="ID", help="run only these case ids (see --list)"
    )
    parser.add_argument("--list", action="store_true", help="print the case ids and stop")
    args = parser.parse_args(argv)
    cases = all_cases()
    if args.list:
        print("\n".join(c.id for c in cases))
        return 0
    if args.only:
        unknown = sorted(set(args.only) - {c.id for c in cases})
        if unknown:
            parser.error(f"unknown case ids {unknown}; --list prints them")
        cases = [c for c in cases if c.id in args.only]
    devices = len(jax.devices())
    too_big = [c.id for c in cases if c.cp > devices]
    if too_big:
        parser.error(f"{devices} devices, but {too_big} need more; run with --devices 8")
    runner, rows, start = Runner(), [], time.perf_counter()
    for case in cases:
        rows.append(runner.row(case))
        r = rows[-1]
        print(
            f"{r['id']}: err_cp {r['err_cp']:.3g} err_one {r['err_one']:.3g}"
            f" -> {r['verdict']} (expected {r['expected']}, {r['seconds']} s)",
            flush=True,
        )
    summary = headroom(rows)
    record = dict(
        schema="gradient-check-matrix/1",
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        source=f"TE's code on CPU, {devices} simulated devices",
        hardware=environment_record(),
        versions={"flax": flax.__version__, "numpy": np.__version__},
        config=dict(
            factor=FACTOR,
            floor=FLOOR,
            max_err_one=MAX_ERR_ONE,
            rule="err_cp <= max(factor * err_one, floor) and err_one <= max_err_one",
            batch=B,
            seq_len=S,
            allgather_stripe=ALLGATHER_STRIPE,
            models={
                key: {"name": cls.name, "reference": cls.reference_kind}
                for key, cls in MODELS.items()
            },
            wall_seconds=round(time.perf_counter() - start, 1),
        ),
        summary=summary,
        rows=rows,
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(table(rows))
    print(json.dumps(summary, indent=1))
    bad = summary["false_alarms"] + summary["misses"]
    print(f"{len(rows)} runs, {len(bad)} wrong verdicts; written to {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
