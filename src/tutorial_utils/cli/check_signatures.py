"""``check``'s ``facade-signatures``: ``tutorial_utils.te`` has TE 2.20.2's names and order.

The facade stands in for ``transformer_engine.jax``, so a reader's TE call must bind the same
way to both: the parameters of ``fused_attn``, ``is_fused_attn_kernel_available`` and the
reorder functions, the ``MeshResource`` fields, the ``CPStrategy`` members. With TE's code
active, the facade's ``fused_attn`` must also match the installed TE's, defaults included.

The facade is passed in, so ``check.py`` can name these constants without importing TE. TE's
own attention module is imported inside :func:`signature_case`, and only when TE's code is
active: without TE (the reference backend) it may not be installed, and on CPU it imports only
after ``tutorial_utils.te_on_cpu.install()``.
"""

from __future__ import annotations

import dataclasses
import inspect
from importlib.metadata import version
from types import ModuleType

from tutorial_utils.cli.check_report import CheckFailed

__all__ = [
    "FUSED_ATTN_PARAMS",
    "KERNEL_AVAILABLE_PARAMS",
    "MESH_RESOURCE_FIELDS",
    "REORDER_PARAMS",
    "CP_STRATEGY_MEMBERS",
    "signature_case",
]

#: TE 2.20.2 ``transformer_engine.jax.attention.fused_attn`` parameters, in order.
FUSED_ATTN_PARAMS = (
    "qkv",
    "bias",
    "sequence_descriptor",
    "seed",
    "attn_bias_type",
    "attn_mask_type",
    "qkv_layout",
    "softmax_type",
    "scaling_factor",
    "dropout_probability",
    "is_training",
    "max_segments_per_seq",
    "window_size",
    "context_parallel_strategy",
    "context_parallel_causal_load_balanced",
    "context_parallel_axis",
    "context_checkpoint_name",
    "softmax_offset",
    "stripe_size",
    "score_mod",
    "score_mod_bprop",
    "score_mod_tensors",
    "score_mod_bprop_tensors",
    "return_max_logit",
)
#: TE 2.20.2 ``is_fused_attn_kernel_available`` parameters (``batch_size`` is second in 2.20.2).
KERNEL_AVAILABLE_PARAMS = (
    "is_training",
    "batch_size",
    "q_dtype",
    "kv_dtype",
    "qkv_layout",
    "attn_bias_type",
    "attn_mask_type",
    "softmax_type",
    "dropout_probability",
    "q_num_heads",
    "kv_num_heads",
    "q_max_seqlen",
    "kv_max_seqlen",
    "head_dim_qk",
    "head_dim_v",
    "window_size",
    "return_max_logit",
    "bottom_right_diagonal",
    "bias_batch",
    "bias_heads",
    "bias_seqlen_q",
    "bias_seqlen_kv",
    "max_segments_per_seq",
)
#: ``MeshResource`` dataclass fields in TE's order (positional use maps by this order).
MESH_RESOURCE_FIELDS = (
    "dp_resource",
    "tp_resource",
    "tpsp_resource",
    "fsdp_resource",
    "pp_resource",
    "cp_resource",
    "ep_resource",
)
#: TE 2.20.2 ``reorder_causal_load_balancing`` (and its inverse) parameters, in order.
REORDER_PARAMS = ("tensor", "strategy", "cp_size", "seq_dim", "stripe_size")
#: TE 2.20.2 ``CPStrategy`` members, in order.
CP_STRATEGY_MEMBERS = ("DEFAULT", "ALL_GATHER", "RING")


def _param_names(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def signature_case(te: ModuleType) -> dict:
    """Compare the facade's signatures with TE 2.20.2's (and with the installed TE's).

    Args:
        te: The facade, ``tutorial_utils.te``.

    Returns:
        ``"same"`` or the facade's parameter list per function, and ``installed_te`` (the
        installed TE's version) when TE's code is active.

    Raises:
        CheckFailed: Any name, order or default that differs.
    """
    attention = te.attention
    problems, metrics = [], {}
    expected = {
        "fused_attn": FUSED_ATTN_PARAMS,
        "is_fused_attn_kernel_available": KERNEL_AVAILABLE_PARAMS,
        "reorder_causal_load_balancing": REORDER_PARAMS,
        "inverse_reorder_causal_load_balancing": REORDER_PARAMS,
    }
    for name, want in expected.items():
        got = _param_names(getattr(attention, name))
        metrics[name] = "same" if tuple(got) == tuple(want) else got
        if tuple(got) != tuple(want):
            problems.append(f"{name} parameters {got} != TE 2.20.2 {list(want)}")
    fields = tuple(f.name for f in dataclasses.fields(te.MeshResource))
    if fields != MESH_RESOURCE_FIELDS:
        problems.append(f"MeshResource fields {fields} != {MESH_RESOURCE_FIELDS}")
    members = tuple(m.name for m in attention.CPStrategy)
    if members != CP_STRATEGY_MEMBERS:
        problems.append(f"CPStrategy members {members} != {CP_STRATEGY_MEMBERS}")
    if te.using_te_code():  # the facade's wrapper must mirror the installed TE exactly
        from transformer_engine.jax import attention as te_attention

        for name in ("fused_attn",):
            real_sig = inspect.signature(getattr(te_attention, name))
            mine = inspect.signature(getattr(attention, name))
            real_view = [(p.name, repr(p.default)) for p in real_sig.parameters.values()]
            mine_view = [(p.name, repr(p.default)) for p in mine.parameters.values()]
            if real_view != mine_view:
                problems.append(
                    f"facade {name} differs from the installed TE: {mine_view} vs {real_view}"
                )
        try:
            metrics["installed_te"] = version("transformer-engine")
        except Exception:  # noqa: BLE001
            metrics["installed_te"] = "unknown"
    if problems:
        raise CheckFailed("; ".join(problems), metrics)
    return metrics
