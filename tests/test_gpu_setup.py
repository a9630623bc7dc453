"""Everything before the GPU machine, tested on CPU: pieces and checksums, cuDNN and CUDA
detection, the exact install and run command lines, and ``make gpu-run`` as a dry run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tutorial_utils.tools import gpu_setup as G
from tutorial_utils.tools.bench import build_parser as bench_parser
from tutorial_utils.tools.check import build_parser as check_parser

ROOT = Path(__file__).resolve().parents[1]


def _bundle(tmp_path, sizes):
    """A bundle folder as ``bundle`` leaves it: big files split, a manifest with checksums."""
    files = []
    for name, size in sizes.items():
        path = tmp_path / name
        path.write_bytes(bytes((i * 7 + len(name)) % 251 for i in range(size)))
        if size > 1000:
            files.append(G.split_file(path, piece_bytes=1000))
        else:
            files.append({"name": name, "bytes": size, "sha256": G._sha256(path), "pieces": []})
    (tmp_path / G.MANIFEST).write_text(json.dumps({"files": files}))
    return files


SIZES = {"transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl": 3500,
         "transformer_engine-2.20.2-py3-none-any.whl": 300, "transformer_engine_jax-2.20.2.tar.gz": 200}


def test_pieces_reassemble_to_the_original(tmp_path):
    original = bytes((i * 7 + len(next(iter(SIZES)))) % 251 for i in range(3500))
    files = _bundle(tmp_path, SIZES)
    assert [len(f["pieces"]) for f in files] == [4, 0, 0]  # 3500 bytes in pieces of at most 1000
    assert not (tmp_path / next(iter(SIZES))).exists()  # only the pieces are carried
    joined = G.join_pieces(tmp_path)
    assert (tmp_path / next(iter(SIZES))).read_bytes() == original
    assert sorted(p.name for p in joined) == sorted(SIZES)
    assert G.join_pieces(tmp_path) == joined  # a second run verifies and keeps the files


def test_a_corrupted_or_missing_piece_is_named_and_nothing_half_written_remains(tmp_path):
    _bundle(tmp_path, SIZES)
    part = tmp_path / (next(iter(SIZES)) + ".part002")
    data = bytearray(part.read_bytes())
    data[10] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(SystemExit, match=r"part002: SHA-256 differs from the manifest"):
        G.join_pieces(tmp_path)
    part.unlink()
    with pytest.raises(SystemExit, match=r"part002: piece missing \(4 pieces make"):
        G.join_pieces(tmp_path)
    assert not list(tmp_path.glob("*.joining")) and not (tmp_path / next(iter(SIZES))).exists()
    with pytest.raises(SystemExit, match=r"manifest.json not found: run `python -m tutorial_utils.tools.gpu_setup bundle"):
        G.join_pieces(tmp_path / "elsewhere")


def test_pieces_fit_one_transfer():
    assert G.PIECE_BYTES <= 64 * 2**20 - 2**20  # room for the manifest in the same transfer


def test_sdist_link_reads_the_simple_index():
    page = ('<a href="https://files.example/x/transformer_engine_jax-2.20.1.tar.gz#sha256=' + "a" * 64 + '">old</a>'
            '<a href="https://files.example/y/transformer_engine_jax-2.20.2.tar.gz#sha256=' + "b" * 64 + '">new</a>')
    assert G.sdist_link(page, "transformer-engine-jax", "2.20.2") == (
        "https://files.example/y/transformer_engine_jax-2.20.2.tar.gz", "b" * 64)
    with pytest.raises(SystemExit, match=r"no transformer-engine-jax 2.20.9 sdist"):
        G.sdist_link(page, "transformer-engine-jax", "2.20.9")


def test_bundle_dry_run_lists_every_file_for_the_target():
    commands = G.bundle(Path("b"), 13, "3.12", dry_run=True)
    text = [" ".join(c) for c in commands]
    assert any("transformer-engine-cu13==2.20.2" in t and "--only-binary=:all:" in t and "--python-version 3.12" in t
               for t in text)
    assert ["fetch-sdist", "transformer-engine-jax", "2.20.2"] in commands
    assert any("nvidia-cudnn-frontend" in t for t in text) and any("transformer-engine==2.20.2" in t for t in text)
    assert any("transformer-engine-cu12==2.20.2" in " ".join(c) for c in G.bundle(Path("b"), 12, dry_run=True))
    with pytest.raises(ValueError, match=r"cuda=11"):
        G.bundle_requirements(11)


def test_install_commands_build_te_against_the_installed_jax(tmp_path):
    files = [tmp_path / n for n in SIZES] + [tmp_path / "nvidia_cudnn_frontend-1.32.0-cp312-cp312-x.whl"]
    wheels, extension, package = G.install_commands(files, cuda_archs="90")
    assert wheels[3:6] == ["install", "--no-index", "--no-deps"] and all(w.endswith(".whl") for w in wheels[6:])
    assert extension[:4] == ["env", "NVTE_FRAMEWORK=jax", "NVTE_CUDA_ARCHS=90", extension[3]]
    assert "--no-build-isolation" in extension and extension[-1].endswith("transformer_engine_jax-2.20.2.tar.gz")
    assert "--no-index" in extension and "--no-deps" in package and package[-2:] == ["-e", "."]
    with pytest.raises(SystemExit, match=r"exactly one transformer_engine_jax sdist"):
        G.install_commands(files[:2])


def test_cudnn_check_names_the_version_it_found():
    assert G.check_cudnn(((9, 12, 1), "libcudnn.so.9")) == "cuDNN 9.12.1 (libcudnn.so.9) >= 9.12.0: ok"
    with pytest.raises(SystemExit, match=r"cuDNN 9\.10\.0 \(/x/libcudnn\.so\.9\) < 9\.12\.0: TransformerEngine 2\.20\.2 "
                                         r"refuses to import on it"):
        G.check_cudnn(((9, 10, 0), "/x/libcudnn.so.9"))
    with pytest.raises(SystemExit, match=r"cuDNN not found"):
        G.check_cudnn(found=None)


def test_cuda_major_from_nvcc_or_the_environment(monkeypatch):
    monkeypatch.delenv("CUDA_MAJOR", raising=False)
    assert G.cuda_major("Cuda compilation tools, release 13.0, V13.0.48") == 13
    assert G.cuda_major("Cuda compilation tools, release 12.8, V12.8.93") == 12
    monkeypatch.setenv("CUDA_MAJOR", "12")
    assert G.cuda_major("release 13.0") == 12
    monkeypatch.setenv("CUDA_MAJOR", "11")
    with pytest.raises(SystemExit, match=r"CUDA_MAJOR='11': use 12 or 13"):
        G.cuda_major()


def test_run_commands_are_accepted_by_the_real_clis(tmp_path):
    steps = G.run_commands(Path("gpu-bundle"), tmp_path, python="python3")
    assert [name for name, _, _ in steps] == ["install", "check", "bench-single", "bench-emulated"]
    assert sum(limit for _, limit, _ in steps) <= 11 * 60  # inside a 12-minute lease
    for name, _, cmd in steps[1:]:
        module, args = cmd[2], cmd[3:]
        parser = check_parser() if module == "tutorial_utils.tools.check" else bench_parser()
        parsed = parser.parse_args(args)  # exits (and fails the test) on any unknown flag
        if name.startswith("bench"):
            assert parsed.preset == "seed" and parsed.out == str(tmp_path)
    assert "--emulate-ranks" in steps[3][2] and "128,256,512" in steps[3][2]


def test_make_gpu_run_dry_run():
    proc = subprocess.run(["make", "--no-print-directory", "-n", "gpu-run", "GPU_OUT=/tmp/out"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "PYTHONPATH=src python3 -m tutorial_utils.tools.gpu_setup run --bundle gpu-bundle --out /tmp/out"
    dry = subprocess.run([sys.executable, "-m", "tutorial_utils.tools.gpu_setup", "run", "--out", "/tmp/out", "--dry-run"],
                         cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert [line.split("]")[0] for line in dry.stdout.splitlines()] == [
        "+ [install, <= 300 s", "+ [check, <= 120 s", "+ [bench-single, <= 90 s", "+ [bench-emulated, <= 150 s"]
