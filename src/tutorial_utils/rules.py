"""Each context-parallel rule of TransformerEngine, written once.

Why: the facade (:mod:`tutorial_utils.te.attention`), the validator
(:mod:`tutorial_utils.validation`), the strategies, the model, the command lines and the
cost model all enforce the same rules of TE 2.20.2 (stripe sizes, sliding windows, sequence
lengths, ``max_segments_per_seq``, head counts, dtypes, strategy names). Each rule is one
function here with one ``ValueError`` message that names the parameter, the value and the
fix; every site calls it, so a rule and its wording change in one place. A caller that
needs a reason string instead of an exception (a skipped benchmark case, a cost-model
row) uses :func:`reason`.

The keywords ``name=`` and ``label=`` let a caller keep the spelling its user typed (a
command-line flag, a dataclass field, ``CPStrategy.RING`` or ``strategy='ring'``). Only the
standard library and NumPy are imported, so every layer of the package can use this
module.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = [
    "STRATEGIES",
    "reason",
    "normalize_strategy",
    "check_stripe_size",
    "check_stripe_given",
    "check_ring_stripe",
    "ring_min_window_left",
    "check_ring_window",
    "te_window_size",
    "check_divisible_seq",
    "check_dual_chunk",
    "check_allgather_load_balanced",
    "check_allgather_layout",
    "check_allgather_slots",
    "check_bshd_stripe",
    "check_bshd_window",
    "check_bshd_max_segments",
    "check_max_segments",
    "check_segment_ids_within",
    "check_gqa_heads",
    "check_ulysses_heads",
    "check_te_dtype",
]

#: The canonical strategy names :func:`normalize_strategy` returns.
STRATEGIES = ("allgather", "ring", "ulysses")

_STRATEGY_ALIASES = {
    "default": "allgather",
    "allgather": "allgather",
    "ring": "ring",
    "ulysses": "ulysses",
    "alltoall": "ulysses",
    "a2a": "ulysses",
}

_TE_DTYPES = {"bfloat16", "float16", "kbfloat16", "kfloat16", "bf16", "fp16", "half"}


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _left(window) -> int:
    return -1 if window is None else int(window[0])


def _window_text(window) -> str:
    return str((-1, -1) if window is None else tuple(int(x) for x in window))


def reason(check: Callable, *args, **kwargs) -> str:
    """The message of a rule as a string: ``""`` when ``check(*args, **kwargs)`` passes.

    Why: the cost model, the benchmark and the checks report a configuration a rule refuses
    as "skipped: <reason>" instead of stopping; this keeps that reason the rule's own text.

    Args:
        check: one of this module's ``check_*`` functions (anything raising ``ValueError``).
        *args: passed to ``check``.
        **kwargs: passed to ``check``.

    Returns:
        The ``ValueError``'s message, or ``""``.

    Raises:
        Nothing of its own: a ``ValueError`` from ``check`` becomes the returned string.
    """
    try:
        check(*args, **kwargs)
    except ValueError as err:
        return str(err)
    return ""


def normalize_strategy(strategy, *, allow_none: bool = False) -> str | None:
    """``'allgather'``, ``'ring'`` or ``'ulysses'`` for any spelling of a CP strategy.

    Why: users pass ``CPStrategy`` members, their ``str()`` (``'CPStrategy.RING'``) or names
    such as ``'ALL_GATHER'``, ``'all-gather'`` and ``'a2a'``; TE's ``DEFAULT`` is AllGather.

    Args:
        strategy: a ``CPStrategy`` member (TE's or the reference's), or a name; case, ``_``
            and ``-`` are ignored, and a leading ``CPStrategy.`` is dropped.
        allow_none: return ``None`` for ``None`` (no CP) instead of refusing it.

    Returns:
        ``'allgather'``, ``'ring'`` or ``'ulysses'`` (or ``None``).

    Raises:
        ValueError: the name is not one of the strategies.
    """
    if strategy is None and allow_none:
        return None
    name = str(getattr(strategy, "name", strategy)).lower()
    name = name.removeprefix("cpstrategy.").replace("_", "").replace("-", "")
    if name not in _STRATEGY_ALIASES:
        raise ValueError(
            f"strategy={strategy!r} is unknown; use 'ring', 'allgather' or 'ulysses' (or a"
            " CPStrategy)."
        )
    return _STRATEGY_ALIASES[name]


def check_stripe_size(stripe_size, *, name: str = "stripe_size") -> int:
    """A stripe size is a positive int; ``None`` means 1. Returns it as an int.

    Why: TE's striped reorder splits each row into stripes of ``stripe_size`` tokens; 0, a
    negative or a float stripe fails deep inside a reshape, ``True`` would pass as 1.

    Args:
        stripe_size: the stripe used with ``reorder_causal_load_balancing``, or ``None``.
        name: how the caller's user spells the parameter.

    Returns:
        The stripe size as an int.

    Raises:
        ValueError: not ``None`` and not a positive int (``bool`` refused).
    """
    if stripe_size is None:
        return 1
    if not _is_int(stripe_size) or stripe_size < 1:
        raise ValueError(
            f"{name}={stripe_size!r} must be a positive int (or None for 1): the stripe used with"
            " reorder_causal_load_balancing."
        )
    return int(stripe_size)


def check_stripe_given(stripe_size, *, label: str = "THD AllGather context parallelism") -> None:
    """A striped (THD) CP call names its stripe: ``stripe_size`` is not ``None``.

    Why: TE's THD AllGather path raises an obscure "Dual Chunk ... Striped" error for
    ``stripe_size=None``; the stripe must be the one the batch was reordered with.

    Args:
        stripe_size: the ``stripe_size`` passed to ``fused_attn``.
        label: the setting the rule applies to, e.g. ``"a CP strategy"``.

    Raises:
        ValueError: ``stripe_size`` is ``None``.
    """
    if stripe_size is None:
        raise ValueError(
            f"stripe_size=None with {label}: striped load balancing needs an explicit stripe_size"
            " (e.g. 1, 128 or 512; Ring takes only 1), the same one used with"
            " reorder_causal_load_balancing."
        )


def check_ring_stripe(
    stripe_size, *, name: str = "stripe_size", label: str = "strategy='ring'"
) -> None:
    """THD Ring attention takes stripe 1 only (``None`` counts as 1).

    Why: TE's THD ring steps assume stripes of one token; with larger stripes TE returns
    wrong masks without an error. Callers apply it when ``cp_size > 1``.

    Args:
        stripe_size: the stripe the Ring inputs were reordered with.
        name: how the caller's user spells the parameter.
        label: how the caller's user spells the strategy (``"CPStrategy.RING"``).

    Raises:
        ValueError: the stripe is not 1.
    """
    if stripe_size is not None and stripe_size != 1:
        raise ValueError(
            f"{name}={stripe_size} with {label}: TE's THD ring attention requires stripe_size=1"
            " (larger stripes give wrong masks without an error). Use stripe_size=1 (and reorder"
            " with stripe_size=1), or AllGather for larger stripes."
        )


def ring_min_window_left(cp_size: int) -> int:
    """The narrowest left sliding window THD Ring computes correctly: ``cp_size - 1``.

    Why: :func:`check_ring_window` and the cost model's window search share this bound.

    Args:
        cp_size: the size of the CP mesh axis.

    Returns:
        ``cp_size - 1``.
    """
    return int(cp_size) - 1


def check_ring_window(window, cp_size: int, *, label: str = "strategy='ring'") -> None:
    """THD Ring with a sliding window needs ``left >= cp_size - 1``; no window is ``None``.

    Why: a narrower window leaves some striped ring step an empty diagonal band, which cuDNN
    cannot express, so spurious pairs appear (TE raises nothing). And TE's striped Ring
    recomputes each step's window from ``left`` whenever the window is not ``(-1, -1)``
    (``adjust_cp_striped_window_size`` in ``transformer_engine/jax/cpp_extensions/
    attention.py``), reading ``left = -1`` as a bound rather than as unbounded: ``(-1, 0)``,
    a common spelling of "causal, no window", leaves most steps without keys, again without
    an error.

    Args:
        window: ``(left, right)`` as normalised by ``validation.check_window``, or ``None``.
        cp_size: the size of the CP mesh axis.
        label: how the caller's user spells the strategy (``"CPStrategy.RING"``).

    Raises:
        ValueError: ``0 <= left < cp_size - 1``, or ``left == -1`` with ``right != -1``.
    """
    left, low = _left(window), ring_min_window_left(cp_size)
    if left == -1 and window is not None and tuple(int(x) for x in window) != (-1, -1):
        raise ValueError(
            f"window_size={_window_text(window)} with {label}: TE's striped Ring reads a left"
            " bound of -1 as a bound, not as unbounded, so most ring steps see no keys and the"
            " result is wrong, without an error. For causal attention without a window pass"
            f" window_size=None (the causal mask does the rest); for a sliding window pass a"
            f" left window >= cp_size-1 = {low}."
        )
    if left != -1 and left < low:
        raise ValueError(
            f"window_size={_window_text(window)} with {label} and cp_size={cp_size}: the left"
            f" window must be >= cp_size-1={low} (narrower windows leave a ring step an empty band"
            " that cuDNN cannot express, so spurious pairs appear). Widen it to left >="
            f" cp_size-1 = {low}, or use AllGather."
        )


def te_window_size(window):
    """The ``window_size`` to give TE for ``window``: ``None`` when the left side is unbounded.

    Why: the cost model and the benchmarks write "causal, no window" as ``(-1, 0)``, which
    TE's striped Ring computes wrongly (:func:`check_ring_window`); ``None`` with a causal
    mask is the same attention and right under every strategy.

    Args:
        window: ``None`` or a ``(left, right)`` pair of ints.

    Returns:
        ``None`` for no window or an unbounded left side, else ``(left, right)``.

    Raises:
        ValueError: ``window`` is not ``None`` or a pair of ints.
    """
    if window is None:
        return None
    if (
        not isinstance(window, (tuple, list))
        or len(window) != 2
        or not all(isinstance(w, (int, np.integer)) and not isinstance(w, bool) for w in window)
    ):
        raise ValueError(
            f"window_size={window!r} is not a (left, right) pair of ints; pass e.g. (8192, 0),"
            " or None for no window."
        )
    return None if window[0] < 0 else (int(window[0]), int(window[1]))


def check_divisible_seq(
    seq_len: int,
    cp_size: int,
    stripe_size: int | None = 1,
    name: str = "seq_len",
    *,
    cp_name: str = "cp_size",
    stripe_name: str = "stripe_size",
) -> None:
    """The sequence splits into ``cp_size`` shards of whole stripes: ``seq_len % (cp*stripe) == 0``.

    Why: TE's striped reorder reshapes a row into ``[seq/(cp*stripe), cp, stripe]`` and each
    rank holds ``seq/cp`` tokens; any remainder fails inside a reshape or a sharding.

    Args:
        seq_len: the row length (axis 1 of q/k/v and of the segment ids).
        cp_size: the size of the CP mesh axis.
        stripe_size: the stripe; ``None`` checks divisibility by ``cp_size`` alone and leaves
            the stripe out of the message.
        name: how the caller's user spells the length (``"q.shape[1]"``, ``"--seq-len"``).
        cp_name: how the caller's user spells the CP size (``"--cp"``).
        stripe_name: how the caller's user spells the stripe (``"ring_stripe_size"``).

    Raises:
        ValueError: ``seq_len`` is not a multiple of ``cp_size * stripe_size``.
    """
    if stripe_size is None:
        if seq_len % cp_size:
            raise ValueError(
                f"{name}={seq_len} is not divisible by {cp_name}={cp_size}; pad each row to a"
                f" multiple of {cp_size} tokens (padding has segment id 0) or choose a {cp_name}"
                f" that divides {seq_len}."
            )
        return
    n = cp_size * stripe_size
    if seq_len % n:
        raise ValueError(
            f"{name}={seq_len} is not divisible by"
            f" {cp_name}*{stripe_name}={cp_size}*{stripe_size}={n}; pad each row to a multiple of"
            f" {n} tokens (padding has segment id 0) or choose a smaller {stripe_name}."
        )


def check_dual_chunk(seq_len: int, cp_size: int, *, name: str = "seq_len") -> None:
    """BSHD load balancing (DualChunkSwap) needs ``seq_len % (2 * cp_size) == 0``.

    Why: DualChunkSwap cuts each row into ``2 * cp_size`` chunks and gives rank r chunks r and
    ``2*cp_size-1-r``; a remainder fails inside TE's reshape.

    Args:
        seq_len: the row length.
        cp_size: the size of the CP mesh axis.
        name: how the caller's user spells the length.

    Raises:
        ValueError: ``seq_len`` is not a multiple of ``2 * cp_size``.
    """
    if seq_len % (2 * cp_size):
        raise ValueError(
            f"{name}={seq_len} is not divisible by 2*cp_size=2*{cp_size}={2 * cp_size}:"
            f" DualChunkSwap load balancing cuts each row into 2*cp_size chunks; pad each row to a"
            f" multiple of {2 * cp_size} tokens."
        )


def check_allgather_load_balanced(load_balanced: bool) -> None:
    """THD AllGather needs ``context_parallel_causal_load_balanced=True``.

    Why: without the flag TE reads the striped shards as contiguous and pairs the wrong
    keys, silently. TE's THD Ring ignores the flag, so the rule is AllGather's alone.

    Args:
        load_balanced: the ``context_parallel_causal_load_balanced`` flag.

    Raises:
        ValueError: the flag is false.
    """
    if not load_balanced:
        raise ValueError(
            "context_parallel_causal_load_balanced=False with THD AllGather context parallelism:"
            " TE then reads the shards as contiguous and pairs the wrong keys. Reorder the inputs"
            " with reorder_causal_load_balancing(x, strategy=ReorderStrategy.Striped,"
            " cp_size=..., seq_dim=1, stripe_size=...) and pass"
            " context_parallel_causal_load_balanced=True."
        )


def check_allgather_layout(mismatch: str | None, *, cp_size: int, stripe_size: int) -> None:
    """THD AllGather pairs every query with its own keys on every rank (exact rule).

    Why: each rank rebuilds run lengths and offsets from its reordered local ids and
    positions in two ways; when they disagree TE attends the wrong keys, silently.
    ``validation.allgather_mismatch`` replays TE's metadata and finds the first such query.

    Args:
        mismatch: ``validation.allgather_mismatch(...)``'s result (``None`` when exact).
        cp_size: the size of the CP mesh axis.
        stripe_size: the stripe the batch was reordered with.

    Raises:
        ValueError: ``mismatch`` is not ``None``; the text after ``Fix:`` is the fix.
    """
    if mismatch is not None:
        raise ValueError(
            f"segment_ids/segment_pos with strategy='allgather', cp_size={cp_size},"
            f" stripe_size={stripe_size}: {mismatch}. Each rank finds its run starts twice, from"
            " id/position changes among valid tokens and from position jumps among all local"
            " tokens (padding included); here the two disagree, e.g. because the token before a"
            " run start has the run's first position minus 1. Fix: start every segment slot"
            " (segment plus its padding) at a multiple of"
            f" cp_size*stripe_size={cp_size * stripe_size} and let padding positions keep"
            " counting from the segment, or use strategy='ring' with stripe_size=1."
        )


def check_allgather_slots(
    slot_len: int, cp_size: int, stripe_size: int, *, name: str = "slot_len"
) -> None:
    """Fixed-length segment slots start on multiples of ``cp_size * stripe_size`` (AllGather).

    Why: it is the safe layout for TE's THD AllGather path (with padding positions counting
    on), and the one a workload without concrete ids can be checked against; it is
    sufficient, not necessary (:func:`check_allgather_layout` is the exact rule).

    Args:
        slot_len: the tokens of one slot (a segment plus its padding).
        cp_size: the size of the CP mesh axis.
        stripe_size: the AllGather stripe.
        name: how the caller's user spells the slot length.

    Raises:
        ValueError: ``slot_len`` is not a multiple of ``cp_size * stripe_size``.
    """
    n = cp_size * stripe_size
    if slot_len % n:
        raise ValueError(
            f"{name}={slot_len}: segment slots do not start at multiples of"
            f" cp_size*stripe_size={cp_size}*{stripe_size}={n}, so TE's THD AllGather path can"
            f" pair the wrong keys. Fix: make every slot a multiple of {n} tokens (padding"
            " positions counting on), or use strategy='ring' with stripe_size=1."
        )


def check_bshd_stripe(stripe_size, *, cp_size: int) -> None:
    """BSHD context parallelism takes ``stripe_size=None``.

    Why: BSHD load-balances with DualChunkSwap, which has no stripe; TE raises an obscure
    "Dual Chunk ... Striped" error for a stripe with a BSHD layout.

    Args:
        stripe_size: the ``stripe_size`` passed to ``fused_attn``.
        cp_size: the size of the CP mesh axis (for the message).

    Raises:
        ValueError: ``stripe_size`` is not ``None``.
    """
    if stripe_size is not None:
        raise ValueError(
            f"stripe_size={stripe_size} with a BSHD layout under context parallelism"
            f" (cp_size={cp_size}): BSHD uses DualChunkSwap load balancing; pass stripe_size=None."
        )


def check_bshd_window(window, *, cp_size: int) -> None:
    """BSHD context parallelism has no sliding window (``left == -1``).

    Why: TE's BSHD CP primitives assert ``window_size[0] == -1``; windows need THD under CP.

    Args:
        window: ``(left, right)`` as normalised by ``validation.check_window``, or ``None``.
        cp_size: the size of the CP mesh axis (for the message).

    Raises:
        ValueError: the left bound is not -1.
    """
    if _left(window) != -1:
        raise ValueError(
            f"window_size={_window_text(window)} with a BSHD layout under context parallelism"
            f" (cp_size={cp_size}): sliding windows need a THD layout under CP; use THD_THD_THD"
            " with segment ids/positions, or window_size=None."
        )


def check_bshd_max_segments(max_segments_per_seq, *, cp_size: int) -> None:
    """BSHD context parallelism takes ``max_segments_per_seq=1``.

    Why: a BSHD row holds one sequence; TE's ring path raises for any other value.

    Args:
        max_segments_per_seq: the value passed to ``fused_attn``.
        cp_size: the size of the CP mesh axis (for the message).

    Raises:
        ValueError: the value is not 1.
    """
    if max_segments_per_seq != 1:
        raise ValueError(
            f"max_segments_per_seq={max_segments_per_seq} with a BSHD layout under context"
            f" parallelism (cp_size={cp_size}): must be 1; pack several sequences per row with a"
            " THD layout instead."
        )


def check_max_segments(max_segments_per_seq, *, name: str = "max_segments_per_seq") -> int:
    """``max_segments_per_seq`` is a positive int. Returns it as an int.

    Why: TE sizes its bincounts and cuDNN's segment count with it; 0 fails inside JAX with a
    zero-size reduction, and a float cannot be a static argument.

    Args:
        max_segments_per_seq: the value passed to ``fused_attn`` or the validator.
        name: how the caller's user spells the parameter (``"--max-segments"``).

    Returns:
        ``max_segments_per_seq`` as an int.

    Raises:
        ValueError: not a positive int (``bool`` refused).
    """
    if not _is_int(max_segments_per_seq) or max_segments_per_seq < 1:
        raise ValueError(
            f"{name}={max_segments_per_seq!r} must be a positive int (the largest segment id in"
            " any row, e.g. 1 for one sequence per row)."
        )
    return int(max_segments_per_seq)


def check_segment_ids_within(top_id: int, max_segments_per_seq: int, *, row: int) -> None:
    """Every segment id of a THD row is at most ``max_segments_per_seq``.

    Why: TE counts segments with ``bincount(length=max_segments_per_seq+1)``, so larger ids
    are dropped silently and their tokens treated as padding (output 0).

    Args:
        top_id: the largest segment id in the row.
        max_segments_per_seq: the value passed to ``fused_attn``.
        row: the batch row (for the message).

    Raises:
        ValueError: ``top_id > max_segments_per_seq``; the last sentence is the fix.
    """
    if top_id > max_segments_per_seq:
        raise ValueError(
            f"segment_ids row {row} uses id {top_id} > max_segments_per_seq={max_segments_per_seq};"
            " TE drops such tokens silently (treats them as padding). Pass"
            f" max_segments_per_seq>={top_id}."
        )


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def check_gqa_heads(
    num_q_heads: int, num_kv_heads: int, name: str = "num_kv_heads", *, q_name: str = "num_q_heads"
) -> int:
    """The KV head count divides the query head count (GQA). Returns the group size.

    Why: GQA maps query head h to KV head ``h // (num_q_heads / num_kv_heads)``; a remainder
    has no meaning, and kernels broadcast or fail obscurely.

    Args:
        num_q_heads: query heads.
        num_kv_heads: key/value heads.
        name: how the caller's user spells the KV head count (``"--kv-heads"``).
        q_name: how the caller's user spells the query head count (``"--q-heads"``).

    Returns:
        The group size, ``num_q_heads // num_kv_heads``.

    Raises:
        ValueError: ``num_kv_heads < 1`` or it does not divide ``num_q_heads``.
    """
    if num_kv_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(
            f"{name}={num_kv_heads} does not divide {q_name}={num_q_heads}; GQA maps query head h"
            " to KV head h // (q_heads/kv_heads), so every KV head serves the same number of query"
            f" heads: pick a KV head count among {_divisors(num_q_heads)}."
        )
    return num_q_heads // num_kv_heads


def check_ulysses_heads(num_q_heads: int, num_kv_heads: int, cp_size: int) -> None:
    """Ulysses (all-to-all) needs query and KV head counts divisible by ``cp_size``.

    Why: the all-to-all swaps the sharded axis from sequence to heads, giving each rank
    ``heads / cp_size`` whole heads.

    Args:
        num_q_heads: query heads.
        num_kv_heads: key/value heads.
        cp_size: the size of the CP mesh axis.

    Raises:
        ValueError: the first head count (query, then KV) that ``cp_size`` does not divide.
    """
    for name, heads in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads)):
        if heads % cp_size:
            raise ValueError(
                f"{name}={heads} is not divisible by cp_size={cp_size}: Ulysses all-to-all gives"
                f" each rank {name}/cp_size whole heads. Use Ring or AllGather, or a cp_size that"
                f" divides {heads}."
            )


def check_te_dtype(
    dtype,
    *,
    name: str = "qkv dtype",
    fix: str = "cast q/k/v with .astype(jnp.bfloat16)",
    allow_fp32: bool = False,
) -> None:
    """TE's fused attention takes float16 or bfloat16 q/k/v (fp32 refused).

    Why: cuDNN's fused attention has no fp32 kernel, and the CPU stand-in for it refuses
    what cuDNN refuses; TE shows the reason as ``Unsupported backend: <reason>``.

    Args:
        dtype: a dtype, a dtype name (``"float32"``) or TE's ``DType`` member (``kFloat32``).
        name: how the caller's user spells the setting (``"--dtype"``).
        fix: the fix the caller's user can apply.
        allow_fp32: accept float32 too (the stand-in's opt-in for layout checks).

    Raises:
        ValueError: the dtype is neither float16 nor bfloat16 (nor an allowed float32).
    """
    shown = getattr(dtype, "name", None)
    if not isinstance(shown, str):
        try:
            shown = np.dtype(dtype).name
        except TypeError:
            shown = str(dtype)
    key = shown.lower()
    if key in _TE_DTYPES or (allow_fp32 and key in ("float32", "kfloat32", "fp32")):
        return
    raise ValueError(
        f"{name} {shown}: cuDNN fused attention (and this CPU stand-in for it) takes float16 or"
        f" bfloat16; {fix}"
    )
