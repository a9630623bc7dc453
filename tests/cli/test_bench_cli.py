"""``python -m tutorial_utils.cli.bench``: records, the per-rank emulation, and the pieces it rests
on."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_run import exit_status_and_stderr

from tutorial_utils.cli import bench as B
from tutorial_utils.inputs import fixed_slot_segments, pack_segments, random_segment_lengths
from tutorial_utils.perfmodel.records import validate_record
from tutorial_utils.perfmodel.workload import get_workload, make_qkv, workload_segments

ROOT = Path(__file__).resolve().parents[2]


def _env(devices=4):
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["TUTORIAL_TE_BACKEND"] = "reference"
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _bench(*args, devices=4, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "tutorial_utils.cli.bench", *args],
        env=_env(devices),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def _only_record(folder: Path) -> dict:
    files = sorted(folder.glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


# ----------------------------------------------------------------------------- the command


def test_tiny_run_writes_one_valid_record(tmp_path):
    proc = _bench(
        "--preset",
        "tiny",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--out",
        str(tmp_path),
        "--windows",
        "32",
        "--stripes",
        "4",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rec = _only_record(tmp_path)
    validate_record(rec)
    assert rec["source"] == "cpu-reference"
    assert rec["timing"] == {
        "warmup_iters": 0,
        "timing_iters": 1,
        "compile_excluded": True,
        "block_until_ready": True,
    }
    assert rec["hardware"]["platform"] == "cpu" and rec["hardware"]["device_count"] == 4
    assert {"jax", "jaxlib", "transformer_engine", "te_backend"} <= set(rec["hardware"])
    assert rec["config"]["preset"] == "tiny" and rec["config"]["window"] == [32, 0]
    by = {r["strategy"]: r for r in rec["results"]}
    assert set(by) == {"single", "ring", "allgather", "ulysses"}
    assert by["allgather"]["stripe_size"] == 4 and by["ring"]["stripe_size"] == 1
    for r in rec["results"]:
        assert r["mean_ms"] > 0 and r["tflops"] > 0 and r["visible_pairs_per_head"] > 0
        assert not r.get("emulated")
    assert (
        by["ring"]["cp_size"] == 4 and "speedup" in by["ring"] and "tflops_per_device" in by["ring"]
    )
    assert rec["failures"] == []
    assert "wrote" in proc.stdout and "[" in proc.stderr  # summary on stdout, progress on stderr


def test_emulated_ranks_on_one_device(tmp_path):
    proc = _bench(
        "--preset",
        "tiny",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--out",
        str(tmp_path),
        "--windows",
        "32",
        "--stripes",
        "4",
        "--emulate-ranks",
        "4",
        "--link-gbps",
        "100",
        devices=1,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rec = _only_record(tmp_path)
    validate_record(rec)
    assert rec["source"] == "cpu-reference"  # emulation on a CPU is still a CPU record ...
    assert (
        "emulated" in rec["notes"] and "emulated" in rec["label"]
    )  # ... clearly labelled as emulated
    assert rec["hardware"]["device_count"] == 1
    assert rec["config"]["emulate_ranks"] == 4 and rec["config"]["link_gbps"] == 100
    # the reference kernel's sub-problems compile at XLA's default level, not the run's level 0: the
    # record says so
    assert rec["config"]["reference_kernel_xla_options"] == {"xla_backend_optimization_level": 3}
    by = {r["strategy"]: r for r in rec["results"]}
    assert not by["single"].get("emulated")
    for name in ("ring", "allgather", "ulysses"):
        row = by[name]
        assert row["emulated"] is True and row["cp_size"] == 4 and row["link_gbps"] == 100
        assert row["mean_ms"] == pytest.approx(row["compute_ms"] + row["exposed_comm_ms"])
    assert np.asarray(by["ring"]["rank_step_ms"]).shape == (4, 4)
    assert len(by["allgather"]["rank_ms"]) == 4 and len(by["ulysses"]["rank_ms"]) == 4
    assert by["allgather"]["compute_ms"] == pytest.approx(max(by["allgather"]["rank_ms"]))
    assert by["allgather"]["comm_bytes_per_rank"]["fwd"] > 0


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--stripes", "0"], "--stripes"),
        (["--stripes", "3"], "--stripes"),
        (["--iters", "0"], "--iters"),
        (["--warmup", "-1"], "--warmup"),
        (["--preset", "huge"], "--preset"),
        (["--windows", "-2"], "--windows"),
        (["--strategies", "zigzag"], "--strategies"),
        (["--emulate-ranks", "3"], "--emulate-ranks"),
        (["--link-gbps", "0"], "--link-gbps"),
        (["--kernel", "te", "--emulate-ranks", "4"], "--kernel"),
    ],
)
def test_bad_arguments_name_the_parameter(tmp_path, args, needle, capsys):
    status, stderr = exit_status_and_stderr(
        B.main, ["--preset", "tiny", "--out", str(tmp_path), *args], capsys
    )
    assert status == 2, stderr
    assert f"argument {needle}" in stderr, stderr
    assert not list(tmp_path.glob("*.json"))


def test_a_cp_size_beyond_the_devices_names_the_parameter(tmp_path):
    """In its own process: the error depends on how many devices JAX starts with (4 here, 8 in the
    suite)."""
    proc = _bench("--preset", "tiny", "--out", str(tmp_path), "--cp", "8", devices=4, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "argument --cp" in proc.stderr, proc.stderr
    assert not list(tmp_path.glob("*.json"))


# ----------------------------------------------------------------------------- pieces


def test_visible_pairs_matches_a_brute_force_count():
    wl = get_workload("tiny")
    ids, pos = workload_segments(wl)
    for left in (-1, 0, 7, 32):
        vis = (
            (ids[:, :, None] == ids[:, None, :])
            & (ids[:, :, None] > 0)
            & (pos[:, None, :] <= pos[:, :, None])
        )
        if left >= 0:
            vis &= pos[:, None, :] >= pos[:, :, None] - left
        assert B.visible_pairs(ids, pos, (left, 0)) == int(vis.sum())


def test_subproblems_cover_every_token_and_block():
    for cp, stripe in ((2, 1), (4, 4), (8, 2)):
        ag = B.rank_subproblems("allgather", 256, cp, stripe)
        assert sorted(np.concatenate([s.q_index for s in ag]).tolist()) == list(range(256))
        assert all(len(s.kv_index) == 256 for s in ag)
    ring = B.rank_subproblems("ring", 256, 4, 1)
    assert len(ring) == 16
    for r in range(4):
        blocks = np.concatenate([s.kv_index for s in ring if s.rank == r])
        assert sorted(blocks.tolist()) == list(range(256))
    uly = B.rank_subproblems("ulysses", 64, 4, num_q_heads=8, num_kv_heads=4)
    assert [s.heads for s in uly] == [(0, 2), (2, 4), (4, 6), (6, 8)] and uly[3].kv_heads == (3, 4)
    with pytest.raises(ValueError, match="stripe_size=1"):
        B.rank_subproblems("ring", 256, 4, 4)
    with pytest.raises(ValueError, match="num_kv_heads"):
        B.rank_subproblems("ulysses", 64, 8, num_q_heads=8, num_kv_heads=4)


@pytest.mark.parametrize("layout", ["slots", "aligned", "unaligned"])
def test_ragged_descriptors_reproduce_the_per_token_masks(layout):
    rng = np.random.default_rng({"slots": 0, "aligned": 1, "unaligned": 2}[layout])
    for cp, stripe in ((2, 1), (4, 1), (4, 4), (8, 2)):
        if layout == "slots":
            ids, pos = fixed_slot_segments(2, 256, 4, 48)
        else:
            align = cp * stripe if layout == "aligned" else 1
            ids, pos = pack_segments(
                random_segment_lengths(rng, 2, 256, 5, align=align), 256, align=align
            )
        for left in (-1, 0, 1, 5, 33, 1000):
            window = (left, 0)
            subs = B.rank_subproblems("allgather", 256, cp, stripe)
            if stripe == 1:
                subs += B.rank_subproblems("ring", 256, cp, 1)
            for sub in subs:
                calls = (
                    B.allgather_ragged_calls(ids, pos, sub.q_index, window)
                    if sub.strategy == "allgather"
                    else B.ring_ragged_calls(ids, pos, sub.q_index, sub.kv_index, cp, window)
                )
                got = np.zeros((2, len(sub.q_index), len(sub.kv_index)), bool)
                rows = np.zeros((2, len(sub.q_index)), int)
                for c in calls:
                    for b in range(2):  # cuDNN's backward needs a call's runs to share no key
                        keys = np.zeros(len(sub.kv_index), int)
                        for n, o in zip(c.kv_seqlens[b], c.kv_offsets[b]):
                            keys[o : o + n] += n > 0
                        assert keys.max(initial=0) <= 1
                    vis = B.ragged_visibility(c, len(sub.q_index), len(sub.kv_index))
                    got |= vis
                    rows += vis.any(axis=2)
                np.testing.assert_array_equal(got, B.subproblem_visibility(ids, pos, sub, window))
                assert (
                    rows.max() <= 1
                )  # a query row is in at most one call (their outputs are summed)


def test_ragged_calls_pad_to_a_common_width():
    ids, pos = fixed_slot_segments(2, 256, 4, 48)
    call = B.allgather_ragged_calls(
        ids, pos, B.rank_subproblems("allgather", 256, 4, 4)[1].q_index, (32, 0)
    )[0]
    wide = call.padded(call.max_segments + 3)
    assert wide.max_segments == call.max_segments + 3 and (wide.q_seqlens[:, -3:] == -1).all()
    np.testing.assert_array_equal(
        B.ragged_visibility(wide, 64, 256), B.ragged_visibility(call, 64, 256)
    )


@pytest.mark.parametrize("strategy", ["allgather", "ring", "ulysses"])
def test_emulated_ranks_merge_to_the_single_device_result(strategy):
    import jax
    import jax.numpy as jnp

    from tutorial_utils.reference import MaskSpec, blockwise_attention

    wl = get_workload("tiny")
    q, k, v, dout = make_qkv(wl, seed=4)
    ids, pos = workload_segments(wl)
    out, grads = B.emulate_strategy_reference(
        strategy,
        q,
        k,
        v,
        dout,
        ids,
        pos,
        cp_size=4,
        stripe_size=wl.stripe_for(strategy),
        window=wl.window,
        block=64,
    )
    spec = MaskSpec(padding=True, causal=True, window=wl.window)
    i, p = jnp.asarray(ids), jnp.asarray(pos)
    ref, vjp = jax.vjp(
        lambda a, b, c: blockwise_attention(
            a, b, c, i, i, p, p, scale=wl.scaling_factor, spec=spec, block_q=64, block_kv=64
        )[0],
        q,
        k,
        v,
    )
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)
    for g, r in zip(grads, vjp(dout)):
        np.testing.assert_allclose(g, r, atol=2e-5, rtol=2e-5)


def test_prediction_arithmetic():
    comm = {"fwd": 3 * 10**9, "bwd": 1 * 10**9}  # 4 GB at 100 GB/s = 40 ms
    ag = B.predict_step_ms("allgather", [10.0, 12.0, 11.0, 9.0], comm, 100.0)
    assert ag["predicted_ms"] == pytest.approx(52.0) and ag["compute_ms"] == 12.0
    ring = B.predict_step_ms("ring", np.array([[5.0, 20.0], [6.0, 1.0]]), comm, 100.0)
    # per step: max(slowest rank, 40/2 = 20 ms hop) -> max(6, 20) + max(20, 20)
    assert ring["predicted_ms"] == pytest.approx(40.0) and ring["compute_ms"] == pytest.approx(26.0)
    assert ring["exposed_comm_ms"] == pytest.approx(14.0)


def test_comm_bytes_are_the_comm_module_te_schedule():
    from tutorial_utils.perfmodel.comm import comm_for_workload

    wl = get_workload("seed")
    for s in ("ring", "allgather", "ulysses"):
        vol = comm_for_workload(wl, s, cp_size=4, schedule="te")
        assert B.comm_bytes(s, wl, 4) == {"fwd": vol.fwd_sent, "bwd": vol.bwd_sent}, s
        assert vol.fwd_sent > 0
    assert B.comm_bytes("single", wl, 4) == {"fwd": 0, "bwd": 0}
