"""TE's loader on the lent node's layout (``devtools/gpu_node.py``), offline: TE 2.20.2's own
``common/__init__.py`` and the run's gate, with every library a stand-in of the same file name,
soname and folder. With a system toolkit (NVRTC and cuRAND at ``CUDA_HOME``) TE takes its other
branch and no longer preloads cuBLAS: the plan that put only NCCL's folder on the loader
path fails at ``libcublas.so.13``; the run's path now loads TE's core library on both branches.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "devtools"))

import gpu_node as N  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="the stand-ins need gcc")


def test_the_nodes_branch_fails_at_cublas_with_nccls_folder_alone_and_loads_with_the_runs_path(
    tmp_path,
):
    report = N.rehearse_loader(tmp_path / "node", ROOT)
    assert report["ok"], report["problems"]
    cases = report["cases"]
    before, now = cases["system toolkit, before"], cases["system toolkit, now"]
    # the plan before: TE finds NVRTC in CUDA_HOME, so nothing preloads cuBLAS
    assert before["gate"] == (
        "import gate: transformer_engine.jax failed to import: OSError: libcublas.so.13: cannot"
        " open shared object file: No such file or directory"
    )
    assert before["preflight"].startswith("TE's core library would not load: libcublas.so.13")
    assert "gpu_setup library-path" in before["preflight"]  # the fix is named
    # the plan now: the same branch, TE's core library loaded, the gate past it
    assert now["probe"]["ok"] and now["probe"]["load_libs_for_no_ctk"] is False
    assert now["probe"]["system_nvrtc"] and now["probe"]["system_curand"]
    assert now["probe"]["core"].endswith("transformer_engine/wheel_lib/libtransformer_engine.so")
    assert now["gate"].endswith(
        "FileNotFoundError: Could not find shared object file for Transformer Engine jax lib."
    )  # the stand-in's end: no extension was built here
    assert now["LD_LIBRARY_PATH"].split(":")[0].endswith("nvidia/nccl/lib")
    # the pip branch loads either way: the layout jax[cuda13] alone gives never showed it
    for plan in ("before", "now"):
        assert cases[f"pip only, {plan}"]["probe"]["load_libs_for_no_ctk"] is True
        assert cases[f"pip only, {plan}"]["probe"]["ok"]


def test_the_stand_in_core_library_needs_what_tes_does_and_has_no_runpath(tmp_path):
    node = N.loader_node(tmp_path / "node")
    dynamic = subprocess.run(
        ["readelf", "-d", node["core"]], capture_output=True, text=True, check=True
    ).stdout
    needed = [line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert [n for n in needed if n in N.CORE_NEEDS] == list(N.CORE_NEEDS)
    assert "RUNPATH" not in dynamic and "RPATH" not in dynamic
