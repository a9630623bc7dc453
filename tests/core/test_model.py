"""The small LM: shapes, RoPE, order-independent loss, training, and CP against one device.

Chapter 7's comparison (the parameter update relative to its size) is checked both ways: a
correct CP run passes it and a deliberately broken one (positions not reordered) fails it.

The comparisons run in fp32 with the reference backend (conftest), so they measure the
model's own bookkeeping: a striped batch gives the natural-order loss and gradients both on
one device and on a (dp, cp) mesh with Ring and AllGather. One test repeats the mesh
comparison in a subprocess with TE's own JAX code on CPU.
"""

import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tutorial_utils.te as te
from tutorial_utils import model, text_data
from tutorial_utils.te.attention import CPStrategy
from tutorial_utils.te.sharding import MeshResource

ROOT = Path(__file__).resolve().parents[2]
FP32 = 2e-5  # fp32 tolerance of the project's CP tests
UPDATE_FP32 = 1e-3  # chapter 7's float32 tolerance on the relative update difference
CONFIG = model.ModelConfig(
    d_model=32,
    num_layers=2,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    max_segments_per_seq=4,
    window_size=(16, 0),
    dtype=jnp.float32,
)


@pytest.fixture(scope="module")
def params():
    return model.init_params(CONFIG, jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def batch():
    # 13-token segments in 16-token slots: padding after every segment
    return text_data.pack_documents(
        text_data.load_documents(30),
        batch=2,
        seq_len=64,
        max_segments_per_seq=4,
        segment_len=13,
        align=4,
    )


def value_and_grad(config, attn):
    return jax.value_and_grad(lambda p, *arrays: model.loss_fn(p, *arrays, config, attn))


@functools.cache
def one_device_step(config=CONFIG):
    return jax.jit(value_and_grad(config, model.NO_CP))


@pytest.fixture(scope="module")
def natural_result(params, batch):
    return one_device_step()(params, *batch.arrays())


def max_abs_diff(a, b):
    """On the host, in each leaf's own dtype (as jnp would compute it, without compiling per
    shape)."""
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


def test_config_and_sharding_reject_bad_values():
    with pytest.raises(ValueError, match=r"num_kv_heads=3 does not divide num_q_heads=4"):
        model.ModelConfig(num_q_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match=r"head_dim=7 is odd"):
        model.ModelConfig(head_dim=7)
    with pytest.raises(ValueError, match=r"window_size=\(4, 4\): a causal model"):
        model.ModelConfig(window_size=(4, 4))
    with pytest.raises(ValueError, match=r"dtype=<class 'jax.numpy.int32'> is not a compute dtype"):
        model.ModelConfig(dtype=jnp.int32)
    with pytest.raises(ValueError, match=r"d_model=0 must be a positive int"):
        model.ModelConfig(d_model=0)
    with pytest.raises(ValueError, match=r"stripe_size=2 with CPStrategy.RING"):
        model.AttentionSharding(CPStrategy.RING, 2)
    with pytest.raises(ValueError, match=r"stripe_size=None with a CP strategy"):
        model.AttentionSharding(CPStrategy.ALL_GATHER)
    with pytest.raises(ValueError, match=r"strategy='ring' must be a CPStrategy"):
        model.AttentionSharding("ring", 1)


def test_shapes(params, batch):
    assert params["embed"].shape == (256, 32) and params["final_norm"].shape == (32,)
    assert len(params["blocks"]) == 2
    assert {k: v.shape for k, v in params["blocks"][0].items()} == {
        "norm1": (32,),
        "wq": (32, 32),
        "wk": (32, 16),
        "wv": (32, 16),
        "wo": (32, 32),
        "norm2": (32,),
        "w_in": (32, 128),
        "w_out": (64, 32),
    }
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    forward = functools.partial(model.forward, config=CONFIG)
    logits = jax.eval_shape(forward, params, batch.tokens, batch.segment_ids, batch.segment_pos)
    assert logits.shape == (2, 64, 256) and logits.dtype == jnp.float32


def test_rope_depends_on_segment_positions_only():
    """q.k after RoPE depends on the distance of the positions; position 0 is the identity."""
    q, k = jax.random.normal(jax.random.PRNGKey(1), (2, 1, 1, 1, 8))
    at = lambda x, p: model.rope(x, jnp.array([[p]]))[0, 0, 0]  # noqa: E731
    assert np.allclose(at(q, 0), q[0, 0, 0])
    np.testing.assert_allclose(
        jnp.dot(at(q, 7), at(k, 3)), jnp.dot(at(q, 24), at(k, 20)), rtol=1e-5
    )
    assert not np.isclose(jnp.dot(at(q, 7), at(k, 3)), jnp.dot(at(q, 7), at(k, 5)))
    np.testing.assert_allclose(jnp.linalg.norm(at(q, 11)), jnp.linalg.norm(q), rtol=1e-6)


@pytest.mark.skipif(
    te.backend_kind() != "reference",
    reason=(
        "without CP, TE's THD code needs each segment "
        "contiguous; only the reference computes a striped batch on one device"
    ),
)
@pytest.mark.parametrize("stripe_size", [1, 2])
def test_striped_batch_has_the_same_loss_and_grads_on_one_device(
    params, batch, natural_result, stripe_size
):
    """cp=4 reorder, no mesh: only the token order changes, and nothing in the model reads it."""
    striped = text_data.reorder_for_cp(batch, cp_size=4, stripe_size=stripe_size)
    assert not np.array_equal(striped.tokens, batch.tokens)
    loss0, grads0 = natural_result
    loss, grads = one_device_step()(params, *striped.arrays())
    print(
        f"one device, cp=4 stripe {stripe_size}: |loss diff| {abs(float(loss - loss0)):.2e}, "
        f"max |grad diff| {max_abs_diff(grads, grads0):.2e}"
    )
    assert abs(float(loss - loss0)) <= 1e-5
    assert max_abs_diff(grads, grads0) <= 1e-5


def test_cp_strategy_without_a_mesh_is_an_error(params, batch):
    with pytest.raises(ValueError, match=r"context_parallel_axis='cp' but no mesh is active"):
        model.loss_fn(
            params, *batch.arrays(), CONFIG, model.AttentionSharding(CPStrategy.ALL_GATHER, 1)
        )


def test_train_steps_reduce_the_loss(params):
    docs = text_data.load_documents(5)
    batches = text_data.make_batches(docs, 2, batch=2, seq_len=64, max_segments_per_seq=2)
    optimizer = optax.adamw(1e-2)
    step = jax.jit(model.make_train_step(CONFIG, optimizer, model.NO_CP))
    state = optimizer.init(params)
    p, losses = params, []
    for i in range(8):
        p, state, loss = step(p, state, *batches[i % 2].arrays())
        losses.append(float(loss))
    print("train losses:", " ".join(f"{x:.3f}" for x in losses))
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0] - 1.0  # from ~ln(256)=5.5 towards byte statistics


def test_bf16_compute_stays_close_to_fp32(params, batch, natural_result):
    bf16 = dataclasses.replace(CONFIG, dtype=jnp.bfloat16)
    loss = jax.jit(lambda p, *a: model.loss_fn(p, *a, bf16, model.NO_CP))(params, *batch.arrays())
    assert loss.dtype == jnp.float32
    assert abs(float(loss) - float(natural_result[0])) < 0.05


@pytest.mark.parametrize(
    "mesh_shape, strategy, stripe_size",
    [
        ((2, 2), CPStrategy.RING, 1),
        ((2, 2), CPStrategy.ALL_GATHER, 2),
        ((1, 4), CPStrategy.ALL_GATHER, 4),
    ],
    ids=["dp2-cp2-ring", "dp2-cp2-allgather-stripe2", "dp1-cp4-allgather-stripe4"],
)
def test_cp_on_a_mesh_matches_one_device(
    params, batch, natural_result, mesh_shape, strategy, stripe_size
):
    """Batch sharded P('dp', 'cp'), params replicated; loss and grads equal the natural one-device
    run."""
    cp_size = mesh_shape[1]
    name = "ring" if strategy == CPStrategy.RING else "allgather"
    striped = text_data.reorder_for_cp(
        batch,
        cp_size=cp_size,
        stripe_size=stripe_size,
        strategy=name,
        window_size=CONFIG.window_size,
    )
    text_data.check_batch_for_mesh(striped, cp_size=cp_size, stripe_size=stripe_size)
    mesh = Mesh(np.asarray(jax.devices()[:4]).reshape(mesh_shape), ("dp", "cp"))
    data, replicated = NamedSharding(mesh, P("dp", "cp")), NamedSharding(mesh, P())
    with (
        jax.set_mesh(mesh),
        te.autocast(mesh_resource=MeshResource(dp_resource="dp", cp_resource="cp")),
    ):
        arrays = [jax.device_put(x, data) for x in striped.arrays()]
        step = jax.jit(
            value_and_grad(CONFIG, model.AttentionSharding(strategy, stripe_size)),
            in_shardings=(replicated,) + (data,) * 5,
            out_shardings=(replicated, replicated),
        )
        loss, grads = step(jax.device_put(params, replicated), *arrays)
    loss0, grads0 = natural_result
    print(
        f"{mesh_shape} {name} stripe {stripe_size}: |loss diff| {abs(float(loss - loss0)):.2e}, "
        f"max |grad diff| {max_abs_diff(grads, grads0):.2e}"
    )
    assert abs(float(loss - loss0)) <= FP32
    assert max_abs_diff(grads, grads0) <= FP32


@pytest.mark.slow
def test_cp_on_a_mesh_matches_one_device_with_te_code_on_cpu():
    """The same comparison with TE's own JAX code (CPU kernel in place of cuDNN), fp32, (dp=2,
    cp=2)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TUTORIAL_TE_BACKEND", "XLA_FLAGS")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "scripts" / "model_te_cpu_script.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(result)
    assert result["backend"].startswith("TransformerEngine 2.20.2 (its JAX code")
    for name in ("ring", "allgather"):
        assert result[name]["loss"] <= FP32 and result[name]["grads"] <= FP32, (name, result[name])


OPTIMIZER = optax.adamw(3e-3)


@functools.cache
def _sharded_train_step(attn, mesh_shape):
    mesh = Mesh(
        np.asarray(jax.devices()[: int(np.prod(mesh_shape))]).reshape(mesh_shape), ("dp", "cp")
    )
    rows, replicated = NamedSharding(mesh, P("dp", "cp")), NamedSharding(mesh, P())
    step = jax.jit(
        model.make_train_step(CONFIG, OPTIMIZER, attn),
        in_shardings=(replicated, replicated) + (rows,) * 5,
        out_shardings=replicated,
    )
    return mesh, step


def _train(batches, attn, mesh_shape):
    """Chapter 7's loop: parameters placed on the mesh, one compiled step for every batch."""
    mesh, step = _sharded_train_step(attn, mesh_shape)
    params = model.init_params(CONFIG, jax.random.PRNGKey(0))
    params, state = jax.device_put(
        (params, OPTIMIZER.init(params)), NamedSharding(mesh, P())
    )  # one compile
    with (
        jax.set_mesh(mesh),
        te.autocast(mesh_resource=MeshResource(dp_resource="dp", cp_resource="cp")),
    ):
        for b in batches:
            params, state, _ = step(params, state, *b.arrays())
    return jax.device_get(params)


def test_relative_update_difference_measures_the_update_not_the_weights():
    init = {"w": np.zeros(4), "b": np.ones(2)}
    ref = {"w": np.full(4, 0.1), "b": np.ones(2)}  # ||update|| = 0.2
    other = {"w": np.array([0.1, 0.1, 0.1, 0.0]), "b": np.ones(2)}
    assert model.relative_update_difference(init, ref, ref) == 0.0
    assert model.relative_update_difference(init, ref, other) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="reference equals init"):
        model.relative_update_difference(init, init, other)
    with pytest.raises(ValueError, match="parameter trees of one model"):
        model.relative_update_difference(init, ref, {"w": np.zeros(4)})


def test_a_broken_cp_run_fails_the_update_comparison_that_a_correct_one_passes():
    """Ring on (dp=2, cp=2), 3 AdamW steps on paragraph-packed rows with padding and a window (16)
    shorter than most segments. Striping every array but the positions (check bypassed) must land
    far outside the tolerance that the correctly striped run meets."""
    batches = text_data.make_batches(
        text_data.load_documents(30),
        3,
        batch=2,
        seq_len=64,
        max_segments_per_seq=4,
        segment_len=24,
        align=4,
        by_paragraph=True,
    )
    ids = np.concatenate([b.segment_ids for b in batches])
    lengths = [np.sum(row == s) for row in ids for s in range(1, row.max() + 1)]
    assert (
        (ids == 0).any()
        and np.mean(np.array(lengths) > CONFIG.window_size[0]) > 0.5
        and len(set(lengths)) > 3
    )
    striped = [
        text_data.reorder_for_cp(
            b, cp_size=2, stripe_size=1, strategy="ring", window_size=CONFIG.window_size
        )
        for b in batches
    ]
    broken = [dataclasses.replace(s, segment_pos=b.segment_pos) for s, b in zip(striped, batches)]
    with pytest.raises(
        ValueError, match=r"undoing the reorder for cp_size=2, stripe_size=1 does not give a packed"
    ):
        text_data.check_batch_for_mesh(broken[0], cp_size=2, stripe_size=1)
    ring = model.AttentionSharding(CPStrategy.RING, 1)
    init = model.init_params(CONFIG, jax.random.PRNGKey(0))
    one = _train(batches, model.NO_CP, (1, 1))
    good = model.relative_update_difference(init, one, _train(striped, ring, (2, 2)))
    bad = model.relative_update_difference(
        init, one, _train(broken, ring, (2, 2))
    )  # same compiled step
    print(f"relative update difference: correct Ring {good:.2e}, positions not reordered {bad:.2e}")
    assert good <= UPDATE_FP32
    assert bad > 10 * UPDATE_FP32
