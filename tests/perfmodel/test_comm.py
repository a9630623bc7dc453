"""comm.py: collective volumes by hand-checkable formulas, and against the HLO XLA builds.

The HLO test differentiates the project's shard_map strategies
(tutorial_utils.context_parallel) on 4 simulated CPU devices (tests/conftest.py sets
XLA_FLAGS before JAX is imported), reads the collectives out of the HLO text and compares
their bytes with comm.comm_volume(..., schedule="reference").
"""

import pytest

from tutorial_utils.perfmodel.comm import (
    comm_for_workload,
    comm_volume,
    dtype_bytes,
    hlo_collective_bytes,
    ring_step_bytes,
)
from tutorial_utils.perfmodel.workload import get_workload

SHAPE = dict(batch=2, seq_len=65536, num_q_heads=128, num_kv_heads=8, head_dim=128, cp_size=4)
MiB = 2**20


def test_seed_allgather_forward_receives_384_mib_of_kv():
    # anchors.md C.4: K+V shard = 128 MiB per rank; the all-gather brings in the other 3 shards.
    vol = comm_volume("allgather", **SHAPE, schedule="reference")
    kv_fwd = sum(
        t.total_received for t in vol.transfers if t.phase == "fwd" and t.tensor in ("K", "V")
    )
    assert kv_fwd == 384 * MiB
    ids_fwd = sum(
        t.total_received
        for t in vol.transfers
        if t.phase == "fwd" and t.tensor.startswith("segment")
    )
    assert ids_fwd == 2 * 3 * 2 * 16384 * 4  # ids + pos, int32, 3 remote shards of [2, 16384]


def test_ring_and_allgather_move_the_same_forward_bytes():
    # cp-1 hops of a shard == an all-gather of that shard, byte for byte.
    ring = comm_volume("ring", **SHAPE, schedule="reference")
    ag = comm_volume("allgather", **SHAPE, schedule="reference")
    assert ring.fwd_sent == ag.fwd_sent == ring.fwd_received


def test_te_schedule_costs_more_backward_than_reference():
    # TE re-gathers K/V in AllGather's backward and rotates [KV, dKV] plus a final hop in Ring's.
    for strategy in ("ring", "allgather"):
        te = comm_volume(strategy, **SHAPE, schedule="te")
        ref = comm_volume(strategy, **SHAPE, schedule="reference")
        assert te.fwd_sent == ref.fwd_sent
        assert te.bwd_sent > ref.bwd_sent
    kv = 2 * 16384 * 8 * 128 * 2
    ring_te = comm_volume("ring", **SHAPE, schedule="te")
    ids = 2 * 16384 * 4
    assert ring_te.bwd_sent == 4 * (4 * kv) + 1 * (2 * kv) + 3 * (2 * ids)


def test_ulysses_moves_q_and_o_so_gqa_makes_it_costlier():
    ul = comm_volume("ulysses", **SHAPE)
    ag = comm_volume("allgather", **SHAPE)
    assert ul.total_sent > 2 * ag.total_sent
    mha = dict(SHAPE, num_kv_heads=128)
    # with MHA the KV-passing strategies lose their advantage: AllGather now moves more than Ulysses
    assert comm_volume("allgather", **mha).total_sent > comm_volume("ulysses", **mha).total_sent


def test_volume_scales_with_dtype_and_vanishes_at_cp1():
    a = comm_volume(
        "ring", **dict(SHAPE, cp_size=4), dtype="float32", id_bytes=4, schedule="reference"
    )
    b = comm_volume(
        "ring", **dict(SHAPE, cp_size=4), dtype="bfloat16", id_bytes=4, schedule="reference"
    )
    kv_a = sum(t.total_sent for t in a.transfers if not t.tensor.startswith("segment"))
    kv_b = sum(t.total_sent for t in b.transfers if not t.tensor.startswith("segment"))
    assert kv_a == 2 * kv_b
    assert comm_volume("ring", **dict(SHAPE, cp_size=1)).total_sent == 0


def test_ring_step_bytes_matches_one_forward_hop():
    vol = comm_volume("ring", **SHAPE, schedule="te")
    hop = ring_step_bytes("fwd", batch=2, seq_len=65536, num_kv_heads=8, head_dim=128, cp_size=4)
    assert hop * 3 == vol.fwd_sent


def test_comm_for_workload_uses_the_workload_shapes():
    wl = get_workload("seed")
    assert comm_for_workload(wl, "ring").total_sent == comm_volume("ring", **SHAPE).total_sent


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(strategy="tree"), "strategy='tree'"),
        (dict(strategy="ring", schedule="nccl"), "schedule='nccl'"),
        (dict(strategy="ring", cp_size=3), "seq_len=65536 is not divisible by cp_size=3"),
        (dict(strategy="ring", head_dim=0), "head_dim=0"),
        (dict(strategy="ring", dtype="int4"), "dtype='int4'"),
    ],
)
def test_bad_input_names_parameter(kwargs, needle):
    args = dict(SHAPE)
    strategy = kwargs.pop("strategy")
    args.update(kwargs)
    with pytest.raises(ValueError) as err:
        comm_volume(strategy, **args)
    assert needle in str(err.value)


def test_dtype_bytes():
    assert dtype_bytes("bfloat16") == 2 and dtype_bytes("float32") == 4 and dtype_bytes(1) == 1


def test_hlo_parser_on_handwritten_lines():
    text = "\n".join(
        [
            (
                "  ag = f32[2,256,4,16]{3,2,1,0} all-gather(x), replica_groups={{0,1,2,3}},"
                " dimensions={1}"
            ),
            (
                "  rs = bf16[2,64,4,16]{3,2,1,0} reduce-scatter(y), replica_groups={{0,1,2,3}},"
                " dimensions={1}"
            ),
            (
                "  cp = s32[2,64]{1,0} collective-permute(z),"
                " source_target_pairs={{0,1},{1,2},{2,3},{3,0}}"
            ),
            (
                "  a2a = (f32[2,64,2,16]{3,2,1,0}, f32[2,64,2,16]{3,2,1,0},"
                " f32[2,64,2,16]{3,2,1,0}, f32[2,64,2,16]{3,2,1,0}) all-to-all(a, b, c, d),"
                " replica_groups={{0,1,2,3}}"
            ),
        ]
    )
    got = hlo_collective_bytes(text, 4)
    assert got["all-gather"] == {"count": 1, "bytes": 2 * 256 * 4 * 16 * 4 * 3 // 4}
    assert got["reduce-scatter"] == {"count": 1, "bytes": 3 * 2 * 64 * 4 * 16 * 2}
    assert got["collective-permute"] == {"count": 1, "bytes": 2 * 64 * 4}
    assert got["all-to-all"] == {"count": 1, "bytes": 4 * 2 * 64 * 2 * 16 * 4 * 3 // 4}


# --------------------------------------------------------------------------------------------
# against the HLO of tutorial_utils.context_parallel


HLO_SHAPE = dict(batch=1, seq_len=64, num_q_heads=8, num_kv_heads=4, head_dim=8, cp_size=4)


def _hlo_texts(strategy, dtype_name):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from tutorial_utils.context_parallel import context_parallel_attention

    if len(jax.devices()) < 4:
        pytest.skip(
            f"needs 4 devices, JAX sees {len(jax.devices())} (XLA_FLAGS not set before import?)"
        )
    mesh = jax.make_mesh((4,), ("cp",))
    b, s, hq, hkv, d = (
        HLO_SHAPE[k] for k in ("batch", "seq_len", "num_q_heads", "num_kv_heads", "head_dim")
    )
    stripe = 2 if strategy == "allgather" else 1
    dtype = getattr(jnp, dtype_name)

    def loss(q, k, v, ids, pos):
        out = context_parallel_attention(
            q, k, v, ids, pos, mesh=mesh, strategy=strategy, stripe_size=stripe, window_size=(8, 0)
        )
        return jnp.sum(out.astype(jnp.float32) ** 2)

    x4 = NamedSharding(mesh, P(None, "cp", None, None))
    tok = NamedSharding(mesh, P(None, "cp"))
    args = (
        jax.ShapeDtypeStruct((b, s, hq, d), dtype, sharding=x4),
        jax.ShapeDtypeStruct((b, s, hkv, d), dtype, sharding=x4),
        jax.ShapeDtypeStruct((b, s, hkv, d), dtype, sharding=x4),
        jax.ShapeDtypeStruct((b, s), jnp.int32, sharding=tok),
        jax.ShapeDtypeStruct((b, s), jnp.int32, sharding=tok),
    )
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args)
    return lowered


def _predicted_by_op(strategy, dtype_name):
    vol = comm_volume(strategy, **HLO_SHAPE, dtype=dtype_name, schedule="reference")
    return {op: b for op, b in vol.by_op().items()}, vol


def _measured_by_op(text):
    got = hlo_collective_bytes(text, 4)
    return {op: v["bytes"] for op, v in got.items() if v["count"]}


@pytest.mark.parametrize("strategy", ["ring", "allgather", "ulysses"])
def test_compiled_hlo_collectives_match_reference_schedule(strategy):
    """float32 so that XLA:CPU keeps the collectives' element type (it widens bf16 ones to f32)."""
    compiled = _hlo_texts(strategy, "float32").compile().as_text()
    predicted, vol = _predicted_by_op(strategy, "float32")
    assert _measured_by_op(compiled) == predicted
    counts = {op: v["count"] for op, v in hlo_collective_bytes(compiled, 4).items() if v["count"]}
    want = {}
    for t in vol.transfers:
        want[t.op] = want.get(t.op, 0) + t.count
    assert counts == want


@pytest.mark.parametrize("strategy", ["ring", "allgather", "ulysses"])
def test_lowered_bf16_hlo_collectives_match_reference_schedule(strategy):
    """The program as written (before XLA's passes), in bf16 as a GPU would run it.

    Precise relation for Ulysses: the reference all-gathers the query and the key copies of
    segment ids and positions separately (4 int32 gathers); XLA's CSE merges the duplicates
    during compilation, which is what comm.py models (2 gathers). So the lowered text has
    exactly two extra int32 shard gathers.
    """
    text = _hlo_texts(strategy, "bfloat16").as_text(dialect="hlo")
    predicted, _ = _predicted_by_op(strategy, "bfloat16")
    measured = _measured_by_op(text)
    if strategy == "ulysses":
        ids_shard = HLO_SHAPE["batch"] * HLO_SHAPE["seq_len"] // 4 * 4
        predicted["all-gather"] += 2 * 3 * ids_shard
    assert measured == predicted
