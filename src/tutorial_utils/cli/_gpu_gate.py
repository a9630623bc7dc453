"""The import gate's checks, run once TE, its JAX extension, JAX and this package's facade have
imported: TE's versions and cuDNN, a GPU in JAX, real TE in the facade, and TE's own answer to
whether it has a fused kernel for the seed workload's calls (:mod:`.gpu_kernels`).

Importing this module is the gate's first check: it imports real TE at its top, so only
:func:`tutorial_utils.cli.gpu_install.import_gate` imports it, after choosing real TE
(``TUTORIAL_TE_BACKEND=te``) and loading pip's NCCL, and it reports a failed import as the
gate's. The leading underscore keeps it out of the API reference, which is built on machines
where TE's import fails.
"""

from __future__ import annotations

import jax
import transformer_engine.jax  # noqa: F401 - the gate requires TE's JAX API to import
import transformer_engine_jax
from transformer_engine.jax import attention as te_attention

from tutorial_utils import te
from tutorial_utils.cli import gpu_kernels
from tutorial_utils.cli.gpu_bundle import TE_VERSION
from tutorial_utils.cli.gpu_cuda import cuda_major, decode_cudnn_version, installed_version

__all__ = ["check_loaded_te"]


def check_loaded_te(nccl: str | None) -> str:
    """Check the imported TE's version and cuDNN, then require a GPU in JAX, real TE in the
    facade and a fused kernel for the seed workload's single-GPU call.

    Args:
        nccl: the NCCL library loaded before TE (named in the line returned).

    Returns:
        ``import gate: ok: ...``, naming TE, cuDNN, NCCL, the backend, the device and JAX.

    Raises:
        SystemExit: TE's packages differ in version, JAX sees no GPU, the facade did not
            choose real TE, or TE has no fused kernel for the seed workload on one GPU.
    """
    versions = {
        p: installed_version(p)
        for p in (
            "transformer-engine",
            f"transformer-engine-cu{cuda_major()}",
            "transformer-engine-jax",
        )
    }
    if set(versions.values()) != {TE_VERSION}:
        raise SystemExit(f"import gate: TE's packages are not all {TE_VERSION}: {versions}")
    cudnn_version = decode_cudnn_version(int(transformer_engine_jax.get_cudnn_version()))
    cudnn = ".".join(map(str, cudnn_version))
    line = (
        f"TE {TE_VERSION} imported (extension, core and Python agree), cuDNN {cudnn}, NCCL {nccl}"
    )
    devices = jax.devices()
    if not any(d.platform == "gpu" for d in devices):
        raise SystemExit(
            f"import gate: {line}; but JAX sees no GPU ({devices}): check the driver (nvidia-smi)."
        )
    if te.backend_kind() != "te":
        raise SystemExit(f"import gate: the facade chose {te.backend_name()!r}, not real TE.")
    kernels, refusal = gpu_kernels.seed_kernel_verdict(
        lambda call: te_attention.is_fused_attn_kernel_available(
            **gpu_kernels.kernel_keywords(te_attention, call)
        ),
        cudnn_version,
    )
    if refusal:
        raise SystemExit(f"import gate: {line}; but {refusal}")
    return (
        f"import gate: ok: {line}; {te.backend_name()} on {devices[0].device_kind}, JAX"
        f" {jax.__version__}\n" + "\n".join(f"  {k}" for k in kernels)
    )
