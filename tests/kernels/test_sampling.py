"""Greedy argmax and top-k log-probs (cuda/sampling.cu) against luce/ref/sampling.py: ties to
the lowest id, -inf entries, NaN rows, full 248320-token vocab, k up to the maximum, batch
invariance."""
import numpy as np
import pytest

from luce.ref.sampling import argmax, top_k_logprobs
from tests.kernels.tolerances import tolerance

VOCAB = 248320


def test_reference_ties_go_to_lowest_id():
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]], np.float32)
    assert argmax(logits).tolist() == [1, 0]
    ids, _ = top_k_logprobs(logits, 3)
    assert ids.tolist() == [[1, 2, 0], [0, 1, 2]]


def _logits(rng, rows, vocab, ties=True):
    """Quantized logits (many exact ties), the row maximum repeated at a few places."""
    x = (np.round(rng.standard_normal((rows, vocab)) * 8) / 4).astype(np.float32)
    if ties:
        for r in range(rows):
            top = x[r].max() + 1.0
            x[r, rng.choice(vocab, min(3, vocab), replace=False)] = top
    return x


def _run_argmax(logits):
    from luce import _cuda_sampling as ks
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    k = load_kernels()
    d = DeviceBuffer.from_numpy(logits)
    ids = GuardedOutput((logits.shape[0],), np.int64, fill=-7)
    ks.argmax(d.ptr, ids.ptr, *logits.shape)
    k.synchronize()
    return ids.result()


def _run_top_k(logits, k):
    from luce import _cuda_sampling as ks
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    kern = load_kernels()
    d = DeviceBuffer.from_numpy(logits)
    rows = logits.shape[0]
    ids = GuardedOutput((rows, k), np.int64, fill=-7)
    lps = GuardedOutput((rows, k), np.float32, fill=7.0)
    work = DeviceBuffer(ks.workspace_bytes(rows, logits.shape[1], k))
    ks.top_k_logprobs(d.ptr, ids.ptr, lps.ptr, work.ptr, work.nbytes, rows, logits.shape[1], k)
    kern.synchronize()
    return ids.result(), lps.result()


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 2, 63, 64, 65])
@pytest.mark.parametrize("vocab", [1, 7, 1000, VOCAB])
def test_argmax_parity(rows, vocab):
    logits = _logits(np.random.default_rng(rows + vocab), rows, vocab)
    assert np.array_equal(_run_argmax(logits), argmax(logits))


@pytest.mark.gpu
def test_argmax_infinities_and_nan_rows():
    logits = np.full((3, 300), -np.inf, np.float32)
    logits[1, 5] = np.inf
    logits[1, 200] = np.inf
    logits[2, 17] = np.nan
    assert _run_argmax(logits).tolist() == [0, 5, -1]


@pytest.mark.gpu
@pytest.mark.parametrize("rows,vocab,k", [(1, VOCAB, 1), (2, VOCAB, 20), (65, 1000, 64),
                                          (3, 64, 64), (63, 5000, 5), (4, 7, 3), (3, 20000, 64)])
def test_top_k_parity(rows, vocab, k):
    logits = _logits(np.random.default_rng(rows * vocab + k), rows, vocab)
    ids, lps = _run_top_k(logits, k)
    ref_ids, ref_lps = top_k_logprobs(logits, k)
    assert np.array_equal(ids, ref_ids)
    rtol, atol = tolerance("top_k_logprobs")
    np.testing.assert_allclose(lps, ref_lps, rtol=rtol, atol=atol)


@pytest.mark.gpu
def test_top_k_with_minus_infinity_and_nan_rows():
    logits = np.full((2, 100), -np.inf, np.float32)
    logits[0, [3, 50, 99]] = [1.0, 2.0, 1.0]
    logits[1, :] = 0.0
    logits[1, 42] = np.nan
    from luce import _cuda_sampling as ks
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels

    k = load_kernels()
    d = DeviceBuffer.from_numpy(logits)
    ids, lps, work = DeviceBuffer(2 * 4 * 8), DeviceBuffer(2 * 4 * 4), DeviceBuffer(ks.workspace_bytes(2, 100, 4))
    ks.top_k_logprobs(d.ptr, ids.ptr, lps.ptr, work.ptr, work.nbytes, 2, 100, 4)
    k.synchronize()
    got_ids, got_lps = ids.download((2, 4), np.int64), lps.download((2, 4), np.float32)
    ref_ids, ref_lps = top_k_logprobs(logits[:1], 4)
    assert got_ids[0].tolist() == ref_ids[0].tolist() == [50, 3, 99, 0]
    np.testing.assert_allclose(got_lps[0, :3], ref_lps[0, :3], rtol=1e-5, atol=1e-5)
    assert got_lps[0, 3] == -np.inf
    assert (got_ids[1] == -1).all() and np.isnan(got_lps[1]).all()


@pytest.mark.gpu
def test_batch_invariance():
    logits = _logits(np.random.default_rng(5), 64, VOCAB)
    all_ids = _run_argmax(logits)
    top_ids, top_lps = _run_top_k(logits, 8)
    for r in (0, 17, 63):
        assert _run_argmax(logits[r:r + 1])[0] == all_ids[r]
        ids, lps = _run_top_k(logits[r:r + 1], 8)
        assert np.array_equal(ids[0], top_ids[r]) and np.array_equal(lps[0], top_lps[r])
