"""The suite's time table (tests/time_table.py) records wall and JAX compile time per test."""

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]  # tests/: time_table.py
ROOT = TESTS.parent

INNER = """
import jax, jax.numpy as jnp, pytest

def test_compiles():
    assert float(jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((32, 32))).sum()) != 0.0

def test_no_jax():
    assert True

@pytest.mark.skip(reason="shown as skipped")
def test_skipped():
    pass
"""


def test_time_table_records_wall_and_compile_time_per_test(tmp_path):
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "JAX_PLATFORMS": "cpu",
        "LD_PRELOAD": os.environ.get("LD_PRELOAD", ""),
        "OPENBLAS_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "time_table",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            "-c",
            os.devnull,
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ten slowest tests" in proc.stdout
    table = json.loads(next((tmp_path / "_build_test").glob("test-times-py*.json")).read_text())
    rows = {k.split("::")[-1]: v for k, v in table["tests"].items()}
    assert set(rows) == {"test_compiles", "test_no_jax", "test_skipped"}
    assert rows["test_compiles"]["compile_s"] > 0 and rows["test_compiles"]["backend_compile_s"] > 0
    assert rows["test_compiles"]["compile_s"] <= rows["test_compiles"]["wall_s"] + 1e-3
    assert rows["test_compiles"]["compiles"] >= 1 and rows["test_no_jax"]["compiles"] == 0
    assert rows["test_no_jax"]["compile_s"] == 0
    assert (
        rows["test_skipped"]["outcome"] == "skipped"
        and rows["test_compiles"]["outcome"] == "passed"
    )
    assert table["ld_preload"] == env["LD_PRELOAD"] and table["openblas_num_threads"] == "1"
    (worker,) = table["workers_busy"].values()  # no xdist: the one process ran all three
    assert (
        worker["tests"] == 3 and 0 < worker["last_stop_s"] <= table["session_wall_s"] + 0.2
    )  # rounding, two clocks
    assert abs(worker["busy_s"] - sum(r["wall_s"] for r in rows.values())) < 0.01
    (file_row,) = table["files"].values()
    assert (
        file_row["tests"] == 3
        and abs(file_row["wall_s"] - sum(r["wall_s"] for r in rows.values())) < 0.01
    )


def test_files_are_handed_out_longest_first_and_the_weights_name_real_files():
    from time_table import FILE_SECONDS, heaviest_files_first

    ids = [
        "tests/test_a.py::x",
        "tests/site/test_site.py::b",
        "tests/test_a.py::y",
        "tests/test_z.py::c",
        "tests/cli/test_plan.py::d",
        "tests/site/test_site.py::e",
    ]
    assert heaviest_files_first(ids) == [
        "tests/site/test_site.py::b",
        "tests/site/test_site.py::e",
        "tests/cli/test_plan.py::d",
        "tests/test_a.py::x",
        "tests/test_a.py::y",
        "tests/test_z.py::c",
    ]
    assert all((ROOT / name).is_file() for name in FILE_SECONDS), [
        n for n in FILE_SECONDS if not (ROOT / n).is_file()
    ]
