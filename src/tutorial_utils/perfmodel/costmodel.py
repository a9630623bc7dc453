"""A small, fitted cost model for CP attention: single-device time, per-strategy time, and why they
differ.

Why: the question "does CP pay off for *my* shapes on *my* GPUs?" needs a number before
anyone books four GPUs. The model is built from exact counts (:mod:`.workcount`: tiles
each rank must touch; :mod:`.comm`: bytes each rank must move) and only as many fitted
parameters as there are measurements to fit them on. It then reports *why* a strategy
misses the ideal ``cp``-fold speedup, as an additive breakdown::

    predicted = ideal (single / cp)
      + fragmentation (extra tiles the CP layout touches; stripe-1 AllGather most)
      + imbalance     (the slowest rank, or each ring step's slowest rank, vs the mean)
      + cp_overhead   (the fitted CP efficiency loss: what the counts do not explain)
      + comm_exposed  (transfer time not hidden under compute)

How the model works:

* Kernel time is proportional to touched ``tile x tile`` blocks: a partly masked tile
  costs a full one. ``time = tiles * tile_area * 4 * d * H_q * 3.5 / (eta * peak)``
  (forward + 2.5x backward).
* ``eta`` (attention efficiency, fraction of dense BF16 peak) is **fitted on one number**:
  TE's published single-GB200 fwd+bwd time (126.7 ms). One parameter, one point: it fits
  exactly and is not validated by that fit.
* Each CP rank runs its kernels at ``kappa_s * eta``: the per-strategy CP efficiency
  factor ``kappa_ring`` is fitted on TE's Ring time (57.2 ms), ``kappa_allgather`` on its
  AllGather time (53.8 ms). Three parameters for three published numbers: all three are
  reproduced exactly **by construction**, so the fit's error on them says nothing. The one
  check the three numbers allow is the *shared* variant: one ``kappa`` for both
  strategies, fitted by least squares on the two CP points. Its residuals
  (:attr:`Calibration.cross_strategy_error`, about 6.5 %) say how much of the
  Ring-vs-AllGather difference the counts themselves explain; the advisor treats two
  strategies closer than that as a tie.
* Ulysses has no measurement: it uses the shared ``kappa``. Label its predictions as such.
* The CP loss is *proportional* to compute. The model has no fixed per-step cost (kernel
  launches, collective latency), so where a step is short (narrow windows, short
  segments, small heads) it is optimistic about CP. ``fit_calibration(cp_loss="constant")``
  is the other reading of the same three times: each strategy's CP loss is a constant
  number of milliseconds instead, fitted the same way (exact per strategy; one shared
  constant for the stated error and for Ulysses). It reproduces the three points equally
  well and moves the narrow-window break-even a long way, so it exists to give
  :func:`break_even_window` a *range* across the two fits; the advisor uses the
  proportional model only. Three points cannot choose between the two readings, only
  measurements off the published shape can.
* Communication: bytes from :func:`tutorial_utils.perfmodel.comm.comm_volume` (TE schedule) over the
  NVLink per-direction bandwidth, latency ignored. AllGather and Ulysses collectives are
  fully exposed (TE's AllGather does not overlap); each Ring hop hides under the
  compute of one step and only the excess (plus the final dK/dV hop home) is exposed.
* Other hardware reuses the GB200-fitted ``eta`` and ``kappa`` as *fractions of peak*
  (so times scale with 1 / dense peak). That is an assumption: FlashAttention-3 reports
  Hopper reaching 50-75 % of peak, more than the ~39 % fitted here, so H100/H200
  predictions are likely pessimistic.

:func:`speedup_sweep` and :func:`break_even_window` move one field of a workload (the
window, above all) to show where the predicted speedup crosses 1; they inherit every
assumption above.

Memory is counted, not fitted: :mod:`tutorial_utils.perfmodel.memory`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from tutorial_utils import rules
from tutorial_utils.inputs import fixed_slot_segments
from tutorial_utils.perfmodel.comm import comm_volume, dtype_bytes, ring_step_bytes
from tutorial_utils.perfmodel.hardware import HardwareProfile, get_hardware
from tutorial_utils.perfmodel.memory import memory_bytes
from tutorial_utils.perfmodel.workcount import BWD_FWD_RATIO, count_work
from tutorial_utils.perfmodel.workload import Workload, get_workload

__all__ = [
    "PUBLISHED_GB200",
    "Calibration",
    "Prediction",
    "fit_calibration",
    "predict_single",
    "predict",
    "predict_all",
    "DEFAULT_TILE",
    "DEFAULT_CASES",
    "published_points",
    "speedup_sweep",
    "break_even_window",
]

DEFAULT_TILE = (128, 128)

#: TE's JAX context-parallel attention tutorial (docs/examples/jax/attention_context_parallel.out),
#: seed workload, fwd+bwd, measured on 4x GB200. Also stored in results/te-published-gb200.json.
PUBLISHED_GB200 = {
    "hardware": "GB200",
    "cp_size": 4,
    "workload": "seed",
    "single_ms": 126.68747901916504,
    "ring": {"stripe_size": 1, "mean_ms": 57.16729164123535, "speedup": 2.22},
    "allgather": {"stripe_size": 512, "mean_ms": 53.79219055175781, "speedup": 2.36},
}

_FWD_SHARE = 1.0 / (1.0 + BWD_FWD_RATIO)


# --------------------------------------------------------------------------------------------
# cached counting


@functools.lru_cache(maxsize=256)
def _counts(batch, seq_len, slots, valid, window, cp, layout, stripe, tile):
    ids, pos = fixed_slot_segments(batch, seq_len, slots, valid)
    return count_work(ids, pos, window, cp_size=cp, layout=layout, stripe_size=stripe, tile=tile)


def _wl_counts(wl: Workload, cp: int, layout: str, stripe: int, tile):
    return _counts(
        wl.batch,
        wl.seq_len,
        wl.segments_per_row,
        wl.valid_per_slot,
        tuple(wl.window),
        cp,
        layout,
        stripe,
        tuple(tile),
    )


def _tile_seconds(wl: Workload, hw: HardwareProfile, eta: float, tile) -> float:
    """Seconds for one tile, forward + backward, over all query heads, at efficiency ``eta``."""
    flops = tile[0] * tile[1] * 4.0 * wl.head_dim * wl.num_q_heads * (1.0 + BWD_FWD_RATIO)
    return flops / (eta * hw.peak_flops)


# --------------------------------------------------------------------------------------------
# calibration


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Fitted parameters, what each was fitted on, and the fit's residuals."""

    eta: float
    cp_factor: dict[str, float]  # kappa per strategy: CP kernel efficiency / single-GPU efficiency
    reference_hardware: str
    tile: tuple
    fitted_on: dict[str, str]
    residuals: dict[str, float]  # predicted/published - 1, per published number
    shared_kappa: float  # diagnostic: one kappa for both CP strategies (least squares, log space)
    shared_residuals: dict[str, float]
    cp_loss: str = "proportional"  # "constant": the CP loss is cp_loss_ms per strategy, kappa is 1
    cp_loss_ms: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def cross_strategy_error(self) -> float:
        """The model's stated error: the largest miss of the shared-``kappa`` fit (a fraction).

        Why: the per-strategy fit reproduces TE's three published times by construction,
        so its residuals are zero and say nothing. With one ``kappa`` for Ring and
        AllGather, only the counts tell the two apart; how far that misses the published
        times bounds how finely the model can rank strategies.
        """
        return max(abs(v) for v in self.shared_residuals.values())

    def as_dict(self) -> dict:
        """Plain-JSON view, so every prediction can carry what it was fitted on."""
        d = dataclasses.asdict(self)
        d["cross_strategy_error"] = self.cross_strategy_error
        return d


def _bisect(f, lo, hi, iters=200):
    """Root of a decreasing function on [lo, hi]."""
    flo = f(lo)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        fm = f(mid)
        if (fm > 0) == (flo > 0):
            lo, flo = mid, fm
        else:
            hi = mid
    return 0.5 * (lo + hi)


CP_LOSS_FORMS = ("proportional", "constant")


def _golden_min(f, lo, hi, iters=120):
    """Minimum of a unimodal function on [lo, hi] (golden-section search)."""
    gr = (math.sqrt(5) - 1) / 2
    for _ in range(iters):
        a, b = hi - gr * (hi - lo), lo + gr * (hi - lo)
        if f(a) < f(b):
            hi = b
        else:
            lo = a
    return 0.5 * (lo + hi)


@functools.lru_cache(maxsize=8)
def fit_calibration(tile=DEFAULT_TILE, cp_loss: str = "proportional") -> Calibration:
    """Fit ``eta`` on TE's single-GB200 time and the CP factors on its Ring and AllGather times.

    Why: kernel efficiency cannot be derived from first principles; it has to come from a
    measurement. This keeps one parameter per measured number and says which is which.
    With as many parameters as points the fit is exact by construction; the shared-``kappa``
    residuals (:attr:`Calibration.cross_strategy_error`) are the model's stated error.
    ``cp_loss="constant"`` fits a constant CP loss in milliseconds per strategy instead of
    a fraction of the compute (see the module notes): a second reading of the same times.
    """
    if cp_loss not in CP_LOSS_FORMS:
        raise ValueError(f"cp_loss={cp_loss!r} is unknown; use one of {CP_LOSS_FORMS}.")
    tile = tuple(tile)
    if cp_loss == "constant":
        return _fit_constant_loss(fit_calibration(tile))
    wl = get_workload("seed")
    hw = get_hardware(PUBLISHED_GB200["hardware"])
    cp = PUBLISHED_GB200["cp_size"]
    single_tiles = int(_wl_counts(wl, 1, "contiguous", 1, tile).allgather_tiles[0])
    flops = single_tiles * _tile_seconds(wl, hw, 1.0, tile) * hw.peak_flops
    eta = flops / (PUBLISHED_GB200["single_ms"] * 1e-3 * hw.peak_flops)
    fitted_on = {
        "eta": (
            f"single-GPU fwd+bwd {PUBLISHED_GB200['single_ms']:.2f} ms (TE tutorial, 1x GB200,"
            " seed)"
        )
    }

    base = Calibration(eta, {}, "GB200", tile, {}, {}, 1.0, {})
    factors = {}
    for strategy in ("ring", "allgather"):
        pub = PUBLISHED_GB200[strategy]
        meas = pub["mean_ms"]

        def f(k, strategy=strategy, pub=pub, meas=meas):
            c = dataclasses.replace(base, cp_factor={strategy: k})
            return _raw_cp_ms(wl, strategy, pub["stripe_size"], hw, c, cp) - meas

        factors[strategy] = _bisect(f, 1e-3, 10.0)
        fitted_on[f"cp_factor[{strategy}]"] = (
            f"{strategy} stripe {pub['stripe_size']} fwd+bwd {meas:.2f} ms (TE tutorial, 4x GB200,"
            " seed)"
        )

    # the stated error: one kappa for both CP strategies, so only the counts tell them apart
    def sse(k):
        c = dataclasses.replace(base, cp_factor={"ring": k, "allgather": k})
        return sum(
            (
                math.log(_raw_cp_ms(wl, s, PUBLISHED_GB200[s]["stripe_size"], hw, c, cp))
                - math.log(PUBLISHED_GB200[s]["mean_ms"])
            )
            ** 2
            for s in ("ring", "allgather")
        )

    shared = _golden_min(sse, 0.05, 3.0)
    shared_cal = dataclasses.replace(base, cp_factor={"ring": shared, "allgather": shared})
    shared_res = {
        s: (
            _raw_cp_ms(wl, s, PUBLISHED_GB200[s]["stripe_size"], hw, shared_cal, cp)
            / PUBLISHED_GB200[s]["mean_ms"]
            - 1.0
        )
        for s in ("ring", "allgather")
    }
    factors["ulysses"] = shared
    fitted_on["cp_factor[ulysses]"] = (
        "not measured: the shared kappa (least squares on both CP times) is reused"
    )

    cal = dataclasses.replace(
        base,
        cp_factor=factors,
        fitted_on=fitted_on,
        shared_kappa=shared,
        shared_residuals=shared_res,
    )
    residuals = {
        "single": predict_single(wl, hw, cal)["predicted_ms"] / PUBLISHED_GB200["single_ms"] - 1.0
    }
    for s in ("ring", "allgather"):
        residuals[s] = (
            _raw_cp_ms(wl, s, PUBLISHED_GB200[s]["stripe_size"], hw, cal, cp)
            / PUBLISHED_GB200[s]["mean_ms"]
            - 1.0
        )
    return dataclasses.replace(cal, residuals=residuals)


def _fit_constant_loss(prop: Calibration) -> Calibration:
    """The constant-milliseconds reading of TE's times, with ``prop``'s ``eta`` (same single-GPU
    fit)."""
    wl = get_workload("seed")
    hw = get_hardware(PUBLISHED_GB200["hardware"])
    cp = PUBLISHED_GB200["cp_size"]
    base = dataclasses.replace(
        prop,
        cp_factor={},
        cp_loss="constant",
        fitted_on={"eta": prop.fitted_on["eta"]},
        shared_kappa=1.0,
    )

    def raw(strategy, loss_ms):
        c = dataclasses.replace(base, cp_loss_ms={strategy: loss_ms})
        return _raw_cp_ms(wl, strategy, PUBLISHED_GB200[strategy]["stripe_size"], hw, c, cp)

    losses, fitted_on = {}, dict(base.fitted_on)
    for strategy in ("ring", "allgather"):
        pub = PUBLISHED_GB200[strategy]
        losses[strategy] = pub["mean_ms"] - raw(
            strategy, 0.0
        )  # exact: the time is linear in the loss
        fitted_on[f"cp_loss_ms[{strategy}]"] = (
            f"{strategy} stripe {pub['stripe_size']} fwd+bwd {pub['mean_ms']:.2f} ms (TE tutorial,"
            " 4x GB200, seed)"
        )

    def sse(c):
        return sum(
            (math.log(raw(s, c)) - math.log(PUBLISHED_GB200[s]["mean_ms"])) ** 2
            for s in ("ring", "allgather")
        )

    shared = _golden_min(
        sse, 0.0, max(PUBLISHED_GB200[s]["mean_ms"] for s in ("ring", "allgather"))
    )
    shared_res = {
        s: raw(s, shared) / PUBLISHED_GB200[s]["mean_ms"] - 1.0 for s in ("ring", "allgather")
    }
    losses["ulysses"] = shared
    fitted_on["cp_loss_ms[ulysses]"] = (
        "not measured: the shared constant (least squares on both CP times) is reused"
    )
    cal = dataclasses.replace(
        base, cp_loss_ms=losses, fitted_on=fitted_on, shared_residuals=shared_res
    )
    residuals = {"single": prop.residuals["single"]}
    for s in ("ring", "allgather"):
        residuals[s] = raw(s, losses[s]) / PUBLISHED_GB200[s]["mean_ms"] - 1.0
    return dataclasses.replace(cal, residuals=residuals)


# --------------------------------------------------------------------------------------------
# predictions


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One strategy x stripe on one workload and GPU; ``None`` times when not applicable."""

    strategy: str
    stripe_size: int | None
    cp_size: int
    hardware: str
    applicable: bool
    reason: str
    predicted_ms: float | None = None
    single_ms: float | None = None
    speedup: float | None = None
    bytes_per_rank: int | None = None
    breakdown: dict[str, float] | None = None
    imbalance: float | None = None
    tile_efficiency: float | None = None
    measured: bool = False
    memory_bytes_per_rank: int | None = None

    def as_dict(self) -> dict:
        """Plain-JSON view of the prediction and its breakdown."""
        return dataclasses.asdict(self)


def _parts(
    wl: Workload, strategy: str, stripe: int | None, hw: HardwareProfile, cal: Calibration, cp: int
) -> dict:
    """Compute, overhead and communication pieces of one CP strategy (times in ms)."""
    tile = cal.tile
    t_tile = _tile_seconds(wl, hw, cal.eta, tile) * 1e3
    constant = cal.cp_loss == "constant"
    kappa = 1.0 if constant else cal.cp_factor.get(strategy, 1.0)
    single_tiles = int(_wl_counts(wl, 1, "contiguous", 1, tile).allgather_tiles[0])
    bw = hw.link_bytes_per_s
    vol = comm_volume(
        strategy,
        batch=wl.batch,
        seq_len=wl.seq_len,
        num_q_heads=wl.num_q_heads,
        num_kv_heads=wl.num_kv_heads,
        head_dim=wl.head_dim,
        cp_size=cp,
        dtype=wl.dtype,
        schedule="te",
    )
    comm_total = vol.total_sent / bw * 1e3
    if strategy == "ring":
        wc = _wl_counts(wl, cp, "striped", 1, tile)
        step_tiles = wc.ring_tiles.max(axis=0)  # lock-stepped: each step waits for its slowest rank
        slow_tiles = float(step_tiles.sum())
        mean_tiles = float(wc.ring_tiles.sum()) / cp
        step_ms = step_tiles * t_tile / kappa
        kw = dict(
            batch=wl.batch,
            seq_len=wl.seq_len,
            num_kv_heads=wl.num_kv_heads,
            head_dim=wl.head_dim,
            cp_size=cp,
            dtype=wl.dtype,
        )
        hop_f = ring_step_bytes("fwd", **kw) / bw * 1e3
        hop_b = ring_step_bytes("bwd", **kw) / bw * 1e3
        fwd_exposed = sum(max(0.0, hop_f - step_ms[t - 1] * _FWD_SHARE) for t in range(1, cp))
        bwd_exposed = sum(max(0.0, hop_b - step_ms[t] * (1 - _FWD_SHARE)) for t in range(cp))
        kv_shard = (
            wl.batch * (wl.seq_len // cp) * wl.num_kv_heads * wl.head_dim * dtype_bytes(wl.dtype)
        )
        home = 2 * kv_shard / bw * 1e3  # final dK|dV hop home: nothing left to hide it under
        exposed = fwd_exposed + bwd_exposed + home
        imbalance, tile_eff = wc.imbalance("ring"), wc.tile_efficiency("ring")
    elif strategy == "allgather":
        wc = _wl_counts(wl, cp, "striped", stripe, tile)
        slow_tiles = float(wc.allgather_tiles.max())
        mean_tiles = float(wc.allgather_tiles.sum()) / cp
        exposed = comm_total
        imbalance, tile_eff = wc.imbalance("allgather"), wc.tile_efficiency("allgather")
    elif strategy == "ulysses":
        slow_tiles = mean_tiles = single_tiles / cp
        exposed = comm_total
        imbalance, tile_eff = (
            1.0,
            _wl_counts(wl, 1, "contiguous", 1, tile).tile_efficiency("allgather"),
        )
    else:
        raise ValueError(f"strategy={strategy!r} is unknown; use 'ring', 'allgather' or 'ulysses'.")
    compute = slow_tiles * t_tile
    overhead = cal.cp_loss_ms.get(strategy, 0.0) if constant else compute * (1.0 / kappa - 1.0)
    return {
        "ideal_ms": single_tiles * t_tile / cp,
        "fragmentation_ms": (mean_tiles - single_tiles / cp) * t_tile,
        "imbalance_ms": (slow_tiles - mean_tiles) * t_tile,
        "cp_overhead_ms": overhead,
        "comm_exposed_ms": exposed,
        "comm_hidden_ms": max(0.0, comm_total - exposed),
        "comm_total_ms": comm_total,
        "_total": compute + overhead + exposed,
        "_bytes": vol.total_sent,
        "_imbalance": imbalance,
        "_tile_eff": tile_eff,
    }


def _raw_cp_ms(wl, strategy, stripe, hw, cal, cp) -> float:
    return _parts(wl, strategy, stripe, hw, cal, cp)["_total"]


def _resolve(workload, hardware, calibration):
    wl = get_workload(workload) if isinstance(workload, str) else workload
    if not isinstance(wl, Workload):
        raise ValueError(
            f"workload={workload!r} must be a Workload or a preset name such as 'seed'."
        )
    hw = get_hardware(hardware)
    cal = fit_calibration() if calibration is None else calibration
    return wl, hw, cal


def predict_single(workload, hardware="GB200", calibration: Calibration | None = None) -> dict:
    """Predicted one-GPU fwd+bwd time of the whole workload (``predicted_ms``, ``tflops``,
    ``tiles``).

    ``memory_bytes`` is the one device's peak attention memory (:func:`memory_bytes`); the
    time is predicted whether or not that fits in HBM, so callers must check.
    """
    wl, hw, cal = _resolve(workload, hardware, calibration)
    wc = _wl_counts(wl, 1, "contiguous", 1, cal.tile)
    tiles = int(wc.allgather_tiles[0])
    ms = tiles * _tile_seconds(wl, hw, cal.eta, cal.tile) * 1e3
    useful = wc.total_pairs * 4.0 * wl.head_dim * wl.num_q_heads * (1 + BWD_FWD_RATIO)
    return {
        "predicted_ms": ms,
        "tiles": tiles,
        "visible_pairs": wc.total_pairs,
        "flops": useful,
        "tflops_per_s": useful / (ms * 1e-3) / 1e12,
        "tile_efficiency": wc.tile_efficiency("allgather"),
        "memory_bytes": memory_bytes(wl, "single")["peak_bytes"],
    }


def _applicability(wl: Workload, strategy: str, stripe: int | None, cp: int) -> str:
    if cp < 2:
        return f"cp_size={cp}: context parallelism needs at least 2 ranks"
    why = rules.reason(rules.check_divisible_seq, wl.seq_len, cp, None)
    if why:
        return why
    if strategy == "ring":
        return rules.reason(rules.check_ring_stripe, stripe) or rules.reason(
            rules.check_ring_window, rules.te_window_size(wl.window), cp
        )
    if strategy == "allgather":
        return (
            rules.reason(rules.check_stripe_given, stripe, label="strategy='allgather'")
            or rules.reason(rules.check_stripe_size, stripe)
            or rules.reason(rules.check_divisible_seq, wl.seq_len, cp, stripe)
            # a workload has no concrete ids to replay, so the sufficient slot rule stands in
            or rules.reason(rules.check_allgather_slots, wl.slot_len, cp, stripe)
        )
    return rules.reason(rules.check_ulysses_heads, wl.num_q_heads, wl.num_kv_heads, cp)


def predict(
    workload,
    strategy: str,
    *,
    stripe_size: int | None = 1,
    hardware="GB200",
    cp_size: int | None = None,
    calibration: Calibration | None = None,
) -> Prediction:
    """Predicted fwd+bwd time, speedup over one GPU, bytes per rank and the breakdown of the gap.

    Why: one call answers "is this configuration worth running", and the breakdown says
    which knob (stripe, layout, strategy, GPU count) would change the answer.
    """
    wl, hw, cal = _resolve(workload, hardware, calibration)
    cp = wl.cp_size if cp_size is None else cp_size
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp_size must be a positive integer, got cp_size={cp!r}.")
    strategy = rules.normalize_strategy(strategy)
    stripe = None if strategy == "ulysses" else stripe_size
    reason = _applicability(wl, strategy, stripe, cp)
    single = predict_single(wl, hw, cal)["predicted_ms"]
    if reason:
        return Prediction(strategy, stripe, cp, hw.name, False, reason, single_ms=single)
    p = _parts(wl, strategy, stripe, hw, cal, cp)
    total = p["_total"]
    breakdown = {k: v for k, v in p.items() if not k.startswith("_")}
    measured = (
        wl == get_workload("seed")
        and cp == PUBLISHED_GB200["cp_size"]
        and hw.name == get_hardware("GB200").name
        and strategy in ("ring", "allgather")
        and stripe == PUBLISHED_GB200[strategy]["stripe_size"]
    )
    note = (
        "model prediction (CP factor fitted on this published point)"
        if measured
        else (
            "model prediction (unmeasured strategy: shared CP factor)"
            if strategy == "ulysses"
            else "model prediction"
        )
    )
    return Prediction(
        strategy,
        stripe,
        cp,
        hw.name,
        True,
        note,
        predicted_ms=total,
        single_ms=single,
        speedup=single / total,
        bytes_per_rank=int(p["_bytes"]),
        breakdown=breakdown,
        imbalance=float(p["_imbalance"]),
        tile_efficiency=float(p["_tile_eff"]),
        measured=measured,
        memory_bytes_per_rank=memory_bytes(wl, strategy, cp_size=cp)["peak_bytes"],
    )


def predict_all(
    workload,
    *,
    hardware="GB200",
    stripes=(1, 64, 128, 256, 512, 1024),
    cp_size: int | None = None,
    calibration: Calibration | None = None,
):
    """Predictions for Ring (stripe 1), AllGather (each stripe) and Ulysses, applicable or not."""
    wl, hw, cal = _resolve(workload, hardware, calibration)
    rows = [predict(wl, "ring", stripe_size=1, hardware=hw, cp_size=cp_size, calibration=cal)]
    for st in stripes:
        rows.append(
            predict(
                wl, "allgather", stripe_size=int(st), hardware=hw, cp_size=cp_size, calibration=cal
            )
        )
    rows.append(
        predict(wl, "ulysses", stripe_size=None, hardware=hw, cp_size=cp_size, calibration=cal)
    )
    return rows


# --------------------------------------------------------------------------------------------
# sweeps: where does CP start to pay off?

#: TE's two published configurations and the stripe the advisor usually picks.
DEFAULT_CASES = (("ring", 1), ("allgather", 128), ("allgather", 512))


def published_points(value: str = "speedup") -> dict[tuple, float]:
    """TE's published 4xGB200 CP results on the seed workload, keyed like :data:`DEFAULT_CASES`.

    Why: figures mark the published points next to the model's bars and curves; the keys
    say which configuration each point belongs to (the model was fitted on exactly these).
    ``value``: ``"speedup"`` (over TE's published one-GPU time) or ``"ms"`` (fwd+bwd).
    """
    if value not in ("speedup", "ms"):
        raise ValueError(f"value={value!r} is unknown; use 'speedup' or 'ms'.")
    pub = PUBLISHED_GB200
    return {
        (s, pub[s]["stripe_size"]): (
            pub[s]["mean_ms"] if value == "ms" else pub["single_ms"] / pub[s]["mean_ms"]
        )
        for s in ("ring", "allgather")
    }


def _with_field(wl: Workload, field: str, value) -> Workload:
    if field == "window" and isinstance(value, int):
        value = (value, 0)
    try:
        return wl.replace(**{field: value})
    except TypeError:
        raise ValueError(
            f"field={field!r} is not a Workload field; use one of "
            f"{[f.name for f in dataclasses.fields(Workload)]}."
        ) from None


def _speedup(wl: Workload, strategy: str, stripe, hardware, calibration) -> float:
    p = predict(wl, strategy, stripe_size=stripe, hardware=hardware, calibration=calibration)
    return p.speedup if p.applicable else float("nan")


def speedup_sweep(
    workload,
    field: str,
    values,
    *,
    cases=DEFAULT_CASES,
    hardware="GB200",
    calibration: Calibration | None = None,
) -> dict:
    """Predicted speedup over one GPU while one field of the workload takes each of ``values``.

    Why: "does CP pay off" turns on one knob at a time (the window, the segment length,
    the K/V head count); a sweep around a shape shows where the answer flips. ``field`` is
    a :class:`~tutorial_utils.perfmodel.workload.Workload` field; for ``"window"`` an integer
    ``w`` means the causal window ``(w, 0)``. Returns ``field``, ``values``, ``base`` (the
    workload's own value, where published points belong), ``hardware``, ``cp_size`` and ``speedup``:
    ``(strategy, stripe) -> array`` with NaN where the strategy cannot run that shape.
    """
    wl, hw, cal = _resolve(workload, hardware, calibration)
    values = list(values)
    if not values:
        raise ValueError("values is empty; pass the field values to sweep, e.g. [256, 1024, 4096].")
    shapes = [_with_field(wl, field, v) for v in values]
    base = getattr(wl, field)
    return {
        "field": field,
        "values": values,
        "base": base[0] if field == "window" else base,
        "hardware": hw.name,
        "cp_size": wl.cp_size,
        "speedup": {
            (s, st): np.array([_speedup(w, s, st, hw, cal) for w in shapes]) for s, st in cases
        },
    }


def break_even_window(
    workload,
    strategy: str,
    *,
    stripe_size: int | None = 1,
    hardware="GB200",
    calibration: Calibration | None = None,
    min_window: int | None = None,
) -> int | None:
    """The narrowest causal window from which on the model predicts CP faster than one GPU.

    Why: the window sets the work per token while the bytes per rank stay fixed, so it is
    the knob that decides whether CP pays off for a packed workload. The speedup is
    evaluated at every power of two between the narrowest window the strategy accepts and
    the longest segment (wider windows change nothing); above the last power of two where
    CP loses, the crossing is found to one token by bisection. ``min_window`` starts the
    search at a wider window (say, the narrowest one a sweep shows). Returns that window,
    the narrowest tested window when CP wins at every tested window (so a caller should say
    "at every window tested (>= that)", not "from it"), or ``None`` when it never wins.
    """
    wl, hw, cal = _resolve(workload, hardware, calibration)
    lo = rules.ring_min_window_left(wl.cp_size) if strategy == "ring" else 0
    if min_window is not None:
        if isinstance(min_window, bool) or not isinstance(min_window, int) or min_window < 0:
            raise ValueError(
                f"min_window={min_window!r} must be a non-negative int (a left window in tokens)."
            )
        lo = max(lo, min_window)
    hi = max(lo, wl.valid_per_slot - 1)
    grid = sorted({lo, hi} | {2**k for k in range(hi.bit_length()) if lo < 2**k < hi})

    def wins(w: int) -> bool:
        return _speedup(wl.replace(window=(w, 0)), strategy, stripe_size, hw, cal) > 1.0

    losing = [i for i, w in enumerate(grid) if not wins(w)]
    if not losing:
        return lo
    if losing[-1] == len(grid) - 1:
        return None
    a, b = grid[losing[-1]], grid[losing[-1] + 1]  # CP loses at a, wins at b
    while b - a > 1:
        mid = (a + b) // 2
        a, b = (a, mid) if wins(mid) else (mid, b)
    return b
