"""The cp-bench/1 record schema: every stored record is valid, and bad records are rejected
with an error that names the offending field."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest

from tutorial_utils.perfmodel import records
from tutorial_utils.perfmodel.records import (
    SCHEMA,
    committed_problems,
    load_records,
    read_records,
    source_title,
    validate_record,
    write_record,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
STORED = sorted(RESULTS.glob("*.json"))


def _measured() -> dict:
    return {
        "schema": SCHEMA,
        "source": "cpu-reference",
        "label": "cpu preset, 4 simulated devices",
        "created": "2026-11-29T07:30:00+00:00",
        "hardware": {"platform": "cpu", "device_count": 4, "backend": "reference"},
        "config": {
            "batch": 2,
            "seq_len": 2048,
            "num_q_heads": 16,
            "num_kv_heads": 4,
            "head_dim": 32,
            "window": [256, 0],
            "dtype": "bfloat16",
            "cp_size": 4,
        },
        "timing": {"warmup_iters": 2, "timing_iters": 5, "compile_excluded": True},
        "results": [
            {"strategy": "single", "stripe_size": None, "mean_ms": 40.0, "std_ms": 1.0},
            {"strategy": "ring", "stripe_size": 1, "mean_ms": 20.0, "speedup": 2.0},
            {"strategy": "allgather", "stripe_size": 16, "mean_ms": 18.5, "max_abs_err": 0.01},
        ],
    }


def _published() -> dict:
    """A throw-away record shaped like a figure copied from a publication (no 'created')."""
    rec = _measured()
    rec.update(source="published", label="a published 4-GPU figure")
    del rec["created"], rec["timing"]
    return rec


# ----------------------------------------------------------------------------- stored records


@pytest.mark.parametrize("path", STORED, ids=[p.name for p in STORED])
def test_stored_record_is_valid(path):
    validate_record(json.loads(path.read_text(encoding="utf-8")))


def test_load_records_reads_the_repository_results():
    loaded = load_records()
    assert [Path(r["_path"]).name for r in loaded] == [p.name for p in STORED]


def test_published_record_if_present():
    path = RESULTS / "te-published-gb200.json"
    if not path.exists():
        pytest.skip(
            "results/te-published-gb200.json not written yet; the schema is covered by the other"
            " tests"
        )
    rec = json.loads(path.read_text(encoding="utf-8"))
    assert rec["source"] == "published"
    assert rec["config"]["cp_size"] == 4
    strategies = {r["strategy"] for r in rec["results"]}
    assert {"single", "ring", "allgather"} <= strategies


# ----------------------------------------------------------------------------- good records


def test_valid_examples_pass():
    validate_record(_measured())
    validate_record(_published())


def test_write_then_load_round_trip(tmp_path):
    path = write_record(_published(), directory=tmp_path)
    assert path.parent == tmp_path and path.suffix == ".json"
    rec = _measured()
    del rec["created"]  # filled in by write_record for measured sources
    path2 = write_record(rec, directory=tmp_path, name="mine")
    assert path2.name == "mine.json"
    assert "created" not in rec, "write_record must not modify the caller's dict"
    loaded = load_records(tmp_path)
    assert [Path(r["_path"]).name for r in loaded] == sorted([path.name, path2.name])
    by_name = {Path(r["_path"]).name: r for r in loaded}
    assert "created" in by_name["mine.json"]
    assert "created" not in by_name[path.name]
    stored = json.loads(path2.read_text())
    assert "_path" not in stored
    for r in loaded:
        validate_record(r)  # bookkeeping keys do not break validation


def test_write_record_fills_schema_and_rejects_bad(tmp_path):
    rec = _measured()
    del rec["schema"]
    assert json.loads(write_record(rec, directory=tmp_path).read_text())["schema"] == SCHEMA
    bad = _measured()
    bad["results"][0]["mean_ms"] = 0
    with pytest.raises(ValueError, match=r"results\[0\]\.mean_ms"):
        write_record(bad, directory=tmp_path, name="bad")
    assert not (tmp_path / "bad.json").exists()
    with pytest.raises(ValueError, match="file name"):
        write_record(_measured(), directory=tmp_path, name="sub/dir.json")


def test_load_records_names_the_bad_file(tmp_path):
    write_record(_measured(), directory=tmp_path, name="good")
    broken = _measured()
    broken["source"] = "rumour"
    (tmp_path / "zz-broken.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match=r"zz-broken\.json.*'source'"):
        load_records(tmp_path)
    assert len(load_records(tmp_path, validate=False)) == 2
    (tmp_path / "zz-broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_records(tmp_path)


def test_a_missing_records_folder_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"records folder .*nothing-here does not exist"):
        load_records(tmp_path / "nothing-here")
    (tmp_path / "plain").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"plain is a file, not a folder"):
        read_records(tmp_path / "plain")


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\xff\xfe{}", r"bad-bytes\.json: not UTF-8 text"),
        (
            b"[" * 100_000 + b"]" * 100_000,
            r"bad-bytes\.json: (JSON nested too deeply|not valid JSON)",
        ),
        (b"{not json", r"bad-bytes\.json: not valid JSON"),
        (b"[1, 2]", r"bad-bytes\.json: cp-bench record must be a JSON object"),
    ],
)
def test_every_loading_error_names_the_file(tmp_path, content, message):
    (tmp_path / "bad-bytes.json").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        load_records(tmp_path)


def test_read_records_keeps_the_good_ones_and_names_the_bad(tmp_path):
    write_record(_measured(), directory=tmp_path, name="good")
    (tmp_path / "zz-bad.json").write_bytes(b"\xff")
    records, problems = read_records(tmp_path)
    assert [Path(r["_path"]).name for r in records] == ["good.json"]
    assert [p.name for p, _ in problems] == ["zz-bad.json"] and "zz-bad.json" in problems[0][1]


def test_only_a_committed_bad_record_fails_the_build(tmp_path):
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "committed.json").write_text("{}")
    (tmp_path / "mine.json").write_text("{}")
    subprocess.run(git + ["add", "committed.json"], cwd=tmp_path, check=True)
    subprocess.run(git + ["commit", "-qm", "r"], cwd=tmp_path, check=True)
    _, problems = read_records(tmp_path)
    assert len(problems) == 2
    bad = committed_problems(problems)
    assert len(bad) == 1 and "committed.json" in bad[0]


def test_results_dir_override(tmp_path, monkeypatch):
    write_record(_published(), directory=tmp_path, name="p")
    monkeypatch.setenv("CP_TUTORIAL_RESULTS", str(tmp_path))
    assert records.default_results_dir() == tmp_path
    assert [Path(r["_path"]).name for r in load_records()] == ["p.json"]


def test_source_titles_keep_sources_apart():
    assert source_title(_measured()).startswith("this machine (CPU, pure-JAX reference backend)")
    assert source_title(_published()).startswith("published")
    groups = records.group_by_source([_published(), _measured(), _published()])
    assert list(groups) == ["cpu-reference", "published"]
    assert len(groups["published"]) == 2


# ----------------------------------------------------------------------------- bad records


def _mutate(path: str, value=..., delete: bool = False):
    """A copy of a valid measured record with one field (dotted path, [i] for list items)
    changed."""
    rec = copy.deepcopy(_measured())
    parts = path.replace("[", ".").replace("]", "").split(".")
    target = rec
    for part in parts[:-1]:
        target = target[int(part)] if part.isdigit() else target[part]
    last = int(parts[-1]) if parts[-1].isdigit() else parts[-1]
    if delete:
        del target[last]
    else:
        target[last] = value
    return rec


BAD = [
    ("schema", "cp-bench/0", "schema"),
    ("source", "somewhere", "source"),
    ("label", "", "label"),
    ("label", None, "label"),
    ("created", "yesterday", "created"),
    ("hardware", "a GPU", "hardware"),
    ("config", [], "config"),
    ("config.seq_len", 0, "config.seq_len"),
    ("config.batch", 2.5, "config.batch"),
    ("config.cp_size", True, "config.cp_size"),
    ("config.num_kv_heads", 5, "config.num_kv_heads"),
    ("config.dtype", None, "config.dtype"),
    ("config.window", [256], "config.window"),
    ("config.window", [-2, 0], "config.window"),
    ("timing", "fast", "timing"),
    ("timing.warmup_iters", -1, "timing.warmup_iters"),
    ("timing.timing_iters", 0, "timing.timing_iters"),
    ("timing.compile_excluded", "yes", "timing.compile_excluded"),
    ("results", [], "results"),
    ("results", {"ring": 1.0}, "results"),
    ("results[1]", "ring 20ms", "results[1]"),
    ("results[1].strategy", "", "results[1].strategy"),
    ("results[1].stripe_size", 0, "results[1].stripe_size"),
    ("results[1].mean_ms", -3.0, "results[1].mean_ms"),
    ("results[1].mean_ms", float("nan"), "results[1].mean_ms"),
    ("results[1].mean_ms", "20", "results[1].mean_ms"),
    ("results[1].speedup", 0.0, "results[1].speedup"),
    ("results[2].max_abs_err", -0.1, "results[2].max_abs_err"),
    ("results[0].std_ms", float("inf"), "results[0].std_ms"),
]

MISSING = [
    "schema",
    "source",
    "label",
    "created",
    "hardware",
    "config",
    "config.seq_len",
    "config.cp_size",
    "results",
    "results[0].mean_ms",
]


@pytest.mark.parametrize("path,value,field", BAD, ids=[f"{p}={v!r}" for p, v, _ in BAD])
def test_bad_value_names_the_field(path, value, field):
    with pytest.raises(ValueError) as err:
        validate_record(_mutate(path, value))
    assert repr(field) in str(err.value), str(err.value)


@pytest.mark.parametrize("path", MISSING)
def test_missing_field_is_named(path):
    with pytest.raises(ValueError) as err:
        validate_record(_mutate(path, delete=True))
    assert repr(path) in str(err.value), str(err.value)


def test_published_may_omit_created_but_not_a_bad_one():
    rec = _published()
    validate_record(rec)
    rec["created"] = "not a date"
    with pytest.raises(ValueError, match="'created'"):
        validate_record(rec)


def test_not_a_dict():
    with pytest.raises(ValueError, match="JSON object"):
        validate_record([_measured()])


def test_null_timing_fields_mean_not_stated():
    rec = _measured()
    rec["timing"] = {"warmup_iters": None, "timing_iters": None, "compile_excluded": True}
    validate_record(rec)


def test_extra_keys_are_allowed():
    rec = _measured()
    rec["notes"] = "anything"
    rec["config"]["stripe_size"] = 16
    rec["results"][0]["first_call_ms"] = 900.0
    validate_record(rec)


def test_source_for_names_what_computed_the_attention():
    assert records.source_for("gpu", "te") == "gpu"
    assert records.source_for("gpu", "te", emulated=True) == "gpu-emulated"
    assert (
        records.source_for("gpu", "reference") == "gpu-reference"
    )  # never labelled as a TE or CPU run
    assert records.source_for("cpu", "te-cpu") == "cpu-te"
    assert records.source_for("cpu", "reference") == "cpu-reference"
    assert records.source_for("cpu", "kernel") == "cpu-kernel"  # the stand-in kernels alone
    with pytest.raises(ValueError, match=r"'kernel' .* runs on 'cpu' only"):
        records.source_for("gpu", "kernel")
    assert all(
        records.source_for(p, k) in records.SOURCES
        for p in ("cpu", "gpu")
        for k in ("te", "te-cpu", "reference")
    )
    with pytest.raises(ValueError, match=r"platform='tpu' must be 'cpu' or 'gpu'"):
        records.source_for("tpu", "te")
    with pytest.raises(ValueError, match=r"backend_kind='cudnn' must be"):
        records.source_for("gpu", "cudnn")


def test_a_record_is_filed_under_what_ran():
    """TE's code on a CPU filed as the pure-JAX reference (as cpu-kernel-compiled-vs-jax.json
    once was) is refused, naming the source to use; the matching source passes."""
    rec = _measured()
    rec["hardware"].update(platform="cpu", backend_kind="te-cpu")
    with pytest.raises(ValueError, match=r"'source'.*backend_kind='te-cpu'.*use 'cpu-te'"):
        validate_record(rec)
    kernels = {**rec, "hardware": {**rec["hardware"], "backend_kind": "kernel"}}
    with pytest.raises(ValueError, match=r"use 'cpu-kernel'"):
        validate_record(kernels)  # still filed as cpu-te
    validate_record({**kernels, "source": "cpu-kernel"})
    rec["source"] = "cpu-te"
    validate_record(rec)
    rec["hardware"].update(platform="gpu", backend_kind="te")
    for source in ("gpu", "gpu-emulated"):
        validate_record({**rec, "source": source})
