"""devtools/xla_flags.py: the fusion emitters come back for TE's AllGather CP programs alone."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import xla_flags

ROOT = Path(__file__).resolve().parents[2]

# Runs the two THD recipes with a spy under the hook: which compiles got the emitters back.
_SPY = """
import json, runpy, sys
from jax._src import compiler
import xla_flags

seen = []
original = compiler.compile_or_get_cached


def spy(backend, computation, devices, options, *args, **kwargs):
    name = str(computation.operation.attributes["sym_name"]).strip('"')
    seen.append([name, int(devices.size), ("xla_cpu_use_fusion_emitters", True)
                 in list(options.env_option_overrides)])
    return original(backend, computation, devices, options, *args, **kwargs)


compiler.compile_or_get_cached = spy
installed = xla_flags.emitters_for_te_allgather()
runpy.run_path(sys.argv[1], run_name="__main__")
print("SPY " + json.dumps({"installed": installed, "seen": seen}))
"""


def _spy(recipe: str, tmp_path) -> dict:
    script = tmp_path / "spy.py"
    script.write_text(_SPY)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["TUTORIAL_TE_ALLGATHER_EMITTERS"] = "0"  # the run's own hook stays off; the spy installs it
    proc = subprocess.run(
        [sys.executable, "-m", "tutorial_utils.te_on_cpu", "--devices", "4", str(script),
         str(ROOT / "examples" / recipe)],
        env=env, capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("SPY "))
    return json.loads(line[4:])


def test_only_te_s_allgather_cp_program_compiles_with_the_emitters(tmp_path):
    gather, ring = _spy("thd_allgather_striped.py", tmp_path), _spy("thd_ring.py", tmp_path)
    if not gather["installed"]:
        assert xla_flags.NO_FUSION_EMITTERS not in xla_flags.fast_compile_flags()
        pytest.skip("this XLA compiles every program with the fusion emitters already")
    # the AllGather recipe: its CP step (4 devices) with the emitters, its one-device step and
    # every small program without
    with_emitters = [(name, n) for name, n, on in gather["seen"] if on]
    assert with_emitters == [("jit_step", 4)], gather["seen"]
    assert any(name == "jit_step" and n == 1 and not on for name, n, on in gather["seen"])
    # the Ring recipe: TE's CP program too, but not an AllGather one
    assert ("jit_step", 4, False) in [tuple(x) for x in ring["seen"]], ring["seen"]
    assert not any(on for *_, on in ring["seen"]), ring["seen"]
