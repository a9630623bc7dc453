"""Extract the Python code of TE's published CP tutorial (kept in ../shared/seeds) and port it.

Why: the promise is that TE's own tutorial runs through ``tutorial_utils.te`` with only its
imports changed. The code is read at test time, never stored in this repository. For
CPU the problem size is shrunk (same structure); nothing else is edited.
"""

from __future__ import annotations

import pathlib
import re

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


def find_seed(repo_root: pathlib.Path):
    for base in (repo_root.parent / "shared" / "seeds", repo_root / "shared" / "seeds"):
        hits = sorted(base.glob(SEED_GLOB))
        if hits:
            return hits[0]
    return None


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
