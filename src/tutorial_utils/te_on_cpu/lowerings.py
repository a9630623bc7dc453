"""CPU lowerings of TE's two innermost fused-attention primitives, and :func:`install`.

The kernel reads ``cu_seqlens``/``seq_offsets`` as cuDNN does (the package docstring says how).
TE's modules are imported inside :func:`install`, the helpers it calls and
:func:`custom_calls_left_on`, once the stand-in extension is in ``sys.modules``.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import warnings
from contextlib import contextmanager

import jax
import jax.numpy as jnp
from jax.interpreters import mlir

from ..reference import (
    MaskSpec,
    blockwise_attention,
    blockwise_backward,
    dense_attention,
)
from . import kernel as cpu_kernel
from .extension import (
    _THD_LAYOUTS,
    LSE_UNCOVERED,
    STANDIN_NAME,
    NVTE_Bias_Type,
    NVTE_Mask_Type,
    NVTE_QKV_Layout,
    NVTE_Softmax_Type,
    _make_standin,
    _StandInModule,
    _state,
)

# ----------------------------------------------------------------------------- the kernel


def _segment_offsets(offsets, n, num_tokens):
    """The first ``n`` segment offsets.

    TE may pass fewer than it declares (the AllGather striped path); the missing ones start
    past the last token, so they cover nothing.
    """
    offs = offsets.reshape(-1).astype(jnp.int32)
    return jnp.pad(offs, (0, max(0, n - offs.shape[0])), constant_values=num_tokens)[:n]


def _query_segments(cu_seqlens, offsets, num_tokens):
    """Per query row of the flattened token axis: (segment index or -1, index inside the segment).

    Query runs do not overlap in anything TE produces; if they did, cuDNN's writes would
    race, and the highest segment index wins here.
    """
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
    """What both kernels read from TE's arguments: layout, q/k/v, key ranges, softmax, bias."""

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
    """Whether :func:`install` has run in this process.

    Returns:
        True once it has.
    """
    return _state["installed"]


#: TE's documented switch for its custom calls (``BasePrimitive.enabled`` in
#: ``cpp_extensions/base.py``), read each time a TE function picks its path: ``false`` turns
#: every primitive that asks it off (norms, GEMMs, activations, softmax, quantization run as
#: TE's own pure JAX). TE 2.20.2's fused attention never asks it, so it stays on the stand-in.
#: Where it is unset (or names no such class), TE falls back to each class's own state.
CUSTOM_CALLS_ENV = "NVTE_JAX_CUSTOM_CALLS"
CUSTOM_CALLS_OFF = "false"


def _te_primitive_classes() -> list:
    """Every primitive class TE 2.20.2 defines except fused attention's, by name."""
    from transformer_engine.jax.cpp_extensions.base import BasePrimitive

    classes, todo = {}, [BasePrimitive]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__name__ not in classes:
                classes[sub.__name__] = sub
                todo.append(sub)
    return [classes[name] for name in sorted(classes) if "Attn" not in name]


def _turn_custom_calls_off() -> None:
    """Turn each class's own state off (TE's ``set_enabled``).

    TE uses it where the user's :data:`CUSTOM_CALLS_ENV` does not decide; unlike the
    variable, the processes this one starts do not inherit it (a GPU job started from a CPU
    test keeps TE's defaults).
    """
    for primitive in _te_primitive_classes():
        primitive.set_enabled(False)


#: Why TE's quantized (FP8/FP4) recipes do not run on CPU; ``{}`` is TE's scaling mode.
QUANTIZATION_REFUSED = (
    "{} (an FP8/FP4 recipe in te.autocast) does not run on CPU: the stand-in for TE's"
    " extension (tutorial_utils.te_on_cpu) has no FP8/FP4 GEMMs, quantization kernels or FP8"
    " attention. Run quantized recipes on a GPU node; on CPU use te.autocast(enabled=False)."
)


def _refuse_quantization() -> None:
    """Answer TE's FP8/FP4 support query with "no" and :data:`QUANTIZATION_REFUSED`.

    TE caches the verdict per scaling mode (``quantize.helper.is_scaling_mode_supported``);
    filled here, ``te.autocast(enabled=True, recipe=...)`` fails in TE's own check with it.
    """
    from transformer_engine.jax.quantize import ScalingMode, helper

    modes = [m for m in ScalingMode if m != ScalingMode.NO_SCALING]
    helper._is_scaling_mode_supported = {m: False for m in modes}
    helper._reason_for_no_scaling_mode = {m: QUANTIZATION_REFUSED.format(m.name) for m in modes}


def custom_calls_left_on() -> list[str]:
    """TE's non-attention custom calls that the current setting leaves on (they fail on CPU).

    Asks each primitive class TE defines, by TE's own ``enabled()``; call after :func:`install`.

    Returns:
        The class names, sorted; empty when the setting turns them all off.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the _RE form warns on each read
        return [c.__name__ for c in _te_primitive_classes() if c.enabled()]


def install():
    """Import ``transformer_engine.jax`` with the stand-in extension and CPU kernels; return it.

    Turns TE's non-attention custom calls off by TE's own per-class switch, which a
    :data:`CUSTOM_CALLS_ENV` the user set overrides: TE's layers (norm, dense, MLP, softmax)
    run as TE's own pure JAX while attention runs on the stand-in. Quantized (FP8/FP4) recipes
    are refused in TE's own support check. Idempotent.

    Returns:
        The ``transformer_engine.jax`` module.

    Raises:
        RuntimeError: If the real extension was already imported (then there is nothing to
            stand in for).
        ImportError: Naming the package, if the pure-Python ``transformer-engine`` wheel is
            missing.
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
    from transformer_engine.jax.cpp_extensions import attention as te_attn

    mlir.register_lowering(
        te_attn.FusedAttnFwdPrimitive.inner_primitive, _lowering(_fwd_kernel), platform="cpu"
    )
    mlir.register_lowering(
        te_attn.FusedAttnBwdPrimitive.inner_primitive, _lowering(_bwd_kernel), platform="cpu"
    )
    _turn_custom_calls_off()
    _refuse_quantization()
    _state["installed"] = True
    return te_jax


@contextmanager
def allow_fp32(enabled: bool = True):
    """Let the stand-in accept float32 q/k/v (cuDNN does not). For tight comparisons in tests only.

    Backend selection happens at trace time, so call (and jit-compile) the function inside
    this context.

    Args:
        enabled: Accept float32 inside the block.

    Yields:
        Nothing; the setting holds inside the ``with`` block.
    """
    old = _state["allow_fp32"]
    _state["allow_fp32"] = bool(enabled)
    try:
        yield
    finally:
        _state["allow_fp32"] = old
