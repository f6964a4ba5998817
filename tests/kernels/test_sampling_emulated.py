"""cuda/sampling.cu's top-k log-probs, its own source on the CPU (tests/kernels/emu): the ids equal
luce/ref/sampling.py's exactly and the log-probs within its tolerance, for vocabs of one slice
and of many (ties and runs of one value across a slice's edge, -inf, NaN rows, k up to 64); a
row's bits are the same alone and among others (the slices' sums are added in one order).
tests/kernels/test_sampling.py runs the same kernels on a GPU."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from luce.ref.sampling import top_k_logprobs
from tests.kernels.emu import build as emu
from tests.kernels.tolerances import tolerance

pytestmark = pytest.mark.slow
SLICE = 8192


class Params(C.Structure):
    """luce_sampling_params (cuda/luce_ops.h), field for field."""
    _fields_ = [("logits", C.c_void_p), ("ids_out", C.c_void_p), ("logprobs_out", C.c_void_p),
                ("rows", C.c_int64), ("vocab", C.c_int64), ("logits_stride", C.c_int64), ("k", C.c_int32),
                ("workspace", C.c_void_p), ("workspace_bytes", C.c_int64)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["sampling.cu"], tmp_path_factory.mktemp("emu_sampling"), "the sampling kernels")
    lib.luce_top_k_logprobs.argtypes = [C.POINTER(Params), C.c_void_p]
    lib.luce_top_k_logprobs_workspace_bytes.restype = C.c_int64
    lib.luce_top_k_logprobs_workspace_bytes.argtypes = [C.c_int64, C.c_int64, C.c_int32]
    return lib


def run(lib, logits: np.ndarray, k: int, workspace_bytes: int | None = None):
    """-> (ids [rows, k], logprobs [rows, k]), or the status when the launch is refused."""
    logits = np.ascontiguousarray(logits, np.float32)
    rows, vocab = logits.shape
    ids, lps = np.full((rows, k), -7, np.int64), np.full((rows, k), 7.0, np.float32)
    need = lib.luce_top_k_logprobs_workspace_bytes(rows, vocab, k)
    ws = np.full(max(need, 1), 0xA5, np.uint8)   # not zeroed: the kernels must write all they read
    prm = Params(logits.ctypes.data, ids.ctypes.data, lps.ctypes.data, rows, vocab, vocab, k, ws.ctypes.data,
                 need if workspace_bytes is None else workspace_bytes)
    status = lib.luce_top_k_logprobs(C.byref(prm), None)
    return (ids, lps) if status == 0 else status


def _logits(rng, rows: int, vocab: int) -> np.ndarray:
    """Quantized logits (many exact ties), each row's maximum at three places."""
    x = (np.round(rng.standard_normal((rows, vocab)) * 8) / 4).astype(np.float32)
    for r in range(rows):
        x[r, rng.choice(vocab, min(3, vocab), replace=False)] = x[r].max() + 1.0
    return x


@pytest.mark.parametrize("rows,vocab,k", [(2, 50, 5), (3, SLICE, 64), (2, SLICE + 5, 8), (4, 3 * SLICE + 100, 20),
                                          (1, 151936, 4), (2, 40000, 64)])
def test_top_k_equals_the_reference_emulated(lib, rows, vocab, k):
    logits = _logits(np.random.default_rng(rows * vocab + k), rows, vocab)
    if vocab > SLICE:   # a run of one value across the first slice's edge: its order is by id alone
        logits[0, SLICE - 40:SLICE + 40] = logits[0].max()
    ids, lps = run(lib, logits, k)
    want_ids, want_lps = top_k_logprobs(logits, k)
    np.testing.assert_array_equal(ids, want_ids)
    rtol, atol = tolerance("top_k_logprobs")
    np.testing.assert_allclose(lps, want_lps, rtol=rtol, atol=atol)


def test_minus_infinity_and_nan_rows_emulated(lib):
    vocab = 2 * SLICE + 9
    logits = np.full((3, vocab), -np.inf, np.float32)
    logits[0, [3, SLICE + 50, 2 * SLICE + 8]] = [1.0, 2.0, 1.0]
    logits[1, :] = 0.0
    logits[1, SLICE + 42] = np.nan                  # a NaN in the second slice spoils the row
    logits[2, :] = 0.5
    ids, lps = run(lib, logits, 4)
    assert ids[0].tolist() == [SLICE + 50, 3, 2 * SLICE + 8, 0]
    np.testing.assert_allclose(lps[0, :3], top_k_logprobs(logits[:1], 4)[1][0, :3], rtol=1e-5, atol=1e-5)
    assert lps[0, 3] == -np.inf
    assert (ids[1] == -1).all() and np.isnan(lps[1]).all()
    assert ids[2].tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(lps[2], np.full(4, -np.log(vocab)), rtol=1e-6)


def test_a_row_alone_and_among_others_gives_the_same_bits_emulated(lib):
    logits = _logits(np.random.default_rng(3), 5, 3 * SLICE + 777)
    ids, lps = run(lib, logits, 8)
    for r in (0, 3, 4):
        one_ids, one_lps = run(lib, logits[r:r + 1], 8)
        assert np.array_equal(one_ids[0], ids[r]) and np.array_equal(one_lps[0].view(np.uint32), lps[r].view(np.uint32))


def test_a_short_workspace_is_refused_emulated(lib):
    logits = _logits(np.random.default_rng(4), 2, SLICE + 1)
    need = lib.luce_top_k_logprobs_workspace_bytes(2, SLICE + 1, 4)
    assert need == 2 * 2 * (4 * 8 + 16)
    assert run(lib, logits, 4, workspace_bytes=need - 1) != 0
