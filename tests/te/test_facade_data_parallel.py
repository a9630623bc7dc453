"""fused_attn under a ("dp", "cp") mesh: the batch is sharded over dp, the sequence over cp."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tutorial_utils.te as te
from tutorial_utils.inputs import fixed_slot_segments
from tutorial_utils.te.attention import (
    AttnBiasType,
    AttnMaskType,
    AttnSoftmaxType,
    CPStrategy,
    QKVLayout,
    ReorderStrategy,
    SequenceDescriptor,
    fused_attn,
    inverse_reorder_causal_load_balancing,
    reorder_causal_load_balancing,
)
from tutorial_utils.te.sharding import MeshResource

B, S, HQ, HKV, D, CP, STRIPE = 2, 256, 4, 2, 16, 2, 4


def _call(q, k, v, ids, pos, **cp):
    desc = SequenceDescriptor.from_segment_ids_and_pos(ids, pos)
    return fused_attn(
        (q, k, v),
        None,
        desc,
        None,
        AttnBiasType.NO_BIAS,
        AttnMaskType.PADDING_CAUSAL_MASK,
        QKVLayout.THD_THD_THD,
        AttnSoftmaxType.VANILLA_SOFTMAX,
        D**-0.5,
        0.0,
        True,
        max_segments_per_seq=4,
        window_size=(16, 0),
        **cp,
    )


@pytest.mark.parametrize(
    "strategy, stripe", [(CPStrategy.ALL_GATHER, STRIPE), (CPStrategy.RING, 1)]
)
def test_dp_times_cp_mesh_matches_one_device(strategy, stripe):
    ids, pos = (jnp.asarray(x) for x in fixed_slot_segments(B, S, 4, 48))
    q, k, v = (
        jax.random.normal(jax.random.PRNGKey(i), (B, S, h, D)) for i, h in enumerate((HQ, HKV, HKV))
    )
    expected = _call(q, k, v, ids, pos)

    mesh = Mesh(np.asarray(jax.devices()[:4]).reshape(2, 2), ("dp", "cp"))
    x_sh, t_sh = NamedSharding(mesh, P("dp", "cp", None, None)), NamedSharding(mesh, P("dp", "cp"))

    def reorder(x):
        return reorder_causal_load_balancing(x, ReorderStrategy.Striped, CP, 1, stripe)

    args = [jax.device_put(reorder(x), x_sh) for x in (q, k, v)] + [
        jax.device_put(reorder(x), t_sh) for x in (ids, pos)
    ]
    fn = jax.jit(
        lambda *a: _call(
            *a,
            context_parallel_strategy=strategy,
            context_parallel_causal_load_balanced=True,
            stripe_size=stripe,
        ),
        in_shardings=(x_sh, x_sh, x_sh, t_sh, t_sh),
    )
    with (
        jax.set_mesh(mesh),
        te.autocast(mesh_resource=MeshResource(dp_resource="dp", cp_resource="cp")),
    ):
        out = fn(*args)
        hlo = fn.lower(*args).as_text()
    assert out.sharding.spec == P("dp", "cp", None, None)
    got = inverse_reorder_causal_load_balancing(out, ReorderStrategy.Striped, CP, 1, stripe)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5, rtol=1e-5)
    # the strategy's own collective is in the program
    collective = "all_gather" if strategy == CPStrategy.ALL_GATHER else "collective_permute"
    assert collective in hlo
