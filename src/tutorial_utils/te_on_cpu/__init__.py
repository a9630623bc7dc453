"""TE on CPU: run TransformerEngine's own JAX code on a machine without CUDA.

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

The parts:

* :mod:`.extension` - the stand-in for ``transformer_engine_jax``: TE's enums, its backend
  query (which names what the stand-in cannot honour) and the other queries TE's import makes;
* :mod:`.lowerings` - the CPU lowerings of TE's fused-attention primitives, :func:`install`
  and :func:`allow_fp32`;
* :mod:`.kernel` and ``cpu_attention_kernel.cc`` - the kernel itself: a compiled C++ XLA FFI
  custom call, built on first use with the system's C++ compiler, with a pure-JAX fallback;
* :mod:`.runner` - ``python -m tutorial_utils.te_on_cpu [--devices N] script.py``, which runs
  an unmodified TE script on CPU.
"""

from . import kernel
from .extension import (
    BACKEND_DESCRIPTION,
    CUDNN_CONTRACT,
    LSE_UNCOVERED,
    STANDIN_NAME,
    _state,
    unsupported_reason,
)
from .lowerings import allow_fp32, install, installed
from .runner import main, simulate_cpu_devices

__all__ = [
    "install",
    "installed",
    "allow_fp32",
    "simulate_cpu_devices",
    "main",
    "unsupported_reason",
    "kernel",
    "STANDIN_NAME",
    "CUDNN_CONTRACT",
    "BACKEND_DESCRIPTION",
    "LSE_UNCOVERED",
    "_state",
]
