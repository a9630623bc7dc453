"""What each recipe run must print: shared by tests/examples/test_examples.py and
tests/site/test_site.py.

The site build runs the recipes of docs/recipes.md once each, so those runs are checked on that
executed page (test_site.py) rather than run a second time; test_examples.py runs the other device
counts, and the recipes a page shows without running (ELSEWHERE), itself.
"""

# (recipe, devices, a regular expression its result line matches)
ON_THE_RECIPES_PAGE = [
    ("thd_ring.py", 4, r"THD Ring, cp=4, stripe=1"),
    ("thd_allgather_striped.py", 4, r"THD AllGather, cp=4, stripe=4"),
    ("flax_dot_product_attention.py", 4, r"Flax DotProductAttention, Ring, cp=4"),
    ("te_decoder_block.py", 4, r"TE decoder block, Ring, cp=4"),
    ("reorder_once_iterator.py", 4, r"reorder-once iterator, Ring, cp=4"),
    ("multi_process.py", 2, r"2 processes, THD Ring over 2 devices"),
    ("cp_dp_fsdp_tp.py", 8, r"THD Ring on 2x2x2 \(data, tp, cp\)"),
]
ELSEWHERE = [
    ("thd_ring.py", 2, r"THD Ring, cp=2, stripe=1"),
    ("thd_ring.py", 8, r"THD Ring, cp=8, stripe=1"),
    # the recipes page runs it on two processes; four here
    ("multi_process.py", 4, r"4 processes, THD Ring over 4 devices"),
    # chapter 8's NNX section shows it; its exit status covers both of its variants
    ("flax_nnx.py", 4, r"Flax NNX, fused_attn in an nnx.Module, Ring, cp=4"),
]
# TE's own refusal of THD AllGather through the Flax layer, which the Flax recipe executes and
# prints (after its line "AllGather THD through the Flax layer: ... from TE's partitioner:"),
# wrapped at 88 columns: the line that starts TE's message, and a phrase of that line
FLAX_REFUSAL = (
    "ValueError: Context parallel fused attention only supports",
    "Dual Chunk load balancing",
)


def result_block(lines, says):
    """The first line matching ``says`` and the indented lines that continue it (a recipe prints
    its result over several lines of at most 88 characters), as one string; None if none."""
    import re

    for i, line in enumerate(lines):
        if re.search(says, line):
            block = [line]
            for more in lines[i + 1 :]:
                if not more.startswith(" "):
                    break
                block.append(more)
            return "\n".join(block)
    return None


def check_result_lines(lines, says):
    """The line matching ``says`` exists and it (with its continuation lines) reports the
    CP-vs-one-device difference."""
    result = result_block(lines, says)
    assert result and "max |" in result, (
        f"no result line for {says!r} with 'max |' in:\n" + "\n".join(lines[-20:])
    )
