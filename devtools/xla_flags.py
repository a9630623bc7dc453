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
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version

OPT_LEVEL_0 = "--xla_backend_optimization_level=0"
NO_FUSION_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def _jaxlib_before(major: int, minor: int) -> bool:
    try:
        found = re.match(r"(\d+)\.(\d+)", version("jaxlib"))
    except PackageNotFoundError:
        return False
    return bool(found) and (int(found[1]), int(found[2])) < (major, minor)


def fast_compile_flags() -> str:
    """The flags above that this machine's XLA accepts, space-separated.

    Returns:
        ``OPT_LEVEL_0``, plus ``NO_FUSION_EMITTERS`` under a jaxlib older than 0.11.
    """
    return OPT_LEVEL_0 + (f" {NO_FUSION_EMITTERS}" if _jaxlib_before(0, 11) else "")
