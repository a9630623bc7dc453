"""The performance guide (docs/performance.md) names only XLA flags this JAX accepts.

An unknown flag in ``XLA_FLAGS`` aborts the process when the backend starts, on a CPU too, and
GPU flags are accepted (and ignored) there: so one CPU process started with every flag the
page names checks them all. A flag XLA removed shows that the check can fail.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _start(flags: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}
    code = "import jax; print(jax.devices()[0].platform)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def page_flags() -> list[str]:
    text = (ROOT / "docs" / "performance.md").read_text()
    flags = sorted(set(re.findall(r"--xla_[a-z0-9_]+(?:=[^\s`\"]+)?", text)))
    # a placeholder value N becomes a number; the dump folder a temporary one
    return [f.replace("=N", "=1") for f in flags]


def test_every_flag_on_the_page_starts_a_backend(tmp_path):
    flags = page_flags()
    assert len(flags) >= 12, flags
    dump = str(tmp_path / "hlo-dump")
    proc = _start([f.replace("=hlo-dump", f"={dump}") for f in flags])
    assert proc.returncode == 0 and proc.stdout.strip() == "cpu", proc.stderr[-2000:]


def test_a_flag_xla_removed_aborts_the_start():
    proc = _start(["--xla_gpu_enable_async_all_gather=true"])
    assert proc.returncode != 0 and "Unknown flag in XLA_FLAGS" in proc.stderr
