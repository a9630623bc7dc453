"""The "how this page ran / what ran where" box, generated for the landing page and every chapter.

A reader must be able to tell, on every page, what produced it and whether any of it ran on a
GPU; written once from ``results/``, the box is inserted by ``conf.py`` as each page is read,
so it never drifts. Only a valid ``cp-bench/1`` record with ``hardware.platform == "gpu"``
(not a published figure) counts as a GPU record.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from tutorial_utils.perfmodel import records as _records

__all__ = [
    "STATUS_CLASS",
    "STANDIN_LABEL",
    "STANDIN_TARGET",
    "NO_GPU_TEXT",
    "gpu_records",
    "build_description",
    "status_text",
    "status_box",
    "chapter_box",
    "chapter_summary",
    "insert_box",
]

#: CSS class of the generated box (the browser test looks for it).
STATUS_CLASS = "cp-run-status"
#: The label that marks a claim resting on the CPU stand-in's reading of cuDNN's contract.
STANDIN_LABEL = "stand-in reading of cuDNN"
#: The FAQ section that says what such a label means.
STANDIN_TARGET = "stand-in-reading"
#: What the box says while no GPU record exists.
NO_GPU_TEXT = "not yet run on a GPU; prepared: `make gpu-run`"
#: Where the landing page wants the box (otherwise it goes under the page's title).
MARKER = "<!-- run-status -->"
#: How many GPU records the box names before it says "and N more".
MAX_NAMED = 3


def gpu_records(directory=None) -> list[dict]:
    """Valid records in ``directory`` (default: ``results/``) that ran on a GPU, oldest first.

    Invalid files are skipped here: the Benchmarks page reports them, and a committed bad
    record fails the build there.
    """
    try:
        found, _problems = _records.read_records(directory)
    except FileNotFoundError:
        return []
    gpu = [
        r
        for r in found
        if r.get("source") != "published" and (r.get("hardware") or {}).get("platform") == "gpu"
    ]
    return sorted(gpu, key=lambda r: (str(r.get("created", "")), Path(r["_path"]).name))


def build_description(gpu: bool, backend: str | None = None, devices: int | None = None) -> str:
    """What this build runs the notebooks on, from what conf.py knows before any kernel starts."""
    backend = backend or "auto"
    if gpu:
        what = (
            "the pure-JAX reference on GPUs" if backend == "reference" else "GPUs (TE with cuDNN)"
        )
    elif backend == "reference":
        what = "CPU (the pure-JAX reference, no TE)"
    else:
        what = "CPU (TE's JAX code, stand-in kernel)"
    if devices:
        what += f", {devices} simulated devices" if not gpu else f", {devices} devices"
    return what


def _describe(record: dict) -> str:
    hw = record.get("hardware") or {}
    name = Path(record["_path"]).name
    count, kind = hw.get("device_count"), hw.get("device_kind") or "GPU"
    where = f"{count} x {kind}" if count else str(kind)
    date = str(record.get("created", ""))[:10]
    parts = [p for p in (where, date) if p]
    return f"`results/{name}` ({', '.join(parts)})"


def status_text(gpu_recs: Iterable[dict], build: str) -> str:
    """One paragraph: what built these pages, and which GPU records exist (or that none does)."""
    recs = list(gpu_recs)
    if not recs:
        gpu = "GPU: " + NO_GPU_TEXT
    else:
        named = [_describe(r) for r in recs[-MAX_NAMED:]]
        more = len(recs) - len(named)
        gpu = "GPU records: " + "; ".join(named) + (f"; and {more} more" if more else "")
        gpu += " (see the {doc}`Benchmarks page </docs/benchmarks>`)"
    return f"**What ran where.** Executed on {build}. {gpu}."


def status_box(gpu_recs: Iterable[dict], build: str) -> str:
    """The landing page's box: the status paragraph alone."""
    return _admonition(
        "What ran where", status_text(gpu_recs, build).replace("**What ran where.** ", "")
    )


def chapter_summary(gpu_recs: Iterable[dict], build: str) -> str:
    """The chapter box's one line: what built the page, and whether a GPU record exists."""
    recs = list(gpu_recs)
    gpu = "no GPU run yet" if not recs else f"GPU records: {len(recs)}"
    return f"Ran on {build}; {gpu}"


def chapter_box(gpu_recs: Iterable[dict], build: str) -> str:
    """Every chapter's box: one line (:func:`chapter_summary`), and the status with what to
    make of the page's figures folded under it.

    Why folded: the same paragraph on every chapter, above the page's own ``Backend:`` line,
    pushed each chapter's first lesson down; the line says what a reader must know at once.
    """
    recs = list(gpu_recs)
    note = (
        " The `Backend:` line names what produced this page; CPU timings say nothing about GPU"
        f" speed; *({{ref}}`{STANDIN_LABEL} <{STANDIN_TARGET}>`)* marks a claim that rests on"
        " the CPU stand-in's reading of cuDNN's contract."
    )
    return (
        f"````{{dropdown}} {chapter_summary(recs, build)}\n"
        f":class-container: {STATUS_CLASS}\n\n"
        f"{status_text(recs, build)}{note}\n````\n"
    )


def _admonition(title: str, body: str) -> str:
    # A four-backtick fence, so a body may hold ordinary code spans and roles.
    return f"````{{admonition}} {title}\n:class: note {STATUS_CLASS}\n\n{body}\n````\n"


_H1 = re.compile(r"^# .+$", re.MULTILINE)


def insert_box(docname: str, text: str, gpu_recs: Iterable[dict], build: str) -> str:
    """``text`` with the page's box in place: the landing page's at its marker (or under its
    title), a chapter's (``notebooks/*``) under its title. Other pages are returned unchanged."""
    if docname == "index":
        box = status_box(gpu_recs, build)
        if MARKER in text:
            return text.replace(MARKER, box, 1)
    elif docname.startswith("notebooks/"):
        box = chapter_box(gpu_recs, build)
    else:
        return text
    title = _H1.search(text)
    if title is None:
        raise ValueError(
            f"{docname}: no '# ' title line to put the run-status box under; "
            "give the page a level-1 heading."
        )
    end = title.end()
    return text[:end] + "\n\n" + box + text[end:]


def build_from_environment(gpu: bool) -> str:
    """:func:`build_description` for the current environment (conf.py's view)."""
    flags = re.search(
        r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", "")
    )
    return build_description(
        gpu,
        os.environ.get("TUTORIAL_TE_BACKEND"),
        int(flags.group(1)) if flags and not gpu else None,
    )
