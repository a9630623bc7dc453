"""tutorial_utils.pages.cp_runs: the plumbing of chapters 5a and 5b.

The attention wrapper is chapter 3's call, the error table applies TE's tolerance, the Ulysses
step reproduces one device (output and gradients), and timing records land where the chapter
says, validate, and never in results/ unless asked.
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tutorial_utils.pages import cp_runs
from tutorial_utils.perfmodel.records import validate_record
from tutorial_utils.perfmodel.workload import get_workload, make_qkv, workload_segments
from tutorial_utils.reference import MaskSpec, dense_attention
from tutorial_utils.reorder import (
    ReorderStrategy,
    inverse_reorder_causal_load_balancing,
    reorder_causal_load_balancing,
)
from tutorial_utils.te.attention import SequenceDescriptor

BF16_TOL = (2.0**-7) ** (2.0 / 3.0)


def test_te_tolerance_is_eps_to_the_two_thirds():
    assert cp_runs.te_tolerance(jnp.bfloat16) == pytest.approx(BF16_TOL)
    assert cp_runs.te_tolerance(jnp.float32) == pytest.approx((2.0**-23) ** (2.0 / 3.0))


def test_max_abs_diff_in_float32():
    a = jnp.asarray([1.0, 2.0, 3.0], jnp.bfloat16)
    assert cp_runs.max_abs_diff(a, jnp.asarray([1.0, 2.5, 3.0])) == 0.5
    assert cp_runs.max_abs_diff(a, 0) == 3.0


def _arrays(seed, shape=(1, 8, 2, 4)):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    return [jax.random.normal(key, shape, jnp.float32).astype(jnp.bfloat16) for key in keys]


def test_error_table_rows_ratios_and_failures():
    single = _arrays(0)
    close = [x + jnp.asarray(0.01, x.dtype) for x in single]
    far = list(single)
    far[2] = far[2] + jnp.asarray(1.0, far[2].dtype)  # dK off by 1
    table = cp_runs.error_table(
        {"same": single, "close": close, "far": far}, single, label="strategy (dp=2, cp=4)"
    )
    assert table.tolerance == pytest.approx(BF16_TOL)
    assert [row[:2] for row in table.rows[:4]] == [
        ("same", t) for t in ("output", "dQ", "dK", "dV")
    ]
    assert all(err == 0.0 and ratio == 0.0 for run, _, err, ratio in table.rows if run == "same")
    assert table.max_errors["same"] == 0.0 and 0 < table.max_errors["close"] < BF16_TOL
    assert table.failures() == ["far dK"] and table.worst_ratio > 1.0
    text = table._repr_markdown_()
    assert text.startswith("tolerance: rtol = atol = 0.0394")
    assert "| strategy (dp=2, cp=4) | | output | dQ | dK | dV |" in text
    lines = text.splitlines()
    far = lines.index(next(line for line in lines if line.startswith("| far |")))
    assert lines[far].startswith("| far | max abs error | 0.0e+00 | 0.0e+00 | 1.0e+00 |")
    ratios = lines[far + 1].strip("|").split("|")
    assert ratios[1].strip() == "/ allowed" and float(ratios[4]) > 1.0  # dK beyond it
    assert len(lines) == 4 + 2 * 3  # tolerance, blank, header, rule; two lines per run


def test_error_table_rejects_bad_input():
    single = _arrays(0)
    with pytest.raises(ValueError, match=r"single must be \(output, dQ, dK, dV\)"):
        cp_runs.error_table({"a": single}, single[:3])
    with pytest.raises(ValueError, match=r"runs\['a'\] must be \(output, dQ, dK, dV\)"):
        cp_runs.error_table({"a": single[:2]}, single)
    with pytest.raises(ValueError, match=r"runs\['a'\]: pairs\['dQ'\]: got has shape"):
        cp_runs.error_table({"a": [single[0], single[1][:, :4]] + single[2:]}, single)
    with pytest.raises(ValueError, match="runs is empty"):
        cp_runs.error_table({}, single)
    with pytest.raises(ValueError, match="must be a positive number"):
        cp_runs.error_table({"a": single}, single, tolerance=0)


def _tiny(**changes):
    return get_workload("tiny", **changes)


def test_thd_attention_is_chapter_3s_call():
    wl = _tiny(dtype="bfloat16")
    q, k, v, _ = make_qkv(wl)
    ids, pos = (jnp.asarray(x) for x in workload_segments(wl))
    out = jax.jit(cp_runs.thd_attention(wl))(
        (q, k, v), SequenceDescriptor.from_segment_ids_and_pos(ids, pos)
    )
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    ref, _ = jax.jit(
        functools.partial(dense_attention, scale=wl.head_dim**-0.5, spec=MaskSpec(window=wl.window))
    )(*f32, ids, ids, pos, pos)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert cp_runs.max_abs_diff(out, ref) <= BF16_TOL


def test_ulysses_step_matches_one_device():
    cp, stripe = 4, 4
    wl = _tiny(cp_size=cp, stripe_size=stripe)  # float32, 8 query / 4 KV heads
    mesh = Mesh(np.asarray(jax.devices()[:cp]), ("cp",))
    q, k, v, dout = make_qkv(wl)
    ids, pos = (jnp.asarray(x) for x in workload_segments(wl))
    spec = MaskSpec(window=wl.window)

    def loss(qkv):
        out, _ = dense_attention(*qkv, ids, ids, pos, pos, scale=wl.head_dim**-0.5, spec=spec)
        return jnp.vdot(out, dout), out

    (_, ref_out), ref_grads = jax.value_and_grad(loss, has_aux=True)((q, k, v))
    fwd = lambda x: reorder_causal_load_balancing(x, ReorderStrategy.Striped, cp, 1, stripe)  # noqa: E731
    back = lambda x: inverse_reorder_causal_load_balancing(
        x, ReorderStrategy.Striped, cp, 1, stripe
    )  # noqa: E731
    x4 = NamedSharding(mesh, P(None, "cp", None, None))
    tok = NamedSharding(mesh, P(None, "cp"))
    qkv = tuple(jax.device_put(fwd(x), x4) for x in (q, k, v))
    step = cp_runs.ulysses_step(wl, mesh, stripe)
    with jax.set_mesh(mesh):
        (_, out), grads = step(
            qkv,
            jax.device_put(fwd(ids), tok),
            jax.device_put(fwd(pos), tok),
            jax.device_put(fwd(dout), x4),
        )
    assert out.sharding.spec == P(None, "cp", None, None)
    table = cp_runs.error_table(
        {"ulysses": [back(x) for x in (out, *grads)]}, [ref_out, *ref_grads], tolerance=1e-5
    )
    assert table.worst_ratio <= 1.0, table.rows


def test_records_dir_follows_the_environment(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("")
    monkeypatch.delenv("CP_TUTORIAL_RECORDS_DIR", raising=False)
    assert cp_runs.records_dir(tmp_path) == tmp_path / "_build" / "records"
    monkeypatch.setenv("CP_TUTORIAL_RECORDS_DIR", "results")
    assert cp_runs.records_dir(tmp_path) == tmp_path / "results"
    monkeypatch.setenv("CP_TUTORIAL_RECORDS_DIR", str(tmp_path / "elsewhere"))
    assert (
        cp_runs.records_dir(tmp_path) == tmp_path / "elsewhere"
        and (tmp_path / "elsewhere").is_dir()
    )
    assert cp_runs.repo_root(tmp_path / "elsewhere") == tmp_path


def _timing(ms):
    return {
        "mean_ms": ms,
        "std_ms": 1.0,
        "min_ms": ms - 1,
        "median_ms": ms,
        "first_call_ms": 10 * ms,
    }


def test_timing_results_rows():
    timings = {"single": _timing(100.0), "ring": _timing(50.0), "ulysses": _timing(200.0)}
    rows = cp_runs.timing_results(
        timings, {"ring": 1, "ulysses": 16}, {"ring": 0.01, "ulysses": 0.0}
    )
    assert [r["strategy"] for r in rows] == ["single", "ring", "ulysses"]
    assert [r["stripe_size"] for r in rows] == [None, 1, None]  # Ulysses has no stripe of its own
    assert [r["speedup"] for r in rows] == [1.0, 2.0, 0.5]
    assert "max_abs_err" not in rows[0] and rows[1]["max_abs_err"] == 0.01
    with pytest.raises(ValueError, match="'single'"):
        cp_runs.timing_results({"ring": _timing(1.0)}, {"ring": 1})


def test_save_timing_record_writes_a_valid_record(tmp_path):
    wl = _tiny()
    rows = cp_runs.timing_results(
        {"single": _timing(10.0), "allgather": _timing(5.0)}, {"allgather": 4}
    )
    path = cp_runs.save_timing_record(wl, rows, warmup=2, iters=5, chapter=5, directory=tmp_path)
    assert path.name.startswith("ch05-tiny-") and path.is_file()
    record = json.loads(path.read_text())
    validate_record(record)
    assert record["label"].startswith("Chapter 5 forward+backward, tiny preset")
    assert record["timing"]["warmup_iters"] == 2 and record["config"]["seq_len"] == wl.seq_len
    lettered = cp_runs.save_timing_record(
        wl, rows, warmup=2, iters=5, chapter="5b", directory=tmp_path
    )
    assert lettered.name.startswith("ch05b-tiny-")
    assert json.loads(lettered.read_text())["label"].startswith("Chapter 5b forward+backward")
    with pytest.raises(
        ValueError, match=r"chapter='b5' must be a chapter number such as 5 or '5b'"
    ):
        cp_runs.save_timing_record(wl, rows, warmup=2, iters=5, chapter="b5", directory=tmp_path)


def test_published_results(tmp_path):
    rows = cp_runs.published_results()
    assert rows is not None and {r["strategy"] for r in rows} >= {"single", "ring", "allgather"}
    assert cp_runs.published_results(tmp_path) is None
    assert cp_runs.published_results(tmp_path / "missing") is None
