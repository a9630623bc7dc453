"""Test set-up: 8 simulated CPU devices, set before JAX is imported anywhere."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TUTORIAL_TE_BACKEND", "reference")

# per-test wall and JAX-compile times, written to _build_test/test-times.json (tests/time_table.py)
pytest_plugins = ["time_table"]
