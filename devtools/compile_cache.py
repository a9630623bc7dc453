"""A persistent XLA compilation cache that one test run or site build shares between processes.

Why it exists: a test run starts well over a hundred Python processes (pytest workers, notebook
kernels, recipe and command-line subprocesses). Each compiles the same small programs again
(random inputs, reshapes, the one-device references) and often the same TE programs, and on a
2-core CPU compiling is most of their time. JAX's persistent cache can share that work, but its
key is not safe for TE's context-parallel programs as they stand:

* a ``custom_partitioning`` op (every TE CP call) enters the key as ``id()`` of its partition
  callback; the program XLA finally runs is whatever that callback returns, chosen by TE's static
  configuration (Ring or AllGather, load balanced or not, the stripe), which the key never sees.
  Python reuses ``id()`` values, above all in fresh processes doing the same steps, so two
  programs that differ only in that configuration can share a key and one would silently run
  the other's executable. (With ``jax_remove_custom_partitioning_ptr_from_cache_key`` they always
  share it.)
* a host callback enters the key as a pointer too, and a hit would call into a stale address.

So :func:`enable` keys each partitioned op by a fingerprint of everything its callback reads: the
callback functions by qualified name, TE's static arguments, the mesh, the pytree structure, TE's
global mesh resource, the environment those callbacks read (TE's ``NVTE_*`` and the stand-in
kernel's ``TUTORIAL_CPU_KERNEL*``), the stand-in's state, whether its compiled kernel loaded, and
JAX's trace context. When any part of that fingerprint is not reproducible (it contains an address,
or the callback is a closure), or the program has a host callback, the program is compiled and not
cached. Entries are written to a temporary file and renamed, so a process never reads half of one
another process is writing.

In a ``jax.distributed`` run on CPU (the launcher's ranks), a program over several processes is
keyed by its devices rather than by each process's own view of the topology, and the first
process compiles it and hands it to the others (:func:`_share_between_cpu_processes`).

It is for the tutorial's own runs: ``tests/conftest.py`` points :data:`ENV` at a folder the test
run creates and deletes at its start (``conf.py`` at the build's own folder), and every process
of the run that has ``devtools/`` on its path turns it on through ``sitecustomize.py`` and
``run_hooks.py`` when JAX is imported. Importing :mod:`tutorial_utils` turns nothing on, so a
reader's notebooks and the examples never use it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import tempfile
from pathlib import Path


def _jax_started() -> bool:
    """True once JAX has created its backends (flags added after that would not apply).

    Standard library only until JAX is imported: this module loads at every process's start.
    """
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except Exception:  # noqa: BLE001 - private API moved: assume started
        return True


#: The folder to cache compiled programs in; unset (the default) means no cache.
ENV = "TUTORIAL_COMPILE_CACHE_DIR"
#: XLA flags a test run adds to ``XLA_FLAGS`` in every process that imports tutorial_utils
#: before JAX starts (tests/conftest.py sets ``--xla_backend_optimization_level=0``); unset: none.
FLAGS_ENV = "TUTORIAL_RUN_XLA_FLAGS"

_PARTITIONED = "CustomSPMDPartitioning"
#: The environment a partition callback can read while it builds its program: TE's own settings
#: (``NVTE_FUSED_RING_ATTENTION_USE_SCAN`` and the like) and which stand-in kernel te_on_cpu lowers
#: (``TUTORIAL_CPU_KERNEL``). The tutorial's other variables (the facade's backend, records and
#: build folders, this cache) choose what is traced, which JAX's key already sees, or nothing
#: compiled at all; keying on them made the same TE program miss between processes that differ
#: only there (a recipe run by the site build and the same command from a fresh clone).
ENV_READ_BY_CALLBACKS = ("NVTE_", "TUTORIAL_CPU_KERNEL")
_state = {"enabled": None, "uncached": 0}


class _AtomicFileCache:
    """JAX's cache interface over one folder, with write-then-rename puts (no lock needed)."""

    def __init__(self, path: str):
        self._path = Path(path)
        self._path.mkdir(parents=True, exist_ok=True)

    def get(self, key: str):
        try:
            return (self._path / f"{key}-cache").read_bytes()
        except FileNotFoundError:
            return None

    def put(self, key: str, value: bytes) -> None:
        final = self._path / f"{key}-cache"
        if final.exists():
            return
        self._path.mkdir(parents=True, exist_ok=True)  # a test may have removed it
        fd, tmp = tempfile.mkstemp(dir=self._path, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(value)
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


class _NotReproducible(Exception):
    """A partitioned op whose callback cannot be fingerprinted the same way in another process."""


def _name(fn) -> str:
    if fn is None:
        return "None"
    if isinstance(fn, functools.partial):  # a module-level function with its bound arguments
        return (
            f"{_name(fn.func)}(*{_plain_repr(fn.args)},"
            f" **{_plain_repr(sorted(fn.keywords.items()))})"
        )
    qualname, module = getattr(fn, "__qualname__", None), getattr(fn, "__module__", None)
    if qualname is None or module is None or "<locals>" in qualname or "<lambda>" in qualname:
        raise _NotReproducible(f"callback {fn!r} is not a module-level function")
    return f"{module}.{qualname}"


def _global_state() -> str:
    """What a TE partition callback may read besides its arguments, as text."""
    parts = [f"python {sys.version}"]
    te_sharding = sys.modules.get("transformer_engine.jax.sharding")
    if te_sharding is not None:
        try:
            parts.append(repr(te_sharding.global_mesh_resource()))
        except (
            AssertionError
        ):  # outside te.autocast: TE's partition callbacks would fail, so no entry is written
            parts.append("no MeshResource set")
    te_on_cpu = sys.modules.get("tutorial_utils.te_on_cpu")
    if te_on_cpu is not None:
        parts.append(repr(sorted(te_on_cpu._state.items())))
        if te_on_cpu._state[
            "installed"
        ]:  # which kernel its lowering emits: the compiled one, or why not
            parts.append(te_on_cpu.kernel.status())
    parts += [
        f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(ENV_READ_BY_CALLBACKS)
    ]
    from jax._src import config as jax_config

    parts += [_plain_repr(item) for item in jax_config.trace_context()]
    return "\n".join(parts)


def _plain_repr(obj) -> str:
    """``repr``, or for an object whose ``repr`` is its address, its slots' or attributes'
    values."""
    text = repr(obj)
    if " at 0x" not in text:
        return text
    slots = [s for s in getattr(type(obj), "__slots__", ()) if s != "__weakref__"]
    fields = {s: getattr(obj, s, None) for s in slots} if slots else getattr(obj, "__dict__", None)
    if not fields:
        raise _NotReproducible(f"{type(obj).__name__} has no reproducible text")
    return f"{type(obj).__qualname__}({sorted(fields.items())!r})"


def _mesh_text(mesh) -> str:
    if mesh is None or getattr(mesh, "empty", False):
        return f"empty mesh {mesh!r}"
    return f"{mesh!r} devices {getattr(mesh, 'device_ids', None)!r}"


def _fingerprint(info, global_state: str) -> str:
    text = "\n".join(
        [
            _name(info.partition),
            _name(info.infer_sharding_from_operands),
            _name(info.propagate_user_sharding),
            repr(info.static_args),
            _mesh_text(info.mesh),
            repr(info.in_tree),
            repr(info.out_tree),
            global_state,
        ]
    )
    if " at 0x" in text:
        raise _NotReproducible("the fingerprint contains an object address")
    return hashlib.sha256(text.encode()).hexdigest()


def _custom_calls(operation):
    """``(op, call_target_name)`` for every custom call in ``operation``, in walk order."""
    from jax._src.lib.mlir import ir

    calls = []

    def visit(op):
        if "call_target_name" in op.attributes:
            calls.append((op, ir.StringAttr(op.attributes["call_target_name"]).value))
        return ir.WalkResult.ADVANCE

    operation.walk(visit)
    return calls


def partitioned_ops(operation, calls=None) -> list:
    """``(op, info)`` for every ``custom_partitioning`` op in ``operation`` (TE's ops): ``info``
    is what JAX registered for its partition callbacks, ``None`` if JAX no longer holds it.

    Args:
        operation: an MLIR operation, a module's ``.operation``.
        calls: :func:`_custom_calls` of ``operation``, when the caller has them already.
    """
    from jax._src import custom_partitioning
    from jax._src.lib.mlir import ir

    return [
        (op, custom_partitioning._sharding_callbacks.get(pointer.encode()))
        for op, target in (_custom_calls(operation) if calls is None else calls)
        if target == _PARTITIONED
        for pointer in [ir.StringAttr(op.attributes["backend_config"]).value]
    ]


def _keyable(computation):
    """The module to hash: partition pointers replaced by fingerprints; None if it must not be
    cached."""
    from jax._src import config as jax_config
    from jax._src.lib.mlir import ir

    if jax_config.remove_custom_partitioning_ptr_from_cache_key.value:
        return None  # JAX would strip our fingerprint too
    calls = _custom_calls(computation.operation)
    if any(target.endswith("callback") for _, target in calls):
        return None
    partitioned = partitioned_ops(computation.operation, calls)
    if not partitioned:
        return computation
    global_state = _global_state()  # the same for every op of this module
    fingerprints = []
    try:
        for _, info in partitioned:
            if info is None:
                return None
            fingerprints.append(_fingerprint(info, global_state))
    except _NotReproducible:
        return None
    with computation.context:
        clone = computation.operation.clone()
        cloned = [op for op, target in _custom_calls(clone) if target == _PARTITIONED]
        for op, fingerprint in zip(cloned, fingerprints, strict=True):
            op.attributes["backend_config"] = ir.StringAttr.get(fingerprint)
        return clone


def enable(path: str | os.PathLike) -> bool:
    """Cache compiled programs under ``path`` for this process. Call before the first compile.

    Returns False (and changes nothing) where this JAX lacks the internals the safe key needs.
    """
    if not str(path) or Path(path).exists() and not Path(path).is_dir():
        raise ValueError(
            f"path={str(path)!r} must name a folder (it is created if missing); "
            f"point {ENV} at a directory, or unset it to run without the cache."
        )
    if _state["enabled"] is not None:
        return _state["enabled"]
    import jax
    from jax._src import compilation_cache, compiler

    original = getattr(compiler, "_get_cache_key", None)
    if original is None or not hasattr(compilation_cache, "get_file_cache"):
        _state["enabled"] = False
        return False

    def safe_cache_key(options, backend, computation, devices, override_fdo_profile=None):
        try:
            keyed = _keyable(computation)
        except Exception:  # noqa: BLE001 - a key we cannot compute means: compile, do not cache
            keyed = None
        if keyed is None:
            _state["uncached"] += 1
            return None
        return original(options, backend, keyed, devices, override_fdo_profile)

    compiler._get_cache_key = safe_cache_key
    compilation_cache.get_file_cache = lambda p: (_AtomicFileCache(p), p)
    _share_between_cpu_processes()
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    # XLA warns "Invalid stack_frame_id" when it loads an executable compiled with Python
    # tracebacks in its locations; the key ignores locations anyway
    jax.config.update("jax_traceback_in_locations_limit", 0)
    _state["enabled"] = True
    return True


def _share_between_cpu_processes() -> None:
    """CPU programs keyed by the devices they run on, not by the topology their process reports.

    JAX keys a program by its process's topology, and on CPU that topology counts every device
    the process has. So:

    * each rank of a ``jax.distributed`` run reports its own, so every rank compiled the same
      program and none hit the others' entry. For a program whose devices span several CPU
      processes, the key takes the devices' kinds and global ids instead, and
      ``jax_share_binary_between_hosts`` lets the first process compile and hand the executable
      to the others through the distributed runtime;
    * a test run's processes simulate 1, 2, 4 or 8 CPU devices (the workers 8, the site build
      4, the device-count runs 1 to 8), so the same program on the same devices, a random input
      or a one-device reference, compiled once per device count. For a program on one process's
      CPU devices, the key takes the process's index and the process count, then the devices'
      kinds and ids. (TE's attention programs do not gain: TE repeats their random seed once
      per device the process sees, ``num_of_devices()``, so their modules differ anyway.)

    The module, the compile options with their device assignment and the XLA flags stay in the
    key. Programs on other platforms keep JAX's key.
    """
    import jax
    from jax._src import cache_key

    original = getattr(cache_key, "_hash_accelerator_config", None)
    if (
        original is None
        or not hasattr(cache_key, "_hash_string")
        or hasattr(original, "__wrapped__")
    ):
        # another JAX (keep its keys: the ranks then compile for themselves), or done already
        return

    def accelerator_config(hash_obj, accelerators):
        devices = list(accelerators.flat)
        if not all(d.platform == "cpu" for d in devices):
            return original(hash_obj, accelerators)
        if len({d.process_index for d in devices}) == 1:
            # One process's CPU devices: JAX's topology fingerprint counts every CPU device the
            # process simulates, so the same program compiled with 1, 4 or 8 of them got three keys
            cache_key._hash_string(
                hash_obj,
                f"cpu devices of process {devices[0].process_index} of {jax.process_count()}",
            )
        for d in devices:
            cache_key._hash_string(hash_obj, f"{d.device_kind} {d.id}")
        return None

    accelerator_config.__wrapped__ = original
    cache_key._hash_accelerator_config = accelerator_config
    jax.config.update("jax_share_binary_between_hosts", True)


def add_run_flags() -> list:
    """Append ``$TUTORIAL_RUN_XLA_FLAGS`` to ``XLA_FLAGS``, each flag not already named there;
    return those added.

    Why: the test run compiles at XLA's lowest backend optimisation level (its arrays are tiny
    and compiling is most of its time), but most of its subprocesses build their own
    ``XLA_FLAGS`` (a device count, or a user's clean environment), which would drop that flag:
    they compiled about a fifth slower, and never shared a cache entry with the workers, since
    JAX's key includes the flags. Nothing is added once JAX's backends have started (the flags
    would no longer apply), and a flag the process already sets keeps its value.
    """
    extra = os.environ.get(FLAGS_ENV, "").split()
    bad = [f for f in extra if not f.startswith("--xla_")]
    if bad:
        raise ValueError(
            f"{FLAGS_ENV}={os.environ[FLAGS_ENV]!r}: {bad[0]!r} is not an XLA flag; give flags such"
            f" as --xla_backend_optimization_level=0, separated by spaces, or unset {FLAGS_ENV}."
        )
    if not extra or _jax_started():
        return []
    flags = os.environ.get("XLA_FLAGS", "").split()
    named = {f.split("=")[0] for f in flags}
    added = [f for f in extra if f.split("=")[0] not in named]
    if added:
        os.environ["XLA_FLAGS"] = " ".join(flags + added)
    return added


def enable_from_env() -> bool:
    """The run's XLA flags (:func:`add_run_flags`), then :func:`enable` at
    ``$TUTORIAL_COMPILE_CACHE_DIR``.

    Returns whether the cache is on; False when that variable is unset.
    """
    add_run_flags()
    path = os.environ.get(ENV)
    return enable(path) if path else False
