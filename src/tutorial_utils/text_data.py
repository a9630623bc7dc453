"""Real text packed into THD batches for (context-parallel) language-model training.

A model trained on random tokens cannot show that packing, reordering and sharding keep the
*meaning* of a batch, so this packs real English text (CPython's bundled ``pydoc_data``
topics: nothing is downloaded) with the segment ids and positions TE's THD attention reads.
"""

from __future__ import annotations

import dataclasses
from pydoc_data.topics import topics

import numpy as np

from .inputs import pack_segments
from .reorder import ReorderStrategy, reorder_causal_load_balancing
from .reorder import inverse_reorder_causal_load_balancing as _undo_reorder
from .validation import first_violation, reorder_mismatch, validate_packed_inputs

__all__ = [
    "VOCAB_SIZE",
    "PackedBatch",
    "load_documents",
    "encode",
    "decode",
    "pack_documents",
    "make_batches",
    "reorder_for_cp",
    "check_batch_for_mesh",
    "check_shifted_targets",
]

VOCAB_SIZE = 256  # one token per byte: no tokenizer to download, every text encodable
FIELDS = ("tokens", "targets", "loss_mask", "segment_ids", "segment_pos")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int.")
    return int(value)


def load_documents(max_docs: int | None = None) -> list[bytes]:
    """CPython's documentation topics, UTF-8 encoded, sorted by topic name.

    Real English text that ships with every Python, so the tutorial downloads nothing.

    Args:
        max_docs: Keep only the first ``max_docs`` topics; ``None`` keeps all.

    Returns:
        A list of documents as bytes.

    Raises:
        ValueError: If ``max_docs`` is given and is not a positive int.
    """
    if max_docs is not None:
        _positive_int("max_docs", max_docs)
    return [topics[key].encode("utf-8") for key in sorted(topics)][:max_docs]


def encode(text: str | bytes) -> np.ndarray:
    """Byte-level tokens: the UTF-8 bytes of ``text`` as int32 values 0..255.

    One token per byte needs no tokenizer to download and encodes every text
    (``VOCAB_SIZE`` is 256).

    Args:
        text: A string (encoded as UTF-8) or bytes.

    Returns:
        1-D int32 NumPy array of token ids.

    Raises:
        ValueError: If ``text`` is neither str nor bytes.
    """
    if isinstance(text, str):
        text = text.encode("utf-8")
    if not isinstance(text, (bytes, bytearray)):
        raise ValueError(
            f"text must be str or bytes, got {type(text).__name__}; decode or join it first."
        )
    return np.frombuffer(bytes(text), np.uint8).astype(np.int32)


def decode(ids) -> str:
    """Inverse of :func:`encode`: token ids back to text.

    Lets a page show what a batch (or a model's output) says.

    Args:
        ids: Integer token ids in ``0..VOCAB_SIZE - 1``, any array-like.

    Returns:
        The decoded string; bytes that are not valid UTF-8 become U+FFFD.

    Raises:
        ValueError: If ``ids`` are not integers in ``0..VOCAB_SIZE - 1``.
    """
    ids = np.asarray(ids)
    if ids.size and (
        not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0 or ids.max() >= VOCAB_SIZE
    ):
        raise ValueError(
            f"ids must be integers in 0..{VOCAB_SIZE - 1} (bytes), got dtype "
            f"{ids.dtype}, range {ids.min()}..{ids.max()}; pass encode()'s tokens."
        )
    return ids.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


@dataclasses.dataclass(frozen=True)
class PackedBatch:
    """Five ``[batch, seq_len]`` int32 NumPy arrays and the order they are in.

    Context parallelism reorders the sequence axis and all five arrays must move with the
    same permutation, so :func:`reorder_for_cp` reorders them together and records what it
    did here; :func:`check_batch_for_mesh` refuses a batch striped for a different mesh.

    Attributes:
        tokens: Input token ids.
        targets: ``targets[t]`` is the token after ``t`` in the same segment (0 where none).
        loss_mask: 1 exactly where such a target exists.
        segment_ids: Segment id of each token (0 = padding).
        segment_pos: Position of each token inside its segment.
        max_segments_per_seq: Most segments a row may hold (TE's ``max_segments_per_seq``).
        cp_size: CP size the arrays are striped for; 1 is the natural order.
        stripe_size: Stripe size of that reorder; ``None`` in the natural order.

    Raises:
        ValueError: If the five arrays do not share one 2-D shape.
    """

    tokens: np.ndarray
    targets: np.ndarray
    loss_mask: np.ndarray
    segment_ids: np.ndarray
    segment_pos: np.ndarray
    max_segments_per_seq: int
    cp_size: int = 1
    stripe_size: int | None = None

    def __post_init__(self):
        shape = np.shape(self.tokens)
        for name in FIELDS:
            if len(shape) != 2 or np.shape(getattr(self, name)) != shape:
                raise ValueError(
                    f"{name} has shape {np.shape(getattr(self, name))}, tokens "
                    f"{shape}; all five arrays must share one [batch, seq_len]."
                )

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The five arrays in the order the model's step takes them.

        Returns:
            ``(tokens, targets, loss_mask, segment_ids, segment_pos)``.
        """
        return tuple(getattr(self, name) for name in FIELDS)


def _pieces(
    docs, seq_len, max_segments_per_seq, segment_len, align, by_paragraph=False
) -> list[np.ndarray]:
    """Every document (or, ``by_paragraph``, every paragraph) cut into pieces, one segment each.

    A piece has at most ``segment_len`` tokens.
    """
    for name, value in (
        ("seq_len", seq_len),
        ("align", align),
        ("max_segments_per_seq", max_segments_per_seq),
    ):
        _positive_int(name, value)
    if segment_len is None:
        segment_len = seq_len // max_segments_per_seq
    if (
        isinstance(segment_len, bool)
        or not isinstance(segment_len, (int, np.integer))
        or not 1 <= segment_len <= seq_len
    ):
        raise ValueError(
            f"segment_len={segment_len!r} must be an int in 1..seq_len={seq_len} "
            "(default: seq_len // max_segments_per_seq)."
        )
    if not isinstance(by_paragraph, bool):
        raise ValueError(f"by_paragraph={by_paragraph!r} must be True or False.")
    texts = [encode(doc) for doc in docs]
    if by_paragraph:  # paragraphs end at a blank line; their lengths vary like real documents
        texts = [
            encode(par)
            for doc in docs
            for par in (doc.encode("utf-8") if isinstance(doc, str) else doc).split(b"\n\n")
            if par.strip()
        ]
    pieces = [ids[i : i + segment_len] for ids in texts for i in range(0, len(ids), segment_len)]
    if not pieces:
        raise ValueError(
            f"docs={docs!r:.60} holds no text; pass non-empty documents, e.g. load_documents()."
        )
    return pieces


def _pack(pieces, cursor, *, batch, seq_len, max_segments_per_seq, align, cycle):
    """Fill ``batch`` rows from ``pieces[cursor:]``; return the batch and the new cursor."""
    rows = []
    for b in range(_positive_int("batch", batch)):
        row, start = [], 0
        while len(row) < max_segments_per_seq:
            if cursor == len(pieces):
                if not cycle:
                    raise ValueError(
                        f"docs: the documents ({len(pieces)} pieces) run out in "
                        f"row {b} of batch={batch}; pass more documents, or a "
                        "smaller batch or seq_len."
                    )
                cursor = 0
            if start + len(pieces[cursor]) > seq_len:
                break  # the piece starts the next row
            row.append(pieces[cursor])
            start += -(-len(pieces[cursor]) // align) * align  # pack_segments' slot rule
            cursor += 1
        rows.append(row)
    ids, pos = pack_segments([[len(p) for p in row] for row in rows], seq_len, align=align)
    tokens = np.zeros_like(ids)
    for b, row in enumerate(rows):
        for s, piece in enumerate(row):
            tokens[b, ids[b] == s + 1] = piece
    has_next = (ids[:, :-1] > 0) & (ids[:, 1:] == ids[:, :-1])  # t+1 is in t's segment
    targets, loss_mask = np.zeros_like(tokens), np.zeros_like(tokens)
    targets[:, :-1] = np.where(has_next, tokens[:, 1:], 0)
    loss_mask[:, :-1] = has_next
    packed = PackedBatch(tokens, targets, loss_mask, ids, pos, max_segments_per_seq)
    return packed, cursor


def pack_documents(
    docs,
    *,
    batch: int,
    seq_len: int,
    max_segments_per_seq: int,
    segment_len: int | None = None,
    align: int = 1,
    by_paragraph: bool = False,
) -> PackedBatch:
    """Pack ``docs`` into a natural-order :class:`PackedBatch`.

    Documents are cut into segments and placed left to right in document order, at most
    ``max_segments_per_seq`` per row; a segment that does not fit starts the next row.

    Args:
        docs: Documents as str or bytes, e.g. :func:`load_documents`'s.
        batch: Number of rows.
        seq_len: Tokens per row.
        max_segments_per_seq: Most segments per row.
        segment_len: Longest segment in tokens; default ``seq_len // max_segments_per_seq``.
        align: Each segment starts at a multiple of ``align``; ``cp_size * stripe_size`` is
            the safe layout for THD AllGather (:func:`reorder_for_cp` checks the one you
            chose).
        by_paragraph: Treat each paragraph (text between blank lines) as a document of its
            own: segments of many lengths, and rows that end in padding.

    Returns:
        The packed batch, in natural order.

    Raises:
        ValueError: If a size is invalid, ``docs`` holds no text, or the documents run out
            before the batch is full.
    """
    pieces = _pieces(docs, seq_len, max_segments_per_seq, segment_len, align, by_paragraph)
    return _pack(
        pieces,
        0,
        batch=batch,
        seq_len=seq_len,
        align=align,
        cycle=False,
        max_segments_per_seq=max_segments_per_seq,
    )[0]


def make_batches(
    docs,
    steps: int,
    *,
    batch: int,
    seq_len: int,
    max_segments_per_seq: int,
    segment_len: int | None = None,
    align: int = 1,
    by_paragraph: bool = False,
) -> list[PackedBatch]:
    """Consecutive batches as :func:`pack_documents` makes them, for a training loop.

    Starts over at the first document when the documents run out, so any number of steps
    can be drawn from a small corpus.

    Args:
        docs: Documents as str or bytes.
        steps: Number of batches.
        batch: Rows per batch.
        seq_len: Tokens per row.
        max_segments_per_seq: Most segments per row.
        segment_len: Longest segment in tokens; default ``seq_len // max_segments_per_seq``.
        align: Each segment starts at a multiple of ``align``.
        by_paragraph: Treat each paragraph as a document of its own.

    Returns:
        A list of ``steps`` natural-order batches.

    Raises:
        ValueError: If a size is invalid or ``docs`` holds no text.
    """
    pieces = _pieces(docs, seq_len, max_segments_per_seq, segment_len, align, by_paragraph)
    out, cursor = [], 0
    for _ in range(_positive_int("steps", steps)):
        packed, cursor = _pack(
            pieces,
            cursor,
            batch=batch,
            seq_len=seq_len,
            align=align,
            max_segments_per_seq=max_segments_per_seq,
            cycle=True,
        )
        out.append(packed)
    return out


def reorder_for_cp(
    batch: PackedBatch,
    *,
    cp_size: int,
    stripe_size: int | None,
    strategy=None,
    window_size=None,
) -> PackedBatch:
    """All five arrays striped for ``cp_size`` devices, once TE can handle them.

    The layout is checked first with
    :func:`~tutorial_utils.validation.validate_packed_inputs`, because TE computes
    some layouts wrongly without an error. That check reads the natural order, so a
    batch that is already reordered is refused, not striped twice.

    Args:
        batch: A natural-order batch.
        cp_size: Number of devices on the CP mesh axis.
        stripe_size: Stripe size of the striped reorder (``None`` means 1).
        strategy: Optional CP strategy whose layout rules are checked too.
        window_size: Optional sliding window whose rules are checked too.

    Returns:
        A copy of ``batch`` with all five arrays striped, and ``cp_size`` and
        ``stripe_size`` recorded.

    Raises:
        ValueError: If ``batch`` is already reordered, the validator refuses its
            layout, or its targets are not its tokens shifted inside each document
            (:func:`check_shifted_targets`; ``targets == tokens`` included).
    """
    cp_size = _positive_int("cp_size", cp_size)
    if batch.cp_size != 1 or batch.stripe_size is not None:
        raise ValueError(
            f"batch is already reordered (cp_size={batch.cp_size}, stripe_size="
            f"{batch.stripe_size}); reorder the natural-order batch instead, or "
            "undo the reorder with inverse_reorder_causal_load_balancing first."
        )
    ids, pos = np.asarray(batch.segment_ids), np.asarray(batch.segment_pos)
    why = reorder_mismatch(ids, pos, cp_size=1, stripe_size=stripe_size)
    if why:  # labelled natural, but the arrays say otherwise (a hand-built batch)
        raise ValueError(
            f"batch is already reordered: {why.split(', but')[0]} although it "
            "is labelled cp_size=1; reorder the natural-order arrays instead."
        )
    validate_packed_inputs(
        ids,
        pos,
        max_segments_per_seq=batch.max_segments_per_seq,
        cp_size=cp_size,
        stripe_size=stripe_size,
        strategy=strategy,
        window_size=window_size,
    )
    check_shifted_targets(batch.tokens, batch.targets, ids, loss_mask=batch.loss_mask)
    stripe = 1 if stripe_size is None else stripe_size
    striped = {
        name: reorder_causal_load_balancing(
            np.asarray(getattr(batch, name)),
            strategy=ReorderStrategy.Striped,
            cp_size=cp_size,
            seq_dim=1,
            stripe_size=stripe,
        )
        for name in FIELDS
    }
    return dataclasses.replace(batch, **striped, cp_size=cp_size, stripe_size=stripe)


def check_batch_for_mesh(batch: PackedBatch, *, cp_size: int, stripe_size: int | None) -> None:
    """Check that ``batch`` is striped for a CP axis of ``cp_size`` devices.

    TE computes a batch striped for another CP size without an error, and wrongly. The arrays
    are checked first (a hand-built batch's labels may be wrong): undone for this mesh they
    must be a packed batch, which also catches positions that were not reordered with the
    ids. Then the labels.

    Args:
        batch: The batch about to be fed to the CP step.
        cp_size: Number of devices on the CP mesh axis; 1 expects the natural order.
        stripe_size: Stripe size the mesh's step expects (``None`` means 1).

    Returns:
        None.

    Raises:
        ValueError: If the arrays or the labels say the batch was reordered for another
            ``(cp_size, stripe_size)``, the ids and positions were not reordered together, or
            the targets are not the tokens shifted inside each document
            (:func:`check_shifted_targets`; ``targets == tokens`` included).
    """
    cp_size = _positive_int("cp_size", cp_size)
    # for cp_size=1 the stripe is irrelevant; the batch's own one recognises its reorder
    stripe = stripe_size if cp_size > 1 else stripe_size or batch.stripe_size
    why = reorder_mismatch(
        batch.segment_ids, batch.segment_pos, cp_size=cp_size, stripe_size=stripe
    )
    if why:
        raise ValueError(f"batch: {why}")
    # no CP size explains the layout: undone for this mesh it must still be a packed batch
    # (positions left in natural order while the ids were striped read as none of them)
    natural = [
        _undo_reorder(np.asarray(x), ReorderStrategy.Striped, cp_size, 1, stripe or 1)
        for x in (batch.segment_ids, batch.segment_pos)
    ]
    why = first_violation(*natural, max_segments_per_seq=batch.max_segments_per_seq)
    if why:
        raise ValueError(
            f"batch: undoing the reorder for cp_size={cp_size}, stripe_size="
            f"{stripe or 1} does not give a packed batch ({why}); reorder all five "
            "arrays together, positions included, with reorder_for_cp on the "
            "natural-order batch."
        )
    want = (1, None) if cp_size == 1 else (cp_size, stripe_size or 1)
    have = (batch.cp_size, batch.stripe_size if cp_size == 1 else batch.stripe_size or 1)
    if have != want:
        fix = (
            "use the natural-order batch"
            if cp_size == 1
            else (
                "reorder the natural-order "
                f"batch with reorder_for_cp(batch, cp_size={cp_size}, stripe_size={stripe_size})"
            )
        )
        raise ValueError(
            f"batch says it was reordered with (cp_size, stripe_size)={have}, but "
            f"the mesh needs {want} (cp_size={cp_size}); {fix}."
        )
    check_shifted_targets(
        batch.tokens,
        batch.targets,
        batch.segment_ids,
        loss_mask=batch.loss_mask,
        cp_size=cp_size,
        stripe_size=stripe,
    )


# ----------------------------------------------------------------------------- the shift check

_CANDIDATE_CP_SIZES = (2, 4, 8, 16, 32, 64)


def _split_segment(ids):
    """Where a segment resumes after another run, as ``(row, segment, token)``, or ``None``."""
    starts = ids != 0
    starts[:, 1:] &= ids[:, 1:] != ids[:, :-1]
    seen = set()
    for b, t in zip(*(x.tolist() for x in np.nonzero(starts))):
        if (b, int(ids[b, t])) in seen:
            return b, int(ids[b, t]), t
        seen.add((b, int(ids[b, t])))
    return None


def _counted(arrays):
    """Tokens that count in the loss: inside a document, and under a non-zero loss mask."""
    counts = arrays["segment_ids"] != 0
    if "loss_mask" in arrays:
        counts &= arrays["loss_mask"] != 0
    return counts


def _shift_errors(arrays):
    """Counted tokens with a wrong target, as boolean ``[batch, seq - 1]`` arrays.

    ``not_shifted``: the next token is in the token's document but is not its target.
    ``crossing``: the token ends its document and its target is the next document's first token.
    """
    tok, tgt, ids = arrays["tokens"], arrays["targets"], arrays["segment_ids"]
    counted = _counted(arrays)[:, :-1]
    same = ids[:, 1:] == ids[:, :-1]
    is_next = tgt[:, :-1] == tok[:, 1:]
    return counted & same & ~is_next, counted & ~same & (ids[:, 1:] != 0) & is_next


def _natural_order_of(arrays):
    """The ``(cp_size, stripe_size)`` whose undoing makes ``arrays`` a well-shifted batch.

    ``(1, 1)`` when they are one already (contiguous documents, shifted targets); ``None`` when
    no striped reorder explains them.
    """
    seq = arrays["tokens"].shape[1]
    candidates = [(1, 1)] + [
        (cp, 2**k)
        for cp in _CANDIDATE_CP_SIZES
        for k in range(seq.bit_length())
        if cp * 2**k <= seq
    ]
    for cp, stripe in candidates:
        if seq % (cp * stripe):
            continue
        undone = {
            name: _undo_reorder(x, ReorderStrategy.Striped, cp, 1, stripe)
            for name, x in arrays.items()
        }
        if _split_segment(undone["segment_ids"]) is None and not any(
            e.any() for e in _shift_errors(undone)
        ):
            return cp, stripe
    return None


def check_shifted_targets(
    tokens,
    targets,
    segment_ids,
    *,
    loss_mask=None,
    cp_size: int = 1,
    stripe_size: int | None = None,
    reorder_strategy=ReorderStrategy.Striped,
) -> None:
    """Refuse a batch whose targets are not its tokens shifted left by one inside each document.

    A language model's target at token ``t`` is the next token of the same document,
    ``targets[b, t] == tokens[b, t + 1]``. The shift belongs in the data pipeline, on the
    natural-order batch, before the reorder for CP: a model that shifts its own inputs, or a
    pipeline that shifts after the reorder, pairs tokens of different stripes, and TE raises no
    error. Every token that counts in the loss is checked (``loss_mask != 0``; without a mask,
    every token of a document). A document's last token has no next token in the row, so its
    target is free (masked, or the true next token with a BOS-prefixed convention), except that
    it must not be the next document's first token. Padding (segment id 0) is not checked.

    Args:
        tokens: ``[batch, seq]`` integer input tokens.
        targets: ``[batch, seq]`` integer targets.
        segment_ids: ``[batch, seq]`` segment ids (0 = padding), each document one contiguous
            run in the natural order.
        loss_mask: Optional ``[batch, seq]`` loss weights; tokens where it is 0 are not checked.
        cp_size: The CP size a reordered batch was reordered for; 1 for the natural order. The
            reorder is undone before the check.
        stripe_size: The stripe size of that reorder (``None`` means 1).
        reorder_strategy: The :class:`~tutorial_utils.reorder.ReorderStrategy` of that reorder.

    Returns:
        None.

    Raises:
        ValueError: Naming the array, the token and the fix: if the targets equal the tokens
            (the shift was not done), a target is not the next token of its document, a
            document's last target is the next document's first token, the shift was done after
            the reorder, or a segment is not one contiguous run (a reordered batch checked as
            natural).
    """
    given = {"tokens": tokens, "targets": targets, "segment_ids": segment_ids}
    if loss_mask is not None:
        given["loss_mask"] = loss_mask
    given = {name: np.asarray(x) for name, x in given.items()}
    shape = given["tokens"].shape
    for name, x in given.items():
        if x.ndim != 2 or x.shape != shape:
            raise ValueError(
                f"{name} has shape {x.shape}, tokens {shape}; pass [batch, seq] arrays of one"
                " shape (one row? add a batch axis with x[None])."
            )
        if name != "loss_mask" and not np.issubdtype(x.dtype, np.integer):
            raise ValueError(
                f"{name} has dtype {x.dtype}, not an integer type; pass it as integer ids"
                f" ({name}.astype(np.int32))."
            )
    cp_size = _positive_int("cp_size", cp_size)
    arrays, where = given, ""
    if cp_size > 1:
        arrays = {
            name: _undo_reorder(x, reorder_strategy, cp_size, 1, stripe_size)
            for name, x in given.items()
        }
        where = (
            f", in the natural order after undoing the reorder for cp_size={cp_size},"
            f" stripe_size={stripe_size or 1}"
        )
    split = _split_segment(arrays["segment_ids"])
    if split is not None:
        fits = _natural_order_of(given)
        looks = (
            ""
            if fits is None or fits[0] == cp_size
            else ", and the arrays as given are in the natural order (pass cp_size=1)"
            if fits[0] == 1
            else f", so the batch looks reordered for cp_size={fits[0]}, stripe_size={fits[1]}"
        )
        raise ValueError(
            f"segment_ids row {split[0]}: segment {split[1]} is not one contiguous run of tokens"
            f" (it resumes at token {split[2]}{where}){looks}; documents must be contiguous runs"
            " in the natural order: pass the natural-order batch, or a reordered one with the"
            " cp_size and stripe_size it was reordered with."
        )
    not_shifted, crossing = _shift_errors(arrays)
    if not (not_shifted.any() or crossing.any()):
        return
    tok, tgt, ids = arrays["tokens"], arrays["targets"], arrays["segment_ids"]
    counts = _counted(arrays)
    fix = (
        "shift in the pipeline, on the natural-order batch before any reorder for CP:"
        " targets[:, :-1] = tokens[:, 1:] inside each document, with loss_mask 0 at each"
        " document's last token"
    )
    if np.array_equal(tgt[counts], tok[counts]):
        raise ValueError(
            "targets equal tokens: the shift was not done (targets[b, t] == tokens[b, t] at"
            f" every token that counts in the loss{where}). targets[b, t] must be"
            f" tokens[b, t + 1], the next token of the same document: {fix}. A model that"
            " shifts its own inputs shifts the reordered rows under CP."
        )
    b, t = min(tuple(np.argwhere(e)[0].tolist()) for e in (not_shifted, crossing) if e.any())
    found = f"targets[{b}, {t}]={int(tgt[b, t])}"
    following = f"tokens[{b}, {t + 1}]={int(tok[b, t + 1])}"
    if cp_size > 1 and not any(e.any() for e in _shift_errors(given)):
        raise ValueError(
            "targets are the reordered tokens shifted: the shift was done after the reorder for"
            f" cp_size={cp_size}, stripe_size={stripe_size or 1}, which pairs each token with a"
            f" token of another stripe (first wrong in the natural order: {found}, but the next"
            f" token is {following}). Shift the natural-order batch first, then reorder tokens,"
            " targets, loss_mask, segment_ids and segment_pos together (reorder_for_cp does)."
        )
    if not_shifted[b, t]:
        raise ValueError(
            f"{found} but the next token of its document (segment {int(ids[b, t])}) is"
            f" {following}{where}: targets must be the tokens shifted left by one inside each"
            f" document; {fix}."
        )
    mask_fix = (
        f"set loss_mask[{b}, {t}] to 0 (loss_mask 0 at each document's last token)"
        if loss_mask is not None
        else "pass loss_mask with 0 at each document's last token, or give those tokens an"
        " ignore target (e.g. -100) that the loss skips"
    )
    raise ValueError(
        f"{found} at the last token of segment {int(ids[b, t])} is {following}, the first token"
        f" of segment {int(ids[b, t + 1])}{where}: the shift crosses a document boundary. A"
        f" document's last token has no next token: {mask_fix}."
    )
