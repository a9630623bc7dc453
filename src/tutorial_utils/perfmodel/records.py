"""Benchmark records: one JSON schema (``cp-bench/1``) for every timing the project shows.

A number without its origin misleads: every record says where it came from (``source``),
what ran (``config``), on what (``hardware``) and how it was timed (``timing``), and
:func:`validate_record` rejects one that leaves any of that out.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "SCHEMA",
    "SOURCES",
    "SOURCE_TITLES",
    "validate_record",
    "write_record",
    "load_records",
    "read_records",
    "committed_problems",
    "default_results_dir",
    "source_title",
    "group_by_source",
    "source_for",
]

SCHEMA = "cp-bench/1"

#: Allowed values of ``source``.
SOURCES = (
    "cpu-te",
    "cpu-reference",
    "cpu-kernel",
    "gpu",
    "gpu-emulated",
    "gpu-reference",
    "published",
)

#: How each source is named wherever records are shown.
SOURCE_TITLES = {
    "cpu-te": "this machine (CPU, TE's JAX code with a CPU reference kernel)",
    "cpu-reference": "this machine (CPU, pure-JAX reference backend)",
    "cpu-kernel": "this machine (CPU, the stand-in kernels called directly, no TE)",
    "gpu-reference": "GPU run without TransformerEngine (pure-JAX reference)",
    "gpu": "GPU run",
    "gpu-emulated": "per-rank emulation on one GPU (predicted multi-GPU step, not measured)",
    "published": "published",
}


def source_for(platform: str, backend_kind: str, emulated: bool = False) -> str:
    """The honest ``source`` of a run: where it ran and what computed the attention.

    ``backend_kind`` is ``tutorial_utils.te.backend_kind()``: ``'te'`` (TE with cuDNN),
    ``'te-cpu'`` (TE's JAX code, CPU reference kernel) or ``'reference'`` (pure JAX); a
    benchmark that calls the CPU stand-in kernels themselves, without TE, says ``'kernel'``.
    """
    if platform not in ("cpu", "gpu"):
        raise ValueError(f"platform={platform!r} must be 'cpu' or 'gpu' (jax.default_backend()).")
    if backend_kind not in ("te", "te-cpu", "reference", "kernel"):
        raise ValueError(
            f"backend_kind={backend_kind!r} must be 'te', 'te-cpu' or 'reference' "
            "(tutorial_utils.te.backend_kind()), or 'kernel' (the CPU stand-in kernels alone)."
        )
    if backend_kind == "kernel":
        if platform != "cpu":
            raise ValueError("backend_kind='kernel' (the CPU stand-in kernels) runs on 'cpu' only.")
        return "cpu-kernel"
    if platform == "gpu":
        if backend_kind != "te":
            return "gpu-reference"
        return "gpu-emulated" if emulated else "gpu"
    return "cpu-te" if backend_kind == "te-cpu" else "cpu-reference"


_CONFIG_INT_FIELDS = ("batch", "seq_len", "num_q_heads", "num_kv_heads", "head_dim", "cp_size")
_RESULT_OPTIONAL_POSITIVE = ("min_ms", "median_ms", "speedup")
_RESULT_OPTIONAL_NONNEGATIVE = ("std_ms", "tflops", "max_abs_err")

PathLike = str | os.PathLike


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _fail(field: str, message: str, value: Any = ...) -> None:
    shown = "" if value is ... else f", got {value!r}"
    raise ValueError(f"cp-bench record field {field!r}: {message}{shown}.")


def _check_iso(field: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        _fail(field, "must be an ISO 8601 date-time string", value)
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    try:
        _dt.datetime.fromisoformat(text)
    except ValueError:
        _fail(
            field, "must be an ISO 8601 date-time string such as '2026-11-29T07:30:00+00:00'", value
        )


def validate_record(record: Any) -> None:
    """Raise ``ValueError`` naming the first field of ``record`` that breaks ``cp-bench/1``.

    Why: a CPU run of the reference backend, a GPU run of real TE and a figure copied from a
    publication answer different questions; the benchmarks page must never put them on one
    axis without saying so.

    Schema ``cp-bench/1``::

        {
          "schema": "cp-bench/1",
          "source": one of SOURCES ("cpu-te", "gpu", "published", ...),
          "label": "short human-readable name",
          "created": "2026-11-29T07:30:00+00:00",  # ISO 8601; optional for "published"
          "hardware": {...},  # free-form, e.g. runtime.environment_record()
          "config": {"batch", "seq_len", "num_q_heads", "num_kv_heads", "head_dim",
                     "dtype", "cp_size", "window" (optional), ...},
          "timing": {"warmup_iters", "timing_iters", "compile_excluded"},   # optional
          "results": [
            {"strategy": "single" | "ring" | "allgather" | "ulysses" | <other>,
             "stripe_size": int | null, "mean_ms": float > 0,
             optional "std_ms", "min_ms", "median_ms", "speedup", "tflops", "max_abs_err"},
            ...
          ]
        }

    Extra keys are allowed everywhere. Keys starting with ``_`` are bookkeeping added by
    :func:`load_records` and are not part of a stored record.
    """
    if not isinstance(record, dict):
        raise ValueError(
            f"cp-bench record must be a JSON object (dict), got {type(record).__name__}."
        )
    if record.get("schema") != SCHEMA:
        _fail("schema", f"must be {SCHEMA!r}", record.get("schema"))

    source = record.get("source")
    if source not in SOURCES:
        _fail("source", f"must be one of {list(SOURCES)}", source)

    label = record.get("label")
    if not isinstance(label, str) or not label.strip():
        _fail("label", "must be a non-empty string", label)

    if "created" in record or source != "published":
        if "created" not in record:
            _fail("created", f"is required for source={source!r} (ISO 8601 date-time of the run)")
        _check_iso("created", record["created"])

    if not isinstance(record.get("hardware"), dict):
        _fail(
            "hardware",
            "must be an object (e.g. tutorial_utils.pages.runtime.environment_record())",
            record.get("hardware"),
        )
    # A record that says what ran must be filed under that: TE's code on a CPU is "cpu-te",
    # never "cpu-reference" (the benchmarks page groups and titles records by source).
    hardware = record["hardware"]
    platform, kind = hardware.get("platform"), hardware.get("backend_kind")
    try:  # source_for knows which (platform, kind) pairs exist; others are not checked
        allowed = {source_for(platform, kind), source_for(platform, kind, emulated=True)}
    except ValueError:
        allowed = None
    if allowed is not None and source not in allowed:
        _fail(
            "source",
            f"does not match hardware.platform={platform!r} and"
            f" hardware.backend_kind={kind!r}; use {' or '.join(sorted(allowed))!r}"
            " (records.source_for), or correct the hardware fields",
            source,
        )

    config = record.get("config")
    if not isinstance(config, dict):
        _fail("config", "must be an object with the workload fields", config)
    for key in _CONFIG_INT_FIELDS:
        if key not in config:
            _fail(f"config.{key}", "is required")
        if not _is_int(config[key]) or config[key] < 1:
            _fail(f"config.{key}", "must be a positive integer", config[key])
    if config["num_q_heads"] % config["num_kv_heads"]:
        _fail(
            "config.num_kv_heads",
            f"must divide num_q_heads={config['num_q_heads']}",
            config["num_kv_heads"],
        )
    if not isinstance(config.get("dtype"), str) or not config.get("dtype"):
        _fail("config.dtype", "must be a dtype name such as 'bfloat16'", config.get("dtype"))
    if config.get("window") is not None:
        window = config["window"]
        if (
            not isinstance(window, (list, tuple))
            or len(window) != 2
            or not all(_is_int(w) and w >= -1 for w in window)
        ):
            _fail(
                "config.window",
                "must be null or [left, right] with ints >= -1 (-1 = unbounded)",
                window,
            )

    if "timing" in record:
        timing = record["timing"]
        if not isinstance(timing, dict):
            _fail("timing", "must be an object", timing)
        # null means "not stated"; a stated value must make sense.
        warmup = timing.get("warmup_iters")
        if warmup is not None and (not _is_int(warmup) or warmup < 0):
            _fail("timing.warmup_iters", "must be an integer >= 0 (or null)", warmup)
        iters = timing.get("timing_iters")
        if iters is not None and (not _is_int(iters) or iters < 1):
            _fail("timing.timing_iters", "must be an integer >= 1 (or null)", iters)
        excluded = timing.get("compile_excluded")
        if excluded is not None and not isinstance(excluded, bool):
            _fail("timing.compile_excluded", "must be true or false (or null)", excluded)

    results = record.get("results")
    if not isinstance(results, list) or not results:
        _fail("results", "must be a non-empty list of per-strategy timings", results)
    for i, row in enumerate(results):
        where = f"results[{i}]"
        if not isinstance(row, dict):
            _fail(where, "must be an object", row)
        strategy = row.get("strategy")
        if not isinstance(strategy, str) or not strategy.strip():
            _fail(
                f"{where}.strategy",
                "must be a non-empty string such as 'ring' or 'allgather'",
                strategy,
            )
        stripe = row.get("stripe_size")
        if stripe is not None and (not _is_int(stripe) or stripe < 1):
            _fail(f"{where}.stripe_size", "must be a positive integer or null", stripe)
        if "mean_ms" not in row:
            _fail(f"{where}.mean_ms", "is required")
        if not _is_number(row["mean_ms"]) or row["mean_ms"] <= 0:
            _fail(f"{where}.mean_ms", "must be a finite number > 0", row["mean_ms"])
        for key in _RESULT_OPTIONAL_POSITIVE:
            if row.get(key) is not None and (not _is_number(row[key]) or row[key] <= 0):
                _fail(f"{where}.{key}", "must be a finite number > 0 (or absent)", row[key])
        for key in _RESULT_OPTIONAL_NONNEGATIVE:
            if row.get(key) is not None and (not _is_number(row[key]) or row[key] < 0):
                _fail(f"{where}.{key}", "must be a finite number >= 0 (or absent)", row[key])


def _slug(text: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()
    return slug or "record"


def _public(record: dict) -> dict:
    return {k: v for k, v in record.items() if not str(k).startswith("_")}


def write_record(
    record: dict, directory: PathLike = "results", name: str | None = None, overwrite: bool = True
) -> Path:
    """Validate ``record`` and write it as pretty-printed JSON; return the file's path.

    ``schema`` is filled in when missing, and so is ``created`` (now, UTC) for every source
    except ``published``. The caller's dict is not modified. Without ``name`` the file is
    called ``<source>-<label>.json``. An existing file of that name is replaced unless
    ``overwrite=False``, which raises ``FileExistsError`` instead.
    """
    if not isinstance(record, dict):
        raise ValueError(f"record must be a dict, got {type(record).__name__}.")
    out = _public(record)
    out.setdefault("schema", SCHEMA)
    if out.get("source") != "published":
        out.setdefault("created", _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    validate_record(out)
    if name is None:
        name = f"{out['source']}-{_slug(out['label'])}.json"
    if os.sep in name or (os.altsep and os.altsep in name):
        raise ValueError(
            f"name={name!r} must be a file name, not a path; pass the folder as directory=."
        )
    if not name.endswith(".json"):
        name += ".json"
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if path.exists() and not overwrite:
        raise FileExistsError(
            f"{path} already exists; pass another name (or overwrite=True / --force)."
        )
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def _candidate_dirs() -> Iterable[Path]:
    env = os.environ.get("CP_TUTORIAL_RESULTS")
    if env:
        yield Path(env)
    # A source checkout (editable install): <repo>/src/tutorial_utils/records.py
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file():
        yield repo / "results"
    # Otherwise the nearest results/ folder at or above the working directory
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "results").is_dir():
            yield folder / "results"
            break


def default_results_dir() -> Path:
    """The folder :func:`load_records` reads when given none.

    In order: ``$CP_TUTORIAL_RESULTS``; the repository's ``results/`` when the package runs
    from a source checkout; the nearest ``results/`` at or above the working directory.
    """
    for folder in _candidate_dirs():
        return folder
    raise FileNotFoundError(
        "No results/ folder found: set CP_TUTORIAL_RESULTS or run from inside the repository."
    )


def _read_one(path: Path, validate: bool) -> Any:
    """One record, or ``ValueError`` whose message starts with the file's path."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); a record is a JSON file."
        ) from err
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err}).") from err
    except RecursionError as err:
        raise ValueError(
            f"{path}: JSON nested too deeply to read; a record is a flat object."
        ) from err
    except OSError as err:
        raise ValueError(f"{path}: cannot be read ({err.strerror or err}).") from err
    if validate:
        try:
            validate_record(record)
        except (ValueError, RecursionError) as err:
            raise ValueError(f"{path}: {err}") from err
    if isinstance(record, dict):
        record["_path"] = str(path)
    return record


def _records_folder(directory: PathLike | None) -> Path:
    folder = Path(directory) if directory is not None else default_results_dir()
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise FileNotFoundError(
            f"records folder {folder} {what}; pass the folder that holds the *.json "
            "records (or set CP_TUTORIAL_RESULTS)."
        )
    return folder


def read_records(directory: PathLike | None = None) -> tuple[list[dict], list[tuple[Path, str]]]:
    """``(records, problems)``: every valid record, and ``(path, message)`` for each bad file.

    Why: one malformed file must not hide the others. The benchmarks page shows each
    problem as an error box naming its file; :func:`load_records` raises on the first one.
    """
    records, problems = [], []
    for path in sorted(_records_folder(directory).glob("*.json")):
        try:
            records.append(_read_one(path, validate=True))
        except ValueError as err:
            problems.append((path, str(err)))
    return records, problems


def load_records(directory: PathLike | None = None, validate: bool = True) -> list[dict]:
    """Every ``*.json`` record in ``directory`` (default: :func:`default_results_dir`).

    Records are returned sorted by file name, each with ``_path`` (the file it came from)
    added. A file that cannot be read, or (with ``validate``, the default) an invalid
    record, raises ``ValueError`` naming the file (and the field). A folder that does not
    exist raises ``FileNotFoundError`` naming it.
    """
    return [_read_one(path, validate) for path in sorted(_records_folder(directory).glob("*.json"))]


def committed_problems(problems: Iterable[tuple[Path, str]]) -> list[str]:
    """The problems whose file git tracks: a bad *committed* record must fail the build.

    A reader's own uncommitted record is only shown as an error box. Without git (an
    unpacked archive), every file counts as committed.
    """
    bad = []
    for path, message in problems:
        try:
            # 0: tracked, 1: untracked; anything else (no repository here) counts as committed
            tracked = (
                subprocess.run(
                    ["git", "ls-files", "--error-unmatch", path.name],
                    cwd=path.parent,
                    capture_output=True,
                    check=False,
                ).returncode
                != 1
            )
        except OSError:
            tracked = True
        if tracked:
            bad.append(message)
    return bad


def source_title(record: dict) -> str:
    """The heading a record is shown under, e.g. ``"GPU run: 4x H200, seed preset"``."""
    title = SOURCE_TITLES.get(record.get("source"), str(record.get("source")))
    return f"{title}: {record.get('label', '')}".rstrip(": ")


def group_by_source(records: Iterable[dict]) -> dict[str, list[dict]]:
    """Records grouped by ``source``, in the order of :data:`SOURCES` (unknown sources last)."""
    groups: dict[str, list[dict]] = {s: [] for s in SOURCES}
    for record in records:
        groups.setdefault(record.get("source"), []).append(record)
    return {s: rs for s, rs in groups.items() if rs}
