"""The site build's side-by-side execution and its budget (devtools/docs_execute.py).

The build itself runs in tests/site/test_site.py (its clean build must stay within the budget);
here, the parts that decide: the budget verdict, the number of pages at once, the order, and
which pages are left to Sphinx.
"""

import json

import docs_execute
import page_stats
import pytest


def _row(page, seconds, cpu, **extra):
    return {"page": page, "seconds": seconds, "cpu_s": cpu, "peak_rss_mib": 100, **extra}


def test_a_clean_build_over_its_program_budget_is_flagged():
    """Programs are compiles plus compile-cache hits: which page compiles a shared program first
    changes with the order, the sum does not."""
    rows = [
        _row("a", 10.0, 250.0, compiles=200, cache_hits=50),
        _row("b", 20.0, 111.0, compiles=111),
    ]
    over = docs_execute.summarize(rows, budget_programs=360)
    assert over["clean_build"] and over["programs"] == 361 and over["within_budget"] is False
    assert over["cpu_s"] == 361.0  # reported, judged as a ratio by tests/site/test_site.py
    assert [r["page"] for r in over["pages"]] == ["b", "a"]  # longest first
    within = docs_execute.summarize(rows[:1], budget_programs=360)
    assert within["within_budget"] is True


def test_a_build_that_reused_pages_gets_no_verdict():
    rows = [_row("a", 10.0, 400.0), _row("b", 5.0, 0.0, executed="in an earlier build")]
    report = docs_execute.summarize(rows, budget_programs=360)
    assert report["clean_build"] is False and report["within_budget"] is None


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_bad_jobs_setting_names_the_variable_and_the_fix(monkeypatch, value):
    monkeypatch.setenv("CP_DOCS_JOBS", value)
    with pytest.raises(ValueError, match=rf"CP_DOCS_JOBS='{value}'.*whole number.*or unset it"):
        docs_execute.jobs()


def test_jobs_default_is_one_more_than_the_cpus_within_memory(monkeypatch):
    monkeypatch.delenv("CP_DOCS_JOBS", raising=False)
    monkeypatch.setattr(docs_execute.os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(docs_execute, "available_memory_gib", lambda: 64.0)
    assert docs_execute.jobs() == 3
    monkeypatch.setattr(docs_execute, "available_memory_gib", lambda: 5.0)  # 2 x 2.5 GiB
    assert docs_execute.jobs() == 2
    monkeypatch.setattr(docs_execute, "available_memory_gib", lambda: 1.0)
    assert docs_execute.jobs() == 1


def test_order_uses_the_last_build_then_the_committed_table(tmp_path, monkeypatch):
    costs = tmp_path / "page_costs.json"
    costs.write_text(json.dumps({"a": 5.0, "b": 50.0}))
    monkeypatch.setattr(docs_execute, "COSTS", costs)
    assert docs_execute.expected_seconds(tmp_path) == {"a": 5.0, "b": 50.0}
    (tmp_path / docs_execute.TIMES_FILE).write_text(
        json.dumps({"pages": [{"page": "a", "seconds": 80.0}]})
    )
    assert docs_execute.expected_seconds(tmp_path) == {"a": 80.0, "b": 50.0}


def test_a_page_missing_from_the_table_runs_first(tmp_path, monkeypatch):
    """A new chapter needs no entry in page_costs.json: unknown pages run first, and
    `python devtools/docs_execute.py` after a build refreshes the table from the build."""
    costs = tmp_path / "page_costs.json"
    costs.write_text(json.dumps({"a": 5.0, "b": 50.0}))
    monkeypatch.setattr(docs_execute, "COSTS", costs)
    assert docs_execute.longest_first(["a", "new", "b"], tmp_path) == ["new", "b", "a"]
    (tmp_path / docs_execute.TIMES_FILE).write_text(
        json.dumps({"pages": [{"page": "new", "seconds": 1.0}]})
    )
    assert docs_execute.refresh_costs(tmp_path) == {"new": 1.0}
    assert json.loads(costs.read_text()) == {"new": 1.0}


def test_forced_pages_are_found_in_the_front_matter():
    assert docs_execute.FORCED.search("---\nmystnb:\n  execution_mode: force\n---\n")
    assert not docs_execute.FORCED.search("---\nmystnb:\n  execution_mode: cache\n---\n")


def test_page_stats_sum_a_pages_processes(tmp_path):
    stats = tmp_path / "page.jsonl"
    lines = [
        {"cpu_s": 1.5, "peak_rss_mib": 300, "compiles": 3, "compile_s": 0.5, "cache_hits": 1},
        {
            "cpu_s": 2.0,
            "peak_rss_mib": 900,
            "compiles": 4,
            "compile_s": 3.5,
            "cache_hits": 0,
            "argv": ["examples/thd_ring.py"],  # a script the page ran, not its kernel
            "large_compiles": [["jit_loss", 1.2], ["jit_train_step", 2.3]],
        },
    ]
    stats.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert page_stats.summarize(stats) == {
        "processes": 2,
        "cpu_s": 3.5,
        "compiles": 7,
        "compile_s": 4.0,
        "cache_hits": 1,
        "peak_rss_mib": 900,
        "large_compiles": [
            ["jit_train_step in examples/thd_ring.py", 2.3],
            ["jit_loss in examples/thd_ring.py", 1.2],
        ],
    }


def test_a_process_names_its_long_compiles_and_the_build_lists_the_longest(monkeypatch):
    """JAX's compile event carries the program's name: a compile of at least LARGE_COMPILE_S is
    kept by name, a shorter one only counted; the report lists the build's longest first."""
    monkeypatch.setattr(page_stats, "_compiles", {"n": 0, "s": 0.0, "hits": 0, "large": []})
    page_stats._on_duration(page_stats.COMPILE_EVENT, 2.5, fun_name="jit_train_step")
    page_stats._on_duration(page_stats.COMPILE_EVENT, 0.2, fun_name="jit_add")
    page_stats._on_duration("/jax/other", 9.0, fun_name="jit_not_a_compile")
    assert page_stats._compiles["n"] == 2
    assert page_stats._compiles["large"] == [["jit_train_step", 2.5]]
    rows = [
        {"page": "a", "large_compiles": [["jit_step", 4.0], ["jit_loss", 1.5]]},
        {"page": "b", "large_compiles": [["jit_train_step", 8.0]]},
        {"page": "c"},
    ]
    assert docs_execute.largest_compiles(rows, n=2) == [
        (8.0, "jit_train_step", "b"),
        (4.0, "jit_step", "a"),
    ]
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=rf"n={bad!r} must be a positive int"):
            docs_execute.largest_compiles(rows, n=bad)


def test_a_page_kernel_talks_over_unix_sockets(tmp_path):
    """Kernels side by side on TCP lost ports their manager had picked to other processes
    ("Address already in use": the kernel died and the build stopped); on IPC they have none."""
    import nbformat

    cell = "from ipykernel.kernelapp import IPKernelApp\nprint(IPKernelApp.instance().transport)"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    stats = tmp_path / "stats.jsonl"
    out = docs_execute._execute(str(tmp_path), str(tmp_path), 60, nbformat.writes(nb), str(stats))
    assert out["error"] is None
    ran = nbformat.reads(out["nb"], as_version=4)
    assert ran.cells[0].outputs[0]["text"].strip() == "ipc"
