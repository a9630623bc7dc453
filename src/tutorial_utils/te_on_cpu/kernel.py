"""The compiled CPU stand-in kernel for cuDNN's fused attention (an XLA FFI custom call).

Lowered from JAX (:func:`tutorial_utils.reference.blockwise_attention` in bounds mode), the
stand-in's loop nest is inlined at every call site; ``cpu_attention_kernel.cc`` does the same
maths in C++ behind one custom call, as cuDNN does on a GPU, so XLA compiles one instruction.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from ..reference import _sink_array

try:  # POSIX only: elsewhere builders are not serialised (see _build_lock)
    import fcntl
except ImportError:
    fcntl = None

SOURCE = Path(__file__).with_name("cpu_attention_kernel.cc")
FWD_TARGET = "tutorial_cpu_attention_fwd"
BWD_TARGET = "tutorial_cpu_attention_bwd"
CHOICES = ("auto", "cpp", "jax")

_lock = threading.Lock()
_state: dict = {"loaded": None, "why_not": None}


def choice() -> str:
    """``TUTORIAL_CPU_KERNEL``: ``auto`` (default: compiled if it builds), ``cpp`` or ``jax``.

    Returns:
        The setting, lower-cased.

    Raises:
        ValueError: If it is set to anything else.
    """
    value = os.environ.get("TUTORIAL_CPU_KERNEL", "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(
            f"TUTORIAL_CPU_KERNEL={value!r} must be one of {', '.join(CHOICES)}; unset it for the "
            "default (the compiled kernel where a C++ compiler works, else the JAX one)."
        )
    return value


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_signature() -> str:
    """What -march=native depends on: the machine and, on Linux, the CPU's feature flags."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line
                break
    except OSError:
        pass
    return f"{platform.machine()} {flags}"


def cache_dir() -> Path:
    """Folder where built kernel libraries are cached.

    ``$TUTORIAL_CPU_KERNEL_CACHE``, else ``cp-attention-tutorial`` under ``$XDG_CACHE_HOME``
    (default ``~/.cache``). Each library is keyed by the source, the compiler, jaxlib's
    version and the CPU.

    Returns:
        The folder (it may not exist yet).
    """
    default = (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cp-attention-tutorial"
    )
    return Path(os.environ.get("TUTORIAL_CPU_KERNEL_CACHE", default))


def _build(cxx: str, include: str) -> Path:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(
        "\0".join([SOURCE.read_text(), version, jaxlib.__version__, _cpu_signature()]).encode()
    ).hexdigest()[:16]
    folder = cache_dir()
    target = folder / f"libtutorial_cpu_attention-{key}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    # One builder at a time: processes that start together (a test run's workers and its site
    # build) wait for the first one's library instead of each building the same one.
    with _build_lock(folder / f".libtutorial_cpu_attention-{key}.lock"):
        if target.exists():
            return target
        return _compile(cxx, include, target, folder)


@contextlib.contextmanager
def _build_lock(path: Path):
    """An exclusive lock on ``path`` between processes (``fcntl.flock``); none without fcntl."""
    if fcntl is None:  # not POSIX: builders may race; the rename below still keeps the file whole
        yield
        return
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _compile(cxx: str, include: str, target: Path, folder: Path) -> Path:
    base = [
        cxx,
        "-O3",
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-fopenmp-simd",
        "-fno-math-errno",
        "-w",
        f"-I{include}",
        str(SOURCE),
    ]
    errors = []
    for extra in (["-march=native"], []):
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(fd)
        proc = subprocess.run(base + extra + ["-o", tmp], capture_output=True, text=True)
        if proc.returncode == 0:
            os.replace(
                tmp, target
            )  # atomic: concurrent builders (test workers) never see half a file
            return target
        os.unlink(tmp)
        errors.append(proc.stderr.strip()[-800:])
    raise RuntimeError(f"{cxx} could not build {SOURCE.name}: {errors[-1]}")


def load() -> tuple[bool, str | None]:
    """Build (once), load and register the FFI targets; ``(True, None)`` or ``(False, why not)``.

    The library is built on first use with the machine's C++ compiler (``$CXX``, ``g++``,
    ``c++`` or ``clang++``) against the FFI headers that jaxlib ships, and cached under
    :func:`cache_dir`.

    Returns:
        ``(True, None)``, or ``(False, why not)``: any failure is reported, not raised.
    """
    with _lock:
        if _state["loaded"] is not None:
            return _state["loaded"], _state["why_not"]
        why = None
        try:
            cxx = _compiler()
            if cxx is None:
                raise RuntimeError("no C++ compiler found ($CXX, g++, c++, clang++)")
            lib = ctypes.CDLL(str(_build(cxx, jax.ffi.include_dir())))
            for name, symbol in (
                (FWD_TARGET, "TutorialCpuAttentionFwd"),
                (BWD_TARGET, "TutorialCpuAttentionBwd"),
            ):
                jax.ffi.register_ffi_target(
                    name, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu"
                )
        except Exception as err:  # noqa: BLE001  (any failure means: use the JAX kernel, and say why)
            why = f"{type(err).__name__}: {err}"
        _state["loaded"], _state["why_not"] = why is None, why
        return why is None, why


def use_compiled() -> bool:
    """Whether te_on_cpu's kernels go through the compiled library (decided at trace time).

    Where no compiler works, the pure-JAX kernel is used (same semantics) and :func:`status`
    says why; ``TUTORIAL_CPU_KERNEL=jax`` asks for the JAX kernel, ``=cpp`` insists on the
    compiled one.

    Returns:
        Whether the compiled kernel runs.

    Raises:
        RuntimeError: If ``TUTORIAL_CPU_KERNEL=cpp`` and the library cannot be built or loaded.
    """
    wanted = choice()
    if wanted == "jax":
        return False
    ok, why = load()
    if not ok and wanted == "cpp":
        raise RuntimeError(
            f"TUTORIAL_CPU_KERNEL=cpp but the compiled kernel is unavailable: {why}. Install a C++ "
            "compiler (g++ or clang++), or unset TUTORIAL_CPU_KERNEL to use the JAX kernel."
        )
    return ok


def status() -> str:
    """One line for banners and records: which stand-in kernel runs, and why.

    Returns:
        ``"compiled C++ kernel"``, or ``"JAX kernel (...)"`` with the reason.
    """
    wanted = choice()
    if wanted == "jax":
        return "JAX kernel (TUTORIAL_CPU_KERNEL=jax)"
    ok, why = load()
    return "compiled C++ kernel" if ok else f"JAX kernel (compiled one unavailable: {why})"


def _check_shapes(q, k, v, lo, hi):
    """Shape errors in Python, naming the argument (the kernel would say 'invalid argument')."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if len(x.shape) != 4:
            raise ValueError(
                f"{name}.shape={tuple(x.shape)} must be [batch, seq, heads, head_dim]; reshape THD "
                "tokens to [1, tokens, heads, head_dim]."
            )
    if k.shape[3] != q.shape[3] or v.shape[:3] != k.shape[:3] or k.shape[0] != q.shape[0]:
        raise ValueError(
            f"q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}: q and k"
            " need one batch and head_dim, k and v one batch, length and head count."
        )
    if q.shape[2] % k.shape[2]:
        raise ValueError(
            f"q has {q.shape[2]} heads and k {k.shape[2]}: query heads must be a multiple of KV"
            " heads."
        )
    for name, x in (("lo", lo), ("hi", hi)):
        if tuple(x.shape) != tuple(q.shape[:2]):
            raise ValueError(
                f"{name}.shape={tuple(x.shape)} must be q's [batch, seq] = {tuple(q.shape[:2])}:"
                " one inclusive key range per query row."
            )


def attention_fwd(q, k, v, lo, hi, sink, *, scale: float):
    """The compiled forward kernel.

    Args:
        q: ``[b, sq, hq, d]``.
        k: ``[b, skv, hkv, d]``.
        v: ``[b, skv, hkv, dv]``.
        lo: ``[b, sq]`` int32: each query row's first key row.
        hi: ``[b, sq]`` int32: its last key row (inclusive; ``lo > hi`` sees nothing).
        sink: ``[hq]`` float32 sink logits, or ``None`` (vanilla softmax).
        scale: The softmax scale.

    Returns:
        ``(out, lse, max_logit)`` in float32: ``out [b, sq, hq, dv]``, the others
        ``[b, hq, sq]``.
    """
    _check_shapes(q, k, v, lo, hi)
    b, sq, hq, _ = q.shape
    dv = v.shape[-1]
    use_sink = sink is not None
    sink = _sink_array(sink, hq)  # vanilla softmax: zeros the kernel ignores
    shapes = (
        jax.ShapeDtypeStruct((b, sq, hq, dv), jnp.float32),
        jax.ShapeDtypeStruct((b, hq, sq), jnp.float32),
        jax.ShapeDtypeStruct((b, hq, sq), jnp.float32),
    )
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    return jax.ffi.ffi_call(FWD_TARGET, shapes)(
        *f32,
        lo.astype(jnp.int32),
        hi.astype(jnp.int32),
        sink,
        scale=np.float32(scale),
        use_sink=np.int32(use_sink),
    )


def attention_bwd(q, k, v, lo, hi, out, lse, dout, sink, *, scale: float):
    """The compiled backward kernel.

    Args:
        q: As for :func:`attention_fwd`.
        k: As for :func:`attention_fwd`.
        v: As for :func:`attention_fwd`.
        lo: As for :func:`attention_fwd`.
        hi: As for :func:`attention_fwd`.
        out: The forward's output.
        lse: The forward's log-sum-exp ``[b, hq, sq]``.
        dout: The output's cotangent.
        sink: As for :func:`attention_fwd`.
        scale: The softmax scale.

    Returns:
        ``(dq, dk, dv, dsink)`` in float32.
    """
    _check_shapes(q, k, v, lo, hi)
    hq = q.shape[2]
    use_sink = sink is not None
    sink = _sink_array(sink, hq)  # vanilla softmax: zeros the kernel ignores
    shapes = tuple(jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in (q, k, v)) + (
        jax.ShapeDtypeStruct((hq,), jnp.float32),
    )
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    return jax.ffi.ffi_call(BWD_TARGET, shapes)(
        *f32,
        lo.astype(jnp.int32),
        hi.astype(jnp.int32),
        out.astype(jnp.float32),
        lse.astype(jnp.float32),
        dout.astype(jnp.float32),
        sink,
        scale=np.float32(scale),
        use_sink=np.int32(use_sink),
    )
