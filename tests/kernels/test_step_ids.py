"""The ids carried between forward calls (cuda/step_ids.cu) against luce/ref/step_ids.py (and the
reference's put_ids, the host's side): steps of
prefill, AR and padding segments in any order (logits rows of prompt tails too), slots in any
order, ids out of range (a diverged row's -1) fed as 0; kept by the AR segments' slots or by
every live segment's (its last row's id, when that row has logits); nothing written outside the
AR rows' token ids and the kept slots."""
import numpy as np
import pytest

from luce.ref.step_ids import feed_ids, keep_ids, put_ids

VOCAB = 1000


def test_reference_keeps_and_feeds_by_slot():
    qo, ar = np.array([0, 3, 4, 5, 5]), np.array([-1, 2, 0, -1])      # prefill of 3 rows, AR slot 2, AR slot 0, padding
    last = np.full(4, 7, np.int32)
    keep_ids(np.array([11, 22, 33]), np.array([2, 3, 4]), qo, ar, last)
    assert last.tolist() == [33, 7, 22, 7]
    tokens = np.array([5, 5, 5, 9, 9], np.int32)
    last[0] = -1
    feed_ids(tokens, qo, ar, last, VOCAB)
    assert tokens.tolist() == [5, 5, 5, 22, 0]
    put_ids(np.array([1, 2, 3, 40, 50], np.int32), qo, ar, last)      # the host's ids, fed back alike
    assert last.tolist() == [50, 7, 40, 7]
    feed_ids(tokens, qo, ar, last, VOCAB)
    assert tokens.tolist() == [5, 5, 5, 40, 50]


def test_reference_keeps_every_segments_last_row():
    """Slots of every live segment (a draft chain's catch-up: a prompt tail, a chain of tree
    rows): the id of each one's last row, where that row has logits."""
    qo, slots = np.array([0, 3, 4, 4, 6, 8]), np.array([1, 2, 3, 0, 4])   # 3 rows, 1, none, 2, 2
    last = np.full(5, 7, np.int32)
    keep_ids(np.array([11, 22, 33, 44, 55]), np.array([2, 3, 4, 5, 6]), qo, slots, last)
    assert last.tolist() == [44, 11, 22, 7, 7]     # slot 3's segment is empty, slot 4's last row has no logits


def _random_step(rng, n_slots):
    """(qo_indptr [S+1], ar_slots [S], seq_slots [S], logits_indices [L]): segments of 0..5 rows,
    prompt tails with logits on their last row, trees on every row."""
    kinds = rng.choice(["prefill", "tree", "ar", "pad"], rng.integers(1, 40))
    slots = rng.permutation(n_slots)
    qo, ar, seq, logits, row = [0], [], [], [], 0
    for i, k in enumerate(kinds):
        n = {"prefill": int(rng.integers(1, 6)), "tree": int(rng.integers(1, 6)), "ar": 1, "pad": 0}[k]
        ar.append(int(slots[i]) if k == "ar" else -1)
        seq.append(int(slots[i]) if k != "pad" else -1)
        logits += list(range(row, row + n)) if k == "tree" else [row + n - 1] if n else []
        row += n
        qo.append(row)
    return np.array(qo, np.int32), np.array(ar, np.int32), np.array(seq, np.int32), np.array(logits, np.int64)


@pytest.mark.gpu
@pytest.mark.parametrize("every_segment", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_keep_and_feed_match_the_reference(seed, every_segment):
    from luce import _cuda_step_ids as k
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    kern = load_kernels()
    rng = np.random.default_rng(seed)
    n_slots = 64
    qo, ar, seq, logits = _random_step(rng, n_slots)
    kept = seq if every_segment else ar
    ids = rng.integers(-1, VOCAB + 5, len(logits)).astype(np.int64)
    last0 = rng.integers(-1, VOCAB + 5, n_slots).astype(np.int32)
    tokens0 = rng.integers(0, VOCAB, qo[-1]).astype(np.int32)
    want_last, want_tokens = last0.copy(), tokens0.copy()
    keep_ids(ids, logits, qo, kept, want_last)
    feed_ids(want_tokens, qo, ar, want_last, VOCAB)

    d_qo, d_ar, d_kept, d_logits, d_ids = (DeviceBuffer.from_numpy(a) for a in (qo, ar, kept, logits, ids))
    last, tokens = GuardedOutput.holding(last0), GuardedOutput.holding(tokens0)
    k.keep_ids(d_ids.ptr, d_logits.ptr, d_qo.ptr, d_kept.ptr, last.ptr, len(logits), len(ar))
    k.feed_ids(tokens.ptr, d_qo.ptr, d_ar.ptr, last.ptr, len(ar), VOCAB)
    kern.synchronize()
    assert np.array_equal(last.result(), want_last)
    assert np.array_equal(tokens.result(), want_tokens)
