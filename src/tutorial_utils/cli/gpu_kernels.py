"""The seed workload's fused-attention calls, asked of TE by the GPU run's import gate.

The run's benchmarks time the ``seed`` preset (THD, padding-causal, window ``(8192, 0)``, rows of
65,536 tokens packed in slots of 16,384, 128 query and 8 KV heads, head dim 128, bfloat16) on one
GPU, and rank by rank for an emulated 4-rank split; ``check --quick`` runs at 512 tokens. A
cuDNN without a kernel for the seed's calls passes that check and then fails every benchmark
case: cuDNN 9.14.0 has a known bug for which TE disables every non-causal mask (padding-causal
included) with ``max_seqlen_kv > 1024`` and a sliding window. So the gate asks TE's own
``is_fused_attn_kernel_available`` for each call here (:func:`seed_kernel_calls`) and refuses a
node without a kernel for the single-GPU one (:func:`seed_kernel_verdict`). TE's attention
module is passed in, so this module runs (and is tested) without TE.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType

from tutorial_utils.perfmodel.workload import PRESETS, Workload

__all__ = [
    "EMULATED_RANKS",
    "CUDNN_SWA_BUG",
    "KernelCall",
    "seed_kernel_calls",
    "kernel_keywords",
    "seed_kernel_verdict",
]

#: The ranks ``bench-emulated`` splits the seed workload into.
EMULATED_RANKS = 4
#: The cuDNN for which TE 2.20.2 disables non-causal masks with ``max_seqlen_kv > 1024`` and a
#: sliding window (``nvte_get_fused_attn_backend``).
CUDNN_SWA_BUG = (9, 14, 0)


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One fused-attention call the run makes: which step makes it, TE's mask name, the query and
    key lengths, and the window."""

    label: str
    step: str
    mask: str
    q_max_seqlen: int
    kv_max_seqlen: int
    window: tuple[int, int]

    def describe(self, wl: Workload) -> str:
        """``THD <mask>, s_q/s_kv, heads, head dim, dtype, window`` of this call on ``wl``."""
        return (
            f"{self.label} ({self.step}): THD {self.mask}, s_q {self.q_max_seqlen} / s_kv"
            f" {self.kv_max_seqlen}, {wl.num_q_heads}q/{wl.num_kv_heads}kv heads, d"
            f" {wl.head_dim}, {wl.dtype}, window {self.window}"
        )


def seed_kernel_calls(wl: Workload | None = None, ranks: int = EMULATED_RANKS) -> list[KernelCall]:
    """The fused-attention calls of ``bench-single`` and ``bench-emulated`` on ``wl``.

    Args:
        wl: the workload (the ``seed`` preset when ``None``).
        ranks: the ranks of the emulated split.

    Returns:
        The single-GPU call first (whole rows), then an emulated AllGather rank (its queries
        against the whole row, bottom-right aligned) and an emulated Ring step (one rank's
        queries against one rank's keys, top-left).
    """
    wl = PRESETS["seed"] if wl is None else wl
    local = wl.seq_len // ranks
    return [
        KernelCall(
            "one GPU", "bench-single", "PADDING_CAUSAL_MASK", wl.seq_len, wl.seq_len, wl.window
        ),
        KernelCall(
            f"AllGather rank of {ranks}",
            "bench-emulated",
            "PADDING_CAUSAL_BOTTOM_RIGHT_MASK",
            local,
            wl.seq_len,
            wl.window,
        ),
        KernelCall(
            f"Ring step of {ranks}",
            "bench-emulated",
            "PADDING_CAUSAL_MASK",
            local,
            local,
            wl.window,
        ),
    ]


def kernel_keywords(te_attention: ModuleType, call: KernelCall, wl: Workload | None = None) -> dict:
    """TE 2.20.2's ``is_fused_attn_kernel_available`` keywords for ``call`` on ``wl``.

    Args:
        te_attention: ``transformer_engine.jax.attention`` (or a module with its enums).
        call: the call.
        wl: the workload (the ``seed`` preset when ``None``); its ``max_segments_per_seq``
            is used for every call.
    """
    wl = PRESETS["seed"] if wl is None else wl
    return {
        "is_training": True,
        "batch_size": wl.batch,
        "q_dtype": wl.jnp_dtype,
        "kv_dtype": wl.jnp_dtype,
        "qkv_layout": te_attention.QKVLayout.THD_THD_THD,
        "attn_bias_type": te_attention.AttnBiasType.NO_BIAS,
        "attn_mask_type": getattr(te_attention.AttnMaskType, call.mask),
        "softmax_type": te_attention.AttnSoftmaxType.VANILLA_SOFTMAX,
        "dropout_probability": 0.0,
        "q_num_heads": wl.num_q_heads,
        "kv_num_heads": wl.num_kv_heads,
        "q_max_seqlen": call.q_max_seqlen,
        "kv_max_seqlen": call.kv_max_seqlen,
        "head_dim_qk": wl.head_dim,
        "head_dim_v": wl.head_dim,
        "window_size": call.window,
        "max_segments_per_seq": wl.max_segments_per_seq,
    }


def seed_kernel_verdict(
    available: Callable[[KernelCall], bool],
    cudnn: tuple[int, int, int],
    wl: Workload | None = None,
) -> tuple[list[str], str | None]:
    """Ask ``available`` about every seed call; refuse when the single-GPU call has no kernel.

    Args:
        available: whether TE has a fused kernel for a call (the gate passes TE's own
            ``is_fused_attn_kernel_available``).
        cudnn: the loaded cuDNN's ``(major, minor, patch)``.
        wl: the workload (the ``seed`` preset when ``None``).

    Returns:
        ``(lines, refusal)``: one line per call, and ``None`` or why the run must stop (no
        benchmark case could run). Calls of ``bench-emulated`` without a kernel do not stop
        the run: the single-GPU record is still made, and ``bench`` records their failures.
    """
    wl = PRESETS["seed"] if wl is None else wl
    lines, missing = [], []
    for call in seed_kernel_calls(wl):
        ok = bool(available(call))
        lines.append(f"{'kernel' if ok else 'NO kernel'}: {call.describe(wl)}")
        if not ok:
            missing.append(call)
    refusal = None
    if any(call.step == "bench-single" for call in missing):
        why = (
            f" cuDNN {'.'.join(map(str, cudnn))} has a known bug for which TE disables every"
            " non-causal mask (padding-causal included) with s_kv > 1024 and a sliding window:"
            " give TE another cuDNN (it loads $CUDNN_HOME's first, then a system toolkit's, then"
            " pip's nvidia-cudnn-cu13)."
            if tuple(cudnn) == CUDNN_SWA_BUG
            else " check the GPU (sm90 or newer) and cuDNN (>= 9.12.0) against TE's support matrix."
        )
        refusal = (
            "TE has no fused kernel for the seed workload on this node ("
            + "; ".join(call.describe(wl) for call in missing)
            + "): every benchmark case would fail."
            + why
        )
    return lines, refusal
