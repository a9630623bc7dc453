"""Per-GPU hardware profiles used by the cost model, each number with where it comes from.

NVIDIA's headline numbers mix dense and sparse FLOP/s and per-direction and bidirectional
bandwidth; every figure here is dense BF16 and per direction, with a source to check it by.
"""

from __future__ import annotations

import dataclasses

__all__ = ["HardwareProfile", "PROFILES", "get_hardware"]

_ML_ENG = "stas00/ml-engineering @744d01e"
_SCALING = "jax-ml/scaling-book gpus.md @1a55377"


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    """One GPU: dense BF16 peak, NVLink bandwidth per direction, HBM size and bandwidth."""

    name: str
    bf16_dense_tflops: float
    nvlink_gbps_per_direction: float
    hbm_gb: float
    hbm_tbps: float
    sources: dict[str, str]

    @property
    def peak_flops(self) -> float:
        """Dense BF16 FLOP/s."""
        return self.bf16_dense_tflops * 1e12

    @property
    def hbm_bytes(self) -> float:
        """HBM capacity in bytes (vendors quote decimal GB: 141 GB = 141e9 bytes)."""
        return self.hbm_gb * 1e9

    @property
    def link_bytes_per_s(self) -> float:
        """NVLink bytes/s one GPU can send (or receive) at once."""
        return self.nvlink_gbps_per_direction * 1e9

    def as_dict(self) -> dict:
        """Plain-JSON view, sources included, for records and the advisor's ``--json`` output."""
        return dataclasses.asdict(self)


PROFILES: dict[str, HardwareProfile] = {
    "H100": HardwareProfile(
        name="H100 SXM",
        bf16_dense_tflops=989.0,
        nvlink_gbps_per_direction=450.0,
        hbm_gb=80.0,
        hbm_tbps=3.35,
        sources={
            "bf16_dense_tflops": (
                f"{_ML_ENG} compute/accelerator/README.md TFLOPS table (989 dense; 1,979 is with"
                f" sparsity); {_SCALING}"
            ),
            "nvlink_gbps_per_direction": (
                f"{_ML_ENG} network/README.md NVLink table (NVLink4 450 GB/s per direction, 900"
                f" bidirectional); {_SCALING} (18 links x 25 GB/s)"
            ),
            "hbm_gb": f"{_ML_ENG} compute/accelerator/README.md",
            "hbm_tbps": f"{_ML_ENG} compute/accelerator/README.md",
        },
    ),
    "H200": HardwareProfile(
        name="H200 SXM",
        bf16_dense_tflops=989.0,
        nvlink_gbps_per_direction=450.0,
        hbm_gb=141.0,
        hbm_tbps=4.8,
        sources={
            "bf16_dense_tflops": (
                f"{_ML_ENG} compute/accelerator/README.md (same compute as H100: 989 dense)"
            ),
            "nvlink_gbps_per_direction": (
                f"{_ML_ENG} network/README.md (NVLink4 450/900 GB/s; 396 GB/s measured per"
                " direction on 8xH200)"
            ),
            "hbm_gb": f"{_ML_ENG} compute/accelerator/README.md",
            "hbm_tbps": f"{_ML_ENG} compute/accelerator/README.md",
        },
    ),
    "B200": HardwareProfile(
        name="B200 SXM",
        bf16_dense_tflops=2250.0,
        nvlink_gbps_per_direction=900.0,
        hbm_gb=180.0,
        hbm_tbps=8.0,
        sources={
            "bf16_dense_tflops": (
                f"{_ML_ENG} compute/accelerator/README.md TFLOPS table (2,250 dense);"
                f" {_SCALING} lists 2.3e15"
            ),
            "nvlink_gbps_per_direction": (
                f"{_ML_ENG} network/README.md (NVLink5 900/1,800 GB/s); {_SCALING} (NVLink5 doubles"
                " NVLink4)"
            ),
            "hbm_gb": f"{_ML_ENG} compute/accelerator/README.md (180 GB usable)",
            "hbm_tbps": f"{_ML_ENG} compute/accelerator/README.md",
        },
    ),
    "GB200": HardwareProfile(
        name="GB200 (per Blackwell GPU)",
        bf16_dense_tflops=2500.0,
        nvlink_gbps_per_direction=900.0,
        hbm_gb=186.0,
        hbm_tbps=8.0,
        sources={
            "bf16_dense_tflops": (
                f"{_ML_ENG} compute/accelerator/README.md TFLOPS table, per-chip note (2,500"
                f" dense); {_SCALING} Appendix A"
            ),
            "nvlink_gbps_per_direction": (
                f"{_ML_ENG} network/README.md (NVLink5 900/1,800 GB/s, 72-GPU NVLink domain)"
            ),
            "hbm_gb": f"{_ML_ENG} compute/accelerator/README.md",
            "hbm_tbps": f"{_ML_ENG} compute/accelerator/README.md",
        },
    ),
}


def get_hardware(name) -> HardwareProfile:
    """Profile by short name (``H100``, ``H200``, ``B200``, ``GB200``; case-insensitive), or pass
    one through."""
    if isinstance(name, HardwareProfile):
        return name
    key = str(name).upper().replace(" ", "").replace("SXM", "")
    if key not in PROFILES:
        raise ValueError(f"hardware={name!r} is unknown; choose one of {sorted(PROFILES)}.")
    return PROFILES[key]
