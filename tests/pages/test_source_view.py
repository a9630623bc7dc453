"""tutorial_utils.pages.source_view.show_source: a page shows the code that runs."""

import inspect

import pytest

from tutorial_utils.context_parallel import merge_partial, ring_attention_shard
from tutorial_utils.pages.source_view import SourceCode, show_source


def test_shows_the_package_source_with_its_file_and_lines():
    shown = show_source(merge_partial)
    text = shown._repr_markdown_()
    assert text.startswith(
        "`tutorial_utils.context_parallel.merge_partial` (src/tutorial_utils/context_parallel.py,"
        " lines "
    )
    assert "```python\n" + inspect.getsource(merge_partial).rstrip() + "\n```" in text
    _, first = inspect.getsourcelines(ring_attention_shard)
    assert f"lines {first}-" in show_source(ring_attention_shard).markdown()
    assert repr(shown).startswith("# tutorial_utils.context_parallel.merge_partial")


def test_nested_functions_are_dedented_and_fences_escape_backticks():
    def inner():
        return "```"

    code = show_source(inner).code
    assert code.startswith("def inner():")
    assert "\n````python\n" in SourceCode("x", "here", code).markdown()


def test_refuses_objects_without_python_source():
    with pytest.raises(TypeError, match="needs a Python function or class"):
        show_source(len)
    with pytest.raises(TypeError, match="needs a Python function or class"):
        show_source(3)


def test_folded_source_is_a_dropdown_around_the_same_block():
    """``folded=True``: one MyST dropdown in a colon fence (a backtick fence's title may not
    hold backticks), titled with the name and the line count, around exactly the unfolded
    block. The built page's check that no directive shows as text is in test_site.py."""
    folded = show_source(merge_partial, folded=True).markdown()
    lines = len(inspect.getsource(merge_partial).rstrip().splitlines())
    first, *body, last = folded.rstrip("\n").splitlines()
    assert first.startswith(":::{dropdown} tutorial_utils.context_parallel.merge_partial (")
    assert "`" not in first and first.endswith(f", {lines} lines") and last == ":::"
    block = show_source(merge_partial).markdown().split("\n\n", 1)[1]
    assert "\n".join(body) + "\n" == block
