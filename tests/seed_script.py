"""TE's published CP tutorial (kept in ../shared/seeds), extracted, shrunk and run by the tests.

Why: the promise is that TE's own tutorial runs through ``tutorial_utils.te`` with only its imports
changed (tests/examples/test_seed_tutorial.py, in process) and through the ``te_on_cpu`` runner with
nothing but its sizes changed (tests/examples/test_examples.py, as a subprocess). The code is read
at test time, never stored in this repository. For CPU the problem size is shrunk (same structure: 2
rows x 4 padded slots at 3/4 fill, GQA, causal SWA, AllGather stripe > 1, Ring stripe 1); nothing
else is edited. :func:`seed_program` is the one place that builds the script both tests run.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SEED_GLOB = "000_*.txt"
_CODE = re.compile(
    r"^(import |from |def |class |@|#|\)|\]|\}|return\b|"
    r"[A-Za-z_]\w*(\s*,\s*[A-Za-z_]\w*)*\s*[-+*/]?=\s|"
    r"[A-Za-z_][\w.\[\]\"']*\()"
)

IMPORT_SWAPS = {
    "import transformer_engine.jax as te": "import tutorial_utils.te as te",
    "from transformer_engine.jax.attention import": "from tutorial_utils.te.attention import",
    "from transformer_engine.jax.sharding import": "from tutorial_utils.te.sharding import",
}

# The published settings lines (GPU sizes), each replaced by :func:`seed_program`'s arguments.
_SIZES = "batch, seq, num_query_heads, num_kv_heads, head_dim = "
_PUBLISHED = {
    "sizes": _SIZES + "2, 65536, 128, 8, 128",
    "window": "window_size = (8192, 0)",
    "dtype": "dtype = jnp.bfloat16",
    "timing_iters": "timing_iters = 5",
    "warmup_iters": "warmup_iters = 2",
    "stripe": "ag_stripe_size = 512",
}

# Two helpers the published page calls but does not show.
_MISSING_HELPERS = """
def _single_gpu_grad_fn():
    def loss_fn(qkv_arg, seq_desc_arg, dout_arg):
        out = fused_thd_attention(qkv_arg, seq_desc_arg)
        return jnp.vdot(out.astype(jnp.float32), dout_arg.astype(jnp.float32))
    return jax.jit(jax.value_and_grad(loss_fn))


def _strategy_name(strategy):
    return {
        CPStrategy.RING: "Ring",
        CPStrategy.ALL_GATHER: "AllGather",
        CPStrategy.DEFAULT: "AllGather",
    }[strategy]
"""

# The script checks itself: both CP cases against one device, one printed line per case.
_SELF_CHECK = """
loss0, grads0 = _single_gpu_grad_fn()((q, k, v), sequence_descriptor, dout)
out0 = fused_thd_attention((q, k, v), sequence_descriptor)
cases = ((CPStrategy.RING, ring_stripe_size), (CPStrategy.ALL_GATHER, ag_stripe_size))
for strategy, stripe in cases:
    result = run_context_parallel_case(strategy, stripe)
    pairs = [(result["output"], out0)] + [
        (inverse_reorder_from_context_parallel(g, stripe), g0)
        for g, g0 in zip(result["grads"], grads0)
    ]
    errs = [
        float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))) for a, b in pairs
    ]
    print(
        f"seed {strategy.name} stripe {stripe}: max error out/dq/dk/dv",
        " ".join(f"{e:.3g}" for e in errs),
    )
    assert max(errs) < TOLERANCE, errs
"""


def find_seed(repo_root: pathlib.Path = ROOT):
    for base in (repo_root.parent / "shared" / "seeds", repo_root / "shared" / "seeds"):
        hits = sorted(base.glob(SEED_GLOB))
        if hits:
            return hits[0]
    return None


def require_seed() -> pathlib.Path:
    """The seed document's path; the calling test is skipped when it is not beside this checkout."""
    seed = find_seed()
    if seed is None:
        pytest.skip(
            "the seed tutorial document (../shared/seeds/000_*.txt) is not present beside this"
            " checkout"
        )
    return seed


def extract_code(text: str) -> str:
    """Keep code lines (and the indented/blank lines inside code blocks), drop prose and outputs."""
    out, in_code = [], False
    for line in text.splitlines():
        if not line.strip():
            if in_code:
                out.append("")
            continue
        if line[0] in " \t" and in_code:
            out.append(line)
            continue
        if _CODE.match(line):
            out.append(line)
            in_code = True
        else:
            in_code = False
    return "\n".join(out) + "\n"


def port(code: str) -> str:
    """Swap TE imports for the facade's; fail loudly if the seed's imports changed."""
    for old, new in IMPORT_SWAPS.items():
        if old not in code:
            raise AssertionError(f"seed code no longer contains {old!r}")
        code = code.replace(old, new)
    if "transformer_engine" in code:
        raise AssertionError("a transformer_engine import is left after porting")
    return code


def seed_program(
    *,
    batch: int,
    seq_len: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    window: int,
    stripe: int,
    dtype: str = "bfloat16",
    iters: tuple[int, int] = (5, 2),
    facade: bool = False,
    self_check_tol: float | None = None,
) -> str:
    """TE's published CP tutorial as a runnable script at the given sizes.

    ``stripe`` is AllGather's stripe (Ring's stays 1, as TE requires); ``dtype`` names a
    ``jnp`` dtype and ``iters`` is (timing, warmup) for the page's benchmarks; the defaults are
    the page's own. ``facade`` swaps TE's imports for ``tutorial_utils.te``'s (:func:`port`),
    else they stay TE's (the ``te_on_cpu`` runner provides them). The page's two unshown helpers
    are appended; with ``self_check_tol`` so is a check of Ring and AllGather (output and
    gradients) against one device, which prints ``seed <STRATEGY> stripe <n>: ...`` per case and
    fails above that maximum absolute error. Skips the calling test when the seed is absent;
    fails when a line it edits is no longer in the seed.
    """
    code = extract_code(require_seed().read_text())
    if facade:
        code = port(code)
    else:
        for old in IMPORT_SWAPS:
            assert old in code, f"seed code no longer contains {old!r}"
    timing, warmup = iters
    shrunk = {
        "sizes": f"{_SIZES}{batch}, {seq_len}, {heads}, {kv_heads}, {head_dim}",
        "window": f"window_size = ({window}, 0)",
        "dtype": f"dtype = jnp.{dtype}",
        "timing_iters": f"timing_iters = {timing}",
        "warmup_iters": f"warmup_iters = {warmup}",
        "stripe": f"ag_stripe_size = {stripe}",
    }
    for key, old in _PUBLISHED.items():
        assert old in code, f"seed no longer contains {old!r}"
        code = code.replace(old, shrunk[key])
    code += _MISSING_HELPERS
    if self_check_tol is not None:
        code += _SELF_CHECK.replace("TOLERANCE", repr(self_check_tol))
    return code
