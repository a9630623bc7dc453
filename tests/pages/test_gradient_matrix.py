"""Chapter 9's calibration table: each model's correct bfloat16 runs in one row (the run nearest
its bound), every other run in a row of its own, and a wrong verdict never folded away."""

import copy
import json

from tutorial_utils.pages.gradient_matrix import gradient_check_matrix


def _table_rows(markdown: str) -> list[str]:
    return [
        ln for ln in markdown.splitlines() if ln.startswith("| ") and not ln.startswith("| model |")
    ]


def test_the_committed_matrix_shows_one_row_per_model_for_its_correct_runs():
    table = gradient_check_matrix()
    rows = table.record["rows"]
    text = table.markdown()
    correct = sum(r["expected"] == "pass" for r in rows)
    assert f"{correct} correct and {len(rows) - correct} broken runs, 0 wrong verdicts" in text
    shown = _table_rows(text)
    folded = [r for r in rows if r["run"] == "correct" and r["dtype"] == "bfloat16"]
    models = {r["model"] for r in folded}
    assert len(shown) == len(rows) - len(folded) + len(models)
    for model in models:
        runs = [r for r in folded if r["model"] == model]
        worst = max(runs, key=lambda r: r["err_cp"] / r["bound"])
        entry = next(e for e in table.entries() if e[0]["model"] == model and len(e) > 1)
        assert entry[0] is worst and len(entry) == len(runs)
        assert f"<span class='cp-num'>{worst['err_cp']:.3g}</span>" in text
    per_model = len(folded) // len(models)
    assert sum(f"| correct, worst of {per_model} |" in line for line in shown) == len(models)
    assert "(Ring and AllGather on 2, 4 and 8 devices) share a row" in text


def test_a_wrong_verdict_keeps_its_own_row(tmp_path):
    record = copy.deepcopy(gradient_check_matrix().record)
    record["rows"][0]["verdict"] = "fail"
    record["summary"]["false_alarms"] = [record["rows"][0]["id"]]
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(record))
    text = gradient_check_matrix(path).markdown()
    assert "1 wrong verdicts" in text
    wrong = [line for line in _table_rows(text) if "(WRONG)" in line]
    assert len(wrong) == 1 and "| correct |" in wrong[0]
    assert len(_table_rows(text)) == len(_table_rows(gradient_check_matrix().markdown())) + 1
