"""Workload presets and validation; deterministic inputs and the packed-segment layouts."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tutorial_utils.inputs import fixed_slot_segments, pack_segments, random_segment_lengths
from tutorial_utils.perfmodel.workload import (
    PRESETS,
    Workload,
    get_workload,
    make_qkv,
    preset_from_env,
    workload_segments,
)
from tutorial_utils.validation import validate_packed_inputs

# ----------------------------------------------------------------------------- presets


def test_seed_preset_is_te_example():
    wl = PRESETS["seed"]
    assert (wl.batch, wl.seq_len, wl.num_q_heads, wl.num_kv_heads, wl.head_dim) == (
        2,
        65536,
        128,
        8,
        128,
    )
    assert (wl.segments_per_row, wl.slot_len, wl.valid_per_slot) == (4, 16384, 12288)
    assert (wl.window, wl.dtype, wl.cp_size, wl.stripe_size, wl.ring_stripe_size) == (
        (8192, 0),
        "bfloat16",
        4,
        512,
        1,
    )


@pytest.mark.parametrize(
    "name, shape",
    [
        ("cpu", (2, 2048, 16, 4, 32, 4, 384, (256, 0), "bfloat16", 4, 16)),
        ("tiny", (2, 256, 8, 4, 16, 4, 48, (32, 0), "float32", 4, 4)),
    ],
)
def test_cpu_presets(name, shape):
    wl = get_workload(name)
    assert (
        wl.batch,
        wl.seq_len,
        wl.num_q_heads,
        wl.num_kv_heads,
        wl.head_dim,
        wl.segments_per_row,
        wl.valid_per_slot,
        wl.window,
        wl.dtype,
        wl.cp_size,
        wl.stripe_size,
    ) == shape
    assert wl.name == name


def test_workload_properties():
    wl = PRESETS["cpu"]
    assert wl.slot_len == 512 and wl.group_size == 4 and wl.max_segments_per_seq == 4
    assert wl.scaling_factor == pytest.approx(32**-0.5)
    assert wl.jnp_dtype == jnp.bfloat16
    assert (
        wl.stripe_for("ring") == 1
        and wl.stripe_for("RING") == 1
        and wl.stripe_for("CPStrategy.RING") == 1
    )
    assert wl.stripe_for("allgather") == 16 and wl.stripe_for("ALL_GATHER") == 16
    d = wl.as_dict()
    assert d["window"] == [256, 0] and d["name"] == "cpu" and d["seq_len"] == 2048
    with pytest.raises(dataclasses.FrozenInstanceError):
        wl.batch = 3  # type: ignore[misc]


def test_replace_and_overrides_revalidate():
    wl = get_workload("tiny", batch=1, window=[16, 0])
    assert wl.batch == 1 and wl.window == (16, 0) and PRESETS["tiny"].batch == 2
    assert wl.replace(dtype="bfloat16").dtype == "bfloat16"
    with pytest.raises(
        ValueError, match=r"Workload.num_kv_heads=3 does not divide Workload.num_q_heads=8"
    ):
        wl.replace(num_kv_heads=3)


def test_unknown_preset_and_env(monkeypatch):
    with pytest.raises(
        ValueError, match=r"preset='huge' is unknown; choose one of \['cpu', 'seed', 'tiny'\]"
    ):
        get_workload("huge")
    monkeypatch.setenv("CP_TUTORIAL_PRESET", "tiny")
    assert preset_from_env().name == "tiny"
    monkeypatch.delenv("CP_TUTORIAL_PRESET")
    assert preset_from_env("seed").name == "seed"


BASE = dict(
    batch=2,
    seq_len=256,
    num_q_heads=8,
    num_kv_heads=4,
    head_dim=16,
    segments_per_row=4,
    valid_per_slot=48,
)


@pytest.mark.parametrize(
    "changes, pattern",
    [
        (dict(batch=0), r"Workload.batch must be a positive integer, got batch=0"),
        (dict(batch=True), r"Workload.batch must be a positive integer, got batch=True"),
        (dict(head_dim=16.0), r"Workload.head_dim must be a positive integer, got head_dim=16.0"),
        (dict(cp_size=-4), r"Workload.cp_size must be a positive integer, got cp_size=-4"),
        (dict(num_kv_heads=3), r"Workload.num_kv_heads=3 does not divide Workload.num_q_heads=8"),
        (dict(segments_per_row=3), r"Workload.seq_len=256 is not divisible by segments_per_row=3"),
        (dict(valid_per_slot=65), r"Workload.valid_per_slot=65 exceeds the slot length 64"),
        (dict(window=(8, 0, 0)), r"Workload.window=\(8, 0, 0\) is not a \(left, right\) pair"),
        (dict(window=(-7, 0)), r"Workload.window=\(-7, 0\): the left bound -7 is negative"),
        (dict(dtype="fp8"), r"Workload.dtype='fp8' is not supported"),
        (
            dict(stripe_size=128),
            r"Workload.seq_len=256 is not divisible by cp_size\*stripe_size=4\*128",
        ),
        (
            dict(ring_stripe_size=3),
            r"Workload.seq_len=256 is not divisible by cp_size\*ring_stripe_size=4\*3",
        ),
    ],
)
def test_workload_field_errors(changes, pattern):
    Workload(**BASE)  # the baseline is valid
    with pytest.raises(ValueError, match=pattern):
        Workload(**{**BASE, **changes})


# ----------------------------------------------------------------------------- make_qkv


def test_make_qkv_shapes_dtypes_and_determinism():
    wl = PRESETS["tiny"]
    q, k, v, dout = make_qkv(wl)
    assert q.shape == dout.shape == (2, 256, 8, 16) and k.shape == v.shape == (2, 256, 4, 16)
    assert all(x.dtype == jnp.float32 for x in (q, k, v, dout))
    again = make_qkv(wl)
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip((q, k, v, dout), again))
    other = make_qkv(wl, seed=1)
    assert not np.array_equal(np.asarray(q), np.asarray(other[0]))
    assert (
        len({float(np.asarray(x).ravel()[0]) for x in (q, k, v, dout)}) == 4
    )  # independent streams
    assert make_qkv(wl, dtype=jnp.bfloat16)[0].dtype == jnp.bfloat16


# ----------------------------------------------------------------------------- fixed slots


def test_fixed_slot_segments_layout():
    ids, pos = fixed_slot_segments(2, 16, 2, 5)
    assert ids.dtype == pos.dtype == np.int32
    assert ids[0].tolist() == [1] * 5 + [0] * 3 + [2] * 5 + [0] * 3
    assert pos[0].tolist() == list(range(8)) * 2  # padding positions keep counting through the slot
    assert np.array_equal(ids[0], ids[1]) and np.array_equal(pos[0], pos[1])
    wl = PRESETS["tiny"]
    got = workload_segments(wl)
    want = fixed_slot_segments(wl.batch, wl.seq_len, wl.segments_per_row, wl.valid_per_slot)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize(
    "args, pattern",
    [
        ((0, 16, 2, 5), r"batch must be a positive int, got batch=0"),
        ((2, 16, 0, 5), r"slots must be a positive int, got slots=0"),
        ((2, 16, 2, 0), r"valid_per_slot must be a positive int, got valid_per_slot=0"),
        ((2, 16.0, 2, 5), r"seq_len must be a positive int, got seq_len=16.0"),
        ((2, 16, 3, 5), r"seq_len=16 is not divisible by slots=3"),
        ((2, 16, 2, 9), r"valid_per_slot=9 exceeds the slot length 8"),
    ],
)
def test_fixed_slot_segments_errors(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        fixed_slot_segments(*args)


# ----------------------------------------------------------------------------- pack_segments


def test_pack_segments_aligned_layout():
    ids, pos = pack_segments([[3, 9], [5]], 32, align=8)
    assert ids[0].tolist() == [1] * 3 + [0] * 5 + [2] * 9 + [0] * 7 + [0] * 8
    assert pos[0].tolist() == list(range(8)) + list(range(16)) + list(range(8))
    assert ids[1].tolist() == [1] * 5 + [0] * 27
    assert pos[1].tolist() == list(range(8)) + list(range(24))
    ids, pos = pack_segments([[2, 2]], 8, slot_padding=[[1, 0]])
    assert ids[0].tolist() == [1, 1, 0, 2, 2, 0, 0, 0]
    assert pos[0].tolist() == [0, 1, 2, 0, 1, 0, 1, 2]


@pytest.mark.parametrize(
    "lengths, seq_len, align, pattern",
    [
        ([[3, 0]], 16, 1, r"lengths\[0\]\[1\]=0: every segment needs at least one valid token"),
        ([[10, 10]], 16, 1, r"lengths\[0\]=\[10, 10\] does not fit in seq_len=16 with align=1"),
        ([[5, 5, 1]], 16, 8, r"lengths\[0\]=\[5, 5, 1\] does not fit in seq_len=16 with align=8"),
        ([[3]], 16, 0, r"align must be a positive int, got align=0"),
    ],
)
def test_pack_segments_errors(lengths, seq_len, align, pattern):
    with pytest.raises(ValueError, match=pattern):
        pack_segments(lengths, seq_len, align=align)


def test_pack_segments_exact_fit():
    ids, _ = pack_segments([[5, 5]], 16, align=8)  # two slots of 8 fill the row exactly
    assert ids[0].tolist() == [1] * 5 + [0] * 3 + [2] * 5 + [0] * 3


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2, 4]),
    st.integers(1, 5),
)
def test_random_packings_are_te_safe(seed, cp, stripe, max_segments):
    """Random lengths packed with align = cp*stripe satisfy every THD/AllGather precondition."""
    rng = np.random.default_rng(seed)
    seq_len = 128
    align = cp * stripe
    lengths = random_segment_lengths(rng, 2, seq_len, max_segments, align=align)
    ids, pos = pack_segments(lengths, seq_len, align=align)
    for r, row in enumerate(lengths):
        assert [int((ids[r] == n).sum()) for n in range(1, len(row) + 1)] == row
        starts = [int(np.argmax(ids[r] == n)) for n in range(1, len(row) + 1)]
        assert all(s % align == 0 for s in starts)
    validate_packed_inputs(
        ids,
        pos,
        max_segments_per_seq=max_segments,
        cp_size=cp,
        stripe_size=stripe,
        strategy="allgather",
    )


def test_random_segment_lengths_too_short():
    with pytest.raises(ValueError, match=r"seq_len=8 is too short for 1 segments aligned to 16"):
        random_segment_lengths(np.random.default_rng(0), 1, 8, 1, align=16)
