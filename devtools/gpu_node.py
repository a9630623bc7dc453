"""The lent GPU node as the rehearsals lay it out here: its image's packages, its system toolkit,
its loader.

A development tool. The node's image (the device entry's KINDS.md): Python 3.12 at
``/opt/torch/.venv``, torch 2.11.0+cu130, jax 0.11.2 with the CUDA 13 plugin, pip's CUDA 13
wheels at the versions torch 2.11.0 pins (:data:`NODE_IMAGE`), and a system ``nvcc`` 13.0 under
``/usr/local/cuda``. That toolkit decides TE's loader branch: with NVRTC or cuRAND found there,
TE's ``common/__init__.py`` sets ``load_libs_for_no_ctk = False`` and no longer preloads cuBLAS
or cudart from pip, while ``libtransformer_engine.so`` needs both and has no RUNPATH.

Two nodes are made:

* :func:`make_node`, for ``gpu_carry.py rehearse``: a fresh venv with :data:`NODE_PACKAGES`
  from the registry, torch included, and a CUDA 13.0 toolkit at ``CUDA_HOME`` made of NVIDIA's
  own wheels (:data:`TOOLKIT_WHEELS`: ``nvcc``, the headers, NVRTC and cuRAND).
* :func:`loader_node`, for ``gpu_carry.py rehearse-loader`` and the tests: offline, in seconds.
  Real: TE 2.20.2's Python (its loader, run unchanged), this project's gate, glibc's dynamic
  linker, and every library's file name, soname and folder as pip and the toolkit lay them out.
  Stand-ins: the libraries' contents (empty ``gcc -shared`` libraries; the core library's only
  content is its ``DT_NEEDED`` list, read by the issue's audit from TE 2.20.2's wheel), torch (a
  package with ``__version__``: TE's import asks nothing else of it before it looks for its
  PyTorch extension), ``CUDA_HOME`` for ``/usr/local/cuda`` (TE searches it first), and this
  machine's Python and JAX for the node's 3.12 and 0.11.2.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tutorial_utils.cli import gpu_setup as G

__all__ = [
    "NODE_IMAGE",
    "NODE_PACKAGES",
    "TOOLKIT_WHEELS",
    "NODE_PYTHON",
    "CORE_NEEDS",
    "node_python",
    "make_node",
    "stub_library",
    "loader_node",
    "base_env",
    "nccl_only_env",
    "run_env",
    "probe",
    "gate",
    "rehearse_loader",
    "purelib_of",
]

#: The node's packages that the GPU run meets, at the image's versions: torch 2.11.0's own
#: pins (``cuda-toolkit==13.0.2``'s wheels, cuDNN, NCCL), JAX's, and the system ``nvcc``.
NODE_IMAGE = {
    "python": "3.12",
    "torch": "2.11.0+cu130",
    "jax": "0.11.2",
    "jax-cuda13-plugin": "0.11.2",
    "nvidia-cublas": "13.1.0.3",
    "nvidia-cuda-runtime": "13.0.96",
    "nvidia-cuda-nvrtc": "13.0.88",
    "nvidia-curand": "10.4.0.35",
    "nvidia-nvtx": "13.0.85",
    "nvidia-cudnn-cu13": "9.19.0.56",
    "nvidia-nccl-cu13": "2.28.9",
    "system nvcc": "13.0.88 (/usr/local/cuda)",
}
#: What ``make_node`` installs from the registry: the image's JAX, Flax (TE's JAX code imports
#: it) and torch, whose exact pins bring pip's CUDA 13.0 libraries at the image's versions.
NODE_PACKAGES = ("jax[cuda13]==0.11.2", "flax==0.12.8", "torch==2.11.0")
#: NVIDIA's wheels that make the CUDA 13.0 toolkit at ``CUDA_HOME``: ``nvcc`` with its headers
#: (what TE builds with), NVRTC and cuRAND (what turns TE's loader to the system branch).
TOOLKIT_WHEELS = (
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-nvrtc==13.0.88",
    "nvidia-curand==10.4.0.35",
)
NODE_PYTHON = "3.12"
#: ``libtransformer_engine.so``'s libraries beyond the C++ runtime, in its ``DT_NEEDED`` order.
CORE_NEEDS = ("libcublas.so.13", "libcublasLt.so.13", "libcudart.so.13")


def node_python(version: str = NODE_PYTHON) -> str:
    """``python<version>``: pyenv's first (as the Makefile's PYTHON312), then the PATH's, if it
    runs."""
    candidates = sorted(Path.home().glob(f".pyenv/versions/{version}*/bin/python{version}")) + [
        shutil.which(f"python{version}")
    ]
    for found in filter(None, candidates):
        if subprocess.run([str(found), "-c", "pass"], capture_output=True).returncode == 0:
            return str(found)
    raise SystemExit(
        f"no working python{version} found: install it (pyenv install {version}) or pass --python."
    )


def _pip(python: Path, args: Sequence[str]) -> None:
    uv = shutil.which("uv") or (Path(sys.executable).parent / "uv")
    if Path(uv).is_file():
        G.run_echoed([str(uv), "pip", "install", "--python", str(python), *args])
    else:
        G.run_echoed([str(python), "-m", "pip", "install", "--quiet", *args])


def make_node(
    work: Path, python: str, packages: Sequence[str] = NODE_PACKAGES
) -> tuple[Path, Path]:
    """A fresh venv that looks like the node: ``packages`` from the registry and nothing else,
    and a CUDA 13.0 toolkit of :data:`TOOLKIT_WHEELS` in ``work/toolkit``.

    Returns:
        ``(the venv's python, CUDA_HOME)``.
    """
    node = work / "node"
    shutil.rmtree(node, ignore_errors=True)
    subprocess.run([python, "-m", "venv", str(node)], check=True)
    _pip(node / "bin" / "python", packages)
    toolkit = work / "toolkit"
    shutil.rmtree(toolkit, ignore_errors=True)
    _pip(node / "bin" / "python", ["--no-deps", "--target", str(toolkit), *TOOLKIT_WHEELS])
    return node / "bin" / "python", toolkit / "nvidia" / "cu13"


# ----------------------------------------------------------------------------- the loader node


def stub_library(
    path: Path, soname: str, needs: Sequence[str] = (), code: str = "", search: Sequence[Path] = ()
) -> Path:
    """A shared library at ``path`` with ``soname``, ``needs`` in its ``DT_NEEDED`` (found in
    ``search`` at link time only: no RUNPATH) and the C ``code`` as its content.

    Args:
        path: the file to write.
        soname: its ``DT_SONAME``.
        needs: sonames it needs, in order.
        code: C source (one harmless function when empty).
        search: folders holding ``needs`` for the link.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.with_name(path.name + ".c")
    source.write_text(code or f"int {path.name.split('.')[0]}_stand_in(void) {{ return 0; }}\n")
    cmd = ["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), str(source)]
    cmd += [f"-L{d}" for d in search] + ["-Wl,--no-as-needed"] + [f"-l:{n}" for n in needs]
    subprocess.run(cmd, check=True, capture_output=True)
    source.unlink()
    return path


def _dist_info(purelib: Path, project: str, version: str) -> None:
    info = purelib / f"{project.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n")
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-any\n")
    (info / "RECORD").write_text("")


def loader_node(work: Path, python: str = sys.executable) -> dict:
    """Lay out the node's loader here, offline: a venv whose site-packages holds pip's CUDA 13
    libraries, NCCL, cuDNN, TE's core library and a torch stand-in, reaching this machine's
    packages (JAX, Flax, TE's Python) through a ``.pth`` file, and a toolkit folder with
    NVRTC and cuRAND for ``CUDA_HOME``.

    Args:
        work: the folder to build in (emptied first).
        python: the Python to make the venv from (the one whose packages it reaches).

    Returns:
        ``{"python", "purelib", "cuda_home", "core"}`` (paths as strings).
    """
    work = Path(work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    venv = work / "node"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
    node_python = venv / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [str(node_python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    here = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (purelib / "machine-packages.pth").write_text(here + "\n")
    cu13 = purelib / "nvidia" / "cu13" / "lib"
    stub_library(cu13 / "libcublasLt.so.13", "libcublasLt.so.13")
    stub_library(cu13 / "libcublas.so.13", "libcublas.so.13", ["libcublasLt.so.13"], "", [cu13])
    stub_library(
        cu13 / "libcudart.so.13",
        "libcudart.so.13",
        code="int cudaRuntimeGetVersion(int *v) { *v = 13000; return 0; }\n",
    )
    stub_library(cu13 / "libnvrtc.so.13", "libnvrtc.so.13")
    stub_library(cu13 / "libcurand.so.10", "libcurand.so.10")
    stub_library(purelib / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9", "libcudnn.so.9")
    stub_library(purelib / "nvidia" / "nccl" / "lib" / "libnccl.so.2", "libnccl.so.2")
    core = stub_library(
        purelib / "transformer_engine" / "wheel_lib" / "libtransformer_engine.so",
        "libtransformer_engine.so",
        CORE_NEEDS,
        search=[cu13],
    )
    _dist_info(purelib, "transformer-engine-cu13", G.TE_VERSION)
    torch = purelib / "torch"
    torch.mkdir()
    (torch / "__init__.py").write_text(
        '"""A stand-in for torch 2.11.0+cu130: TE\'s import reads its version only."""\n'
        '__version__ = "2.11.0+cu130"\n'
    )
    toolkit = work / "toolkit"
    for name, soname in (
        ("libnvrtc.so.13.0.88", "libnvrtc.so.13"),
        ("libcurand.so.10.4.0", "libcurand.so.10"),
    ):
        stub_library(toolkit / "lib64" / name, soname)
    (toolkit / "bin").mkdir(parents=True)
    nvcc = toolkit / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    return {
        "python": str(node_python),
        "purelib": str(purelib),
        "cuda_home": str(toolkit),
        "core": str(core),
    }


#: What the probe prints: TE's own loader state after ``import transformer_engine``.
_PROBE = """\
import json, warnings
warnings.simplefilter("ignore")
try:
    import transformer_engine.common as c
    print(json.dumps({"ok": True, "load_libs_for_no_ctk": c.load_libs_for_no_ctk,
        "system_nvrtc": c.system_nvrtc, "system_curand": c.system_curand,
        "core": str(c._TE_LIB_CTYPES._name)}))
except Exception as err:
    print(json.dumps({"ok": False, "error": f"{type(err).__name__}: {err}"}))
"""


def base_env(node: dict, system_toolkit: bool) -> dict[str, str]:
    """The environment of a process on the node: no ``LD_LIBRARY_PATH`` of this machine's, and
    ``CUDA_HOME`` at the toolkit when ``system_toolkit``."""
    env = {
        "PATH": f"{Path(node['python']).parent}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "JAX_PLATFORMS": "cpu",
        "PYTHONUNBUFFERED": "1",
    }
    if system_toolkit:
        env["CUDA_HOME"] = node["cuda_home"]
    return env


def nccl_only_env(node: dict, env: dict[str, str]) -> dict[str, str]:
    """``env`` as the run gave its steps before pip's CUDA folders were added: NCCL's alone."""
    return {**env, "LD_LIBRARY_PATH": str(Path(node["purelib"]) / "nvidia" / "nccl" / "lib")}


def run_env(node: dict, env: dict[str, str]) -> dict[str, str]:
    """``env`` as the run gives its steps now (:func:`gpu_setup.library_env`, in the node's
    site-packages)."""
    return G.library_env(env, sites=[node["purelib"]])


def probe(node: dict, env: dict[str, str], timeout: float = 300) -> dict:
    """Import TE in the node's Python under ``env``; TE's own loader state, or its error."""
    proc = subprocess.run(
        [node["python"], "-c", _PROBE], env=env, capture_output=True, text=True, timeout=timeout
    )
    lines = (proc.stdout or "").strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"ok": False, "error": (proc.stderr or proc.stdout)[-600:]}


def gate(node: dict, env: dict[str, str], root: Path, timeout: float = 300) -> str:
    """The run's import gate step (``gpu_setup gate``) in the node's Python under ``env``; its
    ``import gate`` line."""
    proc = subprocess.run(
        [node["python"], "-m", "tutorial_utils.cli.gpu_setup", "gate"],
        env={**env, "PYTHONPATH": str(Path(root) / "src"), "TUTORIAL_TE_BACKEND": "te"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    text = proc.stderr + proc.stdout
    return next((x for x in text.splitlines() if "import gate" in x), text[-400:])


def preflight_libraries(node: dict, env: dict[str, str], root: Path, timeout: float = 120) -> str:
    """The preflight's check of cuBLAS, cuBLASLt and cudart (``check_core_libraries``) in the
    node's Python under ``env``: its lines, or its refusal."""
    code = (
        "from tutorial_utils.cli.gpu_cuda import check_core_libraries as c; print('; '.join(c(13)))"
    )
    proc = subprocess.run(
        [node["python"], "-c", code],
        env={**env, "PYTHONPATH": str(Path(root) / "src")},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
    return lines[-1] if lines else ""


def rehearse_loader(work: Path, root: Path = Path("."), python: str = sys.executable) -> dict:
    """TE's loader on the node, before and after pip's CUDA folders joined the run's library path.

    Four cases, each through the preflight's library check, TE's own import and the gate: the
    node's branch (``CUDA_HOME`` with NVRTC and cuRAND) and the pip branch (no
    system toolkit), each with NCCL's folder alone on ``LD_LIBRARY_PATH`` (the plan before) and
    with :func:`run_env` (the plan now). Passes when the node's branch is taken
    (``load_libs_for_no_ctk`` False), NCCL's folder alone fails there with ``libcublas.so.13``,
    and the run's environment loads TE's core library on both branches and takes the gate past
    it (to the JAX extension, which this stand-in does not have).

    Returns:
        The report: each case's probe and gate line, ``problems`` and ``ok``.
    """
    node = loader_node(work, python)
    report = {"node": {**node, "image": NODE_IMAGE}, "cases": {}, "problems": []}
    for branch, toolkit in (("system toolkit", True), ("pip only", False)):
        env = base_env(node, toolkit)
        for plan, make in (("before", nccl_only_env), ("now", run_env)):
            case_env = make(node, env)
            report["cases"][f"{branch}, {plan}"] = {
                "LD_LIBRARY_PATH": case_env.get("LD_LIBRARY_PATH", ""),
                "preflight": preflight_libraries(node, case_env, root),
                "probe": probe(node, case_env),
                "gate": gate(node, case_env, root),
            }
    problems, cases = report["problems"], report["cases"]
    before, now = cases["system toolkit, before"], cases["system toolkit, now"]
    if "libcublas.so.13: cannot open shared object file" not in before["gate"]:
        problems.append(f"the node's branch did not fail before the fix: {before['gate']}")
    if "TE's core library would not load: libcublas.so.13" not in before["preflight"]:
        problems.append(f"the preflight did not name the missing cuBLAS: {before['preflight']}")
    if "libcublas.so.13: " not in now["preflight"] or "would not load" in now["preflight"]:
        problems.append(
            f"the preflight did not load cuBLAS with the run's path: {now['preflight']}"
        )
    for name in ("system toolkit, now", "pip only, now"):
        case = cases[name]
        if not case["probe"].get("ok"):
            problems.append(f"{name}: TE did not import: {case['probe'].get('error')}")
        if "cannot open shared object file" in case["gate"]:
            problems.append(f"{name}: the gate still stops at a library: {case['gate']}")
    if now["probe"].get("load_libs_for_no_ctk") is not False:
        problems.append(f"CUDA_HOME did not turn TE to the system branch: {now['probe']}")
    if cases["pip only, now"]["probe"].get("load_libs_for_no_ctk") is not True:
        problems.append(
            "without CUDA_HOME TE still found a system NVRTC or cuRAND (this machine's"
            f" /usr/local/cuda?): {cases['pip only, now']['probe']}"
        )
    report["ok"] = not problems
    return report


def purelib_of(python: Path, env: dict[str, str]) -> Path:
    """The ``purelib`` of ``python`` under ``env``."""
    code = "import sysconfig; print(sysconfig.get_path('purelib'))"
    return Path(
        subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, env=env, check=True
        ).stdout.strip()
    )
