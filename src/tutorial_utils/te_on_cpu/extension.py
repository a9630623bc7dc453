"""The stand-in for TE's C++ extension ``transformer_engine_jax``: its enums and queries.

TE's Python asks the extension which backend runs a configuration; the stand-in answers with
TE's own enum values and names what it cannot honour, so TE raises its own error.
"""

from __future__ import annotations

import enum
import os
import types

import numpy as np

from .. import rules

__all__ = [
    "STANDIN_NAME",
    "CUDNN_CONTRACT",
    "BACKEND_DESCRIPTION",
    "LSE_UNCOVERED",
    "unsupported_reason",
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


# ----------------------------------------------------------------------------- the C functions TE's


def nvte_get_qkv_format(qkv_layout) -> NVTE_QKV_Format:
    """The tensor format of a layout, as TE's binding answers it.

    Args:
        qkv_layout: An ``NVTE_QKV_Layout`` (or its int value).

    Returns:
        ``NVTE_THD``, ``NVTE_BSHD`` or ``NVTE_QKV_Format_NOT_SET``.
    """
    layout = NVTE_QKV_Layout(int(qkv_layout))
    if layout in _THD_LAYOUTS:
        return NVTE_QKV_Format.NVTE_THD
    if layout == NVTE_QKV_Layout.NVTE_QKV_Layout_NOT_SET:
        return NVTE_QKV_Format.NVTE_QKV_Format_NOT_SET
    return NVTE_QKV_Format.NVTE_BSHD


def unsupported_reason(params) -> str:
    """Why the CPU kernel cannot compute this configuration ('' when it can).

    Each reason names the parameter and the fix, because TE shows it to the user as
    ``Unsupported backend: <reason>``.

    Args:
        params: TE's ``FusedAttnParams``.

    Returns:
        The first reason, or ``""``.
    """
    dtype = DType(int(params.qkv_dtype))
    why = rules.reason(rules.check_te_dtype, dtype, allow_fp32=_state["allow_fp32"])
    if why:
        return why
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
    why = rules.reason(
        rules.check_gqa_heads, params.num_attn_heads, params.num_gqa_groups,
        name="num_gqa_groups", q_name="num_attn_heads",
    )  # fmt: skip
    if why:
        return why
    left, right = int(params.window_size_left), int(params.window_size_right)
    if left < -1 or right < -1:
        return f"window_size=({left}, {right}): each side must be -1 (unbounded) or >= 0"
    return ""


#: How TE's binding reads the fields of the params it gets (``csrc/extensions/attention.cpp``,
#: ``GetFusedAttnBackend``): pybind11 casts, which raise ``RuntimeError`` for a value they cannot
#: convert, e.g. ``num_gqa_groups=None`` from the Flax layer's default.
_CAST_SIZE_T = (
    "batch_size", "num_attn_heads", "num_gqa_groups", "head_dim_qk", "head_dim_v", "max_seqlen_q",
    "max_seqlen_kv", "num_tokens_q", "num_tokens_kv", "bias_batch_size", "bias_num_heads",
    "bias_seqlen_q", "bias_seqlen_kv",
)  # fmt: skip
_CAST_INT64 = ("window_size_left", "window_size_right")
_CAST_FLOAT = ("dropout", "attn_scale")


def _pybind_cast_error(value) -> RuntimeError:
    # pybind11's release-build message, as TE 2.20.2's extension raises it
    return RuntimeError(
        f"Unable to cast Python instance of type {type(value)!r} to C++ type '?' (#define "
        "PYBIND11_DETAILED_ERROR_MESSAGES or compile in debug mode for details)"
    )


def _cast_like_te(params) -> None:
    """Raise where TE's binding's casts would: the same error, for the same values."""
    integral = (int, np.integer)
    for name in _CAST_SIZE_T + _CAST_INT64 + _CAST_FLOAT:
        value = getattr(params, name)
        if name in _CAST_FLOAT:
            ok = isinstance(value, (int, float, np.integer, np.floating))
        else:
            ok = isinstance(value, integral) and (name in _CAST_INT64 or value >= 0)
        if not ok:
            raise _pybind_cast_error(value)


def get_fused_attn_backend(params):
    """TE's backend query: the CPU kernel, or no backend with the reason.

    Args:
        params: TE's ``FusedAttnParams``.

    Returns:
        ``(NVTE_F16_arbitrary_seqlen, "")``, or ``(NVTE_No_Backend, reason)``.
    """
    _cast_like_te(params)
    reason = unsupported_reason(params)
    if reason:
        return NVTE_Fused_Attn_Backend.NVTE_No_Backend, reason
    return NVTE_Fused_Attn_Backend.NVTE_F16_arbitrary_seqlen, ""


def _workspace(*_args):
    """The CPU kernel uses no workspace; XLA still needs a buffer of the declared shape."""
    return (1,), DType.kByte


def get_fused_attn_fwd_workspace_sizes(*args):
    """The forward's workspace: one byte (the CPU kernel uses none).

    Args:
        *args: TE's arguments, unused.

    Returns:
        ``((1,), DType.kByte)``.
    """
    return _workspace(*args)


def get_fused_attn_bwd_workspace_sizes(*args):
    """The backward's workspace: one byte (the CPU kernel uses none).

    Args:
        *args: TE's arguments, unused.

    Returns:
        ``((1,), DType.kByte)``.
    """
    return _workspace(*args)


def get_device_compute_capability(gpu_id: int = 0) -> int:
    """The compute capability whose layouts TE should pick.

    Args:
        gpu_id: Unused.

    Returns:
        :data:`COMPUTE_CAPABILITY` (90).
    """
    return COMPUTE_CAPABILITY


def get_cudnn_version() -> int:
    """The cuDNN version whose contract the kernel follows, as TE's binding encodes it.

    Returns:
        ``major * 10000 + minor * 100 + patch`` of :data:`CUDNN_CONTRACT`.
    """
    major, minor, patch = CUDNN_CONTRACT
    return major * 10000 + minor * 100 + patch


def registrations() -> dict:
    """No CUDA FFI handlers: the CPU lowerings are registered by :func:`install`.

    Returns:
        ``{}``.
    """
    return {}


def get_num_compute_streams() -> int:
    """One compute stream.

    Returns:
        1.
    """
    return 1  # one host thread issues the CPU kernels


def nvte_built_with_cublasmp() -> bool:
    """No cuBLASMp.

    Returns:
        False.
    """
    return False


def is_collective_gemm_with_cublasmp() -> bool:
    """No collective GEMM with cuBLASMp.

    Returns:
        False.
    """
    return False


def get_grouped_gemm_setup_workspace_size(num_groups):
    """Refused: there is no cuBLAS.

    Args:
        num_groups: Unused.

    Raises:
        RuntimeError: Always; TE's import then turns its grouped-GEMM path off.
    """
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


def _custom_calls() -> str:
    value = os.environ.get("NVTE_JAX_CUSTOM_CALLS")
    return "unset" if value is None else repr(value)


def _unimplemented(name):
    def call(*_args, **_kwargs):
        raise NotImplementedError(
            f"transformer_engine_jax.{name} is not implemented by the CPU stand-in"
            " (tutorial_utils.te_on_cpu): it runs TE's fused attention, and TE's other layers"
            " as TE's pure JAX, with TE's custom calls off unless NVTE_JAX_CUSTOM_CALLS turns"
            f" them on (here it is {_custom_calls()}). Run on a GPU node with real"
            " TransformerEngine for this feature."
        )

    call.__name__ = name
    return call


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        raise AttributeError(
            f"transformer_engine_jax.{name} does not exist in the CPU stand-in"
            " (tutorial_utils.te_on_cpu)"
        )


def _make_standin() -> types.ModuleType:
    mod = _StandInModule(
        STANDIN_NAME,
        "CPU stand-in for TransformerEngine's JAX extension (tutorial_utils.te_on_cpu)",
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
