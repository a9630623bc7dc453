"""tutorial_utils.pages.timing_view: chapter 5b's timing lines, folded on CPU."""

from tutorial_utils.pages.timing_view import CPU_LINE, show_timings, timing_lines

TIMINGS = {
    "single": {"mean_ms": 100.0, "std_ms": 2.0},
    "ring": {"mean_ms": 50.0, "std_ms": 1.0},
}


def test_lines_show_speed_ups_only_on_gpus_and_no_spread_for_one_call():
    gpu = timing_lines(TIMINGS, on_gpu=True, iters=5)
    assert gpu == [
        "single       100.0 ms (std   2.0)  1.00x vs single",
        "ring          50.0 ms (std   1.0)  2.00x vs single",
    ]
    cpu = timing_lines(TIMINGS, on_gpu=False, iters=1)
    assert cpu == ["single       100.0 ms (std   n/a)", "ring          50.0 ms (std   n/a)"]


def test_gpus_print_the_lines_and_cpus_fold_them_behind_one_line(capsys):
    assert show_timings(TIMINGS, on_gpu=True, iters=5) is None
    assert capsys.readouterr().out.splitlines() == timing_lines(TIMINGS, on_gpu=True, iters=5)
    folded = show_timings(TIMINGS, on_gpu=False, iters=1)
    assert capsys.readouterr().out == CPU_LINE + "\n"
    markdown = folded._repr_markdown_()
    assert markdown.startswith(":::{dropdown} The CPU times\n```text\n") and markdown.endswith(
        "```\n:::\n"
    )
    assert all(line in markdown for line in timing_lines(TIMINGS, on_gpu=False, iters=1))
