"""``python -m tutorial_utils.cli.check``: verdict lines, the JSON report, SKIP without real TE, and
real failures."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tutorial_utils.cli import check as C

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^(PASS|FAIL|SKIP) \S.*: .+$")


def _env(devices=None, backend="reference"):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["TUTORIAL_TE_BACKEND"] = backend
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.slow
def test_check_quick_on_one_cpu_device(tmp_path):
    """On CPU the te-* checks run TE's own code with the CPU kernel, and say so; at cp=1 no CP check
    passes.

    (``check`` as typed, with 4 simulated devices and CP at cp=4, is run from a fresh clone by
    tests/site/test_shown_commands.py: the README shows that command.)
    """
    out = tmp_path / "sub" / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tutorial_utils.cli.check",
            "--quick",
            "--devices",
            "1",
            "--out",
            str(out),
        ],
        env=_env(backend="te-cpu"),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [
        l
        for l in proc.stdout.splitlines()
        if l and not l.startswith("#") and not l.startswith("check:")
    ]
    assert lines and all(LINE.match(l) for l in lines), lines
    report = json.loads(out.read_text())
    assert (
        report["ok"] is True
        and report["real_te"] is False
        and report["te_backend_kind"] == "te-cpu"
    )
    assert report["summary"]["FAIL"] == 0 and report["summary"]["PASS"] >= 8
    assert report["environment"]["platform"] == "cpu" and report["environment"]["device_count"] == 1
    checks = {c["name"]: c for c in report["checks"]}
    te_checks = [c for n, c in checks.items() if n.startswith("te-")]
    for c in te_checks:
        if c["name"].startswith("te-cp-"):  # one device: nothing to shard over
            assert c["verdict"] == "SKIP" and "needs >= 2 devices" in c["detail"], c
        else:
            assert c["verdict"] == "PASS" and c["detail"].endswith(
                "[TE-on-CPU: TE's JAX code, CPU reference kernel in place of cuDNN]"
            ), c
    assert {"te-fused-attn:thd-gqa-swa", "te-emulated-subproblems"} <= set(checks)
    # one device: no CP to check (SKIP, with the reason), but the 4-rank split computed one rank at
    # a time runs
    for strategy in ("allgather", "ring", "ulysses"):
        assert checks[f"cp-{strategy} (cp=1, cpu)"]["verdict"] == "SKIP"
        assert "at cp=1 nothing is sharded" in checks[f"cp-{strategy} (cp=1, cpu)"]["detail"]
        assert checks[f"cp-emulated-{strategy} (4 ranks, one at a time)"]["verdict"] == "PASS"
    _assert_no_cp_check_passes_at_cp_1(proc.stdout.splitlines())
    assert checks["facade-signatures"]["verdict"] == "PASS"
    assert checks["emulation-descriptors"]["verdict"] == "PASS"
    assert any(
        n.startswith("reference-vs-oracle:") and c["verdict"] == "PASS" for n, c in checks.items()
    )


def _assert_no_cp_check_passes_at_cp_1(lines):
    """No ``cp-*`` / ``te-cp-*`` line passes without sharding; only the emulation (4 ranks, one at a
    time) may."""
    cp_pass = [l for l in lines if re.match(r"PASS (te-)?cp-", l)]
    for line in cp_pass:
        assert "cp=1" not in line and (
            "4 ranks, one at a time" in line or re.search(r"cp=([2-9]|\d\d)", line)
        ), line


def test_no_cp_check_passes_on_one_device():
    """In-process on one of the suite's devices: every CP check that would run at cp=1 is SKIP with
    the reason."""
    import jax

    lines = []
    for only in (
        "cp-allgather (",
        "cp-ring (",
        "cp-ulysses (",
        "te-cp-",
    ):  # the emulation runs in the slow CLI test
        results, more = _run(quick=True, devices=jax.devices()[:1], only=only, te_plumbing=True)
        lines += more
        assert results and all(r.verdict == "SKIP" for r in results.values()), more
    assert len(lines) == 5
    for strategy in ("allgather", "ring", "ulysses"):
        assert f"SKIP cp-{strategy} (cp=1, cpu): CP needs >= 2 devices, found 1" in "\n".join(lines)
    _assert_no_cp_check_passes_at_cp_1(lines)


def test_simulated_devices_are_set_before_jax_starts(monkeypatch):
    """check's device set-up: the notebooks' 4 devices by default, --devices N replaces an inherited
    count."""
    import tutorial_utils.pages.runtime as R

    calls = []
    monkeypatch.setattr(
        R, "setup_devices", lambda n: calls.append((n, R.os.environ.get("XLA_FLAGS")))
    )
    monkeypatch.setattr(R, "gpu_present", lambda: False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_foo=1")
    assert C.simulate_cpu_devices(None) == 4 and calls[-1] == (4, "--xla_foo=1")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --xla_foo=1")
    assert C.simulate_cpu_devices(None) is None  # an explicit XLA_FLAGS count is the user's choice
    assert C.simulate_cpu_devices(1) == 1 and calls[-1] == (1, "--xla_foo=1")
    monkeypatch.setattr(R, "gpu_present", lambda: True)
    assert C.simulate_cpu_devices(4) is None  # GPUs: nothing simulated


def test_simulated_devices_reach_jax_although_the_package_imports_it():
    """``import tutorial_utils`` imports JAX without starting it; the CLI's set-up must still give 4
    devices."""
    code = (
        "import sys, tutorial_utils.cli.check as C; assert 'jax' in sys.modules; "
        "from tutorial_utils.gpu import jax_started; assert not jax_started(); "
        "C.simulate_cpu_devices(None); import jax; print(len(jax.devices()), jax_started())"
    )
    env = _env()
    env.pop("XLA_FLAGS", None)
    env.pop("JAX_PLATFORMS", None)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["4", "True"]


def test_tolerances_are_te_s():
    import jax.numpy as jnp

    assert C.tolerance(jnp.bfloat16) == pytest.approx(0.03937, abs=1e-4)
    assert C.tolerance(jnp.float16) == pytest.approx(0.00984, abs=1e-4)
    assert C.tolerance(jnp.float32) == pytest.approx(2.42e-5, rel=1e-2)


def test_compare_is_allclose():
    a = np.array([1.0, 2.0])
    assert C.compare(a, a + 0.01, 0.01)["ok"]
    assert not C.compare(a, a + 0.05, 0.01)["ok"]
    assert not C.compare(np.array([np.nan]), np.array([0.0]), 1.0)["ok"]
    assert not C.compare(np.zeros(2), np.zeros(3), 1.0)["ok"]


def _run(**kw):
    lines = []
    results = C.run_checks(echo=lines.append, **kw)
    return {r.name: r for r in results}, lines


def test_cp_strategies_on_the_eight_test_devices():
    import jax

    assert len(jax.devices()) == 8
    results, lines = _run(quick=True, only="cp-ring (")
    assert list(results) == ["cp-ring (cp=8, cpu)"]
    assert results["cp-ring (cp=8, cpu)"].verdict == "PASS", lines


@pytest.mark.slow
def test_te_plumbing_runs_the_te_comparisons_on_the_reference_facade():
    """On 4 of the 8 devices: the CP size ``check`` takes by default (cp = 8 runs in the test
    above)."""
    import jax

    results, lines = _run(quick=True, te_plumbing=True, only="te-", devices=jax.devices()[:4])
    assert results["te-fused-attn:thd-gqa-swa"].verdict == "PASS", lines
    assert "plumbing self-test, not TE" in results["te-fused-attn:thd-gqa-swa"].detail
    assert results["te-cp-allgather"].verdict == "PASS", lines
    assert results["te-cp-ring"].verdict == "PASS", lines
    assert results["te-cp-ring"].detail.startswith("cp=4 stripe=1"), results["te-cp-ring"].detail
    assert results["te-emulated-subproblems"].verdict == "PASS", lines


def test_a_wrong_kernel_fails_the_te_check(monkeypatch):
    """The TE comparison is not vacuous: perturb the facade's output and the check must FAIL."""
    from tutorial_utils.te import attention as ta

    real = ta.fused_attn

    def skewed(*args, **kwargs):
        return real(*args, **kwargs) * 1.1

    monkeypatch.setattr(ta, "fused_attn", skewed)
    results, lines = _run(quick=True, te_plumbing=True, only="te-fused-attn:thd-gqa-causal")
    res = results["te-fused-attn:thd-gqa-causal"]
    assert res.verdict == "FAIL", lines
    assert "beyond tol" in res.detail and "out" in res.detail


def test_a_wrong_descriptor_fails_the_descriptor_check(monkeypatch):
    from tutorial_utils.cli import bench as bench_cli

    real = bench_cli.ring_ragged_calls

    def off_by_one(*args, **kwargs):
        import dataclasses

        return [dataclasses.replace(c, window=None) for c in real(*args, **kwargs)]

    monkeypatch.setattr(bench_cli, "ring_ragged_calls", off_by_one)
    results, _ = _run(quick=True, only="emulation-descriptors")
    assert results["emulation-descriptors"].verdict == "FAIL"
    assert "ragged runs give" in results["emulation-descriptors"].detail


def test_signature_check_notices_a_renamed_parameter(monkeypatch):
    from tutorial_utils.cli import check_signatures

    renamed = C.FUSED_ATTN_PARAMS[:-1] + ("return_max_logits",)
    monkeypatch.setattr(check_signatures, "FUSED_ATTN_PARAMS", renamed)
    results, _ = _run(only="facade-signatures")
    assert results["facade-signatures"].verdict == "FAIL"
    assert "fused_attn parameters" in results["facade-signatures"].detail


def test_cp_workload_for_fits_any_device_count():
    from tutorial_utils.validation import check_ulysses_heads

    for n in (1, 2, 3, 4, 6, 8):
        wl = C.cp_workload_for(n)
        assert (
            wl.cp_size == n
            and wl.seq_len % (n * wl.stripe_size) == 0
            and wl.slot_len % (n * wl.stripe_size) == 0
        )
        check_ulysses_heads(wl.num_q_heads, wl.num_kv_heads, n)
        assert wl.window[0] >= n - 1
