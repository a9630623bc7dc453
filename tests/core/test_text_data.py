"""The text pipeline: byte tokens, packing invariants, CP reordering and the mesh check."""

import dataclasses

import numpy as np
import pytest

from tutorial_utils.reorder import ReorderStrategy, inverse_reorder_causal_load_balancing
from tutorial_utils.text_data import (
    VOCAB_SIZE,
    check_batch_for_mesh,
    decode,
    encode,
    load_documents,
    make_batches,
    pack_documents,
    reorder_for_cp,
)
from tutorial_utils.validation import validate_packed_inputs

FIELDS = ("tokens", "targets", "loss_mask", "segment_ids", "segment_pos")


@pytest.fixture(scope="module")
def docs():
    return load_documents(max_docs=30)


@pytest.fixture(scope="module")
def natural(docs):
    # 13-token segments in 16-token slots: every segment is followed by 3 padding tokens
    return pack_documents(
        docs, batch=4, seq_len=64, max_segments_per_seq=4, segment_len=13, align=4
    )


def test_encode_decode_round_trip_non_ascii():
    text = "Grüße, 世界 — naïve ☃ café"
    ids = encode(text)
    assert ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < VOCAB_SIZE == 256
    assert len(ids) == len(text.encode("utf-8")) > len(text)  # one token per byte
    assert decode(ids) == text
    assert np.array_equal(encode(text.encode("utf-8")), ids)
    assert (
        decode(encode("世")[:2]) == "\ufffd"
    )  # a cut multi-byte character is replaced, not raised
    with pytest.raises(ValueError, match=r"ids must be integers in 0\.\.255"):
        decode([72, 256])
    with pytest.raises(ValueError, match="text must be str or bytes, got int"):
        encode(42)


def test_documents_are_real_text_in_a_fixed_order():
    first = load_documents(max_docs=3)
    assert first == load_documents()[:3] and all(
        isinstance(d, bytes) and len(d) > 100 for d in first
    )
    assert decode(encode(first[0])).startswith('The "assert" statement')
    with pytest.raises(ValueError, match=r"max_docs=0 must be a positive int"):
        load_documents(max_docs=0)


def test_packing_invariants(natural, docs):
    ids, pos, tokens, targets, mask = (
        natural.segment_ids,
        natural.segment_pos,
        natural.tokens,
        natural.targets,
        natural.loss_mask,
    )
    assert all(
        getattr(natural, f).shape == (4, 64) and getattr(natural, f).dtype == np.int32
        for f in FIELDS
    )
    assert (natural.cp_size, natural.stripe_size, natural.max_segments_per_seq) == (1, None, 4)
    validate_packed_inputs(ids, pos, max_segments_per_seq=4)
    assert (ids == 0).sum() == 4 * 4 * 3  # the padding the slots leave
    for b in range(4):
        for t in range(63):
            same_segment = ids[b, t] > 0 and ids[b, t + 1] == ids[b, t]
            assert mask[b, t] == same_segment
            assert targets[b, t] == (tokens[b, t + 1] if same_segment else 0)
        assert mask[b, 63] == 0
    assert not mask[ids == 0].any() and not tokens[ids == 0].any()
    for b, s in zip(
        *np.nonzero(ids[:, :-1] != ids[:, 1:])
    ):  # the last token of a segment has no target
        if ids[b, s] > 0:
            assert mask[b, s] == 0
    assert mask.sum() == 4 * 4 * 12  # 13 tokens each, 12 targets
    # the text is there, in document order: the first row starts with the first document
    row0 = "".join(decode(tokens[0, ids[0] == s]) for s in range(1, 5))
    assert docs[0].decode().startswith(row0)


def test_packing_rejects_bad_input_and_running_out(docs):
    with pytest.raises(ValueError, match=r"run out in row 0 of batch=2.*more documents"):
        pack_documents([b"only a few bytes"], batch=2, seq_len=32, max_segments_per_seq=2)
    with pytest.raises(ValueError, match=r"seq_len=0 must be a positive int"):
        pack_documents(docs, batch=1, seq_len=0, max_segments_per_seq=1)
    with pytest.raises(ValueError, match=r"segment_len=65 must be an int in 1\.\.seq_len=64"):
        pack_documents(docs, batch=1, seq_len=64, max_segments_per_seq=1, segment_len=65)
    with pytest.raises(ValueError, match=r"docs=.* holds no text"):
        pack_documents([b""], batch=1, seq_len=64, max_segments_per_seq=1)


def test_make_batches_is_deterministic_and_starts_over(docs):
    one = make_batches(docs[:2], 4, batch=2, seq_len=64, max_segments_per_seq=2, segment_len=30)
    two = make_batches(docs[:2], 4, batch=2, seq_len=64, max_segments_per_seq=2, segment_len=30)
    assert all(np.array_equal(a.tokens, b.tokens) for a, b in zip(one, two))
    assert not np.array_equal(one[0].tokens, one[1].tokens)
    alone = pack_documents(docs[:2], batch=1, seq_len=64, max_segments_per_seq=2, segment_len=30)
    assert np.array_equal(one[0].tokens[0], alone.tokens[0])
    cycled = make_batches([b"abcdefgh"], 2, batch=2, seq_len=8, max_segments_per_seq=1)
    assert all(decode(b.tokens[r]) == "abcdefgh" for b in cycled for r in range(2))


@pytest.mark.parametrize("cp_size, stripe_size", [(4, 1), (4, 2), (2, 4)])
def test_reorder_moves_all_five_arrays_together(natural, cp_size, stripe_size):
    striped = reorder_for_cp(
        natural, cp_size=cp_size, stripe_size=stripe_size, strategy="allgather"
    )
    assert (striped.cp_size, striped.stripe_size) == (cp_size, stripe_size)
    assert not np.array_equal(striped.tokens, natural.tokens)
    for field in FIELDS:
        back = inverse_reorder_causal_load_balancing(
            getattr(striped, field), ReorderStrategy.Striped, cp_size, 1, stripe_size
        )
        assert np.array_equal(back, getattr(natural, field)), field
    # token t's target is still the token after it: the pairs survive the permutation
    pairs = lambda b: sorted(zip(b.tokens[b.loss_mask == 1], b.targets[b.loss_mask == 1]))  # noqa: E731
    assert pairs(striped) == pairs(natural)


def test_reorder_checks_the_layout_first(natural):
    with pytest.raises(
        ValueError, match=r"window_size=\(1, 0\) with strategy='ring' and cp_size=4"
    ):
        reorder_for_cp(natural, cp_size=4, stripe_size=1, strategy="ring", window_size=(1, 0))
    with pytest.raises(ValueError, match=r"stripe_size=2 with strategy='ring'"):
        reorder_for_cp(natural, cp_size=4, stripe_size=2, strategy="ring")
    with pytest.raises(ValueError, match=r"not divisible by cp_size\*stripe_size=4\*32=128"):
        reorder_for_cp(natural, cp_size=4, stripe_size=32)


def test_reordering_twice_is_refused(natural):
    striped = reorder_for_cp(natural, cp_size=4, stripe_size=1)
    with pytest.raises(ValueError, match=r"already reordered \(cp_size=4, stripe_size=1\)"):
        reorder_for_cp(striped, cp_size=4, stripe_size=1)
    relabelled = dataclasses.replace(striped, cp_size=1, stripe_size=None)  # the arrays still tell
    with pytest.raises(
        ValueError,
        match=r"already reordered: the segment ids/positions look reordered for "
        r"cp_size=4 although",
    ):
        reorder_for_cp(relabelled, cp_size=2, stripe_size=1)


def test_check_batch_for_mesh(natural):
    check_batch_for_mesh(natural, cp_size=1, stripe_size=None)
    with pytest.raises(ValueError, match=r"not reordered, but the mesh's CP axis has 4 devices"):
        check_batch_for_mesh(natural, cp_size=4, stripe_size=2)
    for_two = reorder_for_cp(natural, cp_size=2, stripe_size=2)
    with pytest.raises(
        ValueError, match=r"reordered for cp_size=2, but the mesh's CP axis has 4 devices"
    ):
        check_batch_for_mesh(for_two, cp_size=4, stripe_size=2)
    for_four = reorder_for_cp(natural, cp_size=4, stripe_size=2)
    check_batch_for_mesh(for_four, cp_size=4, stripe_size=2)
    with pytest.raises(
        ValueError, match=r"reordered for cp_size=4, but the mesh's CP axis has 1 devices"
    ):
        check_batch_for_mesh(for_four, cp_size=1, stripe_size=None)
    # arrays built by hand with metadata that lies: the arrays are checked, not only the labels
    lying = dataclasses.replace(natural, cp_size=4, stripe_size=2)
    with pytest.raises(ValueError, match=r"not reordered, but the mesh's CP axis has 4 devices"):
        check_batch_for_mesh(lying, cp_size=4, stripe_size=2)
    unlabelled = dataclasses.replace(for_four, cp_size=1, stripe_size=None)
    with pytest.raises(
        ValueError, match=r"reordered with \(cp_size, stripe_size\)=\(1, 1\).*cp_size=4"
    ):
        check_batch_for_mesh(unlabelled, cp_size=4, stripe_size=2)
    # every array striped but the positions: no CP size explains it, and it is refused
    positions_left = dataclasses.replace(for_four, segment_pos=natural.segment_pos)
    with pytest.raises(
        ValueError,
        match=r"undoing the reorder for cp_size=4, stripe_size=2 does not give a packed "
        r"batch.*positions included",
    ):
        check_batch_for_mesh(positions_left, cp_size=4, stripe_size=2)


def test_paragraph_packing_gives_many_lengths_and_padding(docs):
    whole = make_batches(
        docs, 3, batch=4, seq_len=256, max_segments_per_seq=4, segment_len=96, align=8
    )
    paras = make_batches(
        docs,
        3,
        batch=4,
        seq_len=256,
        max_segments_per_seq=4,
        segment_len=96,
        align=8,
        by_paragraph=True,
    )

    def lengths(batches):
        return [
            int(np.sum(row == s))
            for b in batches
            for row in b.segment_ids
            for s in range(1, row.max() + 1)
        ]

    assert len(set(lengths(paras))) > 10 and len(set(lengths(whole))) < len(set(lengths(paras)))
    assert all((b.segment_ids == 0).any(axis=1).all() for b in paras)  # every row ends in padding
    text = decode(paras[0].tokens[0][paras[0].segment_ids[0] == 1])
    assert (
        docs[0].decode().startswith(text) and "\n\n" not in text
    )  # a paragraph, not a whole document
    for b in paras:
        validate_packed_inputs(b.segment_ids, b.segment_pos, max_segments_per_seq=4)
    with pytest.raises(ValueError, match=r"by_paragraph='yes' must be True or False"):
        pack_documents(docs, batch=1, seq_len=64, max_segments_per_seq=1, by_paragraph="yes")
