"""What each recipe run must print: shared by tests/test_examples.py and tests/test_site.py.

The site build runs every recipe once on four simulated devices (docs/recipes.md), so the
four-device runs are checked on that executed page (test_site.py) rather than run a second time;
test_examples.py runs the other device counts itself.
"""

# (recipe, devices, a regular expression its result line matches)
ON_THE_RECIPES_PAGE = [
    ("thd_ring.py", 4, r"THD Ring, cp=4, stripe=1"),
    ("thd_allgather_striped.py", 4, r"THD AllGather, cp=4, stripe=4"),
    ("flax_dot_product_attention.py", 4, r"Flax DotProductAttention, Ring, cp=4"),
    ("reorder_once_iterator.py", 4, r"reorder-once iterator, Ring, cp=4"),
    ("multi_process.py", 4, r"4 processes, THD Ring over 4 devices"),
    ("cp_dp_fsdp_tp.py", 8, r"THD Ring on 2x2x2 \(data, tp, cp\)"),
]
ELSEWHERE = [
    ("thd_ring.py", 2, r"THD Ring, cp=2, stripe=1"),
    ("thd_ring.py", 8, r"THD Ring, cp=8, stripe=1"),
]
# TE's own refusal of THD AllGather through the Flax layer, which the Flax recipe executes and
# prints
FLAX_REFUSAL = ("AllGather THD through the Flax layer", "Striped load balancing with THD layouts")


def check_result_lines(lines, says):
    """The line matching ``says`` exists and reports the CP-vs-one-device difference."""
    import re

    result = [line for line in lines if re.search(says, line)]
    assert result and "max |" in result[0], (
        f"no result line for {says!r} with 'max |' in:\n" + "\n".join(lines[-20:])
    )
