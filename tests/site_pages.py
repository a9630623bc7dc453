"""The site's pages as ``index.md``'s table of contents lists them: the one list tests read."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def toctree_entries(caption: str | None = None) -> list[str]:
    """Documents of ``index.md``'s toctrees (those with ``caption``, or all), in order."""
    text = (ROOT / "index.md").read_text()
    out = []
    for block in re.findall(r"```\{toctree\}\n(.*?)```", text, re.S):
        options = dict(re.findall(r"^:(\w+):[ \t]*(.*)$", block, re.M))
        if caption is None or options.get("caption") == caption:
            out += [
                line.strip()
                for line in block.splitlines()
                if line.strip() and not line.startswith(":")
            ]
    return out


def chapters() -> list[str]:
    """The chapters, e.g. ``notebooks/01_packed_thd_inputs``."""
    return toctree_entries("Chapters")


def chapter_sources() -> list[Path]:
    return [ROOT / f"{doc}.md" for doc in chapters()]
