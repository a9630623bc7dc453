"""One frozen description of a CP attention workload, with the two presets the tutorial uses.

Why: every chapter, test, benchmark and cost-model prediction talks about the *same*
shapes. Keeping them in one validated object means a GPU run and a CPU run differ by one
name (``seed`` vs ``cpu``), never by a forgotten constant.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp

from tutorial_utils import rules
from tutorial_utils.inputs import fixed_slot_segments, random_qkv
from tutorial_utils.validation import check_window

__all__ = [
    "Workload",
    "PRESETS",
    "get_workload",
    "preset_from_env",
    "fit_cp_to_devices",
    "workload_for_devices",
    "make_qkv",
    "workload_segments",
]

_DTYPES = ("bfloat16", "float16", "float32")


@dataclasses.dataclass(frozen=True)
class Workload:
    """Packed THD causal sliding-window GQA attention sharded over ``cp_size`` devices.

    Each batch row holds ``segments_per_row`` slots of ``seq_len / segments_per_row`` tokens;
    the first ``valid_per_slot`` tokens of a slot are a real segment, the rest is padding
    (segment id 0, positions keep counting, as in TE's example).
    """

    batch: int
    seq_len: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    segments_per_row: int
    valid_per_slot: int
    window: tuple[int, int] = (-1, 0)
    dtype: str = "bfloat16"
    cp_size: int = 4
    stripe_size: int = 1
    ring_stripe_size: int = 1
    name: str = "custom"

    def __post_init__(self):
        for field in (
            "batch",
            "seq_len",
            "num_q_heads",
            "num_kv_heads",
            "head_dim",
            "segments_per_row",
            "valid_per_slot",
            "cp_size",
            "stripe_size",
            "ring_stripe_size",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"Workload.{field} must be a positive integer, got {field}={value!r}."
                )
        rules.check_gqa_heads(
            self.num_q_heads,
            self.num_kv_heads,
            "Workload.num_kv_heads",
            q_name="Workload.num_q_heads",
        )
        if self.seq_len % self.segments_per_row:
            raise ValueError(
                f"Workload.seq_len={self.seq_len} is not divisible by"
                f" segments_per_row={self.segments_per_row}; choose a slot count that divides the"
                " row length."
            )
        if self.valid_per_slot > self.slot_len:
            raise ValueError(
                f"Workload.valid_per_slot={self.valid_per_slot} exceeds the slot length"
                f" {self.slot_len}; it must be at most seq_len/segments_per_row."
            )
        object.__setattr__(self, "window", check_window(self.window, name="Workload.window"))
        if self.dtype not in _DTYPES:
            raise ValueError(
                f"Workload.dtype={self.dtype!r} is not supported; use one of {_DTYPES}."
            )
        for stripe_field in ("stripe_size", "ring_stripe_size"):
            rules.check_divisible_seq(
                self.seq_len,
                self.cp_size,
                getattr(self, stripe_field),
                name="Workload.seq_len",
                stripe_name=stripe_field,
            )
        if self.cp_size > 1:
            rules.check_ring_stripe(self.ring_stripe_size, name="Workload.ring_stripe_size")

    @property
    def slot_len(self) -> int:
        return self.seq_len // self.segments_per_row

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA ratio)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def max_segments_per_seq(self) -> int:
        return self.segments_per_row

    @property
    def scaling_factor(self) -> float:
        return self.head_dim**-0.5

    @property
    def jnp_dtype(self):
        return getattr(jnp, self.dtype)

    def stripe_for(self, strategy) -> int:
        """Stripe size TE's example uses for a strategy: 1 for Ring, ``stripe_size`` otherwise.

        ``strategy`` is any spelling :func:`tutorial_utils.rules.normalize_strategy` reads
        (``'ring'``, ``'ALL_GATHER'``, a ``CPStrategy`` or its ``str()``)."""
        ring = rules.normalize_strategy(strategy) == "ring"
        return self.ring_stripe_size if ring else self.stripe_size

    def replace(self, **changes) -> Workload:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["window"] = list(self.window)
        return d


PRESETS = {
    # TE's published 4-GPU example (run on 4x GB200).
    "seed": Workload(
        batch=2,
        seq_len=65536,
        num_q_heads=128,
        num_kv_heads=8,
        head_dim=128,
        segments_per_row=4,
        valid_per_slot=12288,
        window=(8192, 0),
        dtype="bfloat16",
        cp_size=4,
        stripe_size=512,
        ring_stripe_size=1,
        name="seed",
    ),
    # Same structure (2 rows, 4 padded slots at 3/4 fill, GQA, window = half a slot), CPU sized.
    "cpu": Workload(
        batch=2,
        seq_len=2048,
        num_q_heads=16,
        num_kv_heads=4,
        head_dim=32,
        segments_per_row=4,
        valid_per_slot=384,
        window=(256, 0),
        dtype="bfloat16",
        cp_size=4,
        stripe_size=16,
        ring_stripe_size=1,
        name="cpu",
    ),
    # Smallest shape with the same structure, for unit tests.
    "tiny": Workload(
        batch=2,
        seq_len=256,
        num_q_heads=8,
        num_kv_heads=4,
        head_dim=16,
        segments_per_row=4,
        valid_per_slot=48,
        window=(32, 0),
        dtype="float32",
        cp_size=4,
        stripe_size=4,
        ring_stripe_size=1,
        name="tiny",
    ),
}


def get_workload(name: str, **overrides) -> Workload:
    """A preset by name (``seed``, ``cpu``, ``tiny``), optionally with fields replaced."""
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is unknown; choose one of {sorted(PRESETS)}.")
    wl = PRESETS[name]
    return wl.replace(**overrides) if overrides else wl


def preset_from_env(default: str = "cpu") -> Workload:
    """The preset named by ``CP_TUTORIAL_PRESET`` (the one switch between a laptop and a GPU
    node)."""
    name = os.environ.get("CP_TUTORIAL_PRESET", default)
    if name not in PRESETS:
        raise ValueError(
            f"CP_TUTORIAL_PRESET={name!r} is unknown; set it to one of {sorted(PRESETS)} or"
            " unset it."
        )
    return PRESETS[name]


def _fits(wl: Workload, cp: int) -> bool:
    return not any(
        rules.reason(rules.check_divisible_seq, wl.seq_len, cp, st)
        for st in (wl.stripe_size, wl.ring_stripe_size)
    )


def fit_cp_to_devices(wl: Workload, num_devices: int) -> Workload:
    """``wl`` with ``cp_size`` set to the CP size a mesh over ``num_devices`` devices can have.

    Why: data reordered for one CP size and sharded over a mesh of another is silently
    wrong in TE (a cp=4 reorder undone with cp=2, or no CP at all on one device). So the CP
    size comes from the devices that exist: ``CP_TUTORIAL_CP`` when set (it must not exceed
    the device count), else the largest size up to ``num_devices`` that divides the row
    into whole stripes.
    """
    if not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"num_devices={num_devices!r} must be a positive int.")
    env = os.environ.get("CP_TUTORIAL_CP", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(
                f"CP_TUTORIAL_CP={env!r} must be a positive integer (the CP mesh size), or unset."
            )
        cp = int(env)
        if cp > num_devices:
            raise ValueError(
                f"CP_TUTORIAL_CP={cp} but only {num_devices} device(s) are visible; set it to at"
                f" most {num_devices}, or expose more devices"
                f" (XLA_FLAGS=--xla_force_host_platform_device_count={cp} on CPU, before JAX"
                " starts)."
            )
        if not _fits(wl, cp):
            raise ValueError(
                f"CP_TUTORIAL_CP={cp} does not divide preset {wl.name!r}'s rows of"
                f" {wl.seq_len} tokens into stripes of {wl.stripe_size}; pick a power of two up to"
                f" {num_devices}."
            )
    else:
        cp = max(c for c in range(1, num_devices + 1) if _fits(wl, c))
    return wl.replace(cp_size=cp)


def workload_for_devices(default: str = "cpu") -> Workload:
    """The ``CP_TUTORIAL_PRESET`` preset with its CP size fitted to the devices JAX sees.

    Call it after ``import jax``; every chapter that builds a mesh uses it, so the mesh, the
    reorders and the ``Backend:`` line all agree on one CP size.
    """
    return fit_cp_to_devices(preset_from_env(default), len(jax.devices()))


def make_qkv(workload: Workload, seed: int = 2026, dtype=None):
    """The workload's ``q, k, v, dout`` (see :func:`random_qkv`), in its dtype unless ``dtype`` is
    given."""
    dtype = workload.jnp_dtype if dtype is None else dtype
    return random_qkv(
        seed,
        workload.batch,
        workload.seq_len,
        workload.num_q_heads,
        workload.num_kv_heads,
        workload.head_dim,
        dtype,
    )


def workload_segments(workload: Workload):
    """The workload's fixed-slot packing (TE example layout)."""
    return fixed_slot_segments(
        workload.batch, workload.seq_len, workload.segments_per_row, workload.valid_per_slot
    )
