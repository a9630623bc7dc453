"""Run by the ``.pth`` line that ``run_ledger install`` puts in a venv, at every interpreter start.

Standard library only, and it does nothing unless ``TUTORIAL_RUN_LEDGER`` names a file: then it
appends one JSON line per process at exit (its CPU and wall time, argv, the pytest test it ran
under) and, once JAX's compiler module is imported, one line per persistent-cache read, backend
compile, cache write and compile request. Kept out of the package's import path on purpose:
importing ``tutorial_utils`` would import JAX in every Python process of the venv (pip included).
"""

import atexit
import json
import os
import sys
import time

_LOG = os.environ.get("TUTORIAL_RUN_LEDGER")


def _write(record):
    try:
        with open(_LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    except OSError:
        pass


def _at_exit(started):
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    _write(
        {
            "k": "proc",
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "argv": sys.argv[:10],
            "cpu": usage.ru_utime + usage.ru_stime,
            "wall": time.time() - started,
            "end": time.time(),
            "test": os.environ.get("PYTEST_CURRENT_TEST", "")[:200],
        }
    )


def _timed(module, name, kind, key_arg=None):
    original = getattr(module, name, None)
    if original is None:
        _write({"k": "hook-missing", "pid": os.getpid(), "name": f"{module.__name__}.{name}"})
        return

    def wrapper(*args, **kwargs):
        wall, cpu = time.time(), time.process_time()
        result = original(*args, **kwargs)
        record = {
            "k": kind,
            "pid": os.getpid(),
            "s": time.time() - wall,
            "cpu": time.process_time() - cpu,
        }
        if key_arg is not None:
            record["key"] = args[key_arg] if len(args) > key_arg else kwargs.get("cache_key")
        if kind == "read":
            record["hit"] = isinstance(result, tuple) and result[0] is not None
        if kind == "request":
            try:
                record["name"] = str(args[1].operation.attributes["sym_name"]).strip('"')
            except Exception:  # noqa: BLE001 - a name is a courtesy
                record["name"] = "?"
        _write(record)
        return result

    setattr(module, name, wrapper)


def _patch(compiler):
    from jax._src import compilation_cache

    _timed(compilation_cache, "get_executable_and_time", "read", 0)
    _timed(compilation_cache, "put_executable_and_time", "write", 0)
    _timed(compiler, "backend_compile_and_load", "compile")
    _timed(compiler, "compile_or_get_cached", "request")


class _OnCompilerImport:
    """Wraps ``jax._src.compiler`` right after it is first imported (JAX itself is never imported
    here)."""

    def find_spec(self, name, path=None, target=None):
        if name != "jax._src.compiler":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            try:
                _patch(module)
            except Exception as exc:  # noqa: BLE001 - another JAX: record why, never break the process
                _write({"k": "hook-missing", "pid": os.getpid(), "name": repr(exc)[:200]})

        spec.loader.exec_module = exec_module
        return spec


# Once per process: a second site folder with the line (a venv's and a test's own) must not
# record every compile twice.
if _LOG and not getattr(sys, "_tutorial_run_ledger", False):
    sys._tutorial_run_ledger = True
    atexit.register(_at_exit, time.time())
    sys.meta_path.insert(0, _OnCompilerImport())
