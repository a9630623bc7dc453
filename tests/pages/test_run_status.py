"""The generated "how this page ran / what ran where" box, in both states of ``results/``.

No GPU record: every page says it has not run on a GPU and how it is prepared. A GPU record
dropped into the folder: the box names it, with no other edit. conf.py inserts the same text
into the landing page and every chapter; the browser test (test_site.py) sees it there.
"""

import json
from pathlib import Path

import pytest

from tutorial_utils.pages import run_status
from tutorial_utils.perfmodel.records import validate_record

ROOT = Path(__file__).resolve().parents[2]
BUILD = run_status.build_description(False, None, 4)
CHAPTER = (
    "---\njupytext: {}\n---\n\n# 9. A chapter\n\nIntro.\n\n```{code-cell} ipython3\nx = 1\n```\n"
)


def _cpu_record() -> dict:
    record = json.loads((ROOT / "results" / "ch05-cpu-reference.json").read_text())
    validate_record(record)
    return record


def _write(folder: Path, name: str, record: dict) -> None:
    validate_record(record)
    (folder / name).write_text(json.dumps(record))


def _gpu_record() -> dict:
    record = _cpu_record()
    record["source"] = "gpu"
    record["created"] = "2026-12-02T10:00:00+00:00"
    record["hardware"] = {
        **record["hardware"],
        "platform": "gpu",
        "device_kind": "NVIDIA H200",
        "device_count": 1,
    }
    return record


def test_no_gpu_record_says_not_yet_run(tmp_path):
    _write(tmp_path, "ch05-cpu.json", _cpu_record())  # a CPU record is not a GPU run
    published = {**_gpu_record(), "source": "published"}  # nor is a published figure
    _write(tmp_path, "te-published.json", published)
    (tmp_path / "broken.json").write_text("{not json")  # the Benchmarks page reports this one
    assert run_status.gpu_records(tmp_path) == []
    box = run_status.chapter_box(run_status.gpu_records(tmp_path), BUILD)
    assert "GPU: not yet run on a GPU; prepared: `make gpu-run`." in box
    assert box.count("\n\n") == 1  # one paragraph: after the header, none inside
    assert run_status.STATUS_CLASS in box and "4 simulated devices" in box
    # one line in view, the rest folded: a dropdown whose title is the summary
    first = box.splitlines()[0]
    assert first == "````{dropdown} " + run_status.chapter_summary([], BUILD)
    assert first.endswith("4 simulated devices; no GPU run yet") and len(first) < 100


def test_a_gpu_record_is_named_without_a_hand_edit(tmp_path):
    _write(tmp_path, "ch05-cpu.json", _cpu_record())
    _write(tmp_path, "ch05b-seed-gpu.json", _gpu_record())
    recs = run_status.gpu_records(tmp_path)
    assert [Path(r["_path"]).name for r in recs] == ["ch05b-seed-gpu.json"]
    for box in (run_status.chapter_box(recs, BUILD), run_status.status_box(recs, BUILD)):
        assert run_status.NO_GPU_TEXT not in box and "not yet run" not in box
        assert "`results/ch05b-seed-gpu.json` (1 x NVIDIA H200, 2026-12-02)" in box


def test_many_gpu_records_are_summarised(tmp_path):
    for day in range(1, 6):
        _write(
            tmp_path,
            f"gpu-{day}.json",
            {**_gpu_record(), "created": f"2026-12-0{day}T00:00:00+00:00"},
        )
    text = run_status.status_text(run_status.gpu_records(tmp_path), BUILD)
    assert "gpu-5.json" in text and "gpu-1.json" not in text and "and 2 more" in text


def test_box_goes_under_every_chapter_title_and_at_the_landing_marker():
    chapter = run_status.insert_box("notebooks/09_new", CHAPTER, [], BUILD)
    title = chapter.index("# 9. A chapter")
    assert chapter.index("{dropdown} Ran on CPU") > title
    assert chapter.index("{dropdown} Ran on CPU") < chapter.index("Intro.")
    assert chapter.startswith("---\njupytext")  # the front matter stays first
    index = run_status.insert_box(
        "index", f"# Site\n\nText.\n\n{run_status.MARKER}\n\n## Chapters\n", [], BUILD
    )
    assert run_status.MARKER not in index and index.index("What ran where") > index.index("Text.")
    assert run_status.insert_box("docs/faq", "# FAQ\n", [], BUILD) == "# FAQ\n"
    with pytest.raises(ValueError, match="notebooks/x: no '# ' title line"):
        run_status.insert_box("notebooks/x", "no title", [], BUILD)


def test_build_description_names_the_backend():
    assert run_status.build_description(True) == "GPUs (TE with cuDNN)"
    assert "pure-JAX reference" in run_status.build_description(False, "reference", 4)


def test_every_chapter_and_the_landing_page_get_the_box():
    """What conf.py does for each page of the repository: no chapter is left without it."""
    recs = run_status.gpu_records(ROOT / "results")
    for path in sorted((ROOT / "notebooks").glob("*.md")):
        docname = path.relative_to(ROOT).with_suffix("").as_posix()
        text = run_status.insert_box(docname, path.read_text(), recs, BUILD)
        assert text.count(run_status.STATUS_CLASS) == 1, docname
        assert "**How this notebook runs.**" not in text, (
            f"{docname} still has a hand-written paragraph"
        )
    index = (ROOT / "index.md").read_text()
    assert run_status.MARKER in index
    assert run_status.STATUS_CLASS in run_status.insert_box("index", index, recs, BUILD)


def test_claims_resting_on_the_stand_in_are_labelled():
    """The label links the FAQ entry that says what it means; the pages that state such claims use
    it."""
    faq = (ROOT / "docs" / "faq.md").read_text()
    assert f"({run_status.STANDIN_TARGET})=" in faq
    label = f"{run_status.STANDIN_LABEL} <{run_status.STANDIN_TARGET}>"
    for page in (
        "notebooks/01_packed_thd_inputs.md",
        "notebooks/03_fused_attention_call.md",
        "notebooks/05b_te_cp_runs.md",
        "docs/faq.md",
    ):
        assert label in (ROOT / page).read_text(), (
            f"{page}: an unlabelled claim about what cuDNN writes"
        )
