"""The run's shared compilation cache (devtools/compile_cache.py) never hands one TE program
another's executable.

``tests/scripts/compile_cache_script.py`` compiles TE's AllGather call load balanced, not load
balanced, then load balanced again, each as a fresh jit, in its own process with an empty cache.
The two configurations differ only in what TE's partition callback does, which JAX's key does not
see.
"""

import functools
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import compile_cache
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, mode):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "scripts" / "compile_cache_script.py"),
            str(tmp_path / mode),
            mode,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "Invalid stack_frame_id" not in proc.stderr
    )  # XLA's warning when it loads traceback locations
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["enabled"] is True
    return (
        [r["hit"] for r in report["runs"]],
        [np.array(r["out"]) for r in report["runs"]],
        report["uncached"],
    )


def test_configurations_get_their_own_entries_and_a_repeat_hits(tmp_path):
    hits, (balanced, plain, again), uncached = _run(tmp_path, "safe")
    assert hits == [
        False,
        False,
        True,
    ]  # the repeat of the first configuration is served from the cache
    assert (
        np.abs(balanced - plain).max() > 0.1
    )  # the two configurations really compute different things
    np.testing.assert_array_equal(again, balanced)
    assert uncached == 1  # the host-callback program is compiled, not cached


def test_a_key_blind_to_te_s_configuration_returns_the_other_program(tmp_path):
    """The check can fail: with one fingerprint for all, the second call silently runs the first's
    program."""
    hits, (balanced, plain, _), _ = _run(tmp_path, "blind")
    assert hits == [False, True, True]
    np.testing.assert_array_equal(plain, balanced)


_DEVICE_COUNT_SCRIPT = """
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=" + sys.argv[1]
import tutorial_utils  # turns the cache on from the environment
import jax, jax.numpy as jnp, numpy as np
import jax.monitoring
hits = []
jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event) if
event.endswith("cache_hits") else None)
f = jax.jit(lambda x: jnp.sin(x) * 2.0 + jnp.cumsum(x))
out = f(jax.device_put(np.linspace(0.0, 1.0, 64, dtype=np.float32), jax.devices()[0]))
report = {"devices": len(jax.devices()), "hits": len(hits), "out": np.asarray(out).tolist()}
if len(jax.devices()) >= 4:  # and a program over devices 0-3 with a collective in it
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    g = jax.jit(jax.shard_map(lambda x: x - jax.lax.psum(x, "x"), mesh=mesh, in_specs=P("x"),
    out_specs=P("x")))
    before = len(hits)
    y = g(jax.device_put(np.arange(8, dtype=np.float32), NamedSharding(mesh, P("x"))))
    report.update(sharded_hits=len(hits) - before, sharded=np.asarray(y).tolist())
print(json.dumps(report))
"""


def test_programs_are_read_back_by_processes_with_more_devices(tmp_path):
    """Processes simulating 1, 4 and 8 CPU devices: one entry per program, and the same results.

    The one-device program is compiled by the first process and read by the other two; the one
    over devices 0-3 with a ``psum`` is compiled by the 4-device process and run from its entry
    by the 8-device one.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", compile_cache.FLAGS_ENV)}
    env[compile_cache.ENV] = str(tmp_path / "cache")
    runs = []
    for devices in ("1", "4", "8"):
        proc = subprocess.run(
            [sys.executable, "-c", _DEVICE_COUNT_SCRIPT, devices],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert [r["devices"] for r in runs] == [1, 4, 8]
    assert runs[0]["hits"] == 0 and runs[1]["hits"] >= 1, (
        runs
    )  # the 4-device process read the 1-device entry
    np.testing.assert_array_equal(runs[0]["out"], runs[1]["out"])
    np.testing.assert_array_equal(runs[0]["out"], runs[2]["out"])
    assert runs[1]["sharded_hits"] == 0 and runs[2]["sharded_hits"] == 1, runs
    x = np.arange(8, dtype=np.float32)
    want = x - np.tile(
        x.reshape(4, 2).sum(0), 4
    )  # each device's two values minus the sum over the devices
    np.testing.assert_array_equal(runs[1]["sharded"], want)
    np.testing.assert_array_equal(runs[2]["sharded"], want)


class _Slots:
    __slots__ = ("a", "__weakref__")

    def __init__(self):
        self.a = 3


def test_fingerprint_text_is_reproducible_or_refused():
    assert compile_cache._plain_repr(_Slots()) == "_Slots([('a', 3)])"
    with pytest.raises(compile_cache._NotReproducible, match="no reproducible text"):
        compile_cache._plain_repr(object())
    with pytest.raises(compile_cache._NotReproducible, match="not a module-level function"):
        compile_cache._name(lambda: None)
    assert compile_cache._name(json.dumps) == "json.dumps"
    # a partial names its module-level function and bound arguments (the facade's placement guard is
    # one)
    assert (
        compile_cache._name(functools.partial(json.dumps, "q", indent=2))
        == "json.dumps(*('q',), **[('indent', 2)])"
    )
    with pytest.raises(compile_cache._NotReproducible, match="not a module-level function"):
        compile_cache._name(functools.partial(lambda x: x, 1))
    info = types.SimpleNamespace(
        partition=functools.partial(json.dumps, object()),
        infer_sharding_from_operands=None,
        propagate_user_sharding=None,
        static_args=(),
        mesh=None,
        in_tree=None,
        out_tree=None,
    )
    with pytest.raises(
        compile_cache._NotReproducible, match="no reproducible text"
    ):  # an object bound in
        compile_cache._fingerprint(info, "")


def test_a_path_that_is_not_a_folder_is_refused(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(
        ValueError, match=r"path='.*a-file' must name a folder .*TUTORIAL_COMPILE_CACHE_DIR"
    ):
        compile_cache.enable(tmp_path / "a-file")
    with pytest.raises(ValueError, match=r"path='' must name a folder"):
        compile_cache.enable("")


def test_the_run_s_xla_flags_reach_a_subprocess_that_builds_its_own(monkeypatch):
    """A subprocess that sets its own XLA_FLAGS (here a device count) still compiles at the run's
    level."""
    env = {k: v for k, v in os.environ.items() if k != compile_cache.ENV}
    env.update(
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
        JAX_PLATFORMS="cpu",
        **{compile_cache.FLAGS_ENV: "--xla_backend_optimization_level=0"},
    )
    code = (
        "import os, tutorial_utils, jax; print(os.environ['XLA_FLAGS']); print(len(jax.devices()))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == [
        "--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0",
        "2",
    ]
    # in-process: a flag the process names keeps its value, and nothing changes once JAX has started
    monkeypatch.setattr(compile_cache, "_jax_started", lambda: False)
    monkeypatch.setenv(
        compile_cache.FLAGS_ENV,
        "--xla_backend_optimization_level=0 --xla_cpu_enable_fast_math=false",
    )
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=2")
    assert compile_cache.add_run_flags() == ["--xla_cpu_enable_fast_math=false"]
    assert (
        os.environ["XLA_FLAGS"]
        == "--xla_backend_optimization_level=2 --xla_cpu_enable_fast_math=false"
    )
    monkeypatch.setattr(compile_cache, "_jax_started", lambda: True)
    monkeypatch.setenv("XLA_FLAGS", "")
    assert compile_cache.add_run_flags() == [] and os.environ["XLA_FLAGS"] == ""
    monkeypatch.setenv(compile_cache.FLAGS_ENV, "--xla_backend_optimization_level=0 O0")
    with pytest.raises(
        ValueError, match=r"TUTORIAL_RUN_XLA_FLAGS=.*'O0' is not an XLA flag.*or unset"
    ):
        compile_cache.add_run_flags()


def test_the_key_reads_the_environment_te_s_callbacks_read_and_no_more(monkeypatch):
    """TE's ``NVTE_*`` and the stand-in's kernel choice change the key; the tutorial's other
    settings do not."""
    for name in [k for k in os.environ if k.startswith(compile_cache.ENV_READ_BY_CALLBACKS)]:
        monkeypatch.delenv(name)
    base = compile_cache._global_state()
    for name, value in (
        ("TUTORIAL_TE_BACKEND", "te-cpu"),
        ("TUTORIAL_RECORDS_DIR", "/tmp/x"),
        (compile_cache.ENV, "/tmp/c"),
    ):
        monkeypatch.setenv(name, value)
    assert compile_cache._global_state() == base
    for name, value in (
        ("NVTE_FUSED_RING_ATTENTION_USE_SCAN", "0"),
        ("TUTORIAL_CPU_KERNEL", "jax"),
    ):
        monkeypatch.setenv(name, value)
        changed = compile_cache._global_state()
        assert changed != base and f"{name}={value}" in changed
        monkeypatch.delenv(name)


def test_a_cpu_program_gets_one_key_in_every_process_and_at_every_device_count():
    """Ranks, and processes simulating different device counts, report different CPU topologies; the
    key takes the devices."""
    import hashlib

    from jax._src import cache_key

    compile_cache._share_between_cpu_processes()  # what enable() does (idempotent)
    patched = cache_key._hash_accelerator_config
    assert patched.__wrapped__ is not None

    def digest(devices):
        h = hashlib.sha256()
        patched(h, np.array(devices, dtype=object))
        return h.hexdigest()

    rank = lambda i, p, kind="cpu": types.SimpleNamespace(
        id=i, process_index=p, platform="cpu", device_kind=kind
    )  # noqa: E731
    two_ranks = [rank(0, 0), rank(1, 1)]
    assert digest(two_ranks) == digest([rank(0, 0), rank(1, 1)])  # the same in every process
    assert digest(two_ranks) != digest([rank(0, 0), rank(2, 1)])  # other devices, another key
    assert digest(two_ranks) != digest([rank(0, 0), rank(1, 1, "other")])
    import jax

    # One process: its CPU devices by kind and id, whatever number of them the process simulates
    local = list(jax.devices()[:2])
    assert digest(local) == digest([rank(0, 0), rank(1, 0)])  # what a 2-device process would give
    assert digest(local) != digest(two_ranks)  # not the same program over two processes
    assert digest(local) != digest([rank(0, 0), rank(2, 0)])  # other devices, another key
    assert digest(local[:1]) != digest(local)
    fingerprint = hashlib.sha256()
    patched.__wrapped__(
        fingerprint, np.array(local, dtype=object)
    )  # JAX's own: the topology, 8 devices here
    assert digest(local) != fingerprint.hexdigest()
