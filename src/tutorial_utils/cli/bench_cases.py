"""The cases ``python -m tutorial_utils.cli.bench`` runs: the workload of the preset, the CP
size the devices (or ``--emulate-ranks``) allow, and the strategies, stripes and windows that
TE's rules accept for it, each checked so that an error names the flag to change.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import jax
import numpy as np

from tutorial_utils import rules
from tutorial_utils.pages.runtime import gpu_present
from tutorial_utils.perfmodel.workcount import total_visible_pairs
from tutorial_utils.perfmodel.workload import Workload, fit_cp_to_devices, get_workload

__all__ = [
    "DEFAULT_STRIPES",
    "Case",
    "BenchCases",
    "window_tuple",
    "fail",
    "resolve_cases",
    "visible_pairs",
]

DEFAULT_STRIPES = (1, 128, 512)


@dataclasses.dataclass
class Case:
    """One timed row: a strategy, its stripe (``None`` for the single device) and its window."""

    strategy: str
    stripe: int | None
    window: tuple[int, int]

    @property
    def desc(self) -> str:
        """The case as the progress line names it."""
        st = "" if self.stripe is None else f" stripe={self.stripe}"
        return f"{self.strategy}{st} window={self.window[0]}"


@dataclasses.dataclass
class BenchCases:
    """What one run times, after the checks: see :func:`resolve_cases`."""

    preset: str
    workload: Workload
    cp: int
    stripes: list[int]
    windows: list[int]
    cases: list[Case]
    skipped: list[dict]


def window_tuple(left: int) -> tuple[int, int]:
    """TE's window for a ``--windows`` value.

    Args:
        left: The left window; negative for full causal.

    Returns:
        ``(-1, -1)`` for full causal, else ``(left, 0)``.
    """
    return (-1, -1) if left < 0 else (int(left), 0)


def fail(parser: argparse.ArgumentParser, option: str, message: str):
    """Exit with argparse's usage error, naming ``option``.

    Args:
        parser: The command's parser.
        option: The flag at fault, e.g. ``--cp``.
        message: What is wrong and what to do.

    Raises:
        SystemExit: Always (status 2).
    """
    parser.error(f"argument {option}: {message}")


def visible_pairs(segment_ids, segment_pos, window=(-1, 0)) -> int:
    """Visible pairs per head summed over the batch (exact count from
    :mod:`tutorial_utils.perfmodel.workcount`).

    Args:
        segment_ids: ``[batch, seq]`` segment ids, 0 for padding.
        segment_pos: ``[batch, seq]`` positions within each segment.
        window: TE's ``(left, right)`` window; ``left = -1`` (or ``None``) for full causal.

    Returns:
        The count.
    """
    left = -1 if window is None else int(window[0])
    return int(total_visible_pairs(np.asarray(segment_ids), np.asarray(segment_pos), (left, 0)))


def resolve_cases(args: argparse.Namespace, parser: argparse.ArgumentParser) -> BenchCases:
    """Workload, strategies, stripes, windows after checking them against the preset; errors name
    the option.

    Starts JAX when neither ``--cp`` nor ``--emulate-ranks`` is given (the CP size then follows
    the visible devices), so the devices must be set up first.

    Args:
        args: The parsed flags of ``bench``.
        parser: The parser, for the errors.

    Returns:
        The cases to time, and the ones TE's rules skip with the reason.

    Raises:
        SystemExit: A flag (or ``$CP_TUTORIAL_PRESET``) the preset or TE's rules refuse.
    """
    preset = (
        args.preset or os.environ.get("CP_TUTORIAL_PRESET") or ("seed" if gpu_present() else "cpu")
    )
    if preset not in ("seed", "cpu", "tiny"):
        fail(
            parser,
            "--preset",
            f"unknown preset {preset!r} (from $CP_TUTORIAL_PRESET); choose seed, cpu or tiny",
        )
    wl = get_workload(preset)
    if not (args.emulate_ranks or args.cp):  # the CP size a mesh over the visible devices can have
        try:
            wl = fit_cp_to_devices(wl, len(jax.devices()))
        except ValueError as err:
            fail(parser, "--cp", str(err))
    cp = args.emulate_ranks or args.cp or wl.cp_size
    if args.emulate_ranks and args.cp and args.cp != args.emulate_ranks:
        fail(
            parser,
            "--cp",
            f"--cp {args.cp} contradicts --emulate-ranks {args.emulate_ranks}; give one of them",
        )
    cp_option = "--emulate-ranks" if args.emulate_ranks else "--cp"
    why = rules.reason(rules.check_divisible_seq, wl.seq_len, cp, None, cp_name=cp_option)
    if why:
        fail(parser, cp_option, f"preset {preset!r}: {why}")

    def stripe_fits(s):
        return not rules.reason(rules.check_divisible_seq, wl.seq_len, cp, s)

    try:
        wl = wl.replace(
            cp_size=cp, stripe_size=wl.stripe_size if stripe_fits(wl.stripe_size) else 1
        )
    except ValueError as err:
        fail(parser, cp_option, str(err))
    explicit_stripes = args.stripes is not None
    stripes = (
        list(args.stripes)
        if explicit_stripes
        else sorted({s for s in DEFAULT_STRIPES if stripe_fits(s)} | {wl.stripe_size})
    )
    for s in stripes:
        why = rules.reason(
            rules.check_divisible_seq, wl.seq_len, cp, s, cp_name="cp", stripe_name="stripe"
        )
        if why:
            fail(parser, "--stripes", f"stripe {s}: {why}")
    windows = (
        list(args.windows) if args.windows is not None else sorted({wl.window[0], -1}, reverse=True)
    )
    cases, skipped = [], []
    for strategy in args.strategies:
        for left in windows:
            window = window_tuple(left)
            if strategy == "single":
                cases.append(Case("single", None, window))
            elif strategy == "ring":
                why = rules.reason(rules.check_ring_window, rules.te_window_size(window), cp)
                if why:
                    skipped.append({"strategy": "ring", "window": list(window), "reason": why})
                else:
                    cases.append(Case("ring", 1, window))
            elif strategy == "allgather":
                cases.extend(Case("allgather", s, window) for s in stripes)
            else:
                why = rules.reason(rules.check_ulysses_heads, wl.num_q_heads, wl.num_kv_heads, cp)
                if why:
                    skipped.append({"strategy": "ulysses", "window": list(window), "reason": why})
                else:
                    cases.append(Case("ulysses", 1, window))
    if not cases:
        fail(
            parser,
            "--strategies",
            "no runnable case is left after the checks: " + "; ".join(s["reason"] for s in skipped),
        )
    return BenchCases(preset, wl, cp, stripes, windows, cases, skipped)
