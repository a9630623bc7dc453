"""The printing helpers of chapters 1 and 2 (tutorial_utils.pages.inspect_inputs)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tutorial_utils.inputs import fixed_slot_segments, pack_segments
from tutorial_utils.pages.inspect_inputs import (
    descriptor_fields,
    local_rows,
    named_axes,
    preset_table,
    shard_table,
    token_ranges,
    wrapped,
)
from tutorial_utils.te.attention import SequenceDescriptor
from tutorial_utils.te.sharding import MeshResource


@pytest.fixture
def mesh4():
    return Mesh(np.asarray(jax.devices()[:4]), ("cp",))


def test_descriptor_fields_lists_the_filled_pairs_and_their_sharding(mesh4):
    ids, pos = fixed_slot_segments(2, 32, 2, 12)
    text = descriptor_fields(
        SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids), jnp.asarray(pos))
    )
    lines = text.splitlines()
    assert lines[0].split() == ["seqlens", "empty"] and lines[1].split() == ["seq_offsets", "empty"]
    assert "segment_ids  q (2, 32)" in text and "kv (2, 32)" in text and "sharded" not in text
    ids_s, pos_s = jax.device_put(
        (jnp.asarray(ids), jnp.asarray(pos)), NamedSharding(mesh4, P(None, "cp"))
    )
    sharded = descriptor_fields(SequenceDescriptor.from_segment_ids_and_pos(ids_s, pos_s))
    assert sharded.count("q sharded P(None, 'cp')") == 2


def test_descriptor_fields_rejects_other_objects():
    with pytest.raises(ValueError, match="SequenceDescriptor"):
        descriptor_fields(object())


def test_named_axes_shows_where_a_positional_name_lands():
    assert named_axes(MeshResource(cp_resource="cp")) == {"cp_resource": "cp"}
    assert named_axes(MeshResource("cp")) == {"dp_resource": "cp"}
    assert named_axes(MeshResource(dp_resource="dp", cp_resource="cp")) == {
        "dp_resource": "dp",
        "cp_resource": "cp",
    }
    with pytest.raises(ValueError, match="MeshResource"):
        named_axes(MeshResource)


def test_preset_table_has_one_aligned_row_per_preset():
    lines = preset_table("seed", "cpu").splitlines()
    assert len(lines) == 3 and lines[0].split()[0] == "preset"
    assert lines[1].split()[:4] == ["seed", "2", "65536", "4"] and "12288/16384" in lines[1]
    assert lines[2].split()[:4] == ["cpu", "2", "2048", "4"] and "16/4" in lines[2]
    assert lines[0].index("dtype") == lines[1].index("bfloat16") == lines[2].index("bfloat16")
    with pytest.raises(ValueError, match="at least one"):
        preset_table()
    with pytest.raises(ValueError, match="unknown"):
        preset_table("nope")


def test_token_ranges_and_shard_table(mesh4):
    x = jax.device_put(jnp.zeros((2, 32, 3, 4)), NamedSharding(mesh4, P(None, "cp", None, None)))
    ids = jax.device_put(jnp.zeros((2, 32), jnp.int32), NamedSharding(mesh4, P(None, "cp")))
    rep = jax.device_put(jnp.zeros((2, 32), jnp.int32), NamedSharding(mesh4, P()))
    want = {d.id: (8 * i, 8 * i + 8) for i, d in enumerate(mesh4.devices)}
    assert token_ranges(x) == token_ranges(ids) == want
    assert set(token_ranges(rep).values()) == {(0, 32)}
    lines = shard_table(q=x, segment_ids=ids).splitlines()
    assert lines[0].split() == ["device", "q", "segment_ids"]
    assert lines[2].split() == [str(mesh4.devices[1].id), "8:16", "8:16"]
    with pytest.raises(ValueError, match="jax.Array"):
        token_ranges(np.zeros((2, 32)))
    with pytest.raises(ValueError, match="axis"):
        token_ranges(ids, axis=2)
    with pytest.raises(ValueError, match="at least one"):
        shard_table()


def test_local_rows_prints_each_devices_slice(mesh4):
    ids, pos = pack_segments([[18, 10]], seq_len=32)
    ids_s, pos_s = jax.device_put((ids, pos), NamedSharding(mesh4, P(None, "cp")))
    lines = local_rows(segment_ids=ids_s, segment_pos=pos_s).splitlines()
    assert len(lines) == 12 and lines[0] == f"device {mesh4.devices[0].id}:"
    assert [int(v) for v in lines[5].split()[1:]] == list(range(8, 16))  # device 1: positions 8..15
    assert [int(v) for v in lines[7].split()[1:]] == [1, 1, 2, 2, 2, 2, 2, 2]
    with pytest.raises(ValueError, match="2-D"):
        local_rows(q=jnp.zeros((2, 32, 3)))


def test_wrapped_folds_and_indents():
    text = wrapped("word " * 40, width=30)
    lines = text.splitlines()
    assert all(len(line) <= 30 for line in lines) and all(
        line.startswith("    ") for line in lines[1:]
    )
