"""``check_shifted_targets``: targets are the tokens shifted left by one inside each document.

Both ways: correct batches pass (natural order, reordered with the reorder's arguments, a
BOS-prefixed convention, an ignore index without a loss mask), and each broken pipeline is
refused with its own message (no shift, a shift by two, a shift across a document boundary, a
shift done after the reorder, a reordered batch checked as natural). ``reorder_for_cp`` and
``check_batch_for_mesh`` refuse ``targets == tokens``.
"""

import dataclasses

import numpy as np
import pytest

from tutorial_utils.reorder import ReorderStrategy, reorder_causal_load_balancing
from tutorial_utils.text_data import (
    check_batch_for_mesh,
    check_shifted_targets,
    load_documents,
    pack_documents,
    reorder_for_cp,
)

CP, STRIPE = 4, 2


@pytest.fixture(scope="module")
def natural():
    # 14-token documents in 14-token slots: documents touch, so a shift can cross a boundary
    return pack_documents(
        load_documents(max_docs=20), batch=2, seq_len=64, max_segments_per_seq=4, segment_len=14
    )


@pytest.fixture(scope="module")
def striped(natural):
    return reorder_for_cp(natural, cp_size=CP, stripe_size=STRIPE)


def _check(batch, **kwargs):
    check_shifted_targets(
        batch.tokens, batch.targets, batch.segment_ids, loss_mask=batch.loss_mask, **kwargs
    )


def _striped(x):
    return reorder_causal_load_balancing(x, ReorderStrategy.Striped, CP, 1, STRIPE)


# ----------------------------------------------------------------------------- correct batches pass


def test_correct_batches_pass(natural, striped):
    assert ((natural.segment_ids[:, 13] == 1) & (natural.segment_ids[:, 14] == 2)).all()  # touch
    _check(natural)
    _check(striped, cp_size=CP, stripe_size=STRIPE)
    check_batch_for_mesh(striped, cp_size=CP, stripe_size=STRIPE)
    # no loss mask: the last token of each document carries an ignore target
    ignore = np.where(natural.loss_mask == 1, natural.targets, -100)
    check_shifted_targets(natural.tokens, ignore, natural.segment_ids)
    # a BOS-prefixed convention: tokens = targets shifted right, 0 at each document's start;
    # every token of a document is trained on, its last one toward the document's true last token
    ids = natural.segment_ids
    starts = (ids != 0) & (np.pad(ids, ((0, 0), (1, 0)))[:, :-1] != ids)
    bos_tokens = np.where(starts, 0, np.pad(natural.tokens, ((0, 0), (1, 0)))[:, :-1])
    check_shifted_targets(bos_tokens, natural.tokens, ids, loss_mask=ids != 0)


def test_reordering_pipeline_still_passes(natural):
    for stripe in (1, 2, 4):
        batch = reorder_for_cp(natural, cp_size=2, stripe_size=stripe)
        check_batch_for_mesh(batch, cp_size=2, stripe_size=stripe)
        _check(batch, cp_size=2, stripe_size=stripe)


# ----------------------------------------------------------------------------- broken ones fail


def test_targets_equal_tokens_is_refused_with_its_own_message(natural, striped):
    message = r"^targets equal tokens: the shift was not done"
    with pytest.raises(ValueError, match=message):
        check_shifted_targets(natural.tokens, natural.tokens, natural.segment_ids)
    with pytest.raises(ValueError, match=message):
        _check(dataclasses.replace(striped, targets=striped.tokens), cp_size=CP, stripe_size=STRIPE)
    with pytest.raises(ValueError, match=message):
        reorder_for_cp(
            dataclasses.replace(natural, targets=natural.tokens), cp_size=CP, stripe_size=1
        )
    with pytest.raises(ValueError, match=message):
        check_batch_for_mesh(
            dataclasses.replace(striped, targets=striped.tokens), cp_size=CP, stripe_size=STRIPE
        )
    with pytest.raises(ValueError, match=message):
        check_batch_for_mesh(
            dataclasses.replace(natural, targets=natural.tokens), cp_size=1, stripe_size=None
        )


def test_a_target_that_is_not_the_next_token_is_refused(natural):
    by_two = natural.targets.copy()
    by_two[:, :-1] = natural.targets[:, 1:]  # shifted by two
    t0, t1 = natural.tokens[0, 1], by_two[0, 0]
    with pytest.raises(
        ValueError,
        match=(
            rf"^targets\[0, 0\]={t1} but the next token of its document \(segment 1\) is"
            rf" tokens\[0, 1\]={t0}: targets must be the tokens shifted left by one inside each"
            r" document; shift in the pipeline"
        ),
    ):
        check_shifted_targets(
            natural.tokens, by_two, natural.segment_ids, loss_mask=natural.loss_mask
        )
    one_wrong = natural.targets.copy()
    one_wrong[1, 20] += 1
    with pytest.raises(ValueError, match=r"^targets\[1, 20\]=.* \(segment 2\) is tokens\[1, 21\]"):
        check_shifted_targets(
            natural.tokens, one_wrong, natural.segment_ids, loss_mask=natural.loss_mask
        )
    # a masked target is free
    one_wrong_masked = natural.loss_mask.copy()
    one_wrong_masked[1, 20] = 0
    check_shifted_targets(
        natural.tokens, one_wrong, natural.segment_ids, loss_mask=one_wrong_masked
    )


def test_a_shift_across_a_document_boundary_is_refused(natural):
    rolled = np.zeros_like(natural.tokens)
    rolled[:, :-1] = natural.tokens[:, 1:]  # the shift of a pipeline that ignores documents
    every_token = (natural.segment_ids != 0).astype(np.int32)
    with pytest.raises(
        ValueError,
        match=(
            r"^targets\[0, 13\]=\d+ at the last token of segment 1 is tokens\[0, 14\]=\d+, the"
            r" first token of segment 2: the shift crosses a document boundary\. A document's"
            r" last token has no next token: set loss_mask\[0, 13\] to 0"
        ),
    ):
        check_shifted_targets(natural.tokens, rolled, natural.segment_ids, loss_mask=every_token)
    with pytest.raises(
        ValueError, match=r"crosses a document boundary.*ignore target \(e\.g\. -100\)"
    ):
        check_shifted_targets(natural.tokens, rolled, natural.segment_ids)
    # with the boundary masked, the same targets are right
    check_shifted_targets(natural.tokens, rolled, natural.segment_ids, loss_mask=natural.loss_mask)


def test_a_shift_after_the_reorder_is_refused(natural):
    tokens, ids = _striped(natural.tokens), _striped(natural.segment_ids)
    same = (ids[:, 1:] == ids[:, :-1]) & (ids[:, :-1] != 0)  # next token of the striped row
    targets, loss_mask = np.zeros_like(tokens), np.zeros_like(tokens)
    targets[:, :-1], loss_mask[:, :-1] = np.where(same, tokens[:, 1:], 0), same
    with pytest.raises(
        ValueError,
        match=(
            r"^targets are the reordered tokens shifted: the shift was done after the reorder for"
            rf" cp_size={CP}, stripe_size={STRIPE}.*Shift the natural-order batch first"
        ),
    ):
        check_shifted_targets(
            tokens, targets, ids, loss_mask=loss_mask, cp_size=CP, stripe_size=STRIPE
        )
    # the same pipeline through a PackedBatch: check_batch_for_mesh refuses it
    shifted_late = dataclasses.replace(
        reorder_for_cp(natural, cp_size=CP, stripe_size=STRIPE),
        targets=targets,
        loss_mask=loss_mask,
    )
    with pytest.raises(ValueError, match=r"^targets are the reordered tokens shifted"):
        check_batch_for_mesh(shifted_late, cp_size=CP, stripe_size=STRIPE)


def test_reorder_arguments_that_do_not_match_are_named(natural, striped):
    with pytest.raises(
        ValueError,
        match=(
            r"^segment_ids row 0: segment 1 is not one contiguous run of tokens \(it resumes at"
            rf" token \d+\), so the batch looks reordered for cp_size={CP}, stripe_size={STRIPE};"
        ),
    ):
        _check(striped)  # a reordered batch checked as natural
    with pytest.raises(
        ValueError, match=r"and the arrays as given are in the natural order \(pass cp_size=1\)"
    ):
        _check(natural, cp_size=CP, stripe_size=STRIPE)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            dict(targets=np.zeros((2, 63), np.int32)),
            r"^targets has shape \(2, 63\), tokens \(2, 64\)",
        ),
        (dict(tokens=np.zeros((2, 64), np.float32)), r"^tokens has dtype float32, not an integer"),
        (dict(cp_size=0), r"^cp_size=0 must be a positive int"),
    ],
)
def test_bad_arguments_are_named(natural, change, message):
    args = dict(
        tokens=natural.tokens,
        targets=natural.targets,
        segment_ids=natural.segment_ids,
        loss_mask=natural.loss_mask,
    )
    args.update(change)
    with pytest.raises(ValueError, match=message):
        check_shifted_targets(**args)
