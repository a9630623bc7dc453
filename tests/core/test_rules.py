"""Each CP rule in ``tutorial_utils.rules``: it accepts a valid input and refuses an invalid one
with a message naming the parameter, the value and the fix. No JAX is needed."""

import ast
import enum
import sys
from pathlib import Path

import numpy as np
import pytest

from tutorial_utils import rules


class CPStrategy(enum.Enum):  # the shape of TE's enum: members with .name, str() "CPStrategy.X"
    DEFAULT = 0
    ALL_GATHER = 1
    RING = 2


def test_rules_import_only_the_standard_library_and_numpy():
    tree = ast.parse(Path(rules.__file__).read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "rules imports nothing from the package"
            roots.add(node.module.split(".")[0])
    assert roots - {"numpy"} <= set(sys.stdlib_module_names) | {"__future__"}, roots


def test_reason_returns_the_rule_message_or_empty():
    assert rules.reason(rules.check_ulysses_heads, 8, 4, 4) == ""
    why = rules.reason(rules.check_ulysses_heads, 8, 2, 4)
    assert why.startswith("num_kv_heads=2 is not divisible by cp_size=4")
    with pytest.raises(TypeError):  # only ValueError is a rule's refusal
        rules.reason(rules.check_ulysses_heads, 8)


@pytest.mark.parametrize(
    "spelling, want",
    [
        (CPStrategy.DEFAULT, "allgather"),
        (CPStrategy.ALL_GATHER, "allgather"),
        (CPStrategy.RING, "ring"),
        (str(CPStrategy.RING), "ring"),
        ("ALL_GATHER", "allgather"),
        ("all-gather", "allgather"),
        ("a2a", "ulysses"),
        ("alltoall", "ulysses"),
    ],
)
def test_normalize_strategy(spelling, want):
    assert rules.normalize_strategy(spelling) == want
    assert rules.normalize_strategy(None, allow_none=True) is None
    with pytest.raises(
        ValueError, match=r"strategy='mesh' is unknown; use 'ring', 'allgather' or 'ulysses'"
    ):
        rules.normalize_strategy("mesh")
    with pytest.raises(ValueError, match=r"strategy=None is unknown"):
        rules.normalize_strategy(None)


def test_check_stripe_size():
    assert rules.check_stripe_size(None) == 1 and rules.check_stripe_size(np.int64(4)) == 4
    for bad in (0, -2, 2.0, True):
        with pytest.raises(
            ValueError,
            match=rf"stripe_size={bad!r} must be a positive int \(or None for 1\): the stripe used"
            r" with reorder_causal_load_balancing",
        ):
            rules.check_stripe_size(bad)
    with pytest.raises(ValueError, match=r"--stripe=0 must be a positive int"):
        rules.check_stripe_size(0, name="--stripe")


def test_check_stripe_given():
    rules.check_stripe_given(1)
    with pytest.raises(
        ValueError,
        match=r"stripe_size=None with THD AllGather context parallelism: striped load balancing"
        r" needs an explicit stripe_size",
    ):
        rules.check_stripe_given(None)
    with pytest.raises(ValueError, match=r"stripe_size=None with a CP strategy"):
        rules.check_stripe_given(None, label="a CP strategy")


def test_check_ring_stripe():
    rules.check_ring_stripe(1)
    rules.check_ring_stripe(None)  # TE's THD Ring reads None as 1
    with pytest.raises(
        ValueError,
        match=r"stripe_size=2 with strategy='ring': TE's THD ring attention requires"
        r" stripe_size=1 .* Use stripe_size=1 .*or AllGather for larger stripes",
    ):
        rules.check_ring_stripe(2)
    with pytest.raises(ValueError, match=r"stripe_size=4 with CPStrategy.RING"):
        rules.check_ring_stripe(4, label="CPStrategy.RING")
    with pytest.raises(ValueError, match=r"Workload.ring_stripe_size=2 with strategy='ring'"):
        rules.check_ring_stripe(2, name="Workload.ring_stripe_size")


def test_check_ring_window():
    assert rules.ring_min_window_left(4) == 3
    for window in (None, (-1, -1), (3, 0), (8192, 0), (3, -1)):
        rules.check_ring_window(window, 4)
    for window in ((-1, 0), [-1, 4]):  # TE's striped Ring reads left = -1 as a bound
        with pytest.raises(
            ValueError, match=r"reads a left bound of -1 as a bound.*pass window_size=None"
        ):
            rules.check_ring_window(window, 4)
    assert rules.te_window_size((-1, 0)) is None and rules.te_window_size(None) is None
    assert rules.te_window_size([32, 0]) == (32, 0)
    for bad in ((32,), "32, 0", (32.0, 0)):
        with pytest.raises(ValueError, match=r"window_size=.* is not a \(left, right\) pair"):
            rules.te_window_size(bad)
    rules.check_ring_window((0, 0), 1)  # one rank: no ring step is empty
    with pytest.raises(
        ValueError,
        match=r"window_size=\(2, 0\) with strategy='ring' and cp_size=4: the left window must be"
        r" >= cp_size-1=3 .* Widen it to left >= cp_size-1 = 3, or use AllGather",
    ):
        rules.check_ring_window((2, 0), 4)
    with pytest.raises(ValueError, match=r"window_size=\(1, 0\) with CPStrategy.RING"):
        rules.check_ring_window([1, 0], 8, label="CPStrategy.RING")


def test_check_divisible_seq():
    rules.check_divisible_seq(128, 4, 32)
    rules.check_divisible_seq(12, 3, None)
    with pytest.raises(
        ValueError,
        match=r"seq_len=100 is not divisible by cp_size\*stripe_size=4\*8=32; pad each row to a"
        r" multiple of 32 tokens \(padding has segment id 0\) or choose a smaller stripe_size",
    ):
        rules.check_divisible_seq(100, 4, 8)
    with pytest.raises(
        ValueError,
        match=r"--seq-len=10 is not divisible by --cp=4; pad each row to a multiple of 4 tokens"
        r" .*or choose a --cp that divides 10",
    ):
        rules.check_divisible_seq(10, 4, None, name="--seq-len", cp_name="--cp")
    with pytest.raises(ValueError, match=r"cp_size\*ring_stripe_size=4\*3=12"):
        rules.check_divisible_seq(256, 4, 3, stripe_name="ring_stripe_size")


def test_check_dual_chunk():
    rules.check_dual_chunk(16, 4)
    with pytest.raises(
        ValueError,
        match=r"q.shape\[1\]=12 is not divisible by 2\*cp_size=2\*4=8: DualChunkSwap .* pad each"
        r" row to a multiple of 8 tokens",
    ):
        rules.check_dual_chunk(12, 4, name="q.shape[1]")


def test_check_allgather_load_balanced():
    rules.check_allgather_load_balanced(True)
    with pytest.raises(
        ValueError,
        match=r"context_parallel_causal_load_balanced=False with THD AllGather context"
        r" parallelism: .* pass context_parallel_causal_load_balanced=True",
    ):
        rules.check_allgather_load_balanced(False)


def test_check_allgather_layout():
    rules.check_allgather_layout(None, cp_size=4, stripe_size=2)
    where = "row 0, token 8 (segment 2, position 2) lands on rank 0"
    with pytest.raises(ValueError) as err:
        rules.check_allgather_layout(where, cp_size=4, stripe_size=2)
    msg = str(err.value)
    assert msg.startswith(
        "segment_ids/segment_pos with strategy='allgather', cp_size=4, stripe_size=2: " + where
    )
    # check_layout reports the text after "Fix:" as the fix
    assert "Fix: start every segment slot" in msg and "cp_size*stripe_size=8" in msg


def test_check_allgather_slots():
    rules.check_allgather_slots(512, 4, 16)
    with pytest.raises(
        ValueError,
        match=r"slot_len=100: segment slots do not start at multiples of cp_size\*stripe_size="
        r"4\*4=16, .* Fix: make every slot a multiple of 16 tokens",
    ):
        rules.check_allgather_slots(100, 4, 4)


def test_check_bshd_stripe():
    rules.check_bshd_stripe(None, cp_size=2)
    with pytest.raises(
        ValueError,
        match=r"stripe_size=4 with a BSHD layout under context parallelism \(cp_size=2\): BSHD"
        r" uses DualChunkSwap load balancing; pass stripe_size=None",
    ):
        rules.check_bshd_stripe(4, cp_size=2)


def test_check_bshd_window():
    rules.check_bshd_window(None, cp_size=2)
    rules.check_bshd_window((-1, 0), cp_size=2)
    with pytest.raises(
        ValueError,
        match=r"window_size=\(8, 0\) with a BSHD layout under context parallelism \(cp_size=2\):"
        r" .*use THD_THD_THD with segment ids/positions, or window_size=None",
    ):
        rules.check_bshd_window((8, 0), cp_size=2)


def test_check_bshd_max_segments():
    rules.check_bshd_max_segments(1, cp_size=2)
    with pytest.raises(
        ValueError,
        match=r"max_segments_per_seq=2 with a BSHD layout under context parallelism"
        r" \(cp_size=2\): must be 1",
    ):
        rules.check_bshd_max_segments(2, cp_size=2)


def test_check_max_segments():
    assert rules.check_max_segments(3) == 3 and rules.check_max_segments(np.int32(2)) == 2
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(
            ValueError,
            match=rf"max_segments_per_seq={bad!r} must be a positive int \(the largest segment id"
            r" in any row, e\.g\. 1 for one sequence per row\)",
        ):
            rules.check_max_segments(bad)
    with pytest.raises(ValueError, match=r"--max-segments=0 must be a positive int"):
        rules.check_max_segments(0, name="--max-segments")


def test_check_segment_ids_within():
    rules.check_segment_ids_within(2, 2, row=0)
    with pytest.raises(ValueError) as err:
        rules.check_segment_ids_within(4, 2, row=1)
    msg = str(err.value)
    assert msg.startswith("segment_ids row 1 uses id 4 > max_segments_per_seq=2; TE drops")
    # check_layout reports the last sentence as the fix, and recipes.md shows it
    assert msg.endswith(" Pass max_segments_per_seq>=4.")


def test_check_gqa_heads():
    assert rules.check_gqa_heads(8, 2) == 4 and rules.check_gqa_heads(6, 6) == 1
    with pytest.raises(
        ValueError,
        match=r"num_kv_heads=4 does not divide num_q_heads=6; GQA maps .* pick a KV head count"
        r" among \[1, 2, 3, 6\]",
    ):
        rules.check_gqa_heads(6, 4)
    with pytest.raises(ValueError, match=r"--kv-heads=3 does not divide --q-heads=128"):
        rules.check_gqa_heads(128, 3, "--kv-heads", q_name="--q-heads")
    with pytest.raises(ValueError, match=r"num_kv_heads=0 does not divide"):
        rules.check_gqa_heads(4, 0)


def test_check_ulysses_heads():
    rules.check_ulysses_heads(8, 4, 4)
    with pytest.raises(
        ValueError,
        match=r"num_q_heads=6 is not divisible by cp_size=4: Ulysses all-to-all gives each rank"
        r" num_q_heads/cp_size whole heads\. Use Ring or AllGather, or a cp_size that divides 6",
    ):
        rules.check_ulysses_heads(6, 2, 4)
    with pytest.raises(ValueError, match=r"num_kv_heads=2 is not divisible by cp_size=4"):
        rules.check_ulysses_heads(8, 2, 4)


def test_check_te_dtype():
    for ok in ("bfloat16", "float16", np.float16, np.dtype("float16"), "kBFloat16"):
        rules.check_te_dtype(ok)
    rules.check_te_dtype("float32", allow_fp32=True)
    with pytest.raises(ValueError) as err:
        rules.check_te_dtype("kFloat32")
    # the text TE shows after "Unsupported backend: " (te_on_cpu), word for word
    assert str(err.value) == (
        "qkv dtype kFloat32: cuDNN fused attention (and this CPU stand-in for it) takes float16"
        " or bfloat16; cast q/k/v with .astype(jnp.bfloat16)"
    )
    with pytest.raises(ValueError, match=r"--dtype float32: .*; use --dtype bfloat16"):
        rules.check_te_dtype(np.float32, name="--dtype", fix="use --dtype bfloat16")
