"""Run TransformerEngine's own JAX code on a machine without CUDA.

Why: TE's JAX package is Python except for one C++ extension, ``transformer_engine_jax``,
which launches cuDNN and answers a few queries. Everything that decides *what* cuDNN
computes (the reorders, ``SequenceDescriptor`` -> seqlens/offsets, the AllGather and Ring
partitioning and their per-rank metadata) is Python. :func:`install` puts a stand-in for
that extension in ``sys.modules`` and registers CPU lowerings for TE's two innermost
fused-attention primitives, so ``transformer_engine.jax.attention.fused_attn`` runs on
CPU with only the kernel replaced. Whatever TE's Python gets right or wrong on a GPU, it
gets right or wrong here too.

The kernel reads its arguments as cuDNN does. It never sees segment ids or positions,
only the ``cu_seqlens``/``seq_offsets`` TE computed:

* THD: segment ``s`` (of ``batch * max_segments_per_seq``) covers token rows
  ``[off[s], off[s] + cu[s+1] - cu[s])`` of the flattened token axis, for q and kv
  separately; query row ``i`` and key row ``j`` of the same segment may meet when
  (causal) ``j <= i + shift``, (window) ``i + shift - left <= j <= i + shift + right``,
  with ``shift = len_kv - len_q`` for bottom-right masks and 0 otherwise.
* THD rows that see no key output 0 and get zero gradients, with the LSE that TE's
  binding memsets (``0xF0F0F0F0`` = -5.96e29). For rows no segment covers that is TE's
  code; for rows inside a segment whose mask is empty it is an assumption (what cuDNN
  writes there is not known here).
* BSHD: ``cu_seqlens`` hold per-sequence lengths, used only by padding masks.
* The backward uses the output and ``softmax_aux`` TE hands it (Ring passes the merged
  ones), exactly as a flash kernel does.

What the stand-in cannot honour (dropout, FP8, fp32 unless :func:`allow_fp32`, bias with
THD, ``score_mod``) is reported through TE's own backend query, so TE raises
``Unsupported backend: <reason>`` naming the parameter.
"""

from __future__ import annotations

import enum
import functools
import importlib
import os
import sys
import types
import warnings
from contextlib import contextmanager

import numpy as np

from . import cpu_kernel

__all__ = [
    "install",
    "installed",
    "allow_fp32",
    "STANDIN_NAME",
    "CUDNN_CONTRACT",
    "BACKEND_DESCRIPTION",
    "LSE_UNCOVERED",
]

STANDIN_NAME = "transformer_engine_jax"
#: The cuDNN release whose contract the kernel follows: the oldest TE 2.20.2 accepts.
CUDNN_CONTRACT = (9, 12, 0)
#: The compute capability whose layouts TE should pick (THD softmax_aux as [B, S, H, 1]).
COMPUTE_CAPABILITY = 90
BACKEND_DESCRIPTION = "its JAX code; CPU reference kernel in place of cuDNN"
#: What TE's binding leaves in softmax_aux for THD rows no segment covers (memset 0xF0).
LSE_UNCOVERED = float(np.frombuffer(b"\xf0\xf0\xf0\xf0", np.float32)[0])

_state = {"installed": False, "allow_fp32": False}


# ----------------------------------------------------------------------------- enums (TE's C values


class DType(enum.IntEnum):
    kByte = 0
    kInt32 = 2
    kInt64 = 3
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat8E8M0 = 9
    kFloat4E2M1 = 10


class NVTE_Bias_Type(enum.IntEnum):
    NVTE_NO_BIAS = 0
    NVTE_PRE_SCALE_BIAS = 1
    NVTE_POST_SCALE_BIAS = 2
    NVTE_ALIBI = 3


class NVTE_Mask_Type(enum.IntEnum):
    NVTE_NO_MASK = 0
    NVTE_PADDING_MASK = 1
    NVTE_CAUSAL_MASK = 2
    NVTE_PADDING_CAUSAL_MASK = 3
    NVTE_CAUSAL_BOTTOM_RIGHT_MASK = 4
    NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK = 5


class NVTE_QKV_Layout(enum.IntEnum):
    NVTE_BS3HD = 5
    NVTE_BSHD_BS2HD = 7
    NVTE_BSHD_BSHD_BSHD = 9
    NVTE_T3HD = 10
    NVTE_THD_T2HD = 12
    NVTE_THD_THD_THD = 14
    NVTE_QKV_Layout_NOT_SET = 26


class NVTE_QKV_Format(enum.IntEnum):
    NVTE_SBHD = 0
    NVTE_BSHD = 1
    NVTE_THD = 2
    NVTE_QKV_Format_NOT_SET = 8


class NVTE_Softmax_Type(enum.IntEnum):
    NVTE_VANILLA_SOFTMAX = 0
    NVTE_OFF_BY_ONE_SOFTMAX = 1
    NVTE_LEARNABLE_SOFTMAX = 2


class NVTE_Fused_Attn_Backend(enum.IntEnum):
    NVTE_No_Backend = -1
    NVTE_F16_arbitrary_seqlen = 1
    NVTE_FP8 = 2


NVTE_Activation_Type = enum.IntEnum(
    "NVTE_Activation_Type",
    [
        (n, i)
        for i, n in enumerate(
            [
                "GELU",
                "GEGLU",
                "GLU",
                "SILU",
                "SWIGLU",
                "RELU",
                "REGLU",
                "QGELU",
                "QGEGLU",
                "SRELU",
                "SREGLU",
                "CLAMPED_SWIGLU",
            ]
        )
    ],
)
NVTE_Norm_Type = enum.IntEnum("NVTE_Norm_Type", [("LayerNorm", 0), ("RMSNorm", 1)])
JAXX_Scaling_Mode = enum.IntEnum(
    "JAXX_Scaling_Mode",
    [
        ("NO_SCALING", 0),
        ("DELAYED_TENSOR_SCALING", 1),
        ("MXFP8_1D_SCALING", 2),
        ("CURRENT_TENSOR_SCALING", 3),
        ("NVFP4_1D_SCALING", 4),
        ("NVFP4_2D_SCALING", 5),
    ],
)
JAXX_Quantize_Layout = enum.IntEnum(
    "JAXX_Quantize_Layout", [("ROWWISE", 0), ("COLWISE", 1), ("ROWWISE_COLWISE", 2)]
)
JAXX_Score_Function = enum.IntEnum(
    "JAXX_Score_Function", [("SIGMOID", 0), ("SOFTMAX", 1), ("SQRTSOFTPLUS", 2)]
)
JAXX_Routing_Map_Format = enum.IntEnum(
    "JAXX_Routing_Map_Format", [("BYTEMAP", 0), ("BITMAP_U8", 1)]
)
JAXX_Collective_Op = enum.IntEnum(
    "JAXX_Collective_Op", [("NONE", 0), ("ALL_GATHER", 1), ("REDUCE_SCATTER", 2)]
)

_ENUMS = [
    DType,
    NVTE_Bias_Type,
    NVTE_Mask_Type,
    NVTE_QKV_Layout,
    NVTE_QKV_Format,
    NVTE_Softmax_Type,
    NVTE_Fused_Attn_Backend,
    NVTE_Activation_Type,
    NVTE_Norm_Type,
    JAXX_Scaling_Mode,
    JAXX_Quantize_Layout,
    JAXX_Score_Function,
    JAXX_Routing_Map_Format,
    JAXX_Collective_Op,
]

_THD_LAYOUTS = {
    NVTE_QKV_Layout.NVTE_T3HD,
    NVTE_QKV_Layout.NVTE_THD_T2HD,
    NVTE_QKV_Layout.NVTE_THD_THD_THD,
}
_SUPPORTED_DTYPES = {DType.kFloat16, DType.kBFloat16}


# ----------------------------------------------------------------------------- the C functions TE's


def nvte_get_qkv_format(qkv_layout) -> NVTE_QKV_Format:
    layout = NVTE_QKV_Layout(int(qkv_layout))
    if layout in _THD_LAYOUTS:
        return NVTE_QKV_Format.NVTE_THD
    if layout == NVTE_QKV_Layout.NVTE_QKV_Layout_NOT_SET:
        return NVTE_QKV_Format.NVTE_QKV_Format_NOT_SET
    return NVTE_QKV_Format.NVTE_BSHD


def unsupported_reason(params) -> str:
    """Why the CPU kernel cannot compute this configuration ('' when it can).

    ``params`` is TE's ``FusedAttnParams``. Each reason names the parameter and the fix,
    because TE shows it to the user as ``Unsupported backend: <reason>``.
    """
    dtype = DType(int(params.qkv_dtype))
    if dtype not in _SUPPORTED_DTYPES and not (dtype == DType.kFloat32 and _state["allow_fp32"]):
        return (
            f"qkv dtype {dtype.name}: cuDNN fused attention (and this CPU stand-in for it) takes"
            " float16 or bfloat16; cast q/k/v with .astype(jnp.bfloat16)"
        )
    if int(params.scaling_mode) != JAXX_Scaling_Mode.NO_SCALING:
        return (
            f"scaling_mode={JAXX_Scaling_Mode(int(params.scaling_mode)).name}: FP8/FP4 attention"
            " needs real cuDNN on a GPU"
        )
    if params.dropout and params.is_training:
        return (
            f"dropout_probability={params.dropout} with is_training=True: the CPU kernel cannot"
            " reproduce cuDNN's dropout RNG; use 0.0 (or run on a GPU)"
        )
    bias = NVTE_Bias_Type(int(params.bias_type))
    if bias == NVTE_Bias_Type.NVTE_ALIBI:
        return (
            "attn_bias_type=ALIBI is not supported by the CPU kernel; pass an explicit"
            " POST_SCALE_BIAS tensor"
        )
    layout = NVTE_QKV_Layout(int(params.qkv_layout))
    if bias != NVTE_Bias_Type.NVTE_NO_BIAS and layout in _THD_LAYOUTS:
        return f"attn_bias_type={bias.name} with qkv_layout={layout.name}: bias needs a BSHD layout"
    if params.num_gqa_groups < 1 or params.num_attn_heads % params.num_gqa_groups:
        return (
            f"num_gqa_groups={params.num_gqa_groups} does not divide"
            f" num_attn_heads={params.num_attn_heads}; use a KV head count that divides the query"
            " head count"
        )
    left, right = int(params.window_size_left), int(params.window_size_right)
    if left < -1 or right < -1:
        return f"window_size=({left}, {right}): each side must be -1 (unbounded) or >= 0"
    return ""


def get_fused_attn_backend(params):
    reason = unsupported_reason(params)
    if reason:
        return NVTE_Fused_Attn_Backend.NVTE_No_Backend, reason
    return NVTE_Fused_Attn_Backend.NVTE_F16_arbitrary_seqlen, ""


def _workspace(*_args):
    """The CPU kernel uses no workspace; XLA still needs a buffer of the declared shape."""
    return (1,), DType.kByte


def get_fused_attn_fwd_workspace_sizes(*args):
    return _workspace(*args)


def get_fused_attn_bwd_workspace_sizes(*args):
    return _workspace(*args)


def get_device_compute_capability(gpu_id: int = 0) -> int:
    return COMPUTE_CAPABILITY


def get_cudnn_version() -> int:
    major, minor, patch = CUDNN_CONTRACT
    return major * 10000 + minor * 100 + patch


def registrations() -> dict:
    """No CUDA FFI handlers: the CPU lowerings are registered by :func:`install`."""
    return {}


def get_num_compute_streams() -> int:
    return 1  # one host thread issues the CPU kernels


def nvte_built_with_cublasmp() -> bool:
    return False


def is_collective_gemm_with_cublasmp() -> bool:
    return False


def get_grouped_gemm_setup_workspace_size(num_groups):
    # TE probes this at import; an error mentioning cuBLAS makes it disable that GEMM path.
    raise RuntimeError(
        "transformer_engine_jax.get_grouped_gemm_setup_workspace_size: no cuBLAS in the CPU"
        " stand-in"
    )


_UNIMPLEMENTED = [
    "get_cuda_version",
    "get_cublasLt_version",
    "get_cudnn_frontend_version",
    "get_norm_fwd_workspace_sizes",
    "get_norm_bwd_workspace_sizes",
    "get_dact_dbias_quantize_workspace_sizes",
    "get_dbias_quantize_workspace_sizes",
    "get_topk_workspace_sizes",
    "initialize_cgemm_communicator",
    "get_cgemm_num_max_streams",
    "is_non_nt_fp8_gemm_supported",
    "set_ep_bootstrap_params",
    "release_ep_resources",
    "release_ep_resources_at_exit",
    "ep_handle_mem_size",
]


def _unimplemented(name):
    def call(*_args, **_kwargs):
        raise NotImplementedError(
            f"transformer_engine_jax.{name} is not implemented by the CPU stand-in"
            " (tutorial_utils.tools.te_on_cpu): only fused attention runs on CPU. Run on a GPU"
            " node with real TransformerEngine for this feature."
        )

    call.__name__ = name
    return call


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        raise AttributeError(
            f"transformer_engine_jax.{name} does not exist in the CPU stand-in"
            " (tutorial_utils.tools.te_on_cpu)"
        )


def _make_standin() -> types.ModuleType:
    mod = _StandInModule(
        STANDIN_NAME,
        "CPU stand-in for TransformerEngine's JAX extension (tutorial_utils.tools.te_on_cpu)",
    )
    for e in _ENUMS:
        setattr(mod, e.__name__, e)
    for fn in (
        nvte_get_qkv_format,
        get_fused_attn_backend,
        get_fused_attn_fwd_workspace_sizes,
        get_fused_attn_bwd_workspace_sizes,
        get_device_compute_capability,
        get_cudnn_version,
        registrations,
        get_num_compute_streams,
        nvte_built_with_cublasmp,
        is_collective_gemm_with_cublasmp,
        get_grouped_gemm_setup_workspace_size,
    ):
        setattr(mod, fn.__name__, fn)
    for name in _UNIMPLEMENTED:
        setattr(mod, name, _unimplemented(name))
    mod.__file__ = __file__
    return mod


# ----------------------------------------------------------------------------- the kernel


def _segment_offsets(offsets, n, num_tokens):
    """The first ``n`` segment offsets. TE may pass fewer than it declares (the AllGather striped
    path); the missing ones start past the last token, so they cover nothing."""
    import jax.numpy as jnp

    offs = offsets.reshape(-1).astype(jnp.int32)
    return jnp.pad(offs, (0, max(0, n - offs.shape[0])), constant_values=num_tokens)[:n]


def _query_segments(cu_seqlens, offsets, num_tokens):
    """Per query row of the flattened token axis: (segment index or -1, index inside the segment).

    Query runs do not overlap in anything TE produces; if they did, cuDNN's writes would
    race, and the highest segment index wins here.
    """
    import jax.numpy as jnp

    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).astype(jnp.int32)
    n = lens.shape[0]
    offs = _segment_offsets(offsets, n, num_tokens)
    t = jnp.arange(num_tokens, dtype=jnp.int32)
    cover = (
        (lens[:, None] > 0)
        & (t[None, :] >= offs[:, None])
        & (t[None, :] < offs[:, None] + lens[:, None])
    )
    seg = jnp.max(jnp.where(cover, jnp.arange(n, dtype=jnp.int32)[:, None], -1), axis=0)
    return seg, jnp.where(seg >= 0, t - offs[jnp.maximum(seg, 0)], 0)


def _key_ranges(row_in_seg, len_q, kv_start, len_kv, covered, *, causal, bottom_right, window):
    """Inclusive ``[lo, hi]`` key rows for each query row, as cuDNN's mask defines them."""
    import jax.numpy as jnp

    diag = kv_start + row_in_seg + ((len_kv - len_q) if bottom_right else 0)
    lo, hi = kv_start, kv_start + len_kv - 1
    left, right = window
    if causal:
        hi = jnp.minimum(hi, diag)
    if right >= 0:
        hi = jnp.minimum(hi, diag + right)
    if left >= 0:
        lo = jnp.maximum(lo, diag - left)
    return jnp.where(covered, lo, 0), jnp.where(covered, hi, -1)


def _mask_flags(mask_type):
    mask = NVTE_Mask_Type(int(mask_type))
    padding = mask in (
        NVTE_Mask_Type.NVTE_PADDING_MASK,
        NVTE_Mask_Type.NVTE_PADDING_CAUSAL_MASK,
        NVTE_Mask_Type.NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
    )
    causal = mask not in (NVTE_Mask_Type.NVTE_NO_MASK, NVTE_Mask_Type.NVTE_PADDING_MASK)
    return padding, causal


def _unpack(layout, q, k, v):
    if layout in (NVTE_QKV_Layout.NVTE_BS3HD, NVTE_QKV_Layout.NVTE_T3HD):
        return q[..., 0, :, :], q[..., 1, :, :], q[..., 2, :, :]
    if layout in (NVTE_QKV_Layout.NVTE_BSHD_BS2HD, NVTE_QKV_Layout.NVTE_THD_T2HD):
        return q, k[..., 0, :, :], k[..., 1, :, :]
    return q, k, v


def _metadata(config, q, k, q_cu, kv_cu, q_off, k_off):
    """Per query row key ranges (the reference kernel's bounds mode) from what cuDNN receives.

    Returns ``(lo, key_rows, hi, key_rows)`` shaped like the reference's ``(ids_q, ids_kv,
    pos_q, pos_kv)``, the mask spec, and whether the layout is ragged (THD).
    """
    import jax.numpy as jnp

    from ..reference import MaskSpec

    layout = NVTE_QKV_Layout(int(config.qkv_layout.value))
    padding, causal = _mask_flags(config.attn_mask_type.value)
    flags = dict(
        causal=causal,
        bottom_right=bool(config.bottom_right_diagonal),
        window=tuple(int(w) for w in config.effective_window_size),
    )
    b, sq, skv = q.shape[0], q.shape[1], k.shape[1]
    spec = MaskSpec(bounds=True)
    if layout in _THD_LAYOUTS:
        seg, row_in_seg = _query_segments(q_cu, q_off, b * sq)
        n = q_cu.shape[0] - 1
        lens_q = (q_cu[1:] - q_cu[:-1]).astype(jnp.int32)
        lens_kv = (kv_cu[1:] - kv_cu[:-1]).astype(jnp.int32)
        offs_kv = _segment_offsets(k_off, n, b * skv)
        s = jnp.maximum(seg, 0)
        lo, hi = _key_ranges(row_in_seg, lens_q[s], offs_kv[s], lens_kv[s], seg >= 0, **flags)
        rows = jnp.arange(b * skv, dtype=jnp.int32)[None]
        return [lo[None], rows, hi[None], rows], spec, True
    rows_q = jnp.broadcast_to(jnp.arange(sq, dtype=jnp.int32), (b, sq))
    if padding:
        len_q = (q_cu[1 : b + 1] - q_cu[:b]).astype(jnp.int32)[:, None]
        len_kv = (kv_cu[1 : b + 1] - kv_cu[:b]).astype(jnp.int32)[:, None]
    else:
        len_q, len_kv = jnp.full((b, 1), sq, jnp.int32), jnp.full((b, 1), skv, jnp.int32)
    lo, hi = _key_ranges(rows_q, len_q, 0, len_kv, rows_q < len_q, **flags)
    rows = jnp.broadcast_to(jnp.arange(skv, dtype=jnp.int32), (b, skv))
    return [lo, rows, hi, rows], spec, False


def _sink(config, softmax_offset, hq):
    import jax.numpy as jnp

    kind = NVTE_Softmax_Type(int(config.softmax_type.value))
    if kind == NVTE_Softmax_Type.NVTE_VANILLA_SOFTMAX:
        return None
    if kind == NVTE_Softmax_Type.NVTE_OFF_BY_ONE_SOFTMAX:
        return jnp.zeros((hq,), jnp.float32)
    return softmax_offset.reshape(hq).astype(jnp.float32)


def _bias(config, bias, scale):
    kind = NVTE_Bias_Type(int(config.attn_bias_type.value))
    if kind == NVTE_Bias_Type.NVTE_NO_BIAS:
        return None
    return bias if kind == NVTE_Bias_Type.NVTE_POST_SCALE_BIAS else bias * scale


def _as_tokens(x, ragged):
    """THD kernels see one flattened token axis: [b, s, ...] -> [1, b*s, ...]."""
    return x.reshape((1, x.shape[0] * x.shape[1]) + x.shape[2:]) if ragged else x


class _Problem:
    """What both kernels read from TE's arguments: layout, unpacked q/k/v, key ranges, softmax,
    bias."""

    def __init__(self, config, q, k, v, bias, softmax_offset, q_cu, kv_cu, q_off, k_off):
        self.layout = NVTE_QKV_Layout(int(config.qkv_layout.value))
        self.qkv = _unpack(self.layout, q, k, v)
        qq, kk, _ = self.qkv
        self.ranges, self.spec, self.ragged = _metadata(config, qq, kk, q_cu, kv_cu, q_off, k_off)
        self.b, self.sq, self.hq, _ = qq.shape
        self.scale = float(config.scaling_factor)
        self.sink = _sink(config, softmax_offset, self.hq)
        self.bias = _bias(config, bias, self.scale)
        self.tokens = tuple(_as_tokens(x, self.ragged) for x in self.qkv)


def _fwd_kernel(
    q, k, v, bias, softmax_offset, seed, q_cu, kv_cu, q_off, k_off, *_segments, config, avals_out
):
    import jax.numpy as jnp

    from ..reference import blockwise_attention, dense_attention

    pb = _Problem(config, q, k, v, bias, softmax_offset, q_cu, kv_cu, q_off, k_off)
    b, sq, hq, ragged, spec, scale, sink = pb.b, pb.sq, pb.hq, pb.ragged, pb.spec, pb.scale, pb.sink
    lo, _, hi, _ = pb.ranges
    args = (*pb.tokens, *pb.ranges)
    if pb.bias is not None:
        out, lse = dense_attention(*args, scale=scale, spec=spec, sink=sink, bias=pb.bias)
        mx = jnp.full(lse.shape, -jnp.inf, jnp.float32)
    elif cpu_kernel.use_compiled():
        out, lse, mx = cpu_kernel.attention_fwd(*pb.tokens, lo, hi, sink, scale=scale)
    else:
        out, lse, mx = blockwise_attention(
            *args, scale=scale, spec=spec, sink=sink, return_max_logit=True
        )
    out = out.reshape(b, sq, hq, -1).astype(avals_out[0].dtype)
    if ragged:
        covered = (lo <= hi).reshape(b, sq)[:, None, :]  # rows whose key range is not empty
        lse = jnp.where(covered, lse.reshape(hq, b, sq).transpose(1, 0, 2), LSE_UNCOVERED)
        mx = mx.reshape(hq, b, sq).transpose(1, 0, 2)
    lse = lse.reshape(b, hq, sq)
    mx = mx.reshape(b, hq, sq)
    # TE's declared layouts: THD [b, s, h, 1], BSHD [b, h, s, 1]
    softmax_aux = (lse.transpose(0, 2, 1) if ragged else lse)[..., None]
    max_aval = avals_out[2]
    if max_aval.shape == (0,):
        max_tensor = jnp.zeros((0,), max_aval.dtype)
    else:
        max_tensor = (mx.transpose(0, 2, 1) if max_aval.shape[-2] == hq else mx)[..., None].reshape(
            max_aval.shape
        )
    rng_state = jnp.zeros(avals_out[3].shape, avals_out[3].dtype)
    workspace = jnp.zeros(avals_out[4].shape, avals_out[4].dtype)
    del seed
    return [
        out,
        softmax_aux.astype(jnp.float32).reshape(avals_out[1].shape),
        max_tensor.astype(max_aval.dtype),
        rng_state,
        workspace,
    ]


def _bwd_kernel(
    q,
    k,
    v,
    bias,
    softmax_offset,
    softmax_aux,
    rng_state,
    output,
    doutput,
    q_cu,
    kv_cu,
    q_off,
    k_off,
    *_segments,
    config,
    avals_out,
):
    import jax
    import jax.numpy as jnp

    from ..reference import blockwise_backward, dense_attention

    pb = _Problem(config, q, k, v, bias, softmax_offset, q_cu, kv_cu, q_off, k_off)
    layout, b, sq, hq, ragged, spec, scale, sink = (
        pb.layout,
        pb.b,
        pb.sq,
        pb.hq,
        pb.ragged,
        pb.spec,
        pb.scale,
        pb.sink,
    )
    bias_arr, ranges = pb.bias, pb.ranges
    qq, kk, vv = pb.qkv
    tq, tk, tv = pb.tokens
    tout, tdout = _as_tokens(output, ragged), _as_tokens(doutput, ragged)
    dbias = jnp.zeros(avals_out[3].shape, avals_out[3].dtype)
    if bias_arr is not None:

        def f(
            q_, k_, v_, bias_, sink_
        ):  # vanilla softmax has no sink: a zero one would add exp(0) to each row
            return dense_attention(
                q_,
                k_,
                v_,
                *ranges,
                scale=scale,
                spec=spec,
                sink=None if sink is None else sink_,
                bias=bias_,
            )[0]

        sink_in = jnp.zeros((hq,), jnp.float32) if sink is None else sink
        _, vjp = jax.vjp(f, tq, tk, tv, bias_arr.astype(jnp.float32), sink_in)
        dq, dk, dv, dbias_f, dsink = vjp(tdout.astype(tq.dtype))
        if NVTE_Bias_Type(int(config.attn_bias_type.value)) == NVTE_Bias_Type.NVTE_PRE_SCALE_BIAS:
            dbias_f = dbias_f * scale
        dbias = dbias_f.reshape(avals_out[3].shape).astype(avals_out[3].dtype)
    else:
        lse = (
            softmax_aux.reshape(1, b * sq, hq).transpose(0, 2, 1)
            if ragged
            else softmax_aux.reshape(b, hq, sq)
        )
        if cpu_kernel.use_compiled():
            dq, dk, dv, dsink = cpu_kernel.attention_bwd(
                tq, tk, tv, ranges[0], ranges[2], tout, lse, tdout, sink, scale=scale
            )
        else:
            dq, dk, dv, dsink = blockwise_backward(
                tq, tk, tv, *ranges, tout, lse, tdout, scale=scale, spec=spec, sink=sink
            )
    dq, dk, dv = dq.reshape(qq.shape), dk.reshape(kk.shape), dv.reshape(vv.shape)
    if layout in (NVTE_QKV_Layout.NVTE_BS3HD, NVTE_QKV_Layout.NVTE_T3HD):
        dq, dk, dv = jnp.stack([dq, dk, dv], axis=-3), jnp.zeros_like(k), jnp.zeros_like(v)
    elif layout in (NVTE_QKV_Layout.NVTE_BSHD_BS2HD, NVTE_QKV_Layout.NVTE_THD_T2HD):
        dk, dv = jnp.stack([dk, dv], axis=-3), jnp.zeros_like(v)
    if avals_out[4].shape == (0,) or sink is None:
        dsoftmax_offset = jnp.zeros(avals_out[4].shape, jnp.float32)
    else:
        dsoftmax_offset = dsink.reshape(avals_out[4].shape)
    workspace = jnp.zeros(avals_out[5].shape, avals_out[5].dtype)
    return [
        dq.astype(avals_out[0].dtype),
        dk.astype(avals_out[1].dtype),
        dv.astype(avals_out[2].dtype),
        dbias,
        dsoftmax_offset.astype(avals_out[4].dtype),
        workspace,
    ]


def _lowering(kernel):
    from jax.interpreters import mlir

    def rule(ctx, *args, config):
        fn = functools.partial(kernel, config=config, avals_out=ctx.avals_out)
        return mlir.lower_fun(fn, multiple_results=True)(ctx, *args)

    return rule


# ----------------------------------------------------------------------------- installation


@contextmanager
def _env(name, value):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def installed() -> bool:
    return _state["installed"]


def install():
    """Import ``transformer_engine.jax`` with the stand-in extension and CPU kernels; return it.

    Idempotent. Raises ``RuntimeError`` if the real extension was already imported (then
    there is nothing to stand in for) and ``ImportError`` naming the package if the pure
    Python ``transformer-engine`` wheel is missing.
    """
    if _state["installed"]:
        return sys.modules["transformer_engine.jax"]
    existing = sys.modules.get(STANDIN_NAME)
    if existing is not None and not isinstance(existing, _StandInModule):
        raise RuntimeError(
            "the real transformer_engine_jax extension is already imported; the CPU stand-in is for"
            " machines without CUDA. Use TUTORIAL_TE_BACKEND=te there."
        )
    try:
        # NVTE_PROJECT_BUILDING skips loading TE's CUDA core library. TE also warns that its
        # JAX extension's shared object is missing: true, and the reason for this module.
        with _env("NVTE_PROJECT_BUILDING", "1"), warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore",
                message=".*shared object file for the Transformer Engine Jax",
                category=RuntimeWarning,
            )
            common = importlib.import_module("transformer_engine.common")
    except ImportError as err:
        raise ImportError(
            "TE-on-CPU needs the pure-Python wheel: pip install 'transformer-engine==2.20.2' flax"
            " (it is a dependency of this package; reinstall with `make venv`). Import failed:"
            f" {err}"
        ) from err

    def load_framework_extension(framework: str) -> None:
        if framework != "jax":
            raise ImportError(
                f"the CPU stand-in provides only TE's JAX extension, not {framework!r}"
            )
        standin = sys.modules.setdefault(STANDIN_NAME, _make_standin())
        common.check_cudnn_version(standin.get_cudnn_version())

    common.load_framework_extension = load_framework_extension
    te_jax = importlib.import_module("transformer_engine.jax")
    from jax.interpreters import mlir
    from transformer_engine.jax.cpp_extensions import attention as te_attn

    mlir.register_lowering(
        te_attn.FusedAttnFwdPrimitive.inner_primitive, _lowering(_fwd_kernel), platform="cpu"
    )
    mlir.register_lowering(
        te_attn.FusedAttnBwdPrimitive.inner_primitive, _lowering(_bwd_kernel), platform="cpu"
    )
    _state["installed"] = True
    return te_jax


@contextmanager
def allow_fp32(enabled: bool = True):
    """Let the stand-in accept float32 q/k/v (cuDNN does not). For tight comparisons in tests only.

    Backend selection happens at trace time, so call (and jit-compile) the function inside
    this context.
    """
    old = _state["allow_fp32"]
    _state["allow_fp32"] = bool(enabled)
    try:
        yield
    finally:
        _state["allow_fp32"] = old


# ----------------------------------------------------------------------------- the runner for unmod

#: Frameworks a script may try to import that the runner cannot stand in for (TE's JAX API only).
OTHER_FRAMEWORKS = (
    "torch",
    "tensorflow",
    "paddle",
    "transformer_engine.pytorch",
    "transformer_engine.paddle",
)


class _OtherFrameworkError(ModuleNotFoundError):
    """Raised for ``import torch`` & co. under the runner (an ImportError, so optional imports still
    fall back)."""


def _probing() -> bool:
    """Whether the import system was asked by ``importlib.util.find_spec`` (is it installed?), not
    by an import.

    Libraries probe for optional frameworks that way (etils, behind JAX's persistent compilation
    cache, asks for TensorFlow); a probe must read "not installed", not fail.
    """
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return False
        code = frame.f_code
        if (
            code.co_name == "find_spec"
            and "importlib" in code.co_filename
            and "util" in code.co_filename
        ):
            return True
        frame = frame.f_back
    return False


class _RefuseOtherFrameworks:
    """A meta-path finder that refuses the frameworks the runner does not run, with a message naming
    the fix."""

    def find_spec(self, name, path=None, target=None):
        if any(name == f or name.startswith(f + ".") for f in OTHER_FRAMEWORKS) and not _probing():
            raise _OtherFrameworkError(
                f"`import {name}`: `python -m tutorial_utils.tools.te_on_cpu` runs scripts written"
                " against TE's JAX API (transformer_engine.jax) on CPU; it cannot run PyTorch,"
                " TensorFlow or Paddle code. Port the script to transformer_engine.jax, or run it"
                " on a GPU node with the real framework.",
                name=name,
            )
        return None


_CHILD_MARK = "TUTORIAL_TE_ON_CPU_RUNNER"


def _parse_runner_args(argv):
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tutorial_utils.tools.te_on_cpu",
        description=(
            "Run an unmodified script written against TransformerEngine's JAX API on CPU: TE's own"
            " Python, a reference kernel in place of cuDNN, N simulated devices."
        ),
    )
    parser.add_argument(
        "--devices",
        type=int,
        default=4,
        metavar="N",
        help="simulated CPU devices (default 4, the published CP tutorial's cp_size)",
    )
    parser.add_argument("script", help="the Python script to run as __main__")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    ns = parser.parse_args(argv)
    if ns.devices < 1:
        parser.error(f"--devices={ns.devices} must be >= 1 (the number of simulated CPU devices)")
    if not os.path.isfile(ns.script):
        parser.error(f"script {ns.script!r} does not exist (give the path of a .py file)")
    return ns


def simulate_cpu_devices(n: int) -> None:
    """Make JAX start a CPU backend with ``n`` devices; call before the first JAX computation.

    Why both the environment and the config: a process JAX has not imported yet reads
    ``XLA_FLAGS``/``JAX_PLATFORMS`` (and passes them to processes it starts); one that has
    imported it (this package imports JAX) reads the config.
    """
    import jax

    flags = [
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", n)


def main(argv=None) -> int:
    """``python -m tutorial_utils.tools.te_on_cpu [--devices N] script.py [args...]``.

    Sets the CPU platform and device count before JAX starts a backend, installs the stand-in,
    prints one banner line, then runs the script with ``runpy`` as ``__main__``. The script's
    exit status is the runner's.
    """
    import runpy

    ns = _parse_runner_args(sys.argv[1:] if argv is None else argv)
    simulate_cpu_devices(ns.devices)
    # the importable module, not this __main__ copy, so that its state is the one everybody sees
    runtime = importlib.import_module("tutorial_utils.tools.te_on_cpu")
    te_jax = runtime.install()
    version = getattr(importlib.import_module("transformer_engine"), "__version__", "?")
    sys.meta_path.insert(0, _RefuseOtherFrameworks())
    if not os.environ.get(
        _CHILD_MARK
    ):  # processes a script starts with the same command line stay quiet
        print(
            f"te_on_cpu: {ns.script} runs TransformerEngine {version} ({BACKEND_DESCRIPTION}) on"
            f" {ns.devices} simulated CPU device{'s' if ns.devices != 1 else ''}; CPU numbers are"
            " not GPU numbers",
            flush=True,
        )
    os.environ[_CHILD_MARK] = "1"
    del te_jax
    sys.argv = [ns.script, *ns.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(ns.script)))
    try:
        runpy.run_path(ns.script, run_name="__main__")
    except _OtherFrameworkError as err:
        print(f"te_on_cpu: error: {err}", file=sys.stderr)
        return 2
    except SystemExit as done:
        code = done.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
