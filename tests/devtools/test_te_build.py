"""TE 2.20.2's own ``setup.py`` and ``build_tools/``, run as the GPU run's build step runs them.

CI-sized (``devtools/te_build_check.py``): the site-packages that ``jax[cuda13]`` lays out,
filled from PyPI with only the members TE's build reads; every C++ file of the extension
preprocessed, one compiled, no link. The whole build, to a wheel and an import, is
``make gpu-rehearse``. Each fix of the old plan is shown to matter by leaving it out.
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "devtools"))

import te_build_check as T  # noqa: E402

from tutorial_utils.cli import gpu_setup as G  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def root():
    return Path(T.prepare(ROOT / T.CACHE)["root"])


@pytest.fixture(scope="module")
def built(root):
    """The build in a folder inside this git checkout, as the GPU run builds in ``gpu-bundle/``."""
    return T.configure_and_compile(root, root / "work")


def test_tes_setup_py_finds_every_header_and_compiles_with_the_fixed_plan(built, root):
    assert built["rc"] == 0, built["output"][-3000:]
    report = built["report"]
    assert report["stopped_before_link"] and report["compiled"] == [T.COMPILED]
    seen = set(report["preprocessed"] + report["compiled"]) - {
        "flagcheck.cpp"
    }  # pybind11's flag probe
    assert sorted(seen) == built["sources"]  # every C++ file of the extension
    assert report["version"] == G.TE_VERSION  # NVTE_NO_LOCAL_VERSION=1: no "+<commit>"
    assert report["peak_parallel"] == 2  # ParallelCompile ran the jobs it was given
    dirs = report["include_dirs"]
    assert dirs[0] == str(
        root / "node" / "nvidia" / "cu13" / "include"
    )  # pip's nvcc picks the CUDA headers
    assert any(d.endswith("nvidia-cudnn-frontend/include") for d in dirs)
    includes = built["env"]["CPLUS_INCLUDE_PATH"].split(":")
    assert includes[0].endswith("nvidia/cudnn/include") and includes[1].endswith(
        "nvidia-nvtx/nvidia/cu13/include"
    )


def test_without_cudnn_frontend_the_build_stops_as_the_old_plan_did(root):
    result = T.configure_and_compile(
        root, root / "work-no-frontend", leave_out=["nvidia-cudnn-frontend"]
    )
    assert result["rc"] != 0 and result["report"] is None
    assert (
        "RuntimeError: nvidia-cudnn-frontend is required to build Transformer Engine"
        in result["output"]
    )


def test_without_the_nvtx_headers_every_file_fails_to_preprocess(root):
    result = T.configure_and_compile(root, root / "work-no-nvtx", leave_out=["nvidia-nvtx"])
    assert result["rc"] != 0
    assert (
        "common/./nvtx.h:10:10: fatal error: nvtx3/nvToolsExt.h: No such file or directory"
        in result["output"]
    )


def test_in_a_git_checkout_te_versions_the_wheel_with_the_commit_unless_told_not_to(root):
    old = T.configure_and_compile(
        root, root / "work-version", local_version=True, version_only=True
    )
    assert old["rc"] == 0 and old["report"]["version"].startswith(G.TE_VERSION + "+")
    new = T.configure_and_compile(root, root / "work-version", version_only=True)
    assert new["report"]["version"] == G.TE_VERSION
