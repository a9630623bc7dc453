"""Test set-up: 8 simulated CPU devices, set before JAX is imported anywhere."""

import os

# The tests' arrays are tiny and XLA's compile is most of their time (see _build_test/test-times-py3.11.json):
# they compile at XLA's lowest backend optimisation level, which cuts CPU compile time by about a
# third. The site build and the benchmarks drop these flags and compile as a reader's run does.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TUTORIAL_TE_BACKEND", "reference")

# per-test wall and JAX-compile times, written to _build_test/test-times-pyX.Y.json (tests/time_table.py)
pytest_plugins = ["time_table"]
