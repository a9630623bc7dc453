"""XLA flags that make the test run's and the site build's CPU compiles cheaper.

Why: at the chapters' and the tests' sizes, compiling is most of the CPU a page or a test
spends, and two flags cut it without changing what is computed:

* ``--xla_backend_optimization_level=0``: about a third less compile time; XLA-generated code
  runs 2-3 times slower (the attention itself is the compiled stand-in kernel, untouched).
* ``--xla_cpu_use_fusion_emitters=false`` where the installed XLA knows it (jaxlib before
  0.11; jaxlib 0.11's XLA refuses it as an unknown flag and aborts): CPU fusions are emitted
  the older way, which compiles faster. ``tests/te/test_facade.py`` went from 9.8 to 4.9 CPU s,
  chapter 3 from 18.8 to 13.3; results agree to rounding (chapter 7's printed differences moved
  in their last digits).

Only ``jaxlib``'s version is read (package metadata): JAX is not imported, so the flags can
still be set before it starts.

One kind of program compiles faster with the fusion emitters: TE's THD AllGather CP programs.
TE unrolls them into one branch per CP rank, each full of scatters, and without the emitters
XLA expands every scatter into a loop of its own (a cp=4 forward+backward: 23,000 HLO
instructions in 1,700 computations). :func:`emitters_for_te_allgather` turns the emitters back
on for those programs alone: ``tests/te_on_cpu/test_te_on_cpu.py``'s cp=4 and cp=8 AllGather
cases went from 93 to 56 CPU s, while the reference kernel's own CP programs
(``tests/core/test_context_parallel.py``) take 1.8 times longer with the emitters.
"""

from __future__ import annotations

import os
import re
from importlib.metadata import PackageNotFoundError, version

import compile_cache  # devtools/, standard library only at import: JAX still not imported

OPT_LEVEL_0 = "--xla_backend_optimization_level=0"
NO_FUSION_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def _jaxlib_before(major: int, minor: int) -> bool:
    try:
        found = re.match(r"(\d+)\.(\d+)", version("jaxlib"))
    except PackageNotFoundError:
        return False
    return bool(found) and (int(found[1]), int(found[2])) < (major, minor)


# TE's partition callbacks whose programs compile faster with the fusion emitters (their class
# names: FusedAttnCPWithAllGather..., FusedAttnCPStripedWithAllGather...)
EMITTER_PROGRAMS = "WithAllGather"


def fast_compile_flags() -> str:
    """The flags above that this machine's XLA accepts, space-separated.

    Returns:
        ``OPT_LEVEL_0``, plus ``NO_FUSION_EMITTERS`` under a jaxlib older than 0.11.
    """
    return OPT_LEVEL_0 + (f" {NO_FUSION_EMITTERS}" if _jaxlib_before(0, 11) else "")


def _partitioned_by(computation) -> list[str]:
    """The qualified names of the partition callbacks of ``computation``'s TE ops."""
    names = []
    for _, info in compile_cache.partitioned_ops(computation.operation):
        partition = getattr(info, "partition", None)
        partition = getattr(partition, "func", partition)  # a functools.partial
        names.append(getattr(partition, "__qualname__", ""))
    return names


def emitters_for_te_allgather() -> bool:
    """Compile TE's AllGather CP programs with XLA's fusion emitters, in this process.

    Only where :data:`NO_FUSION_EMITTERS` is in ``XLA_FLAGS`` (elsewhere the emitters are on
    already). Call once JAX is imported, before anything compiles.

    Returns:
        Whether the programs will be compiled that way.
    """
    if NO_FUSION_EMITTERS not in os.environ.get("XLA_FLAGS", ""):
        return False
    from jax._src import compiler

    original = compiler.compile_or_get_cached
    if getattr(original, "emitters_for_te_allgather", False):
        return True

    def compile_or_get_cached(backend, computation, devices, compile_options, *args, **kwargs):
        try:
            gathers = any(EMITTER_PROGRAMS in n for n in _partitioned_by(computation))
        except Exception:  # noqa: BLE001 - a module we cannot read compiles as the flags say
            gathers = False
        if gathers:
            compile_options.env_option_overrides = [
                *compile_options.env_option_overrides,
                ("xla_cpu_use_fusion_emitters", True),
            ]
        return original(backend, computation, devices, compile_options, *args, **kwargs)

    compile_or_get_cached.emitters_for_te_allgather = True
    compiler.compile_or_get_cached = compile_or_get_cached
    return True
