"""The cpu backend's argmax and top-k log-probs (luce/cpu/sampling.c) against luce/ref/sampling.py:
ties to the lowest id, NaN rows named, the log-softmax over the whole row, and each row's
result bitwise the same alone or among others, on 1, 2 or 4 threads."""
from __future__ import annotations

import numpy as np
import pytest

from luce import _cpu
from luce.ops import get_backend
from luce.ref import sampling as ref

V = 151_936


@pytest.fixture(scope="module")
def B():
    return get_backend("cpu", threads=2)


def logits(rows: int, seed: int = 0, v: int = V) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal((rows, v)) * 4).astype(np.float32)
    x[:, 11] = x[:, 5] = x.max() + 1.0          # a tie at the top: id 5 must come first
    return x


def test_argmax_and_top_k_match_the_reference(B):
    x = logits(5)
    assert np.array_equal(B.argmax(x), ref.argmax(x))
    for k in (1, 4, 8, 64):
        ids, lp = B.top_k_logprobs(x, k)
        want_ids, want_lp = ref.top_k_logprobs(x, k)
        assert np.array_equal(ids, want_ids), k
        np.testing.assert_allclose(lp, want_lp, rtol=0, atol=1e-5)
    assert B.top_k_logprobs(x, 2)[0][:, :2].tolist() == [[5, 11]] * 5


def test_large_k_uses_the_reference_and_bad_k_is_refused(B):
    x = logits(2, v=300)
    assert np.array_equal(B.top_k_logprobs(x, 100)[0], ref.top_k_logprobs(x, 100)[0])
    with pytest.raises(ValueError, match="k=0"):
        B.top_k_logprobs(x, 0)


def test_nan_rows_are_named(B):
    x = logits(3, v=1000)
    x[2, 17] = np.nan
    with pytest.raises(ValueError, match=r"NaN in logits rows \[2\]"):
        B.argmax(x)
    with pytest.raises(ValueError, match=r"NaN in logits rows \[2\]"):
        B.top_k_logprobs(x, 4)


def test_rows_are_bitwise_the_same_alone_and_in_any_batch_on_any_threads(B):
    x = logits(9, seed=3, v=20_000)
    _cpu.set_threads(1)
    alone = [B.top_k_logprobs(x[i:i + 1], 8) for i in range(9)]
    try:
        for threads in (1, 2, 4):
            _cpu.set_threads(threads)
            ids, lp = B.top_k_logprobs(x, 8)
            for i in range(9):
                assert np.array_equal(ids[i], alone[i][0][0]) and np.array_equal(lp[i], alone[i][1][0]), (threads, i)
    finally:
        _cpu.set_threads(2)
